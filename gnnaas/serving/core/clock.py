"""The time the serving core decides by: one clock, read and waited on.

What depends on time in the serving core (how long a batch waits for batch-mates, aging,
deadlines, a batch's measured time, the catalog's grace periods) reads one :class:`Clock`, given
to it when it is built, and waits with :meth:`Clock.timeout_at` rather than on the event loop's
own timer. A server runs on :data:`MONOTONIC` (``time.monotonic()`` and the event loop's timers).
Tests and simulations run on a :class:`FakeClock`, which stands still until it is told to
:meth:`~FakeClock.advance`: what they check never depends on how fast the machine runs, and they
never sleep. A batch handler that advances a fake clock "takes" that long, as far as the batcher
and the router can tell.

Example:
    >>> clock = FakeClock()
    >>> clock.advance(0.25)
    >>> clock.now()
    0.25
"""

from __future__ import annotations

import asyncio
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType

__all__ = ["MONOTONIC", "Clock", "FakeClock", "MonotonicClock"]


class Clock(ABC):
    """Seconds on a monotonic scale (only differences mean anything), and timeouts on them."""

    real = False
    """Whether the clock is the machine's time, what the event loop's own timer runs on (the
    server's clock), rather than a test's or a simulation's."""

    @abstractmethod
    def now(self) -> float:
        """The time now, in seconds."""

    @abstractmethod
    def timeout_at(self, when: float | None) -> AbstractAsyncContextManager[object]:
        """Like :func:`asyncio.timeout_at`, at ``when`` on this clock: the block is cancelled once
        the clock reads ``when`` (at once if it already does) and :class:`TimeoutError` is raised.

        Args:
            when (float, optional): the time the block must end by; ``None``: no limit.
        """

    def timeout(self, delay_s: float | None) -> AbstractAsyncContextManager[object]:
        """:meth:`timeout_at` ``delay_s`` from now (``None``: no limit)."""
        return self.timeout_at(None if delay_s is None else self.now() + delay_s)

    async def sleep_until(self, when: float) -> None:
        """Returns once the clock reads ``when`` (at the next turn of the loop if it does)."""
        try:
            async with self.timeout_at(when):
                await asyncio.get_running_loop().create_future()  # never resolved
        except TimeoutError:
            pass


class MonotonicClock(Clock):
    """``time.monotonic()``, with timeouts on the running event loop's timer."""

    real = True

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    now = staticmethod(time.monotonic)
    """``time.monotonic()`` itself (read on every request: no Python frame around it)."""

    def timeout_at(self, when: float | None) -> AbstractAsyncContextManager[object]:
        """:func:`asyncio.timeout` for the time left until ``when``."""
        return asyncio.timeout(None if when is None else when - time.monotonic())

    async def sleep_until(self, when: float) -> None:
        """:func:`asyncio.sleep` until ``when`` (the event loop's timer)."""
        await asyncio.sleep(max(when - time.monotonic(), 0.0))


MONOTONIC = MonotonicClock()
"""The clock a server runs on."""


class FakeClock(Clock):
    """A clock that stands still until :meth:`advance` moves it; timeouts on it fire when it
    passes them. For tests and simulations.

    It may be advanced from any thread (a batch handler in a worker thread, a test's thread
    beside a server's event loop): the timeouts it passes fire on their own event loops.

    Args:
        start (float, optional): its first reading. (default: ``0.0``)
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._lock = threading.Lock()
        self._pending: set[_FakeTimeout] = set()  # entered, neither fired nor left
        # (count, its loop, its future): callers of `waiting` not yet satisfied
        self._watchers: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def __repr__(self) -> str:
        return f"{type(self).__name__}(now={self._now!r}, waiting={len(self._pending)})"

    def now(self) -> float:
        """Its reading: ``start`` plus every :meth:`advance` so far."""
        return self._now

    @property
    def pending(self) -> int:
        """How many timeouts wait on it now (entered, neither passed nor left)."""
        return len(self._pending)

    def advance(self, seconds: float) -> None:
        """Moves the clock ``seconds`` forward; the timeouts it reaches fire.

        Raises:
            ValueError: ``seconds`` is negative (or NaN): a monotonic clock never goes back.
        """
        if not seconds >= 0:
            raise ValueError(f"FakeClock.advance: seconds must be >= 0 (got {seconds})")
        with self._lock:
            self._now += seconds
            due = [t for t in self._pending if t.when is not None and t.when <= self._now]
            self._pending.difference_update(due)
        for timeout in due:
            timeout.fire()

    def timeout_at(self, when: float | None) -> AbstractAsyncContextManager[object]:
        """A timeout that fires when :meth:`advance` reaches ``when``."""
        return _FakeTimeout(self, when)

    async def waiting(self, count: int = 1) -> None:
        """Returns once at least ``count`` timeouts wait on this clock: the code under test
        has come to a point where only time passing moves it on, and a test may advance."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if len(self._pending) >= count:
                return
            reached: asyncio.Future[None] = loop.create_future()
            self._watchers.append((count, loop, reached))
        await reached

    def _enter(self, timeout: _FakeTimeout, when: float) -> bool:
        """Registers ``timeout``, due at ``when``; ``True`` when it is due already."""
        with self._lock:
            if when <= self._now:
                return True
            self._pending.add(timeout)
            n = len(self._pending)
            reached = [w for w in self._watchers if w[0] <= n]
            self._watchers = [w for w in self._watchers if w[0] > n]
        for _, loop, future in reached:
            _call_soon(loop, _resolve, future)
        return False

    def _leave(self, timeout: _FakeTimeout) -> None:
        with self._lock:
            self._pending.discard(timeout)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _call_soon(
    loop: asyncio.AbstractEventLoop, callback: Callable[..., object], *args: object
) -> None:
    """``loop.call_soon_threadsafe``, except that a loop already closed is left alone (a test
    that ended with a timeout still entered)."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        if not loop.is_closed():
            raise


class _FakeTimeout:
    """:func:`asyncio.timeout` (the cancellation and the :class:`TimeoutError`), fired by a
    :class:`FakeClock` instead of the event loop's timer."""

    def __init__(self, clock: FakeClock, when: float | None) -> None:
        self.when = when
        self._clock = clock
        self._inner: asyncio.Timeout | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._left = False

    async def __aenter__(self) -> _FakeTimeout:
        self._loop = asyncio.get_running_loop()
        self._inner = asyncio.timeout(None)
        await self._inner.__aenter__()
        if self.when is not None and self._clock._enter(self, self.when):
            self._expire()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._left = True
        self._clock._leave(self)
        if self._inner is not None:  # raises TimeoutError when it fired
            await self._inner.__aexit__(exc_type, exc, tb)

    def fire(self) -> None:
        """Expires the block (from any thread)."""
        if self._loop is not None:
            _call_soon(self._loop, self._expire)

    def _expire(self) -> None:
        if not self._left and self._inner is not None and self._loop is not None:
            self._inner.reschedule(self._loop.time())  # due now: cancels on the next turn
