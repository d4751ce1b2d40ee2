"""The in-memory live graph: a base CSR plus an append-only overlay of changed in-neighbor lists.

:class:`LiveGraph` (see :mod:`gnnaas.data.live` for the layout) answers the samplers' reads and
applies validated writes (:meth:`LiveGraph.prepare` off the event loop, :meth:`LiveGraph.commit`
under the server's exclusive gate). It holds no file: the log, the snapshot and their replay are
:mod:`gnnaas.data.live.wal`'s, and what a write may say is :mod:`gnnaas.data.live.writes`'s.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gnnaas.data.live.writes import Staging, Write
from gnnaas.errors import ArtifactError

__all__ = ["LiveGraph", "Prepared"]


class _Grow:
    """A growable int64 array (amortized doubling)."""

    def __init__(self, initial: int = 1024) -> None:
        self.data = np.empty(max(initial, 16), np.int64)
        self.size = 0

    def extend(self, values: np.ndarray) -> int:
        """Appends ``values``; returns the position of the first."""
        start = self.size
        end = start + values.shape[0]
        if end > self.data.shape[0]:
            grown = np.empty(max(end, 2 * self.data.shape[0]), np.int64)
            grown[:start] = self.data[:start]
            self.data = grown
        self.data[start:end] = values
        self.size = end
        return start

    def view(self) -> np.ndarray:
        return self.data[: self.size]


@dataclass(frozen=True)
class Prepared:
    """A group of writes as :meth:`LiveGraph.commit` applies it.

    Args:
        lists (dict[int, np.ndarray]): the new sorted in-neighbors of every touched target.
        rows (list): ``(first row, [k, F] values)`` feature rows to write.
        num_nodes (int): the node count after the group.
        writes (int): writes in the group (the version advances by as many).
        edge_updates (int): edges added plus removed.
    """

    lists: dict[int, np.ndarray]
    rows: list[tuple[int, np.ndarray]]
    num_nodes: int
    writes: int
    edge_updates: int


class LiveGraph:
    """A dataset's graph that takes writes (see :mod:`gnnaas.data.live`).

    Args:
        rowptr (Tensor): ``[N + 1]`` int64 base CSR pointers over incoming edges.
        col (Tensor): ``[E]`` int64 base in-neighbors (sorted per node).
        x (Tensor): ``[N, F]`` float32 base features.
        capacity (int): most nodes the graph can hold (new nodes beyond it are refused).
        version (int, optional): version of the base (the last write it includes). (default: ``0``)
        max_write_edges (int, optional): most edges one write may add plus remove.
            (default: ``100_000``)
        max_write_nodes (int, optional): most nodes one write may add. (default: ``4096``)
    """

    def __init__(
        self,
        rowptr: Tensor,
        col: Tensor,
        x: Tensor,
        *,
        capacity: int,
        version: int = 0,
        max_write_edges: int = 100_000,
        max_write_nodes: int = 4096,
    ) -> None:
        n = rowptr.numel() - 1
        if capacity < n:
            raise ValueError(f"LiveGraph: capacity {capacity} is below the base's {n} nodes")
        self.rowptr, self.col = rowptr.contiguous(), col.contiguous()
        self._rowptr_np, self._col_np = self.rowptr.numpy(), self.col.numpy()
        self.base_nodes = n
        self.num_features = int(x.size(1))
        self.capacity = int(capacity)
        self.version = int(version)
        self.max_write_edges = max_write_edges
        self.max_write_nodes = max_write_nodes
        self._num_nodes = n
        self._x = torch.zeros(self.capacity, self.num_features, dtype=torch.float32)
        self._x[:n] = x
        self._subsets: dict[tuple[int, ...], tuple[Tensor, Tensor]] = {}  # key -> (index, buffer)
        # Held by commit() and by features() while it builds a subset (a reload builds executors
        # in a worker thread while writes commit): a new buffer is either built before a commit,
        # and updated by it, or after, from the updated rows.
        self._lock = threading.Lock()
        self._over_idx = np.full(self.capacity, -1, np.int64)
        self._over_ptr = _Grow()
        self._over_ptr.extend(np.zeros(1, np.int64))
        self._over_col = _Grow()
        self._live_overlay = 0  # entries of current lists (the rest of over_col is garbage)
        self._overlaid = 0  # nodes with an overlay list
        self._merged: tuple[int, Tensor, Tensor] | None = None
        self.edge_updates = 0  # edges added or removed since the base

    # -- reading ---------------------------------------------------------------------------------

    @property
    def num_nodes(self) -> int:
        """Nodes now (base plus added)."""
        return self._num_nodes

    def neighbors(self, node: int) -> np.ndarray:
        """The current sorted in-neighbors of ``node``."""
        o = self._over_idx[node]
        if o >= 0:
            ptr = self._over_ptr.data
            return self._over_col.data[ptr[o] : ptr[o + 1]]
        if node >= self.base_nodes:
            return np.empty(0, np.int64)
        return self._col_np[self._rowptr_np[node] : self._rowptr_np[node + 1]]

    def has_edge(self, source: int, target: int) -> bool:
        """Whether ``source`` is an in-neighbor of ``target`` now."""
        adj = self.neighbors(target)
        i = int(np.searchsorted(adj, source))
        return i < adj.shape[0] and int(adj[i]) == source

    @property
    def _key_base(self) -> int:
        """Edge ``(s, t)`` is the key ``t * base + s``: keys sort by target, then source."""
        return self.capacity + 1

    def _edge_keys(self, targets: np.ndarray) -> np.ndarray:
        """The sorted keys of the current in-edges of sorted unique ``targets`` (ids beyond the
        graph have none)."""
        current = [self.neighbors(t) for t in targets.tolist()]
        if not current:
            return np.empty(0, np.int64)
        lengths = np.fromiter((a.shape[0] for a in current), np.int64, count=len(current))
        return np.repeat(targets, lengths) * self._key_base + np.concatenate(current)

    def edges_present(self, edges: np.ndarray) -> np.ndarray:
        """Whether each ``[2, m]`` (source, target) edge is in the graph now, in a few vectorized
        operations (targets may be new ids beyond the graph: absent)."""
        query = edges[1] * self._key_base + edges[0]
        keys = self._edge_keys(np.unique(edges[1]))
        if not keys.size:
            return np.zeros(query.shape[0], dtype=bool)
        return keys[np.minimum(np.searchsorted(keys, query), keys.shape[0] - 1)] == query

    def overlay_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``(over_idx, over_ptr, over_col)`` for the compiled sampler; ``None`` before any
        change of the adjacency."""
        if not self._overlaid:
            return None
        return self._over_idx, self._over_ptr.view(), self._over_col.view()

    def merged_csr(self) -> tuple[Tensor, Tensor]:
        """The current graph as one CSR ``(rowptr, col)`` (built once per version; the torch
        sampling path and compaction read it)."""
        if self._merged is not None and self._merged[0] == self.version:
            return self._merged[1], self._merged[2]
        n = self._num_nodes
        lists = [self.neighbors(i) for i in range(n)] if self._overlaid else None
        if lists is None:
            rowptr, col = self.rowptr, self.col
        else:
            degrees = np.fromiter((a.shape[0] for a in lists), np.int64, count=n)
            ptr = np.zeros(n + 1, np.int64)
            np.cumsum(degrees, out=ptr[1:])
            flat = np.concatenate(lists) if lists else np.empty(0, np.int64)
            rowptr, col = torch.from_numpy(ptr), torch.from_numpy(flat.astype(np.int64))
        self._merged = (self.version, rowptr, col)
        return rowptr, col

    def features(self, keep: Tensor | None = None) -> Tensor:
        """The ``[capacity, F_kept]`` feature buffer of the kept columns (all with ``None``);
        rows of new nodes are written into it in place, rows ``>= num_nodes`` are zero."""
        if keep is None or (
            keep.numel() == self.num_features
            and bool((keep == torch.arange(self.num_features)).all())
        ):
            return self._x
        key = tuple(int(i) for i in keep.tolist())
        with self._lock:
            entry = self._subsets.get(key)
            if entry is None:
                index = torch.as_tensor(key, dtype=torch.long)
                entry = (index, self._x.index_select(1, index))
                self._subsets[key] = entry
        return entry[1]

    def stats(self) -> dict[str, Any]:
        """Version, sizes and the overlay's memory (``/v1/datasets`` and the benchmarks)."""
        return {
            "version": self.version,
            "num_nodes": self._num_nodes,
            "capacity": self.capacity,
            "overlay_nodes": self._overlaid,
            "overlay_entries": self._live_overlay,
            "overlay_bytes": 8 * (self._over_col.data.shape[0] + self._over_ptr.data.shape[0])
            + self._over_idx.nbytes,
            "edge_updates": self.edge_updates,
        }

    # -- writing ---------------------------------------------------------------------------------

    def stage(self) -> Staging:
        """A validator for a group of writes applied in order after it (see :class:`Staging`)."""
        return Staging(self)

    def apply(self, write: Write) -> None:
        """Applies one validated write and advances the version (replay; the server prepares a
        whole group off its event loop and commits it at once, :meth:`prepare` / :meth:`commit`)."""
        self.commit(self.prepare([write]))

    def prepare(self, writes: Sequence[Write]) -> Prepared:
        """What a group of validated writes changes, computed without changing anything: the new
        in-neighbor list of every touched target, the feature rows to write, the node count.

        Reads the graph only, so it may run in another thread while batches read the graph;
        :meth:`commit` then applies it in a few array operations (the server holds its exclusive
        gate for that part alone). No other check: validation is :class:`Staging`'s, replay
        trusts the log.

        Raises:
            ArtifactError: a node write does not continue the node ids (a log out of order).
        """
        rows: list[tuple[int, np.ndarray]] = []
        new_nodes: list[int] = []
        chunks: list[np.ndarray] = []
        n = self._num_nodes
        updates = 0
        base = self._key_base
        for write in writes:
            if write.kind == "nodes":
                assert write.features is not None
                if write.first_id != n:
                    raise ArtifactError(
                        f"live graph: a node write expects first id {write.first_id}, the graph "
                        f"has {n} nodes (log out of order)"
                    )
                k = write.features.shape[0]
                rows.append((n, write.features))
                new_nodes.extend(range(n, n + k))
                n += k
            elif write.kind == "features":
                assert write.features is not None
                rows.append((write.node, write.features.reshape(1, -1)))
            for edges in (write.add, write.remove):
                if edges is not None and edges.size:
                    chunks.append(edges[1] * base + edges[0])
                    updates += edges.shape[1]
        empty = np.empty(0, np.int64)
        lists: dict[int, np.ndarray] = {}
        if chunks:
            # Validated writes only add absent edges and remove present ones, so every operation
            # flips its edge: the group's effect is the edges operated on an odd number of times.
            keys, counts = np.unique(np.concatenate(chunks), return_counts=True)
            flips = keys[counts % 2 == 1]
            targets = np.unique(flips // base)
            after = np.setxor1d(self._edge_keys(targets), flips, assume_unique=True)
            owners, sources = after // base, after % base
            lo = np.searchsorted(owners, targets, side="left")
            hi = np.searchsorted(owners, targets, side="right")
            for t, i, j in zip(targets.tolist(), lo.tolist(), hi.tolist(), strict=True):
                lists[t] = sources[i:j]
        for node in new_nodes:  # a new node reads the overlay, even without edges
            lists.setdefault(node, empty)
        return Prepared(lists, rows, n, len(writes), updates)

    def commit(self, prepared: Prepared) -> None:
        """Applies a prepared group (:meth:`prepare`): appends the new lists to the overlay at once,
        points the targets at them, writes the feature rows and advances the version."""
        with self._lock:
            self._commit(prepared)

    def _commit(self, prepared: Prepared) -> None:
        for start, block in prepared.rows:
            values = torch.from_numpy(block)
            self._x[start : start + block.shape[0]] = values
            for index, buf in list(self._subsets.values()):
                buf[start : start + block.shape[0]] = values.index_select(1, index)
        if prepared.lists:
            targets = np.fromiter(prepared.lists, np.int64, count=len(prepared.lists))
            arrays = list(prepared.lists.values())
            lengths = np.fromiter((a.shape[0] for a in arrays), np.int64, count=len(arrays))
            flat = np.concatenate(arrays).astype(np.int64, copy=False)
            start = self._over_col.extend(flat)
            first_slot = self._over_ptr.size - 1
            self._over_ptr.extend(start + np.cumsum(lengths))
            old = self._over_idx[targets]
            had = old >= 0
            ptr = self._over_ptr.data
            self._live_overlay -= int((ptr[old[had] + 1] - ptr[old[had]]).sum())
            self._overlaid += int((~had).sum())
            self._over_idx[targets] = first_slot + np.arange(targets.shape[0])
            self._live_overlay += int(flat.shape[0])
        self._num_nodes = prepared.num_nodes
        self.version += prepared.writes
        self.edge_updates += prepared.edge_updates
        if self._over_col.size > 4 * max(self._live_overlay, 1 << 16):
            self._repack()

    def _repack(self) -> None:
        """Drops superseded lists (the overlay's garbage) by copying the current ones into fresh
        arrays, in a few vectorized operations (it runs under the server's exclusive gate)."""
        nodes = np.nonzero(self._over_idx >= 0)[0]
        slots = self._over_idx[nodes]
        ptr = self._over_ptr.data
        starts, lengths = ptr[slots], ptr[slots + 1] - ptr[slots]
        ends = np.cumsum(lengths)
        total = int(ends[-1]) if ends.size else 0
        # positions of every current entry in the old over_col, list after list
        gather = np.arange(total, dtype=np.int64) + np.repeat(starts - (ends - lengths), lengths)
        col, new_ptr = _Grow(max(total, 1)), _Grow(nodes.shape[0] + 1)
        col.extend(self._over_col.data[gather])
        new_ptr.extend(np.concatenate([np.zeros(1, np.int64), ends]))
        self._over_col, self._over_ptr = col, new_ptr
        self._over_idx[nodes] = np.arange(nodes.shape[0], dtype=np.int64)
        self._live_overlay = total
