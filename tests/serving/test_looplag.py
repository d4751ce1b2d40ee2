"""The event loop's lag: how late its ticks run, read as admission counts it, on a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from gnnaas.serving.core.clock import FakeClock
from gnnaas.serving.core.looplag import TYPICAL_WEIGHT, ComputeTime, LoopLag


def test_the_lag_read_is_the_worst_tick_of_the_last_one_to_two_windows() -> None:
    lag = LoopLag(interval_s=0.002, window_s=0.02)
    assert lag.behind_s(0.0) == 0.0 and lag.latest_s(0.0) == 0.0
    lag.ran(due=1.000, now=1.008)  # 8 ms late: the window starts at 1.008
    lag.ran(due=1.010, now=1.011)  # then 1 ms late
    assert lag.behind_s(1.012) == pytest.approx(0.008)  # the worst of the window
    assert lag.latest_s(1.012) == pytest.approx(0.001)  # the lag as it is
    # The next window: the 8 ms tick still counts, as the window before.
    lag.ran(due=1.030, now=1.030)
    assert lag.behind_s(1.035) == pytest.approx(0.008)
    # Two windows on, with no late tick since, it no longer does.
    lag.ran(due=1.050, now=1.050)
    assert lag.behind_s(1.050) == 0.0
    assert lag.behind_s(1.2) == 0.0


def test_the_typical_lag_is_a_moving_average_of_the_ticks() -> None:
    lag = LoopLag(interval_s=0.002, window_s=0.02)
    lag.ran(due=1.000, now=1.010)  # one spike of 10 ms moves it by a twentieth
    assert lag.typical_s() == pytest.approx(TYPICAL_WEIGHT * 0.010)
    for k in range(200):  # then ticks on time bring it back to nothing
        lag.ran(due=1.1 + k * 0.002, now=1.1 + k * 0.002)
    assert lag.typical_s() < 1e-6
    assert lag.latest_s(1.6) == 0.0


def test_a_pending_tick_counts_how_late_the_loop_is_on_it_right_now() -> None:
    lag = LoopLag(interval_s=0.002, window_s=0.02)
    lag._due = 2.000  # a tick scheduled for 2.000 has not run yet (as `watch` leaves it)
    assert lag.behind_s(2.015) == pytest.approx(0.015)
    assert lag.latest_s(2.015) == pytest.approx(0.015)


def test_a_refusal_for_the_lag_holds_until_the_window_ends() -> None:
    lag = LoopLag(interval_s=0.002, window_s=0.02)
    assert lag.settles_in(0.0) == 0.0  # no lag read: nothing to wait for
    lag.ran(due=1.000, now=1.005)  # the window runs from 1.005 to 1.025
    assert lag.settles_in(1.010) == pytest.approx(0.015)
    # A new window from 1.030: the 5 ms tick counts as the window before, until 1.050.
    assert lag.settles_in(1.030) == pytest.approx(0.020)
    assert lag.settles_in(1.075) == 0.0  # two windows on: no lag read


def test_computing_time_counts_each_moment_once_while_any_batch_runs() -> None:
    busy = ComputeTime()
    assert busy.total(5.0) == 0.0
    busy.started(1.0)
    assert busy.total(1.5) == pytest.approx(0.5)  # the running batch so far
    busy.started(1.2)  # a second batch beside it: the same moments, counted once
    busy.ended(1.6)
    busy.ended(2.0)
    assert busy.total(3.0) == pytest.approx(1.0)
    busy.started(4.0)
    busy.ended(4.25)
    assert busy.total(9.0) == pytest.approx(1.25)


def test_the_lag_beyond_computing_leaves_out_the_time_the_device_computed() -> None:
    lag = LoopLag(interval_s=0.002, window_s=0.02)
    # A tick 8 ms late, 6 ms of which a batch computed (inline on the loop, or holding the GIL).
    lag.ran(due=1.000, now=1.008, computed_s=0.006)
    assert lag.behind_s(1.010) == pytest.approx(0.008)  # the wait a request met
    assert lag.behind_s(1.010, beyond_computing=True) == pytest.approx(0.002)
    assert lag.latest_s(1.010, beyond_computing=True) == pytest.approx(0.002)
    assert lag.typical_s(beyond_computing=True) == pytest.approx(TYPICAL_WEIGHT * 0.002)
    # A tick made late by computing alone is no lag beyond it.
    lag.ran(due=1.010, now=1.019, computed_s=0.011)
    assert lag.latest_s(1.020) == pytest.approx(0.009)
    assert lag.latest_s(1.020, beyond_computing=True) == 0.0
    assert lag.behind_s(1.020, beyond_computing=True) == pytest.approx(0.002)


def test_a_pending_tick_late_while_a_batch_runs_is_not_late_beyond_computing() -> None:
    busy = ComputeTime()
    lag = LoopLag(interval_s=0.002, window_s=0.02, computing=busy.total)
    lag._due, lag._computed = 2.000, busy.total(1.998)  # as `watch` leaves a pending tick
    busy.started(2.001)  # a batch runs from 2.001, past the tick's time
    assert lag.behind_s(2.010) == pytest.approx(0.010)
    assert lag.behind_s(2.010, beyond_computing=True) == pytest.approx(0.001)


async def test_the_ticks_run_while_requests_arrive_and_stop_when_idle() -> None:
    clock = FakeClock()
    observed: list[float] = []
    ticked = asyncio.Event()

    def observe(seconds: float) -> None:
        observed.append(seconds)
        ticked.set()

    lag = LoopLag(interval_s=0.002, window_s=0.02, idle_s=1.0, observe=observe)
    watch = asyncio.create_task(lag.watch(clock))
    try:
        async with asyncio.timeout(10):  # a broken watcher fails the test, not hangs it
            await _ticks(lag, clock, ticked, observed)
    finally:
        watch.cancel()


async def _ticks(
    lag: LoopLag, clock: FakeClock, ticked: asyncio.Event, observed: list[float]
) -> None:
    """A request arrives, a tick runs late, the ticks stop when idle and start again."""
    lag.arrived(clock.now())
    await clock.waiting(1)  # a tick is due at 0.002
    clock.advance(0.005)  # ... and runs at 0.005: 3 ms late
    await ticked.wait()
    assert observed == [pytest.approx(0.003)]
    assert lag.latest_s(clock.now()) == pytest.approx(0.003)
    assert clock.pending == 1  # the next tick is scheduled: a request arrived 5 ms ago
    ticked.clear()
    clock.advance(1.0)  # no request for a second: the ticks stop after this one
    await ticked.wait()
    assert clock.pending == 0
    lag.arrived(clock.now())  # ... and start again with the next request
    await clock.waiting(1)
    assert lag.behind_s(clock.now()) == lag.latest_s(clock.now()) == 0.0  # pause forgotten


async def test_the_watcher_reads_the_computing_time_between_scheduling_a_tick_and_its_run() -> None:
    clock, busy = FakeClock(), ComputeTime()
    ticked = asyncio.Event()
    lag = LoopLag(
        interval_s=0.002, window_s=0.02, computing=busy.total, observe=lambda _: ticked.set()
    )
    watch = asyncio.create_task(lag.watch(clock))
    try:
        async with asyncio.timeout(10):
            lag.arrived(clock.now())
            await clock.waiting(1)  # a tick is due at 0.002
            busy.started(clock.now())  # a batch computes from 0 to 0.005
            clock.advance(0.005)
            busy.ended(clock.now())
            await ticked.wait()  # the tick runs 3 ms late, all of it computing
    finally:
        watch.cancel()
    assert lag.latest_s(clock.now()) == pytest.approx(0.003)
    assert lag.latest_s(clock.now(), beyond_computing=True) == 0.0
