"""Serving a live graph: the open state of each dataset and the group-commit writer.

:class:`LiveState` is one dataset's :class:`~gnnaas.data.live.LiveGraph` with its open write log
and the lock on its state folder; a process opens each at most once (a reload reuses it).
:class:`LiveWriter` turns write requests into durable, visible writes:

1. requests queue up while the previous group commits; the committer takes them all as one group;
2. in a worker thread (the graph is only read there), each is validated against the graph plus the
   group's earlier writes (:class:`Staging`; a bad one fails alone with its
   :class:`~gnnaas.data.live.WriteError` and is never logged), the valid ones are appended to the
   log and fsynced once (group commit), and their effect is prepared
   (:meth:`~gnnaas.data.live.LiveGraph.prepare`: the new adjacency lists);
3. the group is committed under the router's exclusive gate, between batches, in a few array
   operations, so every forward pass reads one version of the graph;
4. only then are the writers answered, with the version their write produced: an acknowledged
   write is on disk and visible to the next prediction (read-your-writes).

A log that cannot be written stops all writes (503) until a restart replays what is on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from gnnaas.data.live import (
    LiveGraph,
    Prepared,
    Staging,
    Staleness,
    Write,
    WriteLog,
    open_live,
)
from gnnaas.errors import OverloadedError

__all__ = ["LiveState", "LiveWriter"]

_log = logging.getLogger(__name__)

_MAX_GROUP = 512  # writes per commit group
Exclusive = Callable[[], contextlib.AbstractAsyncContextManager[None]]


@dataclass(eq=False)
class LiveState:
    """One dataset's live graph, its log and the lock on its state folder."""

    graph: LiveGraph
    log: WriteLog
    lock: Any
    key: tuple[str, str] = ("", "")
    writer: LiveWriter | None = field(default=None, repr=False)
    # Staleness of the precomputed variants served from this graph (a reload's new ones join
    # beside the old ones, which go with their registry).
    trackers: weakref.WeakSet[Staleness] = field(default_factory=weakref.WeakSet, repr=False)

    # The live states this process has open, by (state dir, dataset).
    _OPEN: ClassVar[dict[tuple[str, str], LiveState]] = {}

    @classmethod
    def open(cls, store: Any, state_dir: Path | str) -> LiveState:
        """The live state of ``store`` under ``state_dir``, opened (and replayed) once per
        process.

        Raises:
            ConfigError: another process holds it.
            ArtifactError: its snapshot or log cannot be used.
        """
        key = (str(Path(state_dir).resolve()), store.name)
        state = cls._OPEN.get(key)
        if state is None:
            graph, log, lock = open_live(store, state_dir)
            state = cls(graph, log, lock, key)
            cls._OPEN[key] = state
            _log.info(
                "dataset %s: live graph at version %d (%d nodes)",
                store.name,
                graph.version,
                graph.num_nodes,
            )
        return state

    @classmethod
    def is_open(cls, store_name: str, state_dir: Path | str) -> bool:
        """Whether this process holds the live state of ``store_name`` under ``state_dir``."""
        return (str(Path(state_dir).resolve()), store_name) in cls._OPEN

    def close(self) -> None:
        """Closes the log and releases the lock (after the last write)."""
        if self._OPEN.get(self.key) is self:
            del self._OPEN[self.key]
        self.log.close()
        self.lock.__exit__(None, None, None)

    def writer_for(self, exclusive: Exclusive, retry_after_s: int) -> LiveWriter:
        """The dataset's writer (one per state), applying under ``exclusive``."""
        if self.writer is None:
            self.writer = LiveWriter(self, exclusive, retry_after_s)
        return self.writer


