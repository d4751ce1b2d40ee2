"""SAGE specifics: mean aggregation and which first-layer weights it exposes."""

from __future__ import annotations

import torch
from torch_geometric.nn import SAGEConv
from torch_geometric.nn.aggr import MeanAggregation

from gnnaas.models import SAGE, Arch


def test_layers_are_mean_sage_convs() -> None:
    model = SAGE(6, 16, 4, num_layers=3)
    assert model.arch is Arch.SAGE
    assert [type(c) for c in model.convs] == [SAGEConv] * 3
    assert all(isinstance(c.aggr_module, MeanAggregation) for c in model.convs)
    assert [(c.in_channels, c.out_channels) for c in model.convs] == [(6, 16), (16, 16), (16, 4)]


def test_first_layer_weights_are_neighbor_then_root() -> None:
    model = SAGE(6, 16, 4)
    neighbor, root = model.first_layer_weights()
    assert neighbor is model.convs[0].lin_l.weight
    assert root is model.convs[0].lin_r.weight


def test_mean_aggregation_ignores_neighbor_multiplicity() -> None:
    # node 0 hears from 1 and 2; doubling every edge leaves a mean unchanged
    model = SAGE(3, 8, 2).eval()
    x = torch.randn(3, 3)
    edge_index = torch.tensor([[1, 2], [0, 0]])
    torch.testing.assert_close(model(x, edge_index), model(x, edge_index.repeat(1, 2)))
