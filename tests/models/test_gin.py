"""GIN specifics: the two-layer MLP and which first-layer weight it exposes."""

from __future__ import annotations

import torch
from torch_geometric.nn import GINConv

from gnnaas.models import GIN, Arch


def test_layers_are_gin_convs_with_two_layer_mlps() -> None:
    model = GIN(6, 16, 4, num_layers=2)
    assert model.arch is Arch.GIN
    assert [type(c) for c in model.convs] == [GINConv] * 2
    first, last = (list(c.nn) for c in model.convs)
    assert [type(m) for m in first] == [
        torch.nn.Linear,
        torch.nn.BatchNorm1d,
        torch.nn.ReLU,
        torch.nn.Linear,
    ]
    assert (first[0].in_features, first[-1].out_features) == (6, 16)
    assert (last[0].in_features, last[-1].out_features) == (16, 4)


def test_first_layer_weight_is_the_first_linear() -> None:
    model = GIN(6, 16, 4)
    (weight,) = model.first_layer_weights()
    assert weight is model.convs[0].nn[0].weight
    assert weight.shape == (16, 6)


def test_eval_output_does_not_depend_on_the_batch() -> None:
    # batch norm uses running statistics in eval mode: node 0 scores the same with or without
    # the unrelated nodes 3..5 in the batch (one layer: node 0 reads itself, 1 and 2)
    model = GIN(3, 8, 2, num_layers=1)
    x = torch.randn(6, 3)
    edge_index = torch.tensor([[1, 2, 4, 5, 3], [0, 0, 3, 4, 5]])
    model.train()
    model(x, edge_index)  # moves the running statistics away from their init
    model.eval()
    crowd = model(x, edge_index)[0]
    alone = model(x[:3], edge_index[:, :2])[0]
    torch.testing.assert_close(alone, crowd)
