"""The dynamic batcher: flushes, bounds, the device gate, error fan-out, cancellation, draining.

Nothing here races a sleep against a batching window: windows are either long (60 s) and ended by
a full batch or a stop, or short and checked only from below (a batch never flushes early).
Handlers are held with events, and the event loop is given turns with ``sleep(0)``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence

import pytest

from gnnaas.errors import DeadlineExceeded, OverloadedError
from gnnaas.serving.core.batcher import Batcher, BatchStats


class Handler:
    """Doubles each item; records batches; can be held until ``release`` is set."""

    def __init__(self, *, hold: bool = False, fail: str | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        self.batches: list[list[int]] = []
        self.started = asyncio.Event()  # set (thread-safely) when a batch starts
        self.release = threading.Event()
        if not hold:
            self.release.set()
        self.fail = fail

    def __call__(self, items: Sequence[int]) -> list[int]:
        self.batches.append(list(items))
        self.loop.call_soon_threadsafe(self.started.set)
        self.release.wait(5)
        if self.fail is not None:
            raise RuntimeError(self.fail)
        return [2 * i for i in items]


async def _started(handler: Handler) -> None:
    await asyncio.wait_for(handler.started.wait(), 5)
    handler.started.clear()


async def _queued(batcher: Batcher[int, int], requests: int) -> None:
    while batcher.queued_requests < requests:
        await asyncio.sleep(0)


async def _turns(n: int = 10) -> None:
    """Lets every ready task run ``n`` times (no time passes)."""
    for _ in range(n):
        await asyncio.sleep(0)


LONG_S = 60.0  # a window no test waits for: batches close by filling up or stopping


async def test_returns_one_result_per_request_in_order() -> None:
    handler = Handler()
    batcher: Batcher[int, int] = Batcher(handler, name="t")
    out = await asyncio.gather(*(batcher.submit(i, size=1) for i in range(5)))
    assert [o.value for o in out] == [0, 2, 4, 6, 8]
    await batcher.stop()


async def test_timeout_flush_sends_a_partial_batch_at_the_deadline() -> None:
    handler = Handler()
    batcher: Batcher[int, int] = Batcher(handler, max_batch_size=100, max_wait_s=0.05)
    a, b = await asyncio.gather(batcher.submit(1, size=1), batcher.submit(2, size=1))
    assert handler.batches == [[1, 2]]
    assert (a.batch_requests, a.batch_size, b.value) == (2, 2, 4)
    # Not full, so it waited for the deadline (a lower bound: it can only be later).
    assert a.queue_s >= 0.05 - 1e-3
    await batcher.stop()


async def test_requests_arriving_within_the_window_merge_and_a_full_batch_flushes() -> None:
    handler = Handler()
    batcher: Batcher[int, int] = Batcher(handler, max_batch_size=4, max_wait_s=LONG_S)
    first = asyncio.ensure_future(batcher.submit(0, size=1))
    await _turns()  # the batch is open and waits for batch-mates
    second = asyncio.ensure_future(batcher.submit(1, size=1))
    await _turns()
    assert not handler.batches and batcher.queued_requests == 2
    third = asyncio.ensure_future(batcher.submit(2, size=2))  # fills the batch to 4 nodes
    out = await asyncio.wait_for(asyncio.gather(first, second, third), timeout=10)
    assert handler.batches == [[0, 1, 2]]
    assert [o.batch_size for o in out] == [4, 4, 4]
    await batcher.stop()


async def test_a_waiting_batcher_does_not_hold_the_device_gate() -> None:
    gate = asyncio.Semaphore(1)
    waiting, other = Handler(), Handler()
    slow: Batcher[int, int] = Batcher(
        waiting, name="slow", max_batch_size=10, max_wait_s=LONG_S, gate=gate
    )
    fast: Batcher[int, int] = Batcher(other, name="fast", gate=gate)
    pending = asyncio.ensure_future(slow.submit(1, size=1))
    await _turns()  # `slow` now waits up to 60 s for batch-mates
    # Another lane runs meanwhile: the gate is free while `slow` waits.
    assert (await asyncio.wait_for(fast.submit(5, size=1), timeout=10)).value == 10
    assert not waiting.batches and not gate.locked() and not pending.done()
    filler = asyncio.ensure_future(slow.submit(2, size=9))  # full: flushes at once
    assert [o.value for o in await asyncio.gather(pending, filler)] == [2, 4]
    assert waiting.batches == [[1, 2]]
    await asyncio.gather(slow.stop(), fast.stop())


@pytest.mark.parametrize(("max_batch", "expected"), [(10, [[0, 1, 2]]), (2, [[0, 1], [2]])])
async def test_requests_arriving_while_the_gate_is_busy_join_the_batch(
    max_batch: int, expected: list[list[int]]
) -> None:
    gate = asyncio.Semaphore(1)
    handler = Handler()
    batcher: Batcher[int, int] = Batcher(handler, max_batch_size=max_batch, gate=gate)
    await gate.acquire()  # another variant's batch runs
    pending = [asyncio.ensure_future(batcher.submit(0, size=1))]
    await _turns()  # the batch is closed by its (zero) window and waits for the gate
    pending += [asyncio.ensure_future(batcher.submit(i, size=1)) for i in (1, 2)]
    await _turns()
    assert not handler.batches
    gate.release()
    assert [o.value for o in await asyncio.gather(*pending)] == [0, 2, 4]
    assert handler.batches == expected
    await batcher.stop()


async def test_a_caller_that_gives_up_at_the_gate_is_not_computed() -> None:
    gate = asyncio.Semaphore(1)
    handler = Handler()
    batcher: Batcher[int, int] = Batcher(handler, max_batch_size=10, gate=gate)
    await gate.acquire()  # another variant's batch runs
    kept = asyncio.ensure_future(batcher.submit(0, size=1))
    dropped = asyncio.ensure_future(batcher.submit(1, size=4))
    await _turns()
    dropped.cancel()  # the client disconnected while its batch waited for the device
    await _turns()
    gate.release()
    assert (await kept).value == 0
    assert handler.batches == [[0]]
    assert batcher.queued_nodes == batcher.in_flight_nodes == 0
    await batcher.stop()


async def test_requests_that_arrive_while_a_batch_runs_merge_into_the_next() -> None:
    handler = Handler(hold=True)
    batcher: Batcher[int, int] = Batcher(handler, max_batch_size=10, max_wait_s=0.0)
    first = asyncio.ensure_future(batcher.submit(0, size=1))
    await _started(handler)
    rest = [asyncio.ensure_future(batcher.submit(i, size=3)) for i in (1, 2, 3, 4)]
    await _queued(batcher, 4)
    assert (batcher.queued_nodes, batcher.in_flight_nodes) == (12, 1)
    handler.release.set()
    await asyncio.gather(first, *rest)
    # 3 + 3 + 3 fit the bound of 10, the fourth request is carried into a batch of its own.
    assert handler.batches == [[0], [1, 2, 3], [4]]
    assert batcher.queued_nodes == batcher.in_flight_nodes == 0
    await batcher.stop()


async def test_handler_error_reaches_every_caller_of_the_batch() -> None:
    handler = Handler(hold=True)
    batcher: Batcher[int, int] = Batcher(handler, max_wait_s=0.0)
    first = asyncio.ensure_future(batcher.submit(0, size=1))
    await _started(handler)
    rest = [asyncio.ensure_future(batcher.submit(i, size=1)) for i in (1, 2)]
    await _queued(batcher, 2)
    handler.fail = "boom"
    handler.release.set()
    for fut in (first, *rest):
        with pytest.raises(RuntimeError, match="boom"):
            await fut
    handler.fail = None
    assert (await batcher.submit(5, size=1)).value == 10  # still serving
    await batcher.stop()


async def test_wrong_number_of_results_is_an_error_for_everyone() -> None:
    batcher: Batcher[int, int] = Batcher(lambda items: [1], max_wait_s=0.05)
    results = await asyncio.gather(
        batcher.submit(1, size=1), batcher.submit(2, size=1), return_exceptions=True
    )
    assert all(isinstance(r, RuntimeError) and "1 results for 2" in str(r) for r in results)
    await batcher.stop()


async def test_cancelled_requests_are_skipped() -> None:
    handler = Handler(hold=True)
    batcher: Batcher[int, int] = Batcher(handler, max_wait_s=0.0)
    first = asyncio.ensure_future(batcher.submit(0, size=1))
    await _started(handler)
    gone = asyncio.ensure_future(batcher.submit(1, size=1))
    kept = asyncio.ensure_future(batcher.submit(2, size=1))
    await _queued(batcher, 2)
    gone.cancel()
    handler.release.set()
    assert (await first).value == 0
    assert (await kept).value == 4
    assert gone.cancelled()
    assert handler.batches == [[0], [2]]
    assert batcher.queued_nodes == 0
    await batcher.stop()


async def test_cancelled_while_running_does_not_break_the_batch() -> None:
    handler = Handler(hold=True)
    batcher: Batcher[int, int] = Batcher(handler, max_wait_s=0.05)
    gone = asyncio.ensure_future(batcher.submit(1, size=1))
    kept = asyncio.ensure_future(batcher.submit(2, size=1))
    await _started(handler)
    gone.cancel()
    handler.release.set()
    assert (await kept).value == 4
    await batcher.stop()


async def test_full_queue_raises_overloaded() -> None:
    handler = Handler(hold=True)
    batcher: Batcher[int, int] = Batcher(handler, max_queue_size=4, retry_after_s=2.0)
    first = asyncio.ensure_future(batcher.submit(0, size=1))
    await _started(handler)  # running batches do not count against the queue
    queued = [asyncio.ensure_future(batcher.submit(i, size=2)) for i in (1, 2)]
    await _queued(batcher, 2)
    with pytest.raises(OverloadedError, match="queue of variant batcher is full") as info:
        await batcher.submit(3, size=1)
    assert info.value.retry_after_s == 2.0
    handler.release.set()
    await asyncio.gather(first, *queued)
    await batcher.stop()


async def test_stop_drains_accepted_requests_then_refuses() -> None:
    handler = Handler(hold=True)
    stats: list[BatchStats] = []
    batcher: Batcher[int, int] = Batcher(handler, max_batch_size=2, on_batch=stats.append)
    pending = [asyncio.ensure_future(batcher.submit(i, size=1)) for i in range(5)]
    await _started(handler)
    stopping = asyncio.ensure_future(batcher.stop(timeout_s=5))
    await _turns()
    assert not stopping.done()  # the held batch is still running
    with pytest.raises(OverloadedError, match="shutting down"):
        await batcher.submit(9, size=1)
    handler.release.set()
    await stopping
    assert [p.result().value for p in pending] == [0, 2, 4, 6, 8]
    assert sum(s.num_requests for s in stats) == 5
    assert all(s.batch_size <= 2 and s.error is None for s in stats)


async def test_stop_timeout_fails_what_is_left() -> None:
    handler = Handler(hold=True)
    batcher: Batcher[int, int] = Batcher(handler, max_batch_size=1)
    running = asyncio.ensure_future(batcher.submit(0, size=1))
    await _started(handler)
    waiting = asyncio.ensure_future(batcher.submit(1, size=1))
    await _queued(batcher, 1)
    await batcher.stop(timeout_s=0.05)
    for fut in (running, waiting):
        with pytest.raises(OverloadedError):
            await fut
    handler.release.set()


async def test_stop_closes_a_batch_that_waits_for_batch_mates() -> None:
    handler = Handler()
    batcher: Batcher[int, int] = Batcher(handler, max_batch_size=10, max_wait_s=LONG_S)
    pending = asyncio.ensure_future(batcher.submit(3, size=1))
    await _turns()
    await asyncio.wait_for(batcher.stop(timeout_s=LONG_S), timeout=10)
    assert (await pending).value == 6
    assert handler.batches == [[3]]


async def test_stop_timeout_fails_a_batch_still_waiting_for_the_gate() -> None:
    gate = asyncio.Semaphore(1)
    await gate.acquire()  # never released: the batch can never run
    batcher: Batcher[int, int] = Batcher(Handler(), gate=gate)
    pending = asyncio.ensure_future(batcher.submit(1, size=1))
    await _turns()
    await batcher.stop(timeout_s=0.01)
    with pytest.raises(OverloadedError, match="shutting down"):
        await asyncio.wait_for(pending, timeout=10)  # fails, never hangs
    assert batcher.queued_nodes == 0


def test_room_nodes() -> None:
    batcher: Batcher[int, int] = Batcher(lambda items: items, max_queue_size=8)
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

    batcher: Batcher[int, int] = Batcher(handler, inline_max_size=4, on_batch=stats.append)
    small = await batcher.submit(3, size=3)
    large = await batcher.submit(5, size=5)
    error = None
    failing: Batcher[int, int] = Batcher(_fail, inline_max_size=4)
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
    assert [s.batch_size for s in stats] == [3, 5] and all(s.handler_s >= 0 for s in stats)


def _fail(items: Sequence[int]) -> list[int]:
    raise RuntimeError("inline failure")


# -- priorities and deadlines -------------------------------------------------------------------


async def _hold_one(handler: Handler, batcher: Batcher[int, int]) -> asyncio.Future[object]:
    """A first request whose batch runs (held) so that the next ones queue."""
    first = asyncio.ensure_future(batcher.submit(-1, size=1))
    await _started(handler)
    return first


@pytest.mark.parametrize(("aging_s", "order"), [(LONG_S, [3, 2, 1]), (0.0, [1, 2, 3])])
async def test_higher_priority_first_unless_the_older_has_aged(
    aging_s: float, order: list[int]
) -> None:
    handler = Handler(hold=True)
    batcher: Batcher[int, int] = Batcher(handler, max_batch_size=1, aging_s=aging_s)
    first = await _hold_one(handler, batcher)
    queued = [
        asyncio.ensure_future(batcher.submit(i, size=1, priority=p))
        for i, p in ((1, "low"), (2, "normal"), (3, "high"))
    ]
    await _queued(batcher, 3)
    assert [batcher.queued_ahead(p) for p in ("high", "normal", "low")] == [1, 2, 3]
    handler.release.set()
    await asyncio.gather(first, *queued)
    assert [b[0] for b in handler.batches[1:]] == order  # aged: every request counts as high
    await batcher.stop()


async def test_low_fills_half_the_queue_and_higher_priorities_evict_it() -> None:
    handler = Handler(hold=True)
    batcher: Batcher[int, int] = Batcher(handler, max_queue_size=4)
    first = await _hold_one(handler, batcher)
    lows = [asyncio.ensure_future(batcher.submit(i, size=1, priority="low")) for i in (1, 2)]
    await _queued(batcher, 2)
    assert batcher.room_for("low") == 0 and batcher.room_for("normal") == 2
    with pytest.raises(OverloadedError, match="low-priority requests may fill 2 of 4"):
        await batcher.submit(3, size=1, priority="low")
    normals = [asyncio.ensure_future(batcher.submit(i, size=1)) for i in (4, 5)]
    await _queued(batcher, 4)
    high = asyncio.ensure_future(batcher.submit(6, size=1, priority="high"))  # full: evicts
    await _turns()
    assert lows[1].done() and not lows[0].done()  # the newest low went first
    with pytest.raises(OverloadedError, match="shed for higher-priority traffic"):
        lows[1].result()
    handler.release.set()
    served = await asyncio.gather(first, lows[0], *normals, high)
    assert [s.value for s in served] == [-2, 2, 8, 10, 12]
    await batcher.stop()


async def test_a_low_request_past_its_share_of_the_slack_waits_for_the_next_batch() -> None:
    import time

    handler = Handler(hold=True)
    # One second per node. The high request has 7 s, 6 s of slack beyond its own: the normal one
    # may join it (it adds 1 s, within its third), the low one may not (2 s more, past its
    # quarter), though the batch would still end before the high one's deadline.
    batcher: Batcher[int, int] = Batcher(
        handler, predict_s=lambda nodes: float(nodes), aging_s=LONG_S
    )
    first = await _hold_one(handler, batcher)
    low = asyncio.ensure_future(batcher.submit(1, size=1, priority="low"))
    normal = asyncio.ensure_future(
        batcher.submit(2, size=1, expires=time.monotonic() + LONG_S)  # fits beside the high one
    )
    high = asyncio.ensure_future(
        batcher.submit(3, size=1, priority="high", expires=time.monotonic() + 7.0)
    )
    await _queued(batcher, 3)
    handler.release.set()
    served = await asyncio.gather(first, high, normal, low)
    assert [s.value for s in served] == [-2, 6, 4, 2]  # the low one was not dropped
    assert handler.batches == [[-1], [3, 2], [1]]  # high first; low in a batch of its own
    await batcher.stop()


async def test_requests_cheap_to_add_fill_the_batch_under_tight_deadlines() -> None:
    import time

    handler = Handler(hold=True)
    # 8 s per batch plus a millisecond per node: all of them make their 20 s deadlines together
    batcher: Batcher[int, int] = Batcher(handler, predict_s=lambda nodes: 8.0 + 1e-3 * nodes)
    first = await _hold_one(handler, batcher)
    expires = time.monotonic() + 20.0
    waiting = [asyncio.ensure_future(batcher.submit(i, size=1, expires=expires)) for i in range(50)]
    await _queued(batcher, 50)
    handler.release.set()
    served = await asyncio.gather(first, *waiting)
    assert [s.value for s in served[1:]] == [2 * i for i in range(50)]
    assert handler.batches == [[-1], list(range(50))]  # one batch, not fifty
    await batcher.stop()


async def test_a_stop_still_serves_what_a_fitted_batch_put_back() -> None:
    import time

    handler = Handler(hold=True)
    batcher: Batcher[int, int] = Batcher(handler, predict_s=lambda nodes: float(nodes))
    first = await _hold_one(handler, batcher)
    high = asyncio.ensure_future(
        batcher.submit(1, size=1, priority="high", expires=time.monotonic() + LONG_S)
    )
    low = asyncio.ensure_future(batcher.submit(2, size=50, priority="low"))  # will not fit beside
    await _queued(batcher, 2)
    stopping = asyncio.ensure_future(batcher.stop())
    await _turns()
    handler.release.set()
    await stopping
    assert [f.result().value for f in (first, high, low)] == [-2, 2, 4]
    assert handler.batches == [[-1], [1], [2]]
    assert batcher.queued_nodes == 0 and batcher.queued_requests == 0


@pytest.mark.parametrize(
    ("predict_s", "size", "expires_in_s", "why"),
    [
        (None, 1, -1.0, "deadline passed after .* ms in the queue"),  # passed when it forms
        (float, 3, 2.0, "would pass in its batch"),  # one second per node: 3 s alone
    ],
)
async def test_a_request_that_cannot_make_its_deadline_is_not_computed_and_its_batch_runs(
    predict_s: Callable[[int], float] | None, size: int, expires_in_s: float, why: str
) -> None:
    import time

    handler = Handler(hold=True)
    batcher: Batcher[int, int] = Batcher(handler, predict_s=predict_s)
    first = await _hold_one(handler, batcher)
    late = asyncio.ensure_future(
        batcher.submit(1, size=size, expires=time.monotonic() + expires_in_s)
    )
    fine = asyncio.ensure_future(batcher.submit(2, size=1, expires=time.monotonic() + LONG_S))
    await _queued(batcher, 2)
    handler.release.set()
    await asyncio.gather(first, fine)
    with pytest.raises(DeadlineExceeded, match=why):
        await late
    assert handler.batches == [[-1], [2]]  # computed without it
    assert fine.result().value == 4
    await batcher.stop()


async def test_a_request_its_batch_would_make_late_is_dropped_before_it_runs() -> None:
    import time

    handler = Handler()
    # every batch is predicted to take 10 s
    batcher: Batcher[int, int] = Batcher(handler, predict_s=lambda nodes: 10.0)
    with pytest.raises(DeadlineExceeded, match="would pass in its batch"):
        await batcher.submit(1, size=1, expires=time.monotonic() + 1.0)
    assert handler.batches == []
    out = await batcher.submit(2, size=1)  # no deadline: served
    assert out.value == 4
    await batcher.stop()
