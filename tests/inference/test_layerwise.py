"""Exact layer-wise inference equals a full-graph forward, whatever the chunk size."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.nn import SAGEConv

from gnnaas.data.store import GraphStore
from gnnaas.inference.layerwise import layerwise_inference, peak_bytes
from gnnaas.models import build_model

NUM_CLASSES = 3


def _hand_made() -> GraphStore:
    # 0 ← 1, 0 ← 2, 1 ← 2, 2 ← 0, 3 ← 0, 3 ← 1, 3 ← 2, 4 ← 3; node 5 has no in-neighbor and
    # node 4 has no out-neighbor: directed, with a sink and an isolated node.
    edge_index = torch.tensor([[1, 2, 2, 0, 0, 1, 2, 3], [0, 0, 1, 2, 3, 3, 3, 4]])
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 5, generator=g)
    return GraphStore.from_edge_index("hand", edge_index, x, torch.arange(6) % 3, NUM_CLASSES)


def _random() -> GraphStore:
    g = torch.Generator().manual_seed(0)
    n = 200
    edge_index = torch.randint(0, n, (2, 1500), generator=g)
    x = torch.randn(n, 5, generator=g)
    return GraphStore.from_edge_index("rand", edge_index, x, torch.randint(0, 3, (n,)), 3)


@pytest.fixture(params=["hand", "random"])
def store(request: pytest.FixtureRequest) -> GraphStore:
    return _hand_made() if request.param == "hand" else _random()


def _model(arch: str, family: str = "gnnaas", layers: int = 2) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(arch, 5, 8, NUM_CLASSES, num_layers=layers, family=family)
    if arch == "gin" and family == "gnnaas":  # running statistics away from the identity
        for conv in model.convs:
            bn = conv.nn[1]
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    return model.eval()


@pytest.mark.parametrize(
    ("arch", "family", "layers"),
    [("sage", "gnnaas", 2), ("gin", "gnnaas", 2), ("gin", "pyg", 2), ("sage", "gnnaas", 3)],
)
@pytest.mark.parametrize("chunk_size", [1, 4, 1000])
def test_equals_the_full_graph_forward(
    store: GraphStore, arch: str, family: str, layers: int, chunk_size: int
) -> None:
    model = _model(arch, family, layers)
    with torch.no_grad():
        expected = model(store.x, store.edge_index)  # [N, C]
    out = layerwise_inference(model, store.x, store.rowptr, store.col, chunk_size=chunk_size)
    assert out.logits.shape == (store.num_nodes, NUM_CLASSES)
    torch.testing.assert_close(out.logits, expected, atol=1e-5, rtol=1e-5)
    assert out.embeddings is None


def test_chunk_size_does_not_change_the_result(store: GraphStore) -> None:
    model = _model("gin")
    runs = [
        layerwise_inference(model, store.x, store.rowptr, store.col, chunk_size=c, embeddings=True)
        for c in (1, 3, 64, store.num_nodes)
    ]
    for other in runs[1:]:
        torch.testing.assert_close(other.logits, runs[0].logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(other.embeddings, runs[0].embeddings, atol=1e-5, rtol=1e-5)


def test_embeddings_are_the_last_layers_input_with_the_hidden_width(store: GraphStore) -> None:
    model = _model("sage")
    out = layerwise_inference(model, store.x, store.rowptr, store.col, embeddings=True)
    assert out.embeddings is not None
    assert out.embeddings.shape == (store.num_nodes, model.hidden_channels)
    assert bool((out.embeddings >= 0).all())  # after the first layer's ReLU
    with torch.no_grad():  # the last layer on the embeddings gives the logits
        last = model.convs[-1](out.embeddings, store.edge_index)
    torch.testing.assert_close(out.logits, last, atol=1e-5, rtol=1e-5)


def test_a_convolution_without_a_fused_update_runs_through_pyg(store: GraphStore) -> None:
    model = _model("sage")
    model.convs[0] = SAGEConv(5, 8, aggr="max")  # no fused update: message passing per chunk
    assert model.aggregation(0) is None
    with torch.no_grad():
        expected = model(store.x, store.edge_index)
    out = layerwise_inference(model, store.x, store.rowptr, store.col, chunk_size=7)
    torch.testing.assert_close(out.logits, expected, atol=1e-5, rtol=1e-5)


def test_progress_counts_every_node_of_every_layer(store: GraphStore) -> None:
    seen: list[int] = []
    layerwise_inference(
        _model("sage"), store.x, store.rowptr, store.col, chunk_size=5, progress=seen.append
    )
    assert sum(seen) == 2 * store.num_nodes
    assert max(seen) <= 5


def test_bad_arguments_are_refused(store: GraphStore) -> None:
    model = _model("sage")
    with pytest.raises(ValueError, match="chunk_size"):
        layerwise_inference(model, store.x, store.rowptr, store.col, chunk_size=0)
    with pytest.raises(ValueError, match="nodes but the features"):
        layerwise_inference(model, store.x[:-1], store.rowptr, store.col)


def test_peak_bytes_grows_with_nodes_and_chunk() -> None:
    model = _model("sage")
    small = peak_bytes(model, 1000, 10_000, 100)
    assert peak_bytes(model, 2000, 20_000, 100) > small
    assert peak_bytes(model, 1000, 10_000, 1000) > small
    # the floor: output states of the widest consecutive pair plus the embeddings, float32
    assert small >= 4 * 1000 * (8 + 3 + 8)


# -- a GIN trained on sampled sums: exact sums scaled to the training fanouts ------------------


def test_scaled_sum_of_a_block_brings_each_target_to_its_cap() -> None:
    from gnnaas.models.base import aggregate_neighbors
    from gnnaas.sampling.subgraph import Block

    x = torch.tensor([[1.0], [2.0], [3.0], [4.0], [5.0], [6.0]])
    # target 0 has 4 neighbors (rows 2..5), target 1 one neighbor (row 2)
    block = Block(torch.tensor([[2, 3, 4, 5, 2], [0, 0, 0, 0, 1]]), (6, 2))
    plain = aggregate_neighbors(x, block)
    assert plain.flatten().tolist() == [18.0, 3.0]
    capped = aggregate_neighbors(x, block, cap=2)
    assert capped.flatten().tolist() == [9.0, 3.0]  # 18 * 2/4, and 3 * 1/1 (under the cap)
    assert aggregate_neighbors(x, block, cap=2, mean=True).flatten().tolist() == [4.5, 3.0]


def test_the_sparse_sum_of_a_large_block_is_scaled_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    import gnnaas.models.base as base
    from gnnaas.sampling.subgraph import Block

    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 4, generator=g)
    edge_index = torch.stack([torch.randint(0, 50, (300,), generator=g), torch.arange(300) % 20])
    block = Block(edge_index, (50, 20))
    small = base.aggregate_neighbors(x, block, cap=7)
    monkeypatch.setattr(base, "SPARSE_MIN_ELEMENTS", 1)
    torch.testing.assert_close(base.aggregate_neighbors(x, block, cap=7), small)


def test_caps_apply_only_to_gin_layers_sampled_past_their_training_fanout() -> None:
    gin, sage = _model("gin"), _model("sage")
    for model in (gin, sage):
        model.train_fanouts = (25, 10)
    gin.configure_fanouts((25, 10))
    assert gin.sum_caps is None
    gin.configure_fanouts((10, 5))  # fewer neighbors than trained: plain sums
    assert gin.sum_caps is None
    gin.configure_fanouts((-1, -1))  # layer 0 aggregates the outer hop (10), layer 1 the seeds'
    assert gin.sum_caps == (10, 25)
    gin.configure_fanouts((25, 40))
    assert gin.sum_caps == (10, None)
    sage.configure_fanouts((-1, -1))
    assert sage.sum_caps is None  # a mean needs no scaling
    gin.train_fanouts = None  # e.g. a user's model: no known training fanouts
    gin.configure_fanouts((-1, -1))
    assert gin.sum_caps is None


def test_exact_pass_equals_the_sampled_path_over_full_neighborhoods(store: GraphStore) -> None:
    """What a precomputed GIN stores (layer-wise) and what it computes for a stale node (its
    sampled path with every fanout -1) agree, both with sums scaled to the training fanouts."""
    from gnnaas.inference import InferencePath
    from gnnaas.sampling import DepthSampler

    model = _model("gin")
    model.train_fanouts = (2, 1)  # small caps, so that the hand-made graph's sums are scaled
    exact = layerwise_inference(model, store.x, store.rowptr, store.col).logits
    with torch.no_grad():
        unscaled = model(store.x, store.edge_index)
    sampler = DepthSampler(store.rowptr, store.col, (-1, -1))
    path = InferencePath(model, store.x, sampler)
    sampled = path.run(torch.arange(store.num_nodes)).logits
    torch.testing.assert_close(sampled, exact, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(exact, unscaled, atol=1e-4)  # the caps did bind
