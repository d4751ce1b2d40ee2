"""How far behind the event loop runs: the time a request waits before the app can see it.

A server's requests, refusals and answers all pass through one event loop. When the loop has
more to do than its core can, a request's bytes wait in its socket until the loop reaches
them, and a computed answer waits again before its caller resumes: time that neither the
deadline clock (which starts when the app receives a request) nor the variants' curves (the
device's time) see. On one core at twice the sustained rate that unseen wait, not the queue,
is what made requests late (``benchmarks/results/deadlines-1node-pinned.md``).

:class:`LoopLag` measures it the way the loop itself experiences it: a tick is scheduled every
:attr:`~LoopLag.interval_s` on the loop's timer, and how late it runs is the loop's lag then.
The router counts the lag against every deadline (``Router._expires``), before admission
(:func:`~gnnaas.serving.core.deadlines.admit`) and the batches read it: the deadline is counted
from when the request is estimated to have reached the server (its arrival at the app less the
lag), and its computed answer is predicted to wait the lag again before its caller resumes
(which then writes it at once), but only the lag *beyond computing*: a tick that a batch made
late (running inline on the loop, or holding the GIL in its thread) is late for a reason the
queue's prediction already counts, so the time the device computed meanwhile
(:class:`ComputeTime`, told by the batchers) is taken off it. A high request counts the lag it
met (:meth:`LoopLag.latest_s`) and the typical lag beyond computing for its answer
(:meth:`LoopLag.typical_s`: a spike of the loop is over by the time the request is read), the
others the recent worst (:meth:`LoopLag.behind_s`) of each: while the loop falls behind, normal
and low requests, whose share of their slack the lag soon takes, are refused first, and the
refusal, applied by the protocol layer to those that follow, is the cheapest answer the server
has (``benchmarks/results/shed-cost.md``).

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
import threading
from collections.abc import Callable

from gnnaas.serving.core.clock import Clock

__all__ = ["TYPICAL_WEIGHT", "ComputeTime", "LoopLag"]

TYPICAL_WEIGHT = 0.05
"""The weight of each tick in the typical lag's moving average (:meth:`LoopLag.typical_s`)."""


class ComputeTime:
    """The device's computing time so far: the time on the clock during which at least one
    batch ran that kept the event loop from running (the batchers say when each starts and
    ends, from the thread it runs on: the time counted is the handler's own).

    A tick made late by a batch running inline on the loop, or by a batch in a worker thread
    on a CPU (its threads take the cores and the GIL the loop needs), is late for a reason the
    queue's prediction already counts; :class:`LoopLag` tells that part of its lag apart with
    this. A batch in a worker thread on an accelerator leaves the loop free: with
    ``threads_compete=False`` only inline batches count.

    Args:
        threads_compete (bool, optional): whether a batch run in a worker thread keeps the
            loop from running (a CPU device). (default: ``True``)

    Example:
        >>> busy = ComputeTime()
        >>> busy.started(1.0); busy.ended(1.004)
        >>> busy.started(1.010)
        >>> round(busy.total(1.013) * 1e3, 1)  # 4 ms done, 3 ms of the running batch
        7.0
    """

    def __init__(self, threads_compete: bool = True) -> None:
        self.threads_compete = threads_compete
        self._lock = threading.Lock()  # a worker thread ends its batches
        self._done = 0.0  # until _since
        self._since = 0.0
        self._running = 0

    def __repr__(self) -> str:
        return f"{type(self).__name__}(threads_compete={self.threads_compete})"

    def counts(self, inline: bool) -> bool:
        """Whether a batch run inline on the loop (or in a worker thread) is counted."""
        return inline or self.threads_compete

    def started(self, now: float) -> None:
        """A batch started at ``now``."""
        with self._lock:
            self._advance(now)
            self._running += 1

    def ended(self, now: float) -> None:
        """A batch that :meth:`started` ended at ``now``."""
        with self._lock:
            self._advance(now)
            self._running = max(self._running - 1, 0)

    def total(self, now: float) -> float:
        """Seconds computed up to ``now``."""
        with self._lock:
            return self._total(now)

    def _total(self, now: float) -> float:
        return self._done + (max(now - self._since, 0.0) if self._running else 0.0)

    def _advance(self, now: float) -> None:
        self._done = self._total(now)
        self._since = max(now, self._since)  # a time read before another thread's is not earlier


class _Readings:
    """One kind of tick delay: the largest of the current window and the one before, the
    latest, and a moving average."""

    __slots__ = ("current", "latest", "previous", "typical")

    def __init__(self) -> None:
        self.current = self.previous = self.latest = self.typical = 0.0

    def read(self, lag: float) -> None:
        self.current = max(self.current, lag)
        self.latest = lag
        self.typical += TYPICAL_WEIGHT * (lag - self.typical)

    def roll(self, keep_previous: bool) -> None:
        self.previous = self.current if keep_previous else 0.0
        self.current = 0.0


