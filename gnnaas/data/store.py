"""The graph store: CSR adjacency over incoming edges plus a float32 feature matrix.

Everything downstream (sampler, training, profiling, serving) reads a :class:`GraphStore`. The
adjacency is kept once, as CSR over *incoming* edges sorted by target then source, so that a
node's in-neighbors are one contiguous slice ``col[rowptr[i]:rowptr[i + 1]]``. Pruned variants
read their own contiguous copy of the kept feature columns (:meth:`GraphStore.feature_subset`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = ["GraphStore", "edge_index_to_csr"]


def edge_index_to_csr(edge_index: Tensor, num_nodes: int) -> tuple[Tensor, Tensor]:
    """Turns an ``edge_index`` into CSR over incoming edges, sorted by target then source.

    Edges are kept as given (duplicates and self loops included); only their order changes.

    Args:
        edge_index (Tensor): ``[2, E]`` int64, row 0 source, row 1 target.
        num_nodes (int): number of nodes ``N``.

    Returns:
        tuple[Tensor, Tensor]: ``rowptr`` ``[N + 1]`` and ``col`` ``[E]`` (sources), int64.

    Example:
        >>> rowptr, col = edge_index_to_csr(torch.tensor([[0, 1], [1, 2]]), 3)
        >>> rowptr.tolist(), col.tolist()
        ([0, 0, 1, 2], [0, 1])
    """
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(
            f"edge_index_to_csr: edge_index must be [2, E] (got {list(edge_index.shape)})"
        )
    src, dst = edge_index[0].long(), edge_index[1].long()
    if src.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= num_nodes):
        raise ValueError(f"edge_index_to_csr: node ids must lie in [0, {num_nodes})")
    key = dst * num_nodes + src  # one sort on a combined key orders by (target, source)
    key = key.sort().values
    # Target i's edges are the keys in [i * N, (i + 1) * N); the source is the remainder.
    rowptr = torch.searchsorted(key, torch.arange(num_nodes + 1) * num_nodes)
    return rowptr, key.remainder_(num_nodes)


def _as_index(value: Tensor | Sequence[int], what: str) -> Tensor:
    index = torch.as_tensor(value)
    if index.dtype == torch.bool:
        return index.nonzero().view(-1)
    if index.dtype.is_floating_point or index.dtype.is_complex:
        raise TypeError(f"GraphStore: {what} must hold integer ids (got dtype {index.dtype})")
    if index.dim() != 1:
        raise ValueError(f"GraphStore: {what} must be 1-D (got shape {list(index.shape)})")
    return index.long()


@dataclass(eq=False)
class GraphStore:
    r"""A graph in CSR form over incoming edges, with node features, labels and splits.

    Args:
        name (str): the dataset's canonical name (e.g. ``"Cora"``, ``"synth-reddit@0.1"``).
        rowptr (Tensor): ``[N + 1]`` int64 CSR pointers over incoming edges.
        col (Tensor): ``[E]`` int64; the in-neighbors of node ``i`` are
            ``col[rowptr[i]:rowptr[i + 1]]``, sorted ascending.
        x (Tensor): ``[N, F]`` node features (stored float32 and contiguous).
        y (Tensor): ``[N]`` int64 labels, or ``[N, C]`` float32 0/1 when multi-label.
        num_classes (int): number of classes ``C``.
        multi_label (bool): whether ``y`` is a multi-label 0/1 matrix.
        train_idx (Tensor): int64 training node ids (disjoint from validation and test).
        val_idx (Tensor): int64 validation node ids.
        test_idx (Tensor): int64 test node ids.
        informative (Tensor, optional): ground-truth informative feature columns (synthetic
            datasets only). (default: :obj:`None`)
        source (str, optional): where it came from: ``"planetoid"``, ``"pyg"``, ``"ogb"``,
            ``"synthetic"``. (default: ``"custom"``)

    Shapes:
        - rowptr: :math:`(N + 1)`, col: :math:`(E)`, x: :math:`(N, F)`,
          y: :math:`(N)` or :math:`(N, C)`, edge_index: :math:`(2, E)`

    Example:
        >>> store = GraphStore.from_edge_index("toy", torch.tensor([[0, 1], [1, 2]]),
        ...                                    torch.rand(3, 4), torch.tensor([0, 1, 0]), 2)
        >>> store
        GraphStore(name='toy', nodes=3, edges=2, features=4, classes=2)
    """

    name: str
    rowptr: Tensor
    col: Tensor
    x: Tensor
    y: Tensor
    num_classes: int
    multi_label: bool
    train_idx: Tensor
    val_idx: Tensor
    test_idx: Tensor
    informative: Tensor | None = None
    source: str = "custom"
    _subsets: dict[tuple[int, ...], Tensor] = field(default_factory=dict, init=False, repr=False)
    _edge_index: Tensor | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self.x = self.x.to(torch.float32).contiguous()
        self.rowptr = self.rowptr.long()
        self.col = self.col.long()
        n = self.x.size(0)
        if self.rowptr.dim() != 1 or self.rowptr.numel() != n + 1:
            raise ValueError(
                f"GraphStore '{self.name}': rowptr must have N + 1 = {n + 1} entries "
                f"(got shape {list(self.rowptr.shape)})"
            )
        if int(self.rowptr[-1]) != self.col.numel():
            raise ValueError(
                f"GraphStore '{self.name}': rowptr[-1] ({int(self.rowptr[-1])}) must equal "
                f"len(col) ({self.col.numel()})"
            )
        if self.y.size(0) != n:
            raise ValueError(f"GraphStore '{self.name}': y has {self.y.size(0)} rows, x has {n}")
        if self.multi_label and (self.y.dim() != 2 or self.y.size(1) != self.num_classes):
            raise ValueError(
                f"GraphStore '{self.name}': multi-label y must be [N, {self.num_classes}] "
                f"(got {list(self.y.shape)})"
            )
        if not self.multi_label and self.y.dim() != 1:
            raise ValueError(
                f"GraphStore '{self.name}': single-label y must be [N] (got {list(self.y.shape)})"
            )
        self.y = self.y.float() if self.multi_label else self.y.long()
        self.train_idx = self.train_idx.long()
        self.val_idx = self.val_idx.long()
        self.test_idx = self.test_idx.long()
        if self.informative is not None:
            self.informative = self.informative.long()

    @classmethod
    def from_edge_index(
        cls,
        name: str,
        edge_index: Tensor,
        x: Tensor,
        y: Tensor,
        num_classes: int,
        *,
        multi_label: bool = False,
        train_idx: Tensor | None = None,
        val_idx: Tensor | None = None,
        test_idx: Tensor | None = None,
        informative: Tensor | None = None,
        source: str = "custom",
    ) -> GraphStore:
        """Builds a store from a ``[2, E]`` edge list (row 0 source, row 1 target).

        Missing splits default to: every node in ``train_idx``, empty validation and test.
        """
        n = x.size(0)
        rowptr, col = edge_index_to_csr(edge_index, n)
        empty = torch.empty(0, dtype=torch.long)
        return cls(
            name=name,
            rowptr=rowptr,
            col=col,
            x=x,
            y=y,
            num_classes=num_classes,
            multi_label=multi_label,
            train_idx=torch.arange(n) if train_idx is None else train_idx,
            val_idx=empty if val_idx is None else val_idx,
            test_idx=empty if test_idx is None else test_idx,
            informative=informative,
            source=source,
        )

    @property
    def num_nodes(self) -> int:
        """Number of nodes ``N``."""
        return self.rowptr.numel() - 1

    @property
    def num_edges(self) -> int:
        """Number of stored (directed) edges ``E``; an undirected edge counts twice."""
        return self.col.numel()

    @property
    def num_features(self) -> int:
        """Number of feature columns ``F``."""
        return self.x.size(1)

    @property
    def in_degree(self) -> Tensor:
        """``[N]`` int64 number of in-neighbors of each node."""
        return self.rowptr.diff()

    @property
    def edge_index(self) -> Tensor:
        """``[2, E]`` int64 edges (row 0 source, row 1 target) for full-graph passes; built once."""
        if self._edge_index is None:
            dst = torch.repeat_interleave(torch.arange(self.num_nodes), self.in_degree)
            self._edge_index = torch.stack([self.col, dst])
        return self._edge_index

    def feature_subset(self, keep: Tensor | Sequence[int]) -> Tensor:
        """The contiguous feature columns ``x[:, keep]``, computed once per subset.

        Args:
            keep (Tensor): 1-D int64 column ids (order is kept).

        Returns:
            Tensor: ``[N, len(keep)]`` float32, contiguous; ``x`` itself when ``keep`` lists every
            column in order.
        """
        index = _as_index(keep, "keep")
        f = self.num_features
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= f):
            raise ValueError(
                f"GraphStore '{self.name}': feature_subset ids must lie in [0, {f}) "
                f"(got min {int(index.min())}, max {int(index.max())})"
            )
        if index.numel() == f and bool((index == torch.arange(f)).all()):
            return self.x
        key = tuple(index.tolist())
        with self._lock:
            cached = self._subsets.get(key)
            if cached is None:
                cached = self.x.index_select(1, index)  # [N, F_kept], a fresh contiguous copy
                self._subsets[key] = cached
        return cached

    def induced(self, nodes: Tensor | Sequence[int]) -> GraphStore:
        """The subgraph induced by ``nodes``, relabelled ``0..len(nodes)-1`` in the given order.

        This is the inductive training graph: every node is in ``train_idx``; validation and test
        are empty. Features and labels are copied.

        Args:
            nodes (Tensor): 1-D int64 distinct node ids (or an ``[N]`` bool mask).

        Returns:
            GraphStore: a new store with the same name, classes and source.
        """
        nodes = _as_index(nodes, "nodes")
        n, k = self.num_nodes, nodes.numel()
        if k and (int(nodes.min()) < 0 or int(nodes.max()) >= n):
            raise ValueError(f"GraphStore '{self.name}': induced node ids must lie in [0, {n})")
        new_id = torch.full((n,), -1, dtype=torch.long)
        new_id[nodes] = torch.arange(k)
        if not bool((new_id[nodes] == torch.arange(k)).all()):
            raise ValueError(f"GraphStore '{self.name}': induced nodes must be distinct")

        # Gather the CSR slices of the kept nodes without a loop: position of each kept edge.
        start = self.rowptr[nodes]
        deg = self.rowptr[nodes + 1] - start
        total = int(deg.sum())
        seg_start = torch.cumsum(deg, 0) - deg
        pos = torch.arange(total) + torch.repeat_interleave(
            start - seg_start, deg, output_size=total
        )
        src = new_id[self.col[pos]]
        dst = torch.repeat_interleave(torch.arange(k), deg, output_size=total)
        mask = src >= 0
        src, dst = src[mask], dst[mask]
        if k > 1 and not bool((nodes[1:] > nodes[:-1]).all()):
            # Relabelling in a non-increasing order breaks the source order inside each target.
            order = (dst * k + src).argsort()
            src, dst = src[order], dst[order]
        rowptr = torch.zeros(k + 1, dtype=torch.long)
        torch.cumsum(torch.bincount(dst, minlength=k), 0, out=rowptr[1:])
        empty = torch.empty(0, dtype=torch.long)
        return GraphStore(
            name=self.name,
            rowptr=rowptr,
            col=src,
            x=self.x[nodes],
            y=self.y[nodes],
            num_classes=self.num_classes,
            multi_label=self.multi_label,
            train_idx=torch.arange(k),
            val_idx=empty,
            test_idx=empty.clone(),
            informative=self.informative,
            source=self.source,
        )

    def __repr__(self) -> str:
        label = ", multi_label=True" if self.multi_label else ""
        return (
            f"{type(self).__name__}(name={self.name!r}, nodes={self.num_nodes}, "
            f"edges={self.num_edges}, features={self.num_features}, "
            f"classes={self.num_classes}{label})"
        )
