"""The dynamic batcher: flushes, bounds, the device gate, error fan-out, cancellation, draining.

Each batcher runs on a :class:`FakeClock`: a batch that waits for batch-mates waits until the
test advances the clock past its window, so nothing here races the machine's speed and no test
sleeps. Requests are queued with :meth:`Batcher.enqueue` (queued when it returns), handlers are
held with events, a batch waiting for the gate is seen through the gate, and one waiting for time
through :meth:`FakeClock.waiting`. The decisions themselves (windows, carry, priorities, deadline
fitting) are tested step by step, without an event loop, in ``test_planner.py``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Literal, TypeVar

import pytest
from serving_fakes import next_turn

from gnnaas.errors import DeadlineExceeded, OverloadedError
from gnnaas.serving.core.batcher import Batched, Batcher, BatchStats
from gnnaas.serving.core.clock import FakeClock
from gnnaas.serving.core.looplag import ComputeTime

X = TypeVar("X")

LONG_S = 60.0  # a window no test advances past: batches close by filling up or stopping


class Handler:
    """Doubles each item; records batches; can be held until ``release`` is set, and can take
    ``takes_s`` on ``clock`` (it advances the clock by that much)."""

    def __init__(
        self,
        *,
        hold: bool = False,
        fail: str | None = None,
        clock: FakeClock | None = None,
        takes_s: float = 0.0,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.batches: list[list[int]] = []
        self.started = asyncio.Event()  # set (thread-safely) when a batch starts
        self.release = threading.Event()
        if not hold:
            self.release.set()
        self.fail = fail
        self.clock, self.takes_s = clock, takes_s

    def __call__(self, items: Sequence[int]) -> list[int]:
        self.batches.append(list(items))
        self.loop.call_soon_threadsafe(self.started.set)
        self.release.wait(5)
        if self.clock is not None:
            self.clock.advance(self.takes_s)
        if self.fail is not None:
            raise RuntimeError(self.fail)
        return [2 * i for i in items]


class Gate(asyncio.Semaphore):
    """A device gate of one slot that tells when a batch waits for it."""

    def __init__(self) -> None:
        super().__init__(1)
        self.contended = asyncio.Event()

    async def acquire(self) -> Literal[True]:
        if self.locked():
            self.contended.set()
        return await super().acquire()


async def _soon(awaitable: Awaitable[X]) -> X:
    """Awaits what is due without any time passing on the fake clock; the bound only turns a
    bug into a failure rather than a hang."""
    return await asyncio.wait_for(awaitable, 10)


async def _started(handler: Handler) -> None:
    await _soon(handler.started.wait())
    handler.started.clear()


def _batcher(handler: Callable[[list[int]], Sequence[int]], **kw: object) -> Batcher[int, int]:
    kw.setdefault("clock", FakeClock())
    return Batcher(handler, **kw)  # type: ignore[arg-type]


async def test_returns_one_result_per_request_in_order() -> None:
    batcher = _batcher(Handler(), name="t")
    out = await asyncio.gather(*(batcher.submit(i, size=1) for i in range(5)))
    assert [o.value for o in out] == [0, 2, 4, 6, 8]
    await batcher.stop()


async def test_a_partial_batch_runs_when_its_wait_for_batch_mates_is_over() -> None:
    clock = FakeClock()
    handler = Handler()
    batcher = _batcher(handler, max_batch_size=100, max_wait_s=0.5, clock=clock)
    a, b = batcher.enqueue(1, size=1), batcher.enqueue(2, size=1)
    await _soon(clock.waiting())  # the batch waits for batch-mates
    clock.advance(0.25)  # not yet: its wait goes on
    assert clock.pending == 1 and not handler.batches and not a.done()
    clock.advance(0.25)
    out = await _soon(asyncio.gather(a, b))
    assert handler.batches == [[1, 2]]
    assert [(o.value, o.batch_requests, o.batch_size, o.queue_s) for o in out] == [
        (2, 2, 2, 0.5),
        (4, 2, 2, 0.5),
    ]
    await batcher.stop()


class _EarlyTimers(FakeClock):
    """A clock whose timeouts fire a millisecond before it reads their time, as an event loop's
    timer of millisecond resolution (uvloop's) may."""

    def timeout_at(self, when: float | None) -> AbstractAsyncContextManager[object]:
        return super().timeout_at(None if when is None else when - 1e-3)


async def test_a_wait_ended_by_its_timer_ends_even_if_the_timer_was_a_little_early() -> None:
    clock = _EarlyTimers()
    handler = Handler()
    batcher = _batcher(handler, max_wait_s=0.5, clock=clock)
    pending = batcher.enqueue(1, size=1)
    await _soon(clock.waiting())
    clock.advance(0.499)  # its timer fires; waiting on would spin on a timer already due
    assert (await _soon(pending)).queue_s == 0.499
    assert handler.batches == [[1]]
    await batcher.stop()


async def test_requests_arriving_within_the_window_merge_and_a_full_batch_flushes() -> None:
    clock = FakeClock()
    handler = Handler()
    batcher = _batcher(handler, max_batch_size=4, max_wait_s=LONG_S, clock=clock)
    first = batcher.enqueue(0, size=1)
    await _soon(clock.waiting())  # the batch is open and waits for batch-mates
    second = batcher.enqueue(1, size=1)
    assert not handler.batches and batcher.queued_requests == 2
    third = batcher.enqueue(2, size=2)  # fills the batch to 4 nodes
    out = await _soon(asyncio.gather(first, second, third))
    assert handler.batches == [[0, 1, 2]]
    assert [o.batch_size for o in out] == [4, 4, 4]
    assert clock.now() == 0.0  # it did not wait for its window
    await batcher.stop()


async def test_a_waiting_batcher_does_not_hold_the_device_gate() -> None:
    clock = FakeClock()
    gate = asyncio.Semaphore(1)
    waiting, other = Handler(), Handler()
    slow = _batcher(
        waiting, name="slow", max_batch_size=10, max_wait_s=LONG_S, gate=gate, clock=clock
    )
    fast = _batcher(other, name="fast", gate=gate, clock=clock)
    pending = slow.enqueue(1, size=1)
    await _soon(clock.waiting())  # `slow` now waits up to 60 s for batch-mates
    # Another lane runs meanwhile: the gate is free while `slow` waits.
    assert (await _soon(fast.submit(5, size=1))).value == 10
    assert not waiting.batches and not gate.locked() and not pending.done()
    filler = slow.enqueue(2, size=9)  # full: flushes at once
    assert [o.value for o in await _soon(asyncio.gather(pending, filler))] == [2, 4]
    assert waiting.batches == [[1, 2]]
    await asyncio.gather(slow.stop(), fast.stop())


@pytest.mark.parametrize(("max_batch", "expected"), [(10, [[0, 1, 2]]), (2, [[0, 1], [2]])])
async def test_requests_arriving_while_the_gate_is_busy_join_the_batch(
    max_batch: int, expected: list[list[int]]
) -> None:
    gate = Gate()
    handler = Handler()
    batcher = _batcher(handler, max_batch_size=max_batch, gate=gate)
    await gate.acquire()  # another variant's batch runs
    pending = [batcher.enqueue(0, size=1)]
    await _soon(gate.contended.wait())  # closed by its (zero) window, it waits for the gate
    pending += [batcher.enqueue(i, size=1) for i in (1, 2)]
    assert not handler.batches
    gate.release()
    assert [o.value for o in await _soon(asyncio.gather(*pending))] == [0, 2, 4]
    assert handler.batches == expected
    await batcher.stop()


async def test_a_caller_that_gives_up_at_the_gate_is_not_computed() -> None:
    gate = Gate()
    handler = Handler()
    batcher = _batcher(handler, max_batch_size=10, gate=gate)
    await gate.acquire()  # another variant's batch runs
    kept = batcher.enqueue(0, size=1)
    dropped = batcher.enqueue(1, size=4)
    await _soon(gate.contended.wait())
    dropped.cancel()  # the client disconnected while its batch waited for the device
    gate.release()
    assert (await _soon(kept)).value == 0
    assert handler.batches == [[0]]
    assert batcher.queued_nodes == batcher.in_flight_nodes == 0
    await batcher.stop()


async def test_requests_that_arrive_while_a_batch_runs_merge_into_the_next() -> None:
    handler = Handler(hold=True)
    batcher = _batcher(handler, max_batch_size=10, max_wait_s=0.0)
    first = batcher.enqueue(0, size=1)
    await _started(handler)
    rest = [batcher.enqueue(i, size=3) for i in (1, 2, 3, 4)]
    assert (batcher.queued_nodes, batcher.in_flight_nodes) == (12, 1)
    handler.release.set()
    await _soon(asyncio.gather(first, *rest))
    # 3 + 3 + 3 fit the bound of 10, the fourth request is carried into a batch of its own.
    assert handler.batches == [[0], [1, 2, 3], [4]]
    assert batcher.queued_nodes == batcher.in_flight_nodes == 0
    await batcher.stop()


async def test_batch_times_are_measured_on_the_batchers_clock() -> None:
    """A handler that advances the fake clock by 0.25 s "takes" 0.25 s: the batch's duration,
    the handler's own time and the wait of the request queued behind it all say so."""
    clock = FakeClock(100.0)
    handler = Handler(hold=True, clock=clock, takes_s=0.25)
    stats: list[BatchStats] = []
    batcher = _batcher(handler, clock=clock, on_batch=stats.append)
    first = batcher.enqueue(0, size=1)
    await _started(handler)
    assert batcher.in_flight_since == 100.0
    behind = batcher.enqueue(1, size=1)
    handler.release.set()
    done: list[Batched[int]] = await _soon(asyncio.gather(first, behind))
    assert [o.queue_s for o in done] == [0.0, 0.25]
    assert [(s.duration_s, s.handler_s) for s in stats] == [(0.25, 0.25), (0.25, 0.25)]
    assert clock.now() == 100.5 and batcher.in_flight_since is None
    await batcher.stop()


@pytest.mark.parametrize(
    ("inline_max_size", "threads_compete", "computed_s"),
    [(0, True, 0.5), (0, False, 0.0), (4, False, 0.5)],
    ids=["thread-on-a-cpu", "thread-on-an-accelerator", "inline"],
)
async def test_the_computing_time_is_the_handlers_own_where_it_keeps_the_loop_from_running(
    inline_max_size: int, threads_compete: bool, computed_s: float
) -> None:
    """Two batches of 0.25 s each: counted for the loop's lag beyond computing when they ran
    inline, or in the worker thread on a CPU; a worker thread on an accelerator leaves the
    loop free."""
    clock = FakeClock(100.0)
    computing = ComputeTime(threads_compete=threads_compete)
    handler = Handler(clock=clock, takes_s=0.25)
    batcher = _batcher(handler, clock=clock, computing=computing, inline_max_size=inline_max_size)
    await _soon(batcher.enqueue(0, size=1))
    await _soon(batcher.enqueue(1, size=1))
    clock.advance(1.0)  # nothing runs: the computing time stays
    assert computing.total(clock.now()) == pytest.approx(computed_s)
    await batcher.stop()


async def test_handler_error_reaches_every_caller_of_the_batch() -> None:
    handler = Handler(hold=True)
    batcher = _batcher(handler, max_wait_s=0.0)
    first = batcher.enqueue(0, size=1)
    await _started(handler)
    rest = [batcher.enqueue(i, size=1) for i in (1, 2)]
    handler.fail = "boom"
    handler.release.set()
    for fut in (first, *rest):
        with pytest.raises(RuntimeError, match="boom"):
            await _soon(fut)
    handler.fail = None
    assert (await _soon(batcher.submit(5, size=1))).value == 10  # still serving
    await batcher.stop()


async def test_wrong_number_of_results_is_an_error_for_everyone() -> None:
    batcher = _batcher(lambda items: [1])
    pending = [batcher.enqueue(1, size=1), batcher.enqueue(2, size=1)]  # one batch
    results = await _soon(asyncio.gather(*pending, return_exceptions=True))
    assert all(isinstance(r, RuntimeError) and "1 results for 2" in str(r) for r in results)
    await batcher.stop()


async def test_cancelled_requests_are_skipped() -> None:
    handler = Handler(hold=True)
    batcher = _batcher(handler, max_wait_s=0.0)
    first = batcher.enqueue(0, size=1)
    await _started(handler)
    gone = batcher.enqueue(1, size=1)
    kept = batcher.enqueue(2, size=1)
    gone.cancel()
    handler.release.set()
    assert (await _soon(first)).value == 0
    assert (await _soon(kept)).value == 4
    assert gone.cancelled()
    assert handler.batches == [[0], [2]]
    assert batcher.queued_nodes == 0
    await batcher.stop()


async def test_a_cancelled_submit_withdraws_its_request() -> None:
    handler = Handler(hold=True)
    batcher = _batcher(handler)
    first = batcher.enqueue(0, size=1)
    caller = asyncio.ensure_future(batcher.submit(1, size=1))
    await _started(handler)  # the caller's first step ran before: its request is queued
    assert batcher.queued_requests == 1
    kept = batcher.enqueue(2, size=1)
    caller.cancel()  # the client went away
    handler.release.set()
    assert [(await _soon(f)).value for f in (first, kept)] == [0, 4]
    assert caller.cancelled() and handler.batches == [[0], [2]]
    await batcher.stop()


async def test_cancelled_while_running_does_not_break_the_batch() -> None:
    handler = Handler(hold=True)
    batcher = _batcher(handler)
    gone = batcher.enqueue(1, size=1)
    kept = batcher.enqueue(2, size=1)
    await _started(handler)
    gone.cancel()
    handler.release.set()
    assert (await _soon(kept)).value == 4
    assert handler.batches == [[1, 2]]
    await batcher.stop()


async def test_full_queue_raises_overloaded() -> None:
    handler = Handler(hold=True)
    batcher = _batcher(handler, max_queue_size=4, retry_after_s=2.0)
    first = batcher.enqueue(0, size=1)
    await _started(handler)  # running batches do not count against the queue
    queued = [batcher.enqueue(i, size=2) for i in (1, 2)]
    with pytest.raises(OverloadedError, match="queue of variant batcher is full") as info:
        await batcher.submit(3, size=1)
    assert info.value.retry_after_s == 2.0
    handler.release.set()
    await _soon(asyncio.gather(first, *queued))
    await batcher.stop()


async def test_stop_drains_accepted_requests_then_refuses() -> None:
    clock = FakeClock()
    handler = Handler(hold=True)
    stats: list[BatchStats] = []
    batcher = _batcher(handler, max_batch_size=2, on_batch=stats.append, clock=clock)
    pending = [batcher.enqueue(i, size=1) for i in range(5)]
    await _started(handler)
    stopping = asyncio.ensure_future(batcher.stop(timeout_s=5))
    await _soon(clock.waiting())  # the stop waits (at most 5 s on the clock) for the drain
    assert not stopping.done()  # the held batch is still running
    with pytest.raises(OverloadedError, match="shutting down"):
        await batcher.submit(9, size=1)
    handler.release.set()
    await _soon(stopping)
    assert [p.result().value for p in pending] == [0, 2, 4, 6, 8]
    assert sum(s.num_requests for s in stats) == 5
    assert all(s.batch_size <= 2 and s.error is None for s in stats)


async def test_stop_timeout_fails_what_is_left() -> None:
    clock = FakeClock()
    handler = Handler(hold=True)
    batcher = _batcher(handler, max_batch_size=1, clock=clock)
    running = batcher.enqueue(0, size=1)
    await _started(handler)
    waiting = batcher.enqueue(1, size=1)
    stopping = asyncio.ensure_future(batcher.stop(timeout_s=0.5))
    await _soon(clock.waiting())
    clock.advance(0.5)  # the drain's time is up while the batch still runs
    await _soon(stopping)
    for fut in (running, waiting):
        with pytest.raises(OverloadedError):
            await fut
    handler.release.set()


async def test_stop_closes_a_batch_that_waits_for_batch_mates() -> None:
    clock = FakeClock()
    handler = Handler()
    batcher = _batcher(handler, max_batch_size=10, max_wait_s=LONG_S, clock=clock)
    pending = batcher.enqueue(3, size=1)
    await _soon(clock.waiting())
    await _soon(batcher.stop(timeout_s=LONG_S))
    assert (await pending).value == 6
    assert handler.batches == [[3]] and clock.now() == 0.0


async def test_stop_timeout_fails_a_batch_still_waiting_for_the_gate() -> None:
    clock = FakeClock()
    gate = Gate()
    await gate.acquire()  # never released: the batch can never run
    batcher = _batcher(Handler(), gate=gate, clock=clock)
    pending = batcher.enqueue(1, size=1)
    await _soon(gate.contended.wait())
    stopping = asyncio.ensure_future(batcher.stop(timeout_s=0.5))
    await _soon(clock.waiting())
    clock.advance(0.5)
    await _soon(stopping)
    with pytest.raises(OverloadedError, match="shutting down"):
        await _soon(pending)  # fails, never hangs
    assert batcher.queued_nodes == 0


def test_room_nodes() -> None:
    batcher = _batcher(lambda items: items, max_queue_size=8)
    assert batcher.room_nodes > 8 and batcher.has_room(100)  # nothing waits: any one request
    batcher._queues.nodes = 6  # as if 6 normal nodes waited
    assert (batcher.room_nodes, batcher.has_room(2), batcher.has_room(3)) == (2, True, False)
    batcher._closed = True
    assert batcher.room_nodes == 0 and not batcher.has_room(1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"max_wait_s": -1.0}, "max_wait_s"),
        ({"max_queue_size": 0}, "max_queue_size"),
        ({"aging_s": -1.0}, "aging_s"),
    ],
)
def test_rejects_bad_limits(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Batcher(lambda items: items, **kwargs)  # type: ignore[arg-type]


def test_repr() -> None:
    batcher: Batcher[int, int] = Batcher(lambda items: items, name="toy/sage-full-1x")
    assert repr(batcher) == (
        "Batcher('toy/sage-full-1x', max_batch_size=1024, max_wait_s=0.0, max_queue_size=16384)"
    )


async def test_small_batches_run_on_the_loop_thread_and_large_ones_in_the_worker() -> None:
    threads: list[tuple[int, int]] = []  # (batch nodes, thread id)
    stats: list[BatchStats] = []

    def handler(items: Sequence[int]) -> list[int]:
        threads.append((sum(items), threading.get_ident()))
        return list(items)

    batcher = _batcher(handler, inline_max_size=4, on_batch=stats.append)
    small = await batcher.submit(3, size=3)
    large = await batcher.submit(5, size=5)
    error = None
    failing = _batcher(_fail, inline_max_size=4)
    try:
        await failing.submit(1, size=1)
    except RuntimeError as exc:  # an inline handler's error reaches its caller as usual
        error = str(exc)
    await batcher.stop()
    await failing.stop()
    loop_thread = threading.get_ident()
    assert (small.value, large.value) == (3, 5)
    assert threads[0] == (3, loop_thread) and threads[1][0] == 5 and threads[1][1] != loop_thread
    assert error == "inline failure"
    assert [(s.batch_size, s.handler_s) for s in stats] == [(3, 0.0), (5, 0.0)]


def _fail(items: Sequence[int]) -> list[int]:
    raise RuntimeError("inline failure")


# -- priorities and deadlines -------------------------------------------------------------------


async def _hold_one(handler: Handler, batcher: Batcher[int, int]) -> asyncio.Future[Batched[int]]:
    """A first request whose batch runs (held) so that the next ones queue."""
    first = batcher.enqueue(-1, size=1)
    await _started(handler)
    return first


@pytest.mark.parametrize(("aging_s", "order"), [(LONG_S, [3, 2, 1]), (0.5, [1, 2, 3])])
async def test_higher_priority_first_unless_the_older_have_aged(
    aging_s: float, order: list[int]
) -> None:
    clock = FakeClock()
    handler = Handler(hold=True)
    batcher = _batcher(handler, max_batch_size=1, aging_s=aging_s, clock=clock)
    first = await _hold_one(handler, batcher)
    queued = []
    for i, priority in ((1, "low"), (2, "normal"), (3, "high")):
        queued.append(batcher.enqueue(i, size=1, priority=priority))
        clock.advance(0.125)  # they arrive in this order
    assert [batcher.queued_ahead(p) for p in ("high", "normal", "low")] == [1, 2, 3]
    clock.advance(0.5)  # the running batch took that long: aged, every request counts as high
    handler.release.set()
    await _soon(asyncio.gather(first, *queued))
    assert [b[0] for b in handler.batches[1:]] == order
    await batcher.stop()


async def test_low_fills_half_the_queue_and_higher_priorities_evict_it() -> None:
    handler = Handler(hold=True)
    batcher = _batcher(handler, max_queue_size=4)
    first = await _hold_one(handler, batcher)
    lows = [batcher.enqueue(i, size=1, priority="low") for i in (1, 2)]
    assert batcher.room_for("low") == 0 and batcher.room_for("normal") == 2
    with pytest.raises(OverloadedError, match="low-priority requests may fill 2 of 4"):
        await batcher.submit(3, size=1, priority="low")
    normals = [batcher.enqueue(i, size=1) for i in (4, 5)]
    high = batcher.enqueue(6, size=1, priority="high")  # full: evicts
    assert lows[1].done() and not lows[0].done()  # the newest low went first
    with pytest.raises(OverloadedError, match="shed for higher-priority traffic"):
        lows[1].result()
    handler.release.set()
    served = await _soon(asyncio.gather(first, lows[0], *normals, high))
    assert [s.value for s in served] == [-2, 2, 8, 10, 12]
    await batcher.stop()


async def test_a_low_request_past_its_share_of_the_slack_waits_for_the_next_batch() -> None:
    clock = FakeClock()
    handler = Handler(hold=True)
    # One second per node. The high request has 7 s, 6 s of slack beyond its own: the normal one
    # may join it (it adds 1 s, within its third), the low one may not (2 s more, past its
    # quarter), though the batch would still end before the high one's deadline.
    batcher = _batcher(handler, predict_s=float, aging_s=LONG_S, clock=clock)
    first = await _hold_one(handler, batcher)
    low = batcher.enqueue(1, size=1, priority="low")
    normal = batcher.enqueue(2, size=1, expires=LONG_S)  # fits beside the high one
    high = batcher.enqueue(3, size=1, priority="high", expires=7.0)
    handler.release.set()
    served = await _soon(asyncio.gather(first, high, normal, low))
    assert [s.value for s in served] == [-2, 6, 4, 2]  # the low one was not dropped
    assert handler.batches == [[-1], [3, 2], [1]]  # high first; low in a batch of its own
    await batcher.stop()


async def test_a_stop_still_serves_what_a_fitted_batch_put_back() -> None:
    clock = FakeClock()
    handler = Handler(hold=True)
    batcher = _batcher(handler, predict_s=float, clock=clock)
    first = await _hold_one(handler, batcher)
    high = batcher.enqueue(1, size=1, priority="high", expires=LONG_S)
    low = batcher.enqueue(2, size=50, priority="low")  # will not fit beside
    stopping = asyncio.ensure_future(batcher.stop())
    await _soon(clock.waiting())  # the stop waits for the drain
    handler.release.set()
    await _soon(stopping)
    assert [f.result().value for f in (first, high, low)] == [-2, 2, 4]
    assert handler.batches == [[-1], [1], [2]]
    assert batcher.queued_nodes == 0 and batcher.queued_requests == 0


@pytest.mark.parametrize(
    ("predict_s", "size", "expires", "why"),
    [
        (None, 1, 0.25, "deadline passed after 500.0 ms in the queue"),  # passed when it forms
        (float, 3, 2.0, "would pass in its batch after 500.0 ms"),  # 3 s alone, 1.5 s left
    ],
)
async def test_a_request_that_cannot_make_its_deadline_is_not_computed_and_its_batch_runs(
    predict_s: Callable[[int], float] | None, size: int, expires: float, why: str
) -> None:
    clock = FakeClock()
    handler = Handler(hold=True, clock=clock, takes_s=0.5)
    batcher = _batcher(handler, predict_s=predict_s, clock=clock)
    first = await _hold_one(handler, batcher)
    late = batcher.enqueue(1, size=size, expires=expires)
    fine = batcher.enqueue(2, size=1, expires=LONG_S)
    handler.release.set()  # the running batch takes 0.5 s
    await _soon(asyncio.gather(first, fine))
    with pytest.raises(DeadlineExceeded, match=why):
        await late
    assert handler.batches == [[-1], [2]]  # computed without it
    assert fine.result().value == 4
    await batcher.stop()


async def test_a_request_its_batch_would_make_late_is_dropped_before_it_runs() -> None:
    clock = FakeClock()
    handler = Handler()
    # every batch is predicted to take 10 s
    batcher = _batcher(handler, predict_s=lambda nodes: 10.0, clock=clock)
    with pytest.raises(DeadlineExceeded, match="would pass in its batch"):
        await _soon(batcher.submit(1, size=1, expires=1.0))
    assert handler.batches == []
    out = await _soon(batcher.submit(2, size=1))  # no deadline: served
    assert out.value == 4
    await batcher.stop()


async def test_on_busy_says_when_the_batcher_gains_and_loses_work() -> None:
    # Told once when a request reaches an idle batcher, once when its last batch ended with
    # nothing left waiting: always what `busy` says, never twice the same value.
    told: list[bool] = []
    handler = Handler(hold=True)
    batcher = _batcher(handler, on_busy=told.append)
    first = batcher.enqueue(1, size=1)
    assert told == [True] and batcher.busy
    await _started(handler)  # running
    second = batcher.enqueue(2, size=1)  # waits behind it: still busy, nothing told
    assert told == [True]
    handler.release.set()
    await _soon(asyncio.gather(first, second))
    await _soon(_until_idle(batcher))
    assert told == [True, False] and not batcher.busy
    await _soon(batcher.submit(3, size=1))
    await _soon(_until_idle(batcher))
    assert told == [True, False, True, False]
    await batcher.stop()


async def _until_idle(batcher: Batcher[int, int]) -> None:
    """Gives the batcher's loop the turns it needs to see its queue empty after a batch."""
    while batcher.busy:
        await next_turn()