class LoopLag:
    """The event loop's lag: the largest delay of its ticks in the current window and the one
    before (a window starts at the first tick or reading after the last one ended).

    Each reading comes in two kinds: the whole delay, the wait a request met before the app
    could read it; and the delay *beyond computing* (``beyond_computing=True``), less the time
    the device computed meanwhile (``computing``), the wait an answer can expect on top of the
    batches the queue's prediction already counts.

    Args:
        interval_s (float, optional): the time between ticks while requests arrive.
            (default: ``0.002``)
        window_s (float, optional): how long a late tick counts: the lag read is the largest
            of the ticks in the current window and the one before. (default: ``0.02``)
        idle_s (float, optional): the ticks stop when no request has arrived for this long,
            and start again with the next one. (default: ``1.0``)
        observe (Callable[[float], None], optional): called with each tick's lag in seconds
            (a histogram's ``observe``). (default: ``None``)
        computing (Callable[[float], float], optional): the device's computing time up to a
            time on the clock (:meth:`ComputeTime.total`); a tick's delay beyond computing is
            its delay less the time computed since it was scheduled (which may start up to
            :attr:`interval_s` before it was due). (default: ``None``: every delay counts in
            full)
    """

    def __init__(
        self,
        interval_s: float = 0.002,
        window_s: float = 0.02,
        idle_s: float = 1.0,
        observe: Callable[[float], None] | None = None,
        computing: Callable[[float], float] | None = None,
    ) -> None:
        self.interval_s = interval_s
        self.window_s = window_s
        self.idle_s = idle_s
        self._observe = observe
        self._computing = computing
        self._start = -float("inf")  # when the current window began
        self._all = _Readings()  # the ticks' whole delays
        self._beyond = _Readings()  # ... less the time computed meanwhile
        self._due: float | None = None  # the pending tick's time, while one is scheduled
        self._computed = 0.0  # the computing time when the pending tick was scheduled
        self._last_request = -float("inf")
        self._wake: asyncio.Event | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(interval_s={self.interval_s}, window_s={self.window_s})"

    def ran(self, due: float, now: float, computed_s: float = 0.0) -> None:
        """Records a tick due at ``due`` that ran at ``now``, ``computed_s`` seconds of
        computing after it was scheduled."""
        lag = max(now - due, 0.0)
        self._roll(now)
        self._all.read(lag)
        self._beyond.read(max(lag - computed_s, 0.0))
        if self._observe is not None:
            self._observe(lag)

    def _kind(self, beyond_computing: bool) -> _Readings:
        return self._beyond if beyond_computing else self._all

    def behind_s(self, now: float, beyond_computing: bool = False) -> float:
        """The loop's lag at ``now``, in seconds: the largest tick delay of the current window
        and the one before, or the pending tick's delay so far when that is larger (the loop is
        late on it right now)."""
        self._roll(now)
        kind = self._kind(beyond_computing)
        return max(kind.current, kind.previous, self._pending(now, beyond_computing))

    def latest_s(self, now: float, beyond_computing: bool = False) -> float:
        """The loop's lag at ``now`` as its latest tick read it, or the pending tick's delay so
        far when that is larger: the lag as it is, where :meth:`behind_s` is its recent worst."""
        return max(self._kind(beyond_computing).latest, self._pending(now, beyond_computing))

    def _pending(self, now: float, beyond_computing: bool) -> float:
        """How late the scheduled tick is at ``now`` (0 when none is scheduled or it is not
        due yet)."""
        if self._due is None:
            return 0.0
        late = max(now - self._due, 0.0)
        if beyond_computing and self._computing is not None:
            late = max(late - (self._computing(now) - self._computed), 0.0)
        return late

    def typical_s(self, beyond_computing: bool = False) -> float:
        """The loop's typical lag: a moving average of its ticks' (the last few dozen weigh
        most); beyond computing, what a computed answer can expect to wait before its caller
        resumes (the whole reading is for diagnostics)."""
        return self._kind(beyond_computing).typical

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
        keep = now - self._start < 2 * self.window_s
        self._all.roll(keep)
        self._beyond.roll(keep)
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
        computing = self._computing or (lambda now: 0.0)
        try:
            while True:
                if clock.now() - self._last_request >= self.idle_s:
                    self._forget()  # what it read is over by the time requests come back
                    self._wake.clear()
                    await self._wake.wait()
                now = clock.now()
                self._computed = computing(now)
                due = self._due = now + self.interval_s
                await clock.sleep_until(due)
                self._due = None
                now = clock.now()
                self.ran(due, now, computing(now) - self._computed)
        finally:
            self._due = None  # a tick that will never run is not a lag

    def _forget(self) -> None:
        """Drops every reading (the ticks stop: no lag is measured until they start again)."""
        self._all, self._beyond = _Readings(), _Readings()
