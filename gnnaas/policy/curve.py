"""A variant's service curve: its profiled batch time as a function of the batch size.

The router's cost model (docs/architecture.md §5, ``service_times.csv``): one point per profiled
batch size, piecewise-linear between them and beyond the last. Every decision predicts a few
curves, so a curve computes its segments' slopes once.

Example:
    >>> curve = ServiceCurve.from_points({1: 1.0, 32: 4.1})
    >>> round(curve.predict(64), 1), curve.predict_batched(64, max_batch=32)
    (7.3, 8.2)
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["ServiceCurve"]


@dataclass(frozen=True)
class ServiceCurve:
    """Profiled service time of one variant as a function of the batch size.

    Args:
        batch_sizes (tuple[int, ...]): strictly increasing batch sizes (target nodes), e.g.
            ``(1, 32, 256, 1024)``.
        times_ms (tuple[float, ...]): the service time (ms) at each batch size.

    A single point predicts a constant time below its batch size and a proportional one above.
    """

    batch_sizes: tuple[int, ...]
    times_ms: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.batch_sizes) == 0 or len(self.batch_sizes) != len(self.times_ms):
            raise ValueError(
                "ServiceCurve needs as many times_ms as batch_sizes, at least one "
                f"(got {len(self.batch_sizes)} batch sizes, {len(self.times_ms)} times)"
            )
        if any(b <= 0 for b in self.batch_sizes) or any(
            b1 >= b2 for b1, b2 in zip(self.batch_sizes, self.batch_sizes[1:], strict=False)
        ):
            raise ValueError(
                f"ServiceCurve batch_sizes must be positive and increasing (got {self.batch_sizes})"
            )
        if any(not math.isfinite(t) or t < 0 for t in self.times_ms):
            raise ValueError(f"ServiceCurve times_ms must be finite and >= 0 (got {self.times_ms})")
        # Every request predicts a few curves: each segment's slope once, here.
        bs, ts = self.batch_sizes, self.times_ms
        slopes = tuple((ts[i] - ts[i - 1]) / (bs[i] - bs[i - 1]) for i in range(1, len(bs)))
        object.__setattr__(self, "_slopes", (0.0, *slopes))
        object.__setattr__(self, "_last", len(bs) - 1)

    @classmethod
    def from_points(cls, points: Mapping[int, float]) -> ServiceCurve:
        """Builds a curve from ``{batch_size: time_ms}`` in any order."""
        items = sorted(points.items())
        return cls(tuple(int(b) for b, _ in items), tuple(float(t) for _, t in items))

    def predict(self, batch_size: float) -> float:
        """Predicted service time (ms) for ``batch_size`` target nodes, never negative."""
        bs, ts, last = self.batch_sizes, self.times_ms, self._last  # type: ignore[attr-defined]
        if last == 0:
            return ts[0] if batch_size <= bs[0] else ts[0] * batch_size / bs[0]
        # Segment [i - 1, i] that holds batch_size, clamped to the first/last for extrapolation.
        i = bisect.bisect_left(bs, batch_size)
        if i < 1:
            i = 1
        elif i > last:
            i = last
        t = ts[i - 1] + self._slopes[i] * (batch_size - bs[i - 1])  # type: ignore[attr-defined]
        return t if t > 0.0 else 0.0

    def bends(self) -> tuple[int, ...]:
        """The whole batch sizes on either side of where an extrapolation reaches zero: below
        the first point (a rising first segment) or beyond the last (a falling last one),
        :meth:`predict` stops being linear there (it is never negative). Between the points,
        never negative themselves, it cannot; a single point never does."""
        bs, ts, last = self.batch_sizes, self.times_ms, self._last  # type: ignore[attr-defined]
        slopes = self._slopes  # type: ignore[attr-defined]
        out: list[int] = []
        if last == 0:
            return ()
        first, end = slopes[1], slopes[last]
        if first > 0 and (zero := bs[0] - ts[0] / first) >= 1:
            out += (math.floor(zero), math.ceil(zero))
        if end < 0:
            zero = bs[last] - ts[last] / end
            out += (math.floor(zero), math.ceil(zero))
        return tuple(out)

    def predict_batched(self, nodes: int, max_batch: int | None = None) -> float:
        """Time (ms) to serve ``nodes`` in batches of at most ``max_batch`` (0 for no nodes)."""
        if nodes <= 0:
            return 0.0
        if max_batch is None or nodes <= max_batch:
            return self.predict(nodes)
        full, rest = divmod(nodes, max_batch)
        return full * self.predict(max_batch) + (self.predict(rest) if rest else 0.0)

    def scaled(self, factor: float) -> ServiceCurve:
        """The same curve with every time multiplied by ``factor``."""
        return ServiceCurve(self.batch_sizes, tuple(t * factor for t in self.times_ms))
