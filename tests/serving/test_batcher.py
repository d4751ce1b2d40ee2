"""The dynamic batcher: flushes, bounds, error fan-out, cancellation and draining."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import pytest

from gnnaas.errors import OverloadedError
from gnnaas.serving.batcher import Batcher, BatchStats


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


async def test_returns_one_result_per_request_in_order() -> None:
    handler = Handler()
    batcher: Batcher[int, int] = Batcher(handler, name="t")
    out = await asyncio.gather(*(batcher.submit(i, size=1) for i in range(5)))
    assert [o.value for o in out] == [0, 2, 4, 6, 8]
    await batcher.stop()


async def test_timeout_flush_merges_what_arrived_within_max_wait() -> None:
    handler = Handler()
    batcher: Batcher[int, int] = Batcher(handler, max_batch_size=100, max_wait_s=0.05)
    t0 = time.monotonic()
    first = asyncio.ensure_future(batcher.submit(1, size=1))
    await asyncio.sleep(0.01)
    second = asyncio.ensure_future(batcher.submit(2, size=1))
    a, b = await asyncio.gather(first, second)
    assert time.monotonic() - t0 >= 0.05  # waited for the deadline: the batch was not full
    assert handler.batches == [[1, 2]]
    assert (a.batch_requests, a.batch_size, b.value) == (2, 2, 4)
    assert a.queue_s >= 0.05 > b.queue_s
    await batcher.stop()


async def test_full_batch_flushes_before_the_deadline() -> None:
    handler = Handler()
    batcher: Batcher[int, int] = Batcher(handler, max_batch_size=4, max_wait_s=30.0)
    out = await asyncio.wait_for(
        asyncio.gather(*(batcher.submit(i, size=2) for i in range(2))), timeout=5
    )
    assert handler.batches == [[0, 1]]
    assert out[0].batch_size == 4
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
    await asyncio.sleep(0.01)
    assert not stopping.done()
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
    batcher = Batcher(lambda items: items, name="toy/sage-full-1x")
    assert repr(batcher) == (
        "Batcher('toy/sage-full-1x', max_batch_size=1024, max_wait_s=0.0, max_queue_size=16384)"
    )
