"""Staleness: which nodes' precomputed answers the writes to a live graph have changed.

A precomputed variant (``<base-id>@exact``) answers from a table computed on one version of the
graph; :class:`Staleness` follows the writes applied since and flags every node whose exact answer
they may have changed, so that the server samples those instead (:mod:`gnnaas.inference.lookup`).
It reads the graph and the writes, and changes neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from gnnaas.data.live.graph import LiveGraph
    from gnnaas.data.live.writes import Write

__all__ = ["Staleness"]


class Staleness:
    """Which nodes' precomputed answers the writes since have changed (``stale`` flags).

    A node's exact answer of a ``hops``-layer model depends on every node within ``hops`` hops
    upstream of it (along in-edges). A write changes the nodes it touches: the target of an edge
    added or removed (its aggregation), a node whose features were replaced, a new node; the
    answers that change are those of the touched nodes and of every node within ``hops`` hops
    *downstream* of them. Downstream neighbors come from the base graph's edges reversed (built
    on the first write) plus the edges added since; a removed edge is kept there, which can only
    mark more nodes, never fewer. Nodes beyond the precomputed ones (new nodes) are stale from
    the start.

    Args:
        graph (LiveGraph): the live graph (its base CSR and capacity).
        hops (int): layers of the model.
        num_nodes (int): nodes with a precomputed answer (the first ones).
    """

    def __init__(self, graph: LiveGraph, hops: int, num_nodes: int) -> None:
        self.graph = graph
        self.hops = int(hops)
        self.num_nodes = int(num_nodes)
        self.stale = np.zeros(graph.capacity, dtype=bool)
        self.stale[num_nodes:] = True
        self._out: tuple[np.ndarray, np.ndarray] | None = None  # reversed base CSR
        self._added: dict[int, list[int]] = {}  # source -> targets of edges added since

    @property
    def stale_fraction(self) -> float:
        """Share of the graph's current nodes whose answer is stale."""
        n = self.graph.num_nodes
        return float(self.stale[:n].mean()) if n else 0.0

    def any_stale(self, nodes: np.ndarray) -> bool:
        """Whether any of ``nodes`` (int64 ids) is stale."""
        return bool(self.stale[nodes].any())

    def _reversed(self) -> tuple[np.ndarray, np.ndarray]:
        if self._out is None:
            rowptr, col = self.graph._rowptr_np, self.graph._col_np
            n = rowptr.shape[0] - 1
            targets = np.repeat(np.arange(n, dtype=np.int64), np.diff(rowptr))
            order = np.argsort(col, kind="stable")
            ptr = np.zeros(n + 1, np.int64)
            np.cumsum(np.bincount(col, minlength=n), out=ptr[1:])
            self._out = (ptr, targets[order])
        return self._out

    def _downstream(self, nodes: np.ndarray) -> np.ndarray:
        ptr, out = self._reversed()
        base = nodes[nodes < ptr.shape[0] - 1]
        parts = [out[ptr[v] : ptr[v + 1]] for v in base.tolist()]
        parts += [np.asarray(self._added[v], np.int64) for v in nodes.tolist() if v in self._added]
        return np.unique(np.concatenate(parts)) if parts else np.empty(0, np.int64)

    def mark(self, writes: Sequence[Write]) -> int:
        """Marks what ``writes`` (applied, in order) changed; returns the nodes newly stale."""
        touched: list[np.ndarray] = []
        for w in writes:
            if w.kind == "nodes" and w.features is not None:
                touched.append(np.arange(w.first_id, w.first_id + w.features.shape[0]))
            if w.kind == "features":
                touched.append(np.asarray([w.node], np.int64))
            for edges, added in ((w.add, True), (w.remove, False)):
                if edges is None or not edges.size:
                    continue
                touched.append(edges[1])
                if added:
                    for s, t in edges.T.tolist():
                        self._added.setdefault(s, []).append(t)
        if not touched:
            return 0
        frontier = np.unique(np.concatenate(touched))
        seen = frontier
        before = int(self.stale.sum())
        self.stale[frontier] = True
        # Expanded from every touched node, stale already or not: a node marked at the last hop
        # of an earlier write had its own downstream left unmarked.
        for _ in range(self.hops):
            frontier = np.setdiff1d(self._downstream(frontier), seen, assume_unique=True)
            if not frontier.size:
                break
            seen = np.union1d(seen, frontier)
            self.stale[frontier] = True
        return int(self.stale.sum()) - before
