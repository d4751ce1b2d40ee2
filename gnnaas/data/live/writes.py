"""The writes a live graph takes: the :class:`Write` record and the :class:`Staging` validator.

Every write a client sends becomes one :class:`Write` once :class:`Staging` has checked it against
the graph and the earlier writes of its group; that record is what the write-ahead log stores (its
orjson :meth:`Write.payload`, :mod:`gnnaas.data.live.wal`) and what
:meth:`~gnnaas.data.live.graph.LiveGraph.prepare` applies. Kept apart from the graph so that what a
write may say, and why one is refused (:class:`WriteError`, HTTP 422; :class:`WriteTooLarge`, 413),
reads in one place, and the graph module holds only the in-memory structure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from gnnaas.errors import ConfigError

if TYPE_CHECKING:
    from gnnaas.data.live.graph import LiveGraph

__all__ = ["Staging", "Write", "WriteError", "WriteTooLarge"]


class WriteError(ConfigError):
    """A write that cannot be applied as sent; nothing of it was applied (HTTP 422)."""


class WriteTooLarge(WriteError):
    """A write over the per-write limits of nodes or edges (HTTP 413)."""


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
