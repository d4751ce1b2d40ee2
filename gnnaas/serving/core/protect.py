"""Keeping high priority within its deadlines: how many normal and low requests admission lets in.

Deadline admission (:func:`~gnnaas.serving.core.deadlines.admit`) predicts a request's wait from
the work queued on the device. It does not see what every admitted request costs the server
beyond its batch: reading it, deciding, writing its answer, on the one event loop that also reads
the high-priority requests. On a server with one core for that loop, lower-priority requests
admitted on a short queue can still fill the loop, and high-priority ones then miss their
deadlines before the queue shows anything (``benchmarks/results/deadlines-1node*.md``).

So admission also holds a rate for the normal and the low requests with a deadline of each
dataset, moved by the one signal that matters (additive increase, multiplicative decrease): a
high-priority request that misses its deadline (expired in the queue, answered late, or shed at
admission) while the event loop's recent lag beyond computing is a share of it
(:data:`LAG_SHARE`; a miss on a device busy with its own batches is what admission predicts, and
cutting the lower priorities would not help it) cuts the rate of low to :data:`CUT`\\ [``low``]
of what it was admitted at, and that of normal to :data:`CUT`\\ [``normal``] of its own (low
harder than normal); the misses of requests already on their way when it cut (within twice the
missed request's deadline) count as that one.
Each rate then grows back by what it was admitted at before the cut in :data:`RECOVERY_S`, so a
load that returns to what overloaded the loop is probed again, not at once, and a limit grown to
twice what is admitted is lifted. Without a miss there is no limit; without high-priority traffic
there is never one.

A request over its priority's rate is refused as shed for higher-priority traffic (503, cause
``evicted``); the router writes the refusal in its shed book until the next request of that
priority may pass, so the edge refuses the others before reading them
(:mod:`gnnaas.serving.core.shedding`). Plain Python on the router's clock, no I/O; one object per
router, read and written on the event loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["CUT", "LAG_SHARE", "RATE_WINDOW_S", "RECOVERY_S", "LowerRates"]

CUT = {"normal": 0.75, "low": 0.5}
"""What a high-priority miss leaves of each lower priority's admitted rate."""
RECOVERY_S = 8.0
"""Seconds for a cut rate to grow back by what it was admitted at before the cut."""
RATE_WINDOW_S = 1.0
"""Time constant of the measured admitted rate (an exponentially weighted rate)."""
LAG_SHARE = 0.25
"""A high-priority miss cuts only when the event loop's recent lag beyond the device's computing
(its own work: reading, deciding, answering) is at least this share of the deadline: that work is
what admission does not see; a batch's time it predicts."""
_BURST_S = 0.02  # a limited priority may pass this many seconds' worth of requests at once
_MIN_RATE = 10.0  # requests per second a cut starts from and a limit grows back by, at least
_LIFTED = 2.0  # a limit this many times the admitted rate no longer limits: it is lifted
_MAX_WAIT_S = 0.1  # a refusal holds at most this long: admission then decides again
# Misses within this many of the missed request's deadlines after a cut count as that cut: the
# requests then on their way (in the queue, or waiting for the loop to read them) were admitted
# before it, and a cut takes about a deadline to show.
_CALM_DEADLINES = 2.0


@dataclass
class _Stream:
    """One lower priority of one dataset: its admitted rate, its limit and its tokens."""

    rate: float = 0.0  # admitted per second, measured
    at: float = -math.inf  # when ``rate`` was last moved
    limit: float = math.inf  # admitted per second allowed (inf: no limit)
    rise: float = 0.0  # per second, per second: how fast ``limit`` grows back
    tokens: float = 0.0
    filled: float = -math.inf  # when ``tokens`` and ``limit`` were last moved

    def measured(self, now: float) -> float:
        """The admitted rate at ``now`` (decayed since the last admission)."""
        return self.rate * math.exp(-(now - self.at) / RATE_WINDOW_S)

    def advance(self, now: float) -> None:
        """Grows the limit back and refills the tokens up to ``now``; a limit grown to well
        above what is admitted is lifted."""
        dt = now - self.filled
        if dt <= 0 or math.isinf(self.limit):
            self.filled = max(self.filled, now)
            return
        self.limit += self.rise * dt
        self.tokens = min(self.tokens + self.limit * dt, max(1.0, self.limit * _BURST_S))
        self.filled = now
        if self.limit > _LIFTED * max(self.measured(now), _MIN_RATE):
            self.limit, self.rise = math.inf, 0.0