class LiveWriter:
    """Validates, logs (group commit) and applies writes to one live graph (module docstring).

    Args:
        state (LiveState): the graph and its log.
        exclusive (Callable): an async context manager factory under which no batch runs.
        retry_after_s (int): ``Retry-After`` of the 503 once the log has failed.
    """

    def __init__(self, state: LiveState, exclusive: Exclusive, retry_after_s: int = 1) -> None:
        self.state = state
        self.exclusive = exclusive
        self.retry_after_s = retry_after_s
        self._pending: list[tuple[Callable[[Staging], Write], asyncio.Future[Any]]] = []
        self._task: asyncio.Task[None] | None = None
        self._broken: str | None = None
        self.groups = 0  # commit groups (fsyncs), read by tests and benchmarks

    async def submit(self, build: Callable[[Staging], Write]) -> tuple[Write, int]:
        """Queues one write (``build`` validates it against a :class:`Staging`) and waits until
        it is durable and applied.

        Returns:
            tuple[Write, int]: the write as applied and the graph version it produced.

        Raises:
            WriteError: the write is invalid (nothing of it was applied).
            OverloadedError: the log failed earlier; writes are refused until a restart.
        """
        if self._broken is not None:
            raise OverloadedError(self._broken, self.retry_after_s)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((build, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._commit_loop())
        return await asyncio.shield(future)  # a client that leaves does not cancel its write

    async def _commit_loop(self) -> None:
        while self._pending:
            group, self._pending = self._pending[:_MAX_GROUP], self._pending[_MAX_GROUP:]
            try:
                # Validation, the new adjacency lists and the fsync run off the event loop: they
                # only read the graph (this loop is its one writer), so batches go on meanwhile.
                outcomes, prepared = await asyncio.to_thread(
                    self._stage_and_persist, [build for build, _ in group]
                )
            except Exception as exc:  # the disk, or a bug: what is on disk is unknown now
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else repr(exc)
                self._fail(group, f"the write log cannot be written ({why})")
                return
            if prepared is not None:
                try:
                    async with self.exclusive():  # a few array operations, between batches
                        self.state.graph.commit(prepared)
                        # before any batch reads the new graph: precomputed answers it changed
                        # are stale from now on
                        writes = [o[0] for o in outcomes if not isinstance(o, BaseException)]
                        for tracker in list(self.state.trackers):
                            tracker.mark(writes)
                except BaseException as exc:  # the group is logged but not applied: stop here
                    self._fail(group, f"a logged write could not be applied ({exc!r})")
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    return
                self.groups += 1
            for (_, future), outcome in zip(group, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)

    def _fail(self, group: list[tuple[Any, asyncio.Future[Any]]], why: str) -> None:
        """Stops taking writes (the log and the graph may disagree now; a restart replays the
        log): this group's and the queued writers get 503, their outcome unknown."""
        self._broken = (
            f"{why}; writes are refused until the server restarts, and this write's outcome is "
            f"unknown until then (the restart replays what reached the log)"
        )
        _log.error("live graph %s: %s", self.state.key[1], self._broken)
        for _, future in [*group, *self._pending]:
            if not future.done():
                future.set_exception(OverloadedError(self._broken, self.retry_after_s))
        self._pending = []

    def _stage_and_persist(
        self, builds: list[Callable[[Staging], Write]]
    ) -> tuple[list[Any], Prepared | None]:
        """Validates a group, logs the valid writes (one fsync) and prepares their commit.

        Returns:
            tuple: per write its ``(write, version)`` or its exception, and the prepared group
            (``None`` when no write was valid).
        """
        graph = self.state.graph
        staging = graph.stage()
        outcomes: list[Any] = []
        accepted: list[Write] = []
        for build in builds:
            try:
                write = build(staging)
            except Exception as exc:  # WriteError, or a bug: that write fails alone
                outcomes.append(exc)
                continue
            accepted.append(write)
            outcomes.append((write, graph.version + len(accepted)))
        if not accepted:
            return outcomes, None
        first = graph.version + 1
        records = [(first + i, w.payload()) for i, w in enumerate(accepted)]
        prepared = graph.prepare(accepted)  # before the log: a write that cannot apply is not kept
        self.state.log.append(records)
        return outcomes, prepared

    async def drain(self) -> None:
        """Waits for the writes already queued (shutdown)."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)


@contextlib.asynccontextmanager
async def all_permits(gate: asyncio.Semaphore, permits: int) -> AsyncIterator[None]:
    """Holds every permit of ``gate``: no batch runs meanwhile."""
    taken = 0
    try:
        for _ in range(permits):
            await gate.acquire()
            taken += 1
        yield
    finally:
        for _ in range(taken):
            gate.release()
