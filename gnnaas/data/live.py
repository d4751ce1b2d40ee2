"""A live graph: node, edge and feature writes over a base CSR, durable in an append-only log.

:class:`LiveGraph` holds one dataset's served graph as the base CSR (over incoming edges) plus an
*overlay*: for every node whose in-neighbors changed, and every new node, its current sorted
in-neighbor list, kept append-only in two growable arrays (``over_ptr``/``over_col``) that the
compiled sampler reads in place of the base slice (:mod:`gnnaas.sampling.fastpath`). A write touches
only the changed nodes' lists (no copy of the graph); superseded lists are garbage that is dropped
when it outgrows the live ones, and :func:`compact` folds everything into a new base. Features live
in preallocated buffers of ``capacity`` rows (the full matrix and one per variant's kept columns),
so a new node's row is written in place and the buffers the executors hold stay valid.

Writes go through :class:`Staging` (validation against the graph plus the earlier writes of the same
group, so a group can be checked, logged and applied as one) and :class:`WriteLog` (records of
``length, crc32, version`` + an orjson payload, fsynced once per group before any is acknowledged).
:meth:`LiveGraph.open` loads the newest snapshot (or the dataset) and replays the log; a torn last
record (a crash during its write, never acknowledged) is cut off.

Edges are ``[source, target]``: ``source`` becomes an in-neighbor of ``target`` (messages flow
source → target). The built-in graphs are symmetric; send both directions for an undirected edge.

Files under ``<state-dir>/<dataset>/``: ``snapshot.safetensors`` (after a compaction),
``log.wal``, and ``lock`` (held by the process that owns the graph).

Example:
    >>> graph = LiveGraph(rowptr, col, x, capacity=x.size(0) + 1000)  # doctest: +SKIP
    >>> staging = graph.stage()  # doctest: +SKIP
    >>> op = staging.add_edges([[0, 5]], [])  # doctest: +SKIP
    >>> graph.apply(op)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import struct
import threading
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import torch
from torch import Tensor

from gnnaas.errors import ArtifactError, ConfigError
from gnnaas.utils import new_file_mode

__all__ = [
    "WriteTooLarge",
    "LiveGraph",
    "Prepared",
    "Staging",
    "Staleness",
    "Write",
    "WriteError",
    "WriteLog",
    "compact",
    "live_store",
    "read_live",
    "state_folder",
    "writes_since",
]

_log = logging.getLogger(__name__)

_HEADER = struct.Struct("<IIQ")  # payload length, crc32 of the payload, graph version after it
_UNSAFE = re.compile(r"[^A-Za-z0-9._@-]")


class WriteError(ConfigError):
    """A write that cannot be applied as sent; nothing of it was applied (HTTP 422)."""


class WriteTooLarge(WriteError):
    """A write over the per-write limits of nodes or edges (HTTP 413)."""


def state_folder(state_dir: Path | str, dataset: str) -> Path:
    """Where a dataset's snapshot, log and lock live under ``state_dir``."""
    return Path(state_dir) / _UNSAFE.sub("_", dataset)


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
class Write:
    """One validated write, ready to log and apply.

    Args:
        kind (str): ``nodes``, ``edges`` or ``features``.
        first_id (int): ``nodes``: id of the first new node.
        features (np.ndarray): ``nodes``: ``[k, F]``; ``features``: ``[1, F]``.
        add (np.ndarray): ``[2, a]`` edges to add (source, target; resolved ids).
        remove (np.ndarray): ``[2, r]`` edges to remove.
        node (int): ``features``: the node whose row is replaced.
    """

    kind: str
    first_id: int = -1
    features: np.ndarray | None = None
    add: np.ndarray | None = None
    remove: np.ndarray | None = None
    node: int = -1

    def payload(self) -> bytes:
        body: dict[str, Any] = {"kind": self.kind}
        if self.kind == "nodes":
            body["first_id"] = self.first_id
        if self.kind == "features":
            body["node"] = self.node
        if self.features is not None:
            body["features"] = self.features.tolist()
        for name in ("add", "remove"):
            value = getattr(self, name)
            if value is not None and value.size:
                body[name] = value.tolist()
        return orjson.dumps(body)

    @classmethod
    def from_payload(cls, data: bytes) -> Write:
        body = orjson.loads(data)

        def edges(name: str) -> np.ndarray:
            return np.asarray(body.get(name, [[], []]), dtype=np.int64).reshape(2, -1)

        feats = body.get("features")
        return cls(
            kind=body["kind"],
            first_id=int(body.get("first_id", -1)),
            features=None if feats is None else np.asarray(feats, dtype=np.float32),
            add=edges("add"),
            remove=edges("remove"),
            node=int(body.get("node", -1)),
        )


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
    """A dataset's graph that takes writes (see the module docstring).

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


class Staging:
    """Validates a group of writes against a graph and the group's earlier writes.

    Every method checks one write completely (ids in range, feature width, finite values, edges to
    remove present and edges to add absent, size limits) and raises :class:`WriteError` naming the
    first offender, or returns the :class:`Write` to log and apply, after which it counts for the
    next writes of the group. Nothing is applied here.
    """

    def __init__(self, graph: LiveGraph) -> None:
        self.graph = graph
        self.added_nodes = 0
        self._added: set[tuple[int, int]] = set()
        self._removed: set[tuple[int, int]] = set()

    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes + self.added_nodes

    def _present(self, edges: np.ndarray) -> list[bool]:
        """Whether every ``[2, m]`` edge is in the graph once the group's earlier writes apply
        (the graph's answer, vectorized, corrected by them)."""
        now = self.graph.edges_present(edges).tolist()
        if self._added or self._removed:
            for i, pair in enumerate(zip(edges[0].tolist(), edges[1].tolist(), strict=True)):
                if pair in self._added:
                    now[i] = True
                elif pair in self._removed:
                    now[i] = False
        return now

    def _features(self, rows: Any, what: str) -> np.ndarray:
        f = self.graph.num_features
        try:
            arr = np.asarray(rows, dtype=np.float32)
        except (TypeError, ValueError):
            raise WriteError(f"{what} must be numbers") from None
        if arr.ndim != 2 or arr.shape[1] != f:
            got = arr.shape[1] if arr.ndim == 2 else f"shape {list(arr.shape)}"
            raise WriteError(f"{what} must have {f} values per node (got {got})")
        bad = np.nonzero(~np.isfinite(arr).all(axis=1))[0]
        if bad.size:
            raise WriteError(f"{what}: row {int(bad[0])} holds NaN or infinity")
        return np.ascontiguousarray(arr)

    def _edges(self, pairs: Any, what: str, num_nodes: int, new_base: int = -1) -> np.ndarray:
        try:
            arr = np.asarray(pairs if len(pairs) else np.empty((0, 2)), dtype=np.float64)
        except (TypeError, ValueError):
            raise WriteError(f"{what} must be a list of [source, target] id pairs") from None
        if arr.ndim != 2 or arr.shape[1] != 2 or not np.all(np.isfinite(arr)):
            raise WriteError(f"{what} must be a list of [source, target] id pairs")
        if not np.all(arr == np.round(arr)):
            raise WriteError(f"{what}: node ids must be integers")
        ids = arr.astype(np.int64)
        if new_base >= 0:  # -1 is the request's first new node, -2 its second, ...
            neg = ids < 0
            ids[neg] = new_base - 1 - ids[neg]
        bad = np.nonzero(((ids < 0) | (ids >= num_nodes)).any(axis=1))[0]
        if bad.size:
            i = int(bad[0])
            raise WriteError(
                f"{what}[{i}] = {arr[i].astype(np.int64).tolist()}: node ids must lie in "
                f"[0, {num_nodes})"
                + (" or be -1 .. -k for this request's new nodes" if new_base >= 0 else "")
            )
        return ids.T.copy()  # [2, m]

    def _check_size(self, edges: int) -> None:
        if edges > self.graph.max_write_edges:
            raise WriteTooLarge(
                f"a write may change at most {self.graph.max_write_edges} edges (got {edges}); "
                f"split it"
            )

    def add_nodes(self, features: Any, edges: Any = ()) -> Write:
        """New nodes with ``features`` ``[k, F]`` and ``edges`` among them and existing nodes
        (a negative id ``-i`` is the request's ``i``-th new node)."""
        rows = self._features(features, "features")
        k = rows.shape[0]
        if k == 0:
            raise WriteError("features must hold at least one node")
        if k > self.graph.max_write_nodes:
            raise WriteTooLarge(
                f"a write may add at most {self.graph.max_write_nodes} nodes (got {k}); split it"
            )
        if self.num_nodes + k > self.graph.capacity:
            raise WriteError(
                f"the graph holds at most {self.graph.capacity} nodes ({self.num_nodes} now); "
                f"restart the server: it makes room for a quarter more nodes at start"
            )
        first = self.num_nodes
        add = self._edges(edges, "edges", first + k, new_base=first)
        self._check_size(add.shape[1])
        self._record(self._check_add(add, "edges"), set())
        self.added_nodes += k
        return Write("nodes", first_id=first, features=rows, add=add)

    def _check_add(
        self, add: np.ndarray, what: str, removed: set[tuple[int, int]] | None = None
    ) -> set[tuple[int, int]]:
        """The edges to add: each absent (or in ``removed``, by the same write) and listed once."""
        seen: set[tuple[int, int]] = set()
        present = self._present(add)
        for i, (s, t) in enumerate(zip(add[0].tolist(), add[1].tolist(), strict=True)):
            if (s, t) in seen or (present[i] and (removed is None or (s, t) not in removed)):
                raise WriteError(f"{what}[{i}] = [{s}, {t}] is already in the graph")
            seen.add((s, t))
        return seen

    def _record(self, added: set[tuple[int, int]], removed: set[tuple[int, int]]) -> None:
        """Counts a write's edges for the group's later writes."""
        self._removed.update(removed)
        self._added.difference_update(removed)
        self._added.update(added)
        self._removed.difference_update(added)

    def change_edges(self, add: Any = (), remove: Any = ()) -> Write:
        """Adds and removes edges between existing nodes (removals first, then additions)."""
        n = self.num_nodes
        gone = self._edges(remove, "remove", n)
        new = self._edges(add, "add", n)
        if not gone.size and not new.size:
            raise WriteError("a write must add or remove at least one edge")
        self._check_size(gone.shape[1] + new.shape[1])
        pairs = list(zip(gone[0].tolist(), gone[1].tolist(), strict=True))
        if len(set(pairs)) != len(pairs):
            raise WriteError("remove lists an edge twice")
        for i, present in enumerate(self._present(gone)):
            if not present:
                s, t = pairs[i]
                raise WriteError(f"remove[{i}] = [{s}, {t}] is not in the graph")
        removed = set(pairs)
        self._record(self._check_add(new, "add", removed), removed)
        return Write("edges", add=new, remove=gone)

    def set_features(self, node: int, features: Any) -> Write:
        """Replaces the feature row of an existing ``node``."""
        if not 0 <= node < self.num_nodes:
            raise WriteError(f"node {node} is not in the graph (ids lie in [0, {self.num_nodes}))")
        row = self._features([features] if np.ndim(features) == 1 else features, "features")
        if row.shape[0] != 1:
            raise WriteError("features must be one row of values")
        return Write("features", features=row, node=node)


class WriteLog:
    """The append-only log of a live graph's writes (see the module docstring).

    Args:
        path (Path): the log file (created if missing).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("ab")

    def close(self) -> None:
        self._file.close()

    def append(self, records: Sequence[tuple[int, bytes]]) -> None:
        """Writes ``(version, payload)`` records and fsyncs once (group commit): when this
        returns, every record survives a crash."""
        chunks = []
        for version, payload in records:
            chunks.append(_HEADER.pack(len(payload), zlib.crc32(payload), version))
            chunks.append(payload)
        self._file.write(b"".join(chunks))
        self._file.flush()
        os.fsync(self._file.fileno())

    @staticmethod
    def read(path: Path) -> Iterator[tuple[int, bytes, int]]:
        """``(version, payload, end offset)`` of every whole record; stops at a torn tail (the
        last record, cut short or failing its checksum: a write a crash interrupted, never
        acknowledged).

        Raises:
            ArtifactError: a record fails its checksum and more follow it: acknowledged writes
                lie beyond a damaged one, so nothing is cut off; the message says where.
        """
        if not path.exists():
            return
        data = path.read_bytes()
        pos = 0
        while pos + _HEADER.size <= len(data):
            length, crc, version = _HEADER.unpack_from(data, pos)
            start, end = pos + _HEADER.size, pos + _HEADER.size + length
            if end > len(data):
                return  # torn: the crash came before the whole record reached the disk
            if zlib.crc32(data[start:end]) != crc:
                if end == len(data):
                    return  # torn: the last record's bytes did not all reach the disk
                raise ArtifactError(
                    f"write log {path} is damaged at byte {pos} of {len(data)} (a record fails "
                    f"its checksum and {len(data) - end} bytes of records follow it); restore "
                    f"the file from a backup, or cut it at byte {pos} to drop every write "
                    f"from there on"
                )
            yield version, data[start:end], end
            pos = end

    @staticmethod
    def truncate(path: Path, size: int) -> None:
        """Cuts a torn tail off the log (durably)."""
        with path.open("r+b") as f:
            f.truncate(size)
            f.flush()
            os.fsync(f.fileno())


@contextlib.contextmanager
def _held(folder: Path) -> Iterator[Any]:
    folder.mkdir(parents=True, exist_ok=True)
    handle = (folder / "lock").open("a")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"{folder} is in use by another gnnaas process (a running server, or a "
                f"compaction); stop it first"
            ) from None
        yield handle
    finally:
        handle.close()


def _load_base(folder: Path, store: Any) -> tuple[Tensor, Tensor, Tensor, int]:
    snapshot = folder / "snapshot.safetensors"
    if not snapshot.exists():
        return store.rowptr, store.col, store.x, 0
    from safetensors import safe_open

    try:
        with safe_open(str(snapshot), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in ("rowptr", "col", "x")}
    except Exception as exc:
        raise ArtifactError(f"live graph snapshot {snapshot} cannot be read ({exc})") from exc
    if int(tensors["x"].size(1)) != int(store.num_features):
        raise ArtifactError(
            f"live graph snapshot {snapshot} has {tensors['x'].size(1)} features, the dataset "
            f"{store.num_features}"
        )
    return tensors["rowptr"], tensors["col"], tensors["x"], int(meta.get("version", "0"))


def _last_end(path: Path) -> int:
    """End offset of the last whole record of the log (0 for none)."""
    return max((end for _, _, end in WriteLog.read(path)), default=0)


def open_live(
    store: Any, state_dir: Path | str, *, extra_capacity: int | None = None
) -> tuple[LiveGraph, WriteLog, Any]:
    """The live graph of ``store`` under ``state_dir``: its newest snapshot (else the dataset)
    with the log replayed, the log open for appends, and the held lock (close it to release).

    Args:
        store (GraphStore): the dataset as loaded (its base when no snapshot exists).
        state_dir (Path | str): the server's ``--state-dir``.
        extra_capacity (int, optional): room for new nodes beyond the current count; by default
            a quarter of it, at least 1,024. (default: ``None``)

    Raises:
        ConfigError: another process holds the dataset's state.
        ArtifactError: the snapshot cannot be read or the log does not fit it.
    """
    folder = state_folder(state_dir, store.name)
    lock = _held(folder)
    handle = lock.__enter__()
    try:
        rowptr, col, x, version = _load_base(folder, store)
        path = folder / "log.wal"
        records = [
            (v, Write.from_payload(payload), end)
            for v, payload, end in WriteLog.read(path)
            if v > version  # older ones are in the snapshot (a crash before the log was reset)
        ]
        new_nodes = sum(w.features.shape[0] for _, w, _ in records if w.kind == "nodes")  # type: ignore[union-attr]
        n = rowptr.numel() - 1 + new_nodes
        room = extra_capacity if extra_capacity is not None else max(1024, n // 4)
        graph = LiveGraph(rowptr, col, x, capacity=n + room, version=version)
        for v, write, _ in records:
            graph.apply(write)
            if graph.version != v:
                raise ArtifactError(f"live graph log {path}: record of version {v} out of order")
        valid = max((end for _, _, end in records), default=0)
        valid = max(valid, _last_end(path))
        if path.exists() and path.stat().st_size > valid:
            _log.warning(
                "%s: cut a torn last record (%d bytes) off %s: a crash while it was written, "
                "so it was never acknowledged",
                store.name,
                path.stat().st_size - valid,
                path,
            )
            WriteLog.truncate(path, valid)  # a torn last record: never acknowledged
        name, replayed = store.name, len(records)
        _log.info("%s: replayed %d log records (graph version %d)", name, replayed, graph.version)
        return graph, WriteLog(path), lock
    except BaseException:
        lock.__exit__(None, None, None)
        raise
    finally:
        del handle


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def compact(store: Any, state_dir: Path | str) -> dict[str, Any]:
    """Folds a dataset's log into a new snapshot, atomically (the server must be stopped).

    The snapshot is written to a temporary file, fsynced and renamed over the old one; then the
    log is replaced by an empty one. A crash between the two leaves records the snapshot already
    holds, which replay skips by version.

    Returns:
        dict: ``version``, ``num_nodes``, ``num_edges``, ``records`` folded.
    """
    from safetensors.torch import save_file

    graph, log, lock = open_live(store, state_dir)
    try:
        folder = state_folder(state_dir, store.name)
        records = sum(1 for _ in WriteLog.read(log.path))
        rowptr, col = graph.merged_csr()
        n = graph.num_nodes
        tmp = folder / "snapshot.safetensors.tmp"
        save_file(
            {
                "rowptr": rowptr.contiguous(),
                "col": col.contiguous(),
                "x": graph.features()[:n].clone(),
            },
            str(tmp),
            metadata={"version": str(graph.version), "dataset": store.name},
        )
        os.chmod(tmp, new_file_mode())  # safetensors writes 0600
        with tmp.open("rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, folder / "snapshot.safetensors")
        _fsync_dir(folder)  # the new snapshot is durable before the log it replaces goes
        log.close()
        empty = folder / "log.wal.tmp"
        empty.write_bytes(b"")
        os.replace(empty, folder / "log.wal")
        _fsync_dir(folder)
        return {
            "version": graph.version,
            "num_nodes": n,
            "num_edges": int(col.numel()),
            "records": records,
        }
    finally:
        log.close()
        lock.__exit__(None, None, None)


def read_live(store: Any, state_dir: Path | str) -> LiveGraph:
    """The live graph of ``store`` as its state folder holds it now, read only: the newest
    snapshot (else the dataset) with the log's whole records replayed, without taking the lock or
    touching a file, so that it can run beside the server that writes it (``gnnaas infer``,
    ``gnnaas precompute``). A record being written meanwhile fails its checksum and is left out.

    Raises:
        ArtifactError: the snapshot cannot be read or the log does not fit it.
    """
    folder = state_folder(state_dir, store.name)
    rowptr, col, x, version = _load_base(folder, store)
    path = folder / "log.wal"
    records = [
        (v, Write.from_payload(payload)) for v, payload, _ in WriteLog.read(path) if v > version
    ]
    new_nodes = sum(w.features.shape[0] for _, w in records if w.kind == "nodes")  # type: ignore[union-attr]
    graph = LiveGraph(rowptr, col, x, capacity=rowptr.numel() - 1 + new_nodes, version=version)
    for v, write in records:
        graph.apply(write)
        if graph.version != v:
            raise ArtifactError(f"live graph log {path}: record of version {v} out of order")
    return graph


def live_store(store: Any, state_dir: Path | str) -> tuple[Any, int]:
    """The dataset as its live graph under ``state_dir`` holds it now, as a ``GraphStore``, and
    the graph's version (read only, as :func:`read_live`): what ``gnnaas profile --state-dir``
    measures, so that a precomputed variant's answers (one row per node of the live graph) and
    the trained variants are profiled on the graph the server serves. New nodes have no label
    (0; no class when multi-label) and are in no split: accuracy stays measured on the dataset's
    validation and test nodes, with the neighborhoods they have now.

    Raises:
        ArtifactError: the snapshot cannot be read or the log does not fit it.
    """
    from gnnaas.data.store import GraphStore

    graph = read_live(store, state_dir)
    rowptr, col = graph.merged_csr()
    n = graph.num_nodes
    y = store.y
    if n > y.size(0):  # [N + new] with zero rows for the new nodes
        y = torch.cat([y, y.new_zeros((n - y.size(0), *y.shape[1:]))])
    current = GraphStore(
        name=store.name,
        rowptr=rowptr,
        col=col,
        x=graph.features()[:n],
        y=y,
        num_classes=store.num_classes,
        multi_label=store.multi_label,
        train_idx=store.train_idx,
        val_idx=store.val_idx,
        test_idx=store.test_idx,
        informative=store.informative,
        source=store.source,
    )
    return current, graph.version


def writes_since(store: Any, state_dir: Path | str, version: int) -> list[Write] | None:
    """The writes of the log after ``version``, in order; ``None`` when they are not all there
    (a compaction since folded some into the snapshot)."""
    folder = state_folder(state_dir, store.name)
    snapshot = folder / "snapshot.safetensors"
    if snapshot.exists() and _load_base(folder, store)[3] > version:
        return None
    return [
        Write.from_payload(payload)
        for v, payload, _ in WriteLog.read(folder / "log.wal")
        if v > version
    ]


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
