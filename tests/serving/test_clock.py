"""The serving core's clock: a fake one that moves only when told, and the real one's timeouts."""

from __future__ import annotations

import asyncio

import pytest

from gnnaas.serving.core.clock import MONOTONIC, FakeClock


async def _wait_forever(clock: FakeClock, delay_s: float | None) -> None:
    async with clock.timeout(delay_s):
        await asyncio.Event().wait()


def test_a_fake_clock_moves_only_when_advanced() -> None:
    clock = FakeClock(5.0)
    assert clock.now() == 5.0
    clock.advance(0.25)
    clock.advance(0.0)
    assert clock.now() == 5.25
    assert repr(clock) == "FakeClock(now=5.25, waiting=0)"


@pytest.mark.parametrize("seconds", [-1.0, float("nan")])
def test_a_fake_clock_never_goes_back(seconds: float) -> None:
    with pytest.raises(ValueError, match=r"FakeClock.advance: seconds must be >= 0 \(got"):
        FakeClock().advance(seconds)


async def test_a_fake_timeout_fires_when_the_clock_reaches_it() -> None:
    clock = FakeClock(10.0)
    task = asyncio.create_task(_wait_forever(clock, 0.5))
    await clock.waiting()
    clock.advance(0.4)  # not yet: nothing fires, it still waits
    assert clock.pending == 1 and not task.done()
    clock.advance(0.1)
    with pytest.raises(TimeoutError):
        await task
    assert clock.pending == 0 and clock.now() == 10.5


async def test_a_fake_timeout_already_due_fires_at_once_and_none_never_fires() -> None:
    clock = FakeClock()
    with pytest.raises(TimeoutError):
        async with clock.timeout_at(0.0):
            await asyncio.Event().wait()
    entered, done = asyncio.Event(), asyncio.Event()

    async def unbounded() -> str:
        async with clock.timeout(None):
            entered.set()
            await done.wait()
        return "finished"

    waiter = asyncio.create_task(unbounded())
    await entered.wait()
    clock.advance(1e9)
    done.set()
    assert await waiter == "finished"  # ended by its event, not by the clock


async def test_a_block_that_ends_in_time_leaves_the_clock() -> None:
    clock = FakeClock()
    done = asyncio.Event()

    async def block() -> str:
        async with clock.timeout(1.0):
            await done.wait()
        return "finished"

    task = asyncio.create_task(block())
    await clock.waiting()
    done.set()
    assert await task == "finished"
    assert clock.pending == 0
    clock.advance(2.0)  # passes its time after it ended: nothing fires


async def test_a_fake_clock_advanced_from_another_thread_fires_on_the_timeouts_loop() -> None:
    clock = FakeClock()
    tasks = [asyncio.create_task(_wait_forever(clock, s)) for s in (1.0, 3.0)]
    await clock.waiting(2)
    await asyncio.to_thread(clock.advance, 2.0)  # as a batch handler in a worker thread would
    with pytest.raises(TimeoutError):
        await tasks[0]
    assert not tasks[1].done()
    tasks[1].cancel()
    with pytest.raises(asyncio.CancelledError):
        await tasks[1]


async def test_waiting_returns_once_that_many_timeouts_wait() -> None:
    clock = FakeClock()
    first = asyncio.create_task(_wait_forever(clock, 1.0))
    two = asyncio.create_task(clock.waiting(2))
    await clock.waiting(1)
    assert not two.done()
    second = asyncio.create_task(_wait_forever(clock, 1.0))
    await two
    clock.advance(1.0)
    for task in (first, second):
        with pytest.raises(TimeoutError):
            await task


async def test_the_monotonic_clock_times_out_on_the_event_loop() -> None:
    with pytest.raises(TimeoutError):
        async with MONOTONIC.timeout(-1.0):  # passed already: at once
            await asyncio.Event().wait()
    done = asyncio.Event()
    done.set()
    async with MONOTONIC.timeout(None):
        await done.wait()
    async with MONOTONIC.timeout(3600.0):
        await done.wait()
    assert repr(MONOTONIC) == "MonotonicClock()"
