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
:func:`open_live` loads the newest snapshot (or the dataset) and replays the log; a torn last
record (a crash during its write, never acknowledged) is cut off.

Edges are ``[source, target]``: ``source`` becomes an in-neighbor of ``target`` (messages flow
source → target). The built-in graphs are symmetric; send both directions for an undirected edge.

Files under ``<state-dir>/<dataset>/``: ``snapshot.safetensors`` (after a compaction),
``log.wal``, and ``lock`` (held by the process that owns the graph).

The code is one module per part, each importing only those before it:
:mod:`~gnnaas.data.live.writes` (the :class:`Write` record, :class:`Staging`, the write errors),
:mod:`~gnnaas.data.live.graph` (:class:`LiveGraph`, in memory), :mod:`~gnnaas.data.live.wal` (the
log, the lock, opening and replaying: :func:`open_live`, :func:`read_live`, :func:`live_store`,
:func:`writes_since`), :mod:`~gnnaas.data.live.compaction` (:func:`compact`) and
:mod:`~gnnaas.data.live.staleness` (:class:`Staleness`). Every name is importable from here.

Example:
    >>> graph = LiveGraph(rowptr, col, x, capacity=x.size(0) + 1000)  # doctest: +SKIP
    >>> staging = graph.stage()  # doctest: +SKIP
    >>> op = staging.change_edges(add=[[0, 5]])  # doctest: +SKIP
    >>> graph.apply(op)  # doctest: +SKIP
"""

from gnnaas.data.live.compaction import compact
from gnnaas.data.live.graph import LiveGraph, Prepared
from gnnaas.data.live.staleness import Staleness
from gnnaas.data.live.wal import (
    WriteLog,
    live_store,
    open_live,
    read_live,
    state_folder,
    writes_since,
)
from gnnaas.data.live.writes import Staging, Write, WriteError, WriteTooLarge

__all__ = [
    "LiveGraph",
    "Prepared",
    "Staging",
    "Staleness",
    "Write",
    "WriteError",
    "WriteLog",
    "WriteTooLarge",
    "compact",
    "live_store",
    "open_live",
    "read_live",
    "state_folder",
    "writes_since",
]
