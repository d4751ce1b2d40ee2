"""GraphStore: CSR layout, edge_index, cached feature subsets, induced subgraphs."""

from __future__ import annotations

import pytest
import torch

from gnnaas.data import GraphStore, edge_index_to_csr

# 0 → 1, 2 → 1, 1 → 0, 3 → 0, 0 → 2, 1 → 2, 2 → 3, 0 → 3 (source, target), deliberately unsorted
EDGES = [(0, 1), (2, 1), (3, 0), (1, 0), (1, 2), (0, 2), (2, 3), (0, 3)]


def _toy(**kwargs: object) -> GraphStore:
    edge_index = torch.tensor(EDGES).t()
    x = torch.arange(20, dtype=torch.float32).view(4, 5)
    y = torch.tensor([0, 1, 0, 1])
    return GraphStore.from_edge_index("toy", edge_index, x, y, 2, **kwargs)  # type: ignore[arg-type]


def test_csr_over_incoming_edges_sorted_by_target_then_source() -> None:
    store = _toy()
    assert store.rowptr.tolist() == [0, 2, 4, 6, 8]
    # in-neighbors: 0 ← {1, 3}, 1 ← {0, 2}, 2 ← {0, 1}, 3 ← {0, 2}
    assert store.col.tolist() == [1, 3, 0, 2, 0, 1, 0, 2]
    assert store.rowptr.dtype == store.col.dtype == torch.long
    assert (store.num_nodes, store.num_edges, store.num_features) == (4, 8, 5)
    assert store.in_degree.tolist() == [2, 2, 2, 2]


def test_edge_index_round_trip() -> None:
    store = _toy()
    ei = store.edge_index
    assert ei.shape == (2, 8)
    assert sorted(map(tuple, ei.t().tolist())) == sorted(EDGES)
    assert ei[1].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]  # grouped by target
    assert store.edge_index is ei  # built once


def test_csr_keeps_isolated_nodes_and_duplicates() -> None:
    rowptr, col = edge_index_to_csr(torch.tensor([[2, 2, 0], [1, 1, 1]]), 4)
    assert rowptr.tolist() == [0, 0, 3, 3, 3]
    assert col.tolist() == [0, 2, 2]


@pytest.mark.parametrize(
    ("edge_index", "match"),
    [(torch.zeros(3, 2, dtype=torch.long), r"\[2, E\]"), (torch.tensor([[0], [9]]), r"\[0, 4\)")],
)
def test_csr_rejects_bad_edges(edge_index: torch.Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        edge_index_to_csr(edge_index, 4)


def test_x_is_float32_contiguous() -> None:
    x = torch.arange(20, dtype=torch.float64).view(5, 4).t()  # non-contiguous float64
    store = GraphStore.from_edge_index("t", torch.tensor(EDGES).t(), x, torch.zeros(4), 2)
    assert store.x.dtype == torch.float32 and store.x.is_contiguous()
    assert store.y.dtype == torch.long


def test_feature_subset_is_contiguous_and_cached() -> None:
    store = _toy()
    keep = torch.tensor([4, 1, 3])
    sub = store.feature_subset(keep)
    assert sub.is_contiguous() and sub.shape == (4, 3)
    assert torch.equal(sub, store.x[:, keep])
    assert store.feature_subset(torch.tensor([4, 1, 3])) is sub  # same subset → cached copy
    assert store.feature_subset([4, 1, 3]) is sub
    other = store.feature_subset(torch.tensor([1, 3, 4]))  # order matters
    assert other is not sub and torch.equal(other, store.x[:, [1, 3, 4]])
    assert sub.data_ptr() != store.x.data_ptr()


def test_feature_subset_of_all_columns_in_order_is_x() -> None:
    store = _toy()
    assert store.feature_subset(torch.arange(5)) is store.x
    assert store.feature_subset(torch.tensor([1, 0, 2, 3, 4])) is not store.x


@pytest.mark.parametrize("keep", [[5], [-1]])
def test_feature_subset_rejects_out_of_range(keep: list[int]) -> None:
    with pytest.raises(ValueError, match=r"feature_subset ids must lie in \[0, 5\)"):
        _toy().feature_subset(keep)


def test_feature_subset_rejects_float_and_2d() -> None:
    with pytest.raises(TypeError, match="integer ids"):
        _toy().feature_subset(torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="1-D"):
        _toy().feature_subset(torch.tensor([[0, 1]]))


@pytest.mark.parametrize("nodes", [[0, 2, 3], [3, 0, 2]])
def test_induced_relabels_and_keeps_inner_edges(nodes: list[int]) -> None:
    store = _toy(val_idx=torch.tensor([1]), test_idx=torch.tensor([2]))
    sub = store.induced(torch.tensor(nodes))
    assert sub.num_nodes == 3
    relabel = {old: new for new, old in enumerate(nodes)}
    inner = {(relabel[s], relabel[t]) for s, t in EDGES if s in relabel and t in relabel}
    assert set(map(tuple, sub.edge_index.t().tolist())) == inner
    assert sub.num_edges == len(inner)
    # CSR invariants: sources sorted inside each target
    for i in range(sub.num_nodes):
        seg = sub.col[sub.rowptr[i] : sub.rowptr[i + 1]]
        assert torch.equal(seg, seg.sort().values)
    assert torch.equal(sub.x, store.x[nodes]) and sub.x.is_contiguous()
    assert torch.equal(sub.y, store.y[nodes])
    assert sub.train_idx.tolist() == [0, 1, 2]
    assert sub.val_idx.numel() == 0 and sub.test_idx.numel() == 0
    assert sub.name == store.name and sub.num_classes == store.num_classes


def test_induced_accepts_a_mask_and_rejects_duplicates() -> None:
    store = _toy()
    sub = store.induced(torch.tensor([True, False, True, False]))
    assert sub.num_nodes == 2 and sub.edge_index.t().tolist() == [[0, 1]]  # 0 → 2
    with pytest.raises(ValueError, match="distinct"):
        store.induced(torch.tensor([1, 1]))
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        store.induced(torch.tensor([4]))


def test_induced_multi_label_keeps_matrix_labels() -> None:
    y = torch.tensor([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 0]], dtype=torch.float32)
    store = GraphStore.from_edge_index(
        "ml", torch.tensor(EDGES).t(), torch.rand(4, 2), y, 3, multi_label=True
    )
    sub = store.induced(torch.tensor([1, 2]))
    assert sub.multi_label and torch.equal(sub.y, y[[1, 2]])


def test_repr_is_short() -> None:
    assert repr(_toy()) == "GraphStore(name='toy', nodes=4, edges=8, features=5, classes=2)"


def test_validation_of_shapes() -> None:
    store = _toy()
    with pytest.raises(ValueError, match="rowptr must have N \\+ 1 = 5"):
        GraphStore("bad", store.rowptr[:-1], store.col, store.x, store.y, 2, False,
                   store.train_idx, store.val_idx, store.test_idx)  # fmt: skip
    with pytest.raises(ValueError, match="rowptr\\[-1\\]"):
        GraphStore("bad", store.rowptr, store.col[:-1], store.x, store.y, 2, False,
                   store.train_idx, store.val_idx, store.test_idx)  # fmt: skip
    with pytest.raises(ValueError, match="multi-label y must be"):
        GraphStore("bad", store.rowptr, store.col, store.x, store.y, 2, True,
                   store.train_idx, store.val_idx, store.test_idx)  # fmt: skip
