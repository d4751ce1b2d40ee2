"""Dynamic batching: concurrent requests for one variant merge into one forward pass.

One :class:`Batcher` per variant. What the next batch holds is decided by a pure step,
:meth:`~gnnaas.serving.core.planner.BatchPlanner.plan` (the rules are in
:mod:`gnnaas.serving.core.planner`); the batcher only drives it on the event loop: at each
wake-up it reads the time on its :class:`~gnnaas.serving.core.clock.Clock` and does what the plan
says. The first request of a batch waits for others until the batch holds ``max_batch_size``
nodes or ``max_wait_s`` has passed since it was queued. Only then does the batcher ask for the
device ``gate`` shared with the other variants' batchers, so a batch that waits for batch-mates
never keeps another variant's full batch off the device. While it waits for the gate, requests
that arrive still join it (up to ``max_batch_size``, without waiting any longer); then it runs the
blocking handler in a worker thread and fans the results back to the callers' futures. One batch
per variant is in flight at a time, so requests that arrive while a batch runs wait and merge into
the next one; with ``max_wait_s=0`` batching adds no latency when the variant is idle.

The queue is bounded in nodes: a request that does not fit raises
:class:`~gnnaas.errors.OverloadedError` at once. Callers that give up (cancelled futures) are
skipped, a handler error reaches every caller of its batch, and :meth:`Batcher.stop` drains what
was accepted.

**Priorities.** A request is ``high``, ``normal`` or ``low`` (:data:`PRIORITIES`). A batch takes
higher priorities first, each in arrival order; a request that has waited longer than
``aging_s`` competes as ``high``, so when the server is not overloaded no request waits much
longer than that (aging bounds the wait). Under overload the lower priorities shed first: low
requests may fill only half of the queue (:data:`QUEUE_SHARES`), and a request that finds no room
makes room by evicting queued requests of lower priorities, low ones first, newest first (they get
:class:`~gnnaas.errors.OverloadedError`): low sheds first, then normal, and high keeps its place.

**Deadlines.** A request may carry an absolute deadline (on the batcher's clock). It is never
computed after it: one whose deadline has passed when its batch forms is dropped before compute
with :class:`~gnnaas.errors.DeadlineExceeded`, and the batch runs without it. With
``predict_s`` (the predicted batch time) a formed batch is fitted to its deadlines by priority
(:func:`~gnnaas.serving.core.deadlines.fit_batch`); a member left out goes back to the head of
its queue for the next batch.

**Time.** Every time the batcher reads (a request's queueing, aging, deadlines, a batch's start
and its measured duration, the handler's own time) and every wait it makes (for batch-mates, for
the drain in :meth:`Batcher.stop`) is on its one ``clock``: a server's is ``time.monotonic()``; a
test's is a :class:`~gnnaas.serving.core.clock.FakeClock`, whose handler "takes" the time it
advances the clock by.

Example:
    >>> async def main() -> list[int]:
    ...     batcher = Batcher(lambda items: [sum(i) for i in items], name="demo")
    ...     out = await batcher.submit([1, 2], size=2)
    ...     await batcher.stop()
    ...     return out.value
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from gnnaas.errors import DeadlineExceeded, OverloadedError
from gnnaas.serving.core.clock import MONOTONIC, Clock
from gnnaas.serving.core.looplag import ComputeTime
from gnnaas.serving.core.planner import BatchPlanner
from gnnaas.serving.core.queues import AGING_S, PRIORITIES, QUEUE_SHARES, RANK

__all__ = ["PRIORITIES", "QUEUE_SHARES", "BatchStats", "Batched", "Batcher"]

_log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Batched(Generic[R]):
    """What :meth:`Batcher.submit` returns.

    Args:
        value (R): the handler's result for this request.
        queue_s (float): time from enqueue to the start of its batch.
        batch_size (int): nodes in the batch that served it.
        batch_requests (int): requests in that batch.
    """

    value: R
    queue_s: float
    batch_size: int
    batch_requests: int


@dataclass(frozen=True)
class BatchStats:
    """One executed batch, passed to the ``on_batch`` callback.

    Args:
        batch_size (int): nodes in the batch.
        num_requests (int): requests merged into it.
        duration_s (float): time of the batch on the event loop (thread hand-off included), on
            the batcher's clock.
        error (BaseException | None): what the handler raised, if anything.
        handler_s (float, optional): time of the handler call itself, on the batcher's clock,
            measured in the thread that runs it: the work the profiled service curve predicts.
            (default: ``nan``)
    """

    batch_size: int
    num_requests: int
    duration_s: float
    error: BaseException | None = None
    handler_s: float = math.nan


@dataclass(eq=False)
class _Pending(Generic[T, R]):
    item: T
    size: int
    future: asyncio.Future[Batched[R]]
    enqueued_at: float  # on the batcher's clock: the queue time, aging, the wait for batch-mates
    rank: int = 1  # index in PRIORITIES
    expires: float | None = None  # on the batcher's clock: never computed after it

    @property
    def gone(self) -> bool:
        """Its caller gave up (or it was answered: evicted, expired)."""
        return self.future.done()


class Batcher(Generic[T, R]):
    """Merges concurrent requests into batches for a blocking handler.

    Args:
        handler (Callable[[list[T]], Sequence[R]]): blocking function that serves a batch of items
            and returns one result per item, in order. Runs in a worker thread.
        name (str, optional): used in logs and thread names. (default: ``"batcher"``)
        max_batch_size (int, optional): most nodes per batch; a single larger request runs alone.
            (default: ``1024``)
        max_wait_s (float, optional): how long the first request of a batch waits for others.
            (default: ``0.0``)
        max_queue_size (int, optional): most nodes waiting; beyond it :meth:`submit` raises
            :class:`OverloadedError`. (default: ``16384``)
        executor (concurrent.futures.Executor, optional): where the handler runs; by default a
            private single-thread pool, shut down by :meth:`stop`. (default: ``None``)
        on_batch (Callable[[BatchStats], None], optional): called on the event loop after each
            batch (metrics, load tracking). (default: ``None``)
        retry_after_s (float, optional): hint carried by :class:`OverloadedError`.
            (default: ``1.0``)
        gate (asyncio.Semaphore, optional): shared by the batchers of one device so that at most
            its value of batches run at once. The gate is taken only after the batch has
            waited its ``max_wait_s`` (or is full), and requests arriving while it waits for the
            gate still merge into it. (default: ``None``: no limit beyond one batch per batcher)
        inline_max_size (int, optional): batches of at most this many nodes run on the event
            loop's own thread instead of the worker thread: no hand-off between threads for the
            small batches that cost less than the hand-off saves; the loop waits for them, so keep
            it to batches that take well under a millisecond. (default: ``0``: none)
        aging_s (float, optional): a request waiting longer than this competes as ``high``.
            (default: ``0.1``)
        predict_s (Callable[[int], float], optional): the predicted time (s) of a batch of that
            many nodes: a batch is fitted to its deadlines with it (module docstring).
            (default: ``None``: only passed deadlines are dropped)
        clock (Clock, optional): what every time read and every wait is on (module docstring);
            ``expires`` of :meth:`submit` and :attr:`in_flight_since` are on it.
            (default: :data:`~gnnaas.serving.core.clock.MONOTONIC`)
        on_busy (Callable[[bool], None], optional): called on the event loop each time
            :attr:`busy` changes, with its new value: when a request arrives at an idle batcher,
            and when the last batch ends with nothing left waiting (the router keeps the
            device's lanes with work this way, without polling every lane). (default: ``None``)
        computing (ComputeTime, optional): told when each batch's handler starts and ends, on
            :attr:`clock`, from the thread it runs on (the event loop's lag beyond computing
            reads it: :mod:`.looplag`). (default: ``None``)
    """

    def __init__(
        self,
        handler: Callable[[list[T]], Sequence[R]],
        *,
        name: str = "batcher",
        max_batch_size: int = 1024,
        max_wait_s: float = 0.0,
        max_queue_size: int = 16384,
        executor: concurrent.futures.Executor | None = None,
        on_batch: Callable[[BatchStats], None] | None = None,
        retry_after_s: float = 1.0,
        gate: asyncio.Semaphore | None = None,
        inline_max_size: int = 0,
        aging_s: float = AGING_S,
        predict_s: Callable[[int], float] | None = None,
        clock: Clock = MONOTONIC,
        on_busy: Callable[[bool], None] | None = None,
        computing: ComputeTime | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"Batcher max_batch_size must be >= 1 (got {max_batch_size})")
        if max_wait_s < 0:
            raise ValueError(f"Batcher max_wait_s must be >= 0 (got {max_wait_s})")
        if max_queue_size < 1:
            raise ValueError(f"Batcher max_queue_size must be >= 1 (got {max_queue_size})")
        if not aging_s >= 0:
            raise ValueError(f"Batcher aging_s must be >= 0 (got {aging_s})")
        self.name = name
        self.max_queue_size = max_queue_size
        self.retry_after_s = retry_after_s
        self.inline_max_size = inline_max_size
        self.clock = clock
        self._handler = handler
        self._on_batch = on_batch
        self._gate = gate
        self._computing = computing
        self._own_executor = executor is None
        self._executor = executor or concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"gnnaas-{name}"
        )
        self._planner: BatchPlanner[_Pending[T, R]] = BatchPlanner(
            max_batch_size=max_batch_size,
            max_wait_s=max_wait_s,
            max_queue_size=max_queue_size,
            aging_s=aging_s,
            predict_s=predict_s,
        )
        self._queues = self._planner.queues
        self._ready = asyncio.Event()  # set when an entry (or the stop) arrives
        self._stop_requested = False
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._in_flight_nodes = 0
        self._in_flight_since: float | None = None
        self._on_busy = on_busy
        self._published = False  # the last value given to on_busy

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.name!r}, max_batch_size={self.max_batch_size}, "
            f"max_wait_s={self.max_wait_s}, max_queue_size={self.max_queue_size})"
        )

    @property
    def max_batch_size(self) -> int:
        """Most nodes per batch."""
        return self._planner.max_batch_size

    @property
    def max_wait_s(self) -> float:
        """How long the first request of a batch waits for others."""
        return self._planner.max_wait_s

    @property
    def aging_s(self) -> float:
        """How long a request waits before it competes as ``high``."""
        return self._planner.aging_s

    # -- load, read by the router's load snapshot ------------------------------------------------

    @property
    def queued_nodes(self) -> int:
        """Nodes accepted and not yet in a running batch."""
        return self._queues.nodes

    @property
    def queued_requests(self) -> int:
        """Requests accepted and not yet in a running batch."""
        return self._queues.requests

    def queued_ahead(self, priority: str = "low") -> int:
        """Queued nodes a new request of ``priority`` would wait behind: those of its priority
        and of higher ones (all of them for ``low``)."""
        return self._queues.ahead(priority)

    @property
    def in_flight_nodes(self) -> int:
        """Nodes in the batch that is running now (0 when idle)."""
        return self._in_flight_nodes

    @property
    def in_flight_since(self) -> float | None:
        """When the running batch started (on :attr:`clock`), ``None`` when idle."""
        return self._in_flight_since

    @property
    def busy(self) -> bool:
        """Whether a batch runs or a request waits."""
        return self._in_flight_since is not None or self._queues.requests > 0

    def _publish(self) -> None:
        """Tells ``on_busy`` when :attr:`busy` changed since it was last told (called after
        each change of the queues or the running batch, with no ``await`` in between)."""
        busy = self.busy
        if busy != self._published and self._on_busy is not None:
            self._published = busy
            self._on_busy(busy)

    @property
    def room_nodes(self) -> int:
        """How many more ``normal`` nodes :meth:`submit` accepts now (any number while nothing
        waits)."""
        return self.room_for("normal")

    def room_for(self, priority: str) -> int:
        """How many more nodes of ``priority`` :meth:`submit` accepts now without evicting: up
        to its share of the queue (:data:`QUEUE_SHARES`); any number while nothing waits."""
        return 0 if self._closed else self._queues.room(priority)

    def room_with_eviction(self, priority: str = "normal") -> int:
        """How many nodes of ``priority`` :meth:`submit` accepts now, evicting lower priorities
        if it has to."""
        room = self.room_for(priority)
        if room == sys.maxsize or self._closed or priority == "low":
            return room
        return room + self._queues.evictable(priority)

    def has_room(self, size: int, priority: str = "normal") -> bool:
        """Whether :meth:`submit` would accept ``size`` more nodes of ``priority`` now, evicting
        lower priorities if it has to."""
        if size <= self.room_for(priority):
            return True
        queues = self._queues
        if queues.nodes == 0 or self._closed:
            return False
        return queues.nodes - queues.evictable(priority) + size <= queues.cap(RANK[priority])

    @property
    def closed(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._closed

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Starts the loop task on the running event loop (idempotent)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"gnnaas-batcher-{self.name}"
            )

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Refuses new requests, serves those accepted, then stops (bounded by ``timeout_s`` on
        :attr:`clock`).

        Requests still waiting after ``timeout_s`` fail with :class:`OverloadedError`.
        """
        if self._closed:
            return
        self._closed = True
        try:
            if self._task is not None:
                self._stop_requested = True
                self._ready.set()
                try:
                    async with self.clock.timeout(timeout_s):
                        await asyncio.shield(self._task)
                except TimeoutError:
                    _log.warning("batcher %s: drain timed out after %.1f s", self.name, timeout_s)
                    self._task.cancel()
                    await asyncio.gather(self._task, return_exceptions=True)
            self._fail_waiting(
                OverloadedError(f"variant {self.name} is shutting down", cause="stopping")
            )
        finally:
            if self._own_executor:
                self._executor.shutdown(wait=False, cancel_futures=True)

    # -- requests --------------------------------------------------------------------------------

    async def submit(
        self,
        item: T,
        size: int,
        *,
        priority: str = "normal",
        expires: float | None = None,
    ) -> Batched[R]:
        """Queues ``item`` (``size`` nodes) and waits for its result.

        Args:
            item (T): what the handler serves.
            size (int): its nodes.
            priority (str, optional): one of :data:`PRIORITIES`. (default: ``"normal"``)
            expires (float, optional): the time (on :attr:`clock`) after which it must not be
                computed. (default: ``None``: no deadline)

        Raises:
            OverloadedError: the queue cannot take ``size`` more nodes of ``priority`` (nor by
                evicting lower priorities), or the batcher is stopping.
            DeadlineExceeded: its deadline passed (or its batch would pass it) before it ran.
        """
        # A caller that is cancelled cancels the future; the batch then skips it.
        return await self.enqueue(item, size, priority=priority, expires=expires)

    def enqueue(
        self,
        item: T,
        size: int,
        *,
        priority: str = "normal",
        expires: float | None = None,
    ) -> asyncio.Future[Batched[R]]:
        """:meth:`submit` without the wait: queues ``item`` now (on the event loop's thread) and
        returns the future of its result; cancelling the future withdraws the request.

        Raises:
            OverloadedError: as :meth:`submit`, at once.
        """
        if self._closed:
            raise OverloadedError(
                f"variant {self.name} is shutting down; retry on another instance",
                self.retry_after_s,
                cause="stopping",
            )
        rank = RANK[priority]
        if size > self.room_for(priority):
            if not self.has_room(size, priority):
                cap = self._queues.cap(rank)
                limit = (
                    f"limit {cap}"
                    if cap == self.max_queue_size
                    else f"{priority}-priority requests may fill {cap} of {self.max_queue_size}"
                )
                raise OverloadedError(
                    f"queue of variant {self.name} is full ({self.queued_nodes} nodes waiting, "
                    f"{limit}); retry later",
                    self.retry_after_s,
                )
            self._evict_below(rank, size)
        self.start()
        future: asyncio.Future[Batched[R]] = asyncio.get_running_loop().create_future()
        self._planner.push(_Pending(item, size, future, self.clock.now(), rank, expires))
        self._publish()
        self._ready.set()
        return future

    def _evict_below(self, rank: int, size: int) -> None:
        """Sheds queued requests of lower priority than ``rank``, newest first, until ``size``
        nodes of ``rank`` fit its share of the queue."""
        for victim in self._queues.evict_for(rank, size):
            if not victim.future.done():
                victim.future.set_exception(
                    OverloadedError(
                        f"variant {self.name} is overloaded: this {PRIORITIES[victim.rank]}-"
                        "priority request was shed for higher-priority traffic; retry later",
                        self.retry_after_s,
                        cause="evicted",
                    )
                )

    # -- the loop: drives the planner's step -----------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        planner, clock = self._planner, self.clock
        now = clock.now()
        while True:
            plan = planner.plan(now, stopping=self._stop_requested)
            self._fail_expired(plan.expired, now)
            self._publish()  # idle again once the last batch ran and nothing waits
            if not plan.ready:
                if plan.idle and self._stop_requested:
                    return  # after a stop, what a fitted batch put back was still served
                until = plan.wait_until
                timed_out = await self._wait(until)
                now = clock.now()
                if timed_out and until is not None and now < until:
                    # The event loop's timer fired a little before the clock reads `until`
                    # (uvloop's count whole milliseconds): its firing is the clock's word that
                    # the time has come, or the step would only ask to wait a moment more.
                    now = until
                continue
            # The batch waited for batch-mates without the gate: another variant's batch may
            # have run meanwhile. What arrived while the gate was busy joins now.
            async with self._gate or contextlib.nullcontext():
                now = clock.now()
                plan = planner.plan(now, closing=True)
                self._fail_expired(plan.expired, now)
                if plan.run:
                    await self._execute(loop, plan.run)
            now = clock.now()

    async def _wait(self, until: float | None) -> bool:
        """Until an entry (or the stop) arrives, or :attr:`clock` reaches ``until``; returns
        whether the time ran out."""
        self._ready.clear()  # the step just took what had arrived
        try:
            async with self.clock.timeout_at(until):
                await self._ready.wait()
        except TimeoutError:
            return True
        return False

    def _fail_expired(self, expired: list[tuple[_Pending[T, R], str]], now: float) -> None:
        for pending, why in expired:
            if not pending.future.done():
                waited_ms = (now - pending.enqueued_at) * 1e3
                pending.future.set_exception(
                    DeadlineExceeded(
                        f"the request's deadline {why} after {waited_ms:.1f} ms in the queue of "
                        f"variant {self.name}; it was not computed (retry with a longer "
                        "X-Deadline-Ms or when the load is lower)"
                    )
                )

    async def _execute(self, loop: asyncio.AbstractEventLoop, batch: list[_Pending[T, R]]) -> None:
        """Runs ``batch`` (inline or on the worker thread), then answers its callers and
        reports it (``on_batch``)."""
        size = sum(p.size for p in batch)
        started = self.clock.now()
        self._in_flight_nodes, self._in_flight_since = size, started
        error: BaseException | None = None
        results: Sequence[R] = ()
        handler_s = [math.nan]
        try:
            results = await self._run_handler(loop, [p.item for p in batch], size, handler_s)
        except asyncio.CancelledError:  # hard stop: the callers must not wait forever
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(
                        OverloadedError(f"variant {self.name} was stopped", cause="stopping")
                    )
            raise
        except Exception as exc:  # fanned out to every caller below
            error = exc
        finally:
            self._in_flight_nodes, self._in_flight_since = 0, None
        duration = self.clock.now() - started
        self._answer(batch, results, error, started, size)
        if self._on_batch is not None:
            try:
                self._on_batch(BatchStats(size, len(batch), duration, error, handler_s[0]))
            except Exception:
                _log.exception("batcher %s: on_batch callback failed", self.name)

    async def _run_handler(
        self, loop: asyncio.AbstractEventLoop, items: list[T], size: int, handler_s: list[float]
    ) -> Sequence[R]:
        """The handler's results for ``items``, its own time (on :attr:`clock`, in the thread
        it runs on) in ``handler_s[0]``; :attr:`computing` is told the same times."""
        clock, handler = self.clock, self._handler
        inline = size <= self.inline_max_size
        computing = self._computing
        if computing is not None and not computing.counts(inline):
            computing = None

        def timed(items: list[T]) -> Sequence[R]:
            start = clock.now()
            if computing is not None:
                computing.started(start)
            try:
                return handler(items)
            finally:
                end = clock.now()
                handler_s[0] = end - start
                if computing is not None:
                    computing.ended(end)

        if inline:
            results = timed(items)  # on the loop's thread: no hand-off
        else:
            results = await loop.run_in_executor(self._executor, timed, items)
        if len(results) != len(items):
            raise RuntimeError(
                f"batch handler of {self.name} returned {len(results)} results "
                f"for {len(items)} requests"
            )
        return results

    def _answer(
        self,
        batch: list[_Pending[T, R]],
        results: Sequence[R],
        error: BaseException | None,
        started: float,
        size: int,
    ) -> None:
        """Each caller's result (or the batch's error); callers cancelled meanwhile are
        skipped."""
        for i, p in enumerate(batch):
            if p.future.done():  # cancelled while running
                continue
            if error is not None:
                p.future.set_exception(error)
            else:
                p.future.set_result(Batched(results[i], started - p.enqueued_at, size, len(batch)))
        if error is not None:
            _log.warning("batcher %s: batch of %d nodes failed: %r", self.name, size, error)

    def _fail_waiting(self, error: BaseException) -> None:
        for p in self._planner.clear():
            if not p.future.done():
                p.future.set_exception(error)
        self._publish()
