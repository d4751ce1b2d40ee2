"""How far behind the event loop runs: the time a request waits before the app can see it.

A server's requests, refusals and answers all pass through one event loop. When the loop has
more to do than its core can, a request's bytes wait in its socket until the loop reaches
them, and an answer waits again before it is written: time that neither the deadline clock
(which starts when the app receives a request) nor the variants' curves (the device's time)
see. On one core at twice the sustained rate that unseen wait, not the queue, is what made
requests late (``benchmarks/results/deadlines-1node-pinned.md``).

:class:`LoopLag` measures it the way the loop itself experiences it: a tick is scheduled every
:attr:`~LoopLag.interval_s` on the loop's timer, and how late it runs is the loop's lag then.
The router counts the lag against every deadline (``Router._expires``), before admission
(:func:`~gnnaas.serving.core.deadlines.admit`) and the batches read it: the deadline is counted
from when the request is estimated to have reached the server (its arrival at the app less the
lag), and its answer is predicted to wait the lag again before it is written. A high request
counts the lag it met (:meth:`LoopLag.latest_s`) and the typical lag for its answer
(:meth:`LoopLag.typical_s`: a spike of the loop is over by the time the request is read), the
others the recent worst (:meth:`LoopLag.behind_s`) for both: while the loop falls behind,
normal and low requests, whose share of their slack the lag soon takes, are refused first, and
the refusal, applied by the protocol layer to those that follow, is the cheapest answer the
server has (``benchmarks/results/shed-cost.md``).

The ticks run only while requests arrive (an idle server is not woken every few
milliseconds); :meth:`LoopLag.watch` runs them on the router's clock, so a test drives them
with a :class:`~gnnaas.serving.core.clock.FakeClock`.

Example:
    >>> lag = LoopLag(interval_s=0.002, window_s=0.05)
    >>> lag.ran(due=1.000, now=1.007)  # a tick due at 1.000 ran 7 ms late
    >>> round(lag.behind_s(1.010) * 1e3, 1)
    7.0
    >>> lag.behind_s(1.2)  # two windows later, with no late tick since
    0.0
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gnnaas.serving.core.clock import Clock

__all__ = ["TYPICAL_WEIGHT", "LoopLag"]

TYPICAL_WEIGHT = 0.05
"""The weight of each tick in the typical lag's moving average (:meth:`LoopLag.typical_s`)."""


class LoopLag:
    """The event loop's lag: the largest delay of its ticks in the current window and the one
    before (a window starts at the first tick or reading after the last one ended).

    Args:
        interval_s (float, optional): the time between ticks while requests arrive.
            (default: ``0.002``)
        window_s (float, optional): how long a late tick counts: the lag read is the largest
            of the ticks in the current window and the one before. (default: ``0.02``)
        idle_s (float, optional): the ticks stop when no request has arrived for this long,
            and start again with the next one. (default: ``1.0``)
        observe (Callable[[float], None], optional): called with each tick's lag in seconds
            (a histogram's ``observe``). (default: ``None``)
    """

    def __init__(
        self,
        interval_s: float = 0.002,
        window_s: float = 0.02,
        idle_s: float = 1.0,
        observe: Callable[[float], None] | None = None,
    ) -> None:
        self.interval_s = interval_s
        self.window_s = window_s
        self.idle_s = idle_s
        self._observe = observe
        self._start = -float("inf")  # when the current window began
        self._current = 0.0  # the largest lag in it
        self._previous = 0.0  # ... and in the window before it
        self._latest = 0.0  # the latest tick's
        self._typical = 0.0  # a moving average of the ticks' (TYPICAL_WEIGHT each)
        self._due: float | None = None  # the pending tick's time, while one is scheduled
        self._last_request = -float("inf")
        self._wake: asyncio.Event | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(interval_s={self.interval_s}, window_s={self.window_s})"

    def ran(self, due: float, now: float) -> None:
        """Records a tick due at ``due`` that ran at ``now``."""
        lag = max(now - due, 0.0)
        self._roll(now)
        self._current = max(self._current, lag)
        self._latest = lag
        self._typical += TYPICAL_WEIGHT * (lag - self._typical)
        if self._observe is not None:
            self._observe(lag)

    def behind_s(self, now: float) -> float:
        """The loop's lag at ``now``, in seconds: the largest tick delay of the current window
        and the one before, or the pending tick's delay so far when that is larger (the loop is
        late on it right now)."""
        self._roll(now)
        return max(self._current, self._previous, self._pending(now))

    def latest_s(self, now: float) -> float:
        """The loop's lag at ``now`` as its latest tick read it, or the pending tick's delay so
        far when that is larger: the lag as it is, where :meth:`behind_s` is its recent worst."""
        return max(self._latest, self._pending(now))

    def _pending(self, now: float) -> float:
        """How late the scheduled tick is at ``now`` (0 when none is scheduled or it is not
        due yet)."""
        return 0.0 if self._due is None else max(now - self._due, 0.0)

    def typical_s(self) -> float:
        """The loop's typical lag: a moving average of its ticks' (the last few dozen weigh
        most), what a request yet to be answered can expect to wait again."""
        return self._typical

    def settles_in(self, now: float) -> float:
        """Seconds from ``now`` until the reading of :meth:`behind_s` may fall: the end of the
        current window, when the ticks of the one before stop counting (0 with no lag read)."""
        if self.behind_s(now) <= 0.0:
            return 0.0
        return max(self._start + self.window_s - now, 0.0)

    def _roll(self, now: float) -> None:
        """Starts a new window when the current one is over."""
        if now - self._start < self.window_s:
            return
        self._previous = self._current if now - self._start < 2 * self.window_s else 0.0
        self._current = 0.0
        self._start = now

    def arrived(self, now: float) -> None:
        """A request arrived at ``now``: the ticks run (again) if they had stopped."""
        self._last_request = now
        if self._wake is not None and not self._wake.is_set():
            self._wake.set()

    async def watch(self, clock: Clock) -> None:
        """Ticks on the running event loop, timed on ``clock``, while requests arrive (see
        :meth:`arrived`); runs until cancelled."""
        self._wake = asyncio.Event()
        try:
            while True:
                if clock.now() - self._last_request >= self.idle_s:
                    self._forget()  # what it read is over by the time requests come back
                    self._wake.clear()
                    await self._wake.wait()
                due = self._due = clock.now() + self.interval_s
                await clock.sleep_until(due)
                self._due = None
                self.ran(due, clock.now())
        finally:
            self._due = None  # a tick that will never run is not a lag

    def _forget(self) -> None:
        """Drops every reading (the ticks stop: no lag is measured until they start again)."""
        self._current = self._previous = self._latest = self._typical = 0.0