class LowerRates:
    """The admitted rates of normal and low requests per dataset, cut when a high one misses.

    Example:
        >>> rates = LowerRates()
        >>> rates.wait_s("d", "low", 0.0)  # no miss yet: no limit
        0.0
    """

    def __init__(self) -> None:
        self._streams: dict[tuple[str, str], _Stream] = {}
        self._calm_at: dict[str, float] = {}  # per dataset: misses before this are one cut

    def _stream(self, dataset: str, priority: str) -> _Stream:
        key = (dataset, priority)
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = _Stream()
        return stream

    def limit(self, dataset: str, priority: str, now: float) -> float:
        """Requests per second of ``priority`` admitted on ``dataset`` at most (inf: no limit)."""
        stream = self._streams.get((dataset, priority))
        if stream is None:
            return math.inf
        stream.advance(now)
        return stream.limit

    def limits(self, now: float) -> list[tuple[str, str, float]]:
        """``(dataset, priority, limit)`` of every lower-priority stream admission has seen, the
        limit in requests per second at ``now`` (inf: none holds)."""
        out = []
        for (dataset, priority), stream in list(self._streams.items()):
            stream.advance(now)
            out.append((dataset, priority, stream.limit))
        return out

    def wait_s(self, dataset: str, priority: str, now: float) -> float:
        """``0.0`` when a request of ``priority`` may be admitted on ``dataset`` at ``now`` (it
        is then counted), else the seconds until the next one may, at most a tenth of a second
        (it is refused). High priority is never limited."""
        if priority not in CUT:
            return 0.0
        stream = self._stream(dataset, priority)
        stream.advance(now)
        if not math.isinf(stream.limit):
            if stream.tokens < 1.0:
                if stream.limit * _MAX_WAIT_S <= 1.0 - stream.tokens:
                    return _MAX_WAIT_S
                return (1.0 - stream.tokens) / stream.limit
            stream.tokens -= 1.0
        stream.rate = stream.measured(now) + 1.0 / RATE_WINDOW_S
        stream.at = now
        return 0.0

    def missed(self, dataset: str, now: float, deadline_s: float, lag_s: float) -> bool:
        """A high-priority request of ``dataset`` with a deadline of ``deadline_s`` missed it at
        ``now``, the event loop's recent lag beyond computing being ``lag_s``: cuts the lower
        priorities' rates, unless that lag is under :data:`LAG_SHARE` of the deadline (the
        device's own load made it miss, which admission predicts) or a cut less than two
        ``deadline_s`` ago already counted the requests then on their way. Returns whether it
        cut."""
        if lag_s < LAG_SHARE * deadline_s or now < self._calm_at.get(dataset, -math.inf):
            return False
        self._calm_at[dataset] = now + _CALM_DEADLINES * deadline_s
        for priority, cut in CUT.items():
            stream = self._stream(dataset, priority)
            stream.advance(now)
            # From what was admitted (a loop that stalled admitted little: at least a floor),
            # growing back at least as fast as after the first cut of this episode.
            before = max(min(stream.limit, stream.measured(now)), _MIN_RATE)
            stream.limit = cut * before
            stream.rise = max(stream.rise, before / RECOVERY_S)
            stream.tokens = min(stream.tokens, 1.0)
        return True

    def clear(self) -> None:
        """Forgets every limit (the served set was replaced)."""
        self._streams.clear()
        self._calm_at.clear()
