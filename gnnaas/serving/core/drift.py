"""Drift of the service curves: each variant's predicted vs measured batch time, as served.

The router predicts a batch's time from the variant's profiled service curve
(``service_times.csv``). :class:`DriftRecord` keeps, per variant, the most recent served batches as
``(batch nodes, predicted ms from the unscaled curve, measured ms)`` and summarizes how far the
curve is from what the server measures (docs/architecture.md §5: the server publishes predicted vs
measured batch time per variant). The summary is shown by ``/metrics`` and
``/v1/datasets/{dataset}/variants``.

The relative error of a batch is ``measured / predicted - 1`` (positive: slower than profiled).
Batches are also summarized per batch-size bucket (the service curve's sizes), because a curve can
be right for small batches and wrong for large ones.

Two predictions are kept per batch: the curve alone (``predicted_ms``), which shows whether the
profile is right for this variant and size, and the router's prediction (``predicted_ms`` × the
device's measured slowdown at the batch's size in force while the batch ran, before the batch
itself is folded into it: :class:`~gnnaas.serving.core.slowdown.Slowdown`, the machine's factor
times a shape per batch-size bucket; docs/architecture.md §5). The router chose the batch's
requests with the slowdown of their arrival, which differs from it by at most the batches that
finished in between. A VM whose speed moved between the profiling minute and this one moves every
curve alike, and a regime that moves every variant's large batches alike moves that bucket's
shape; the slowdown removes those, not one variant's curve of the wrong shape.

Example:
    >>> record = DriftRecord(maxlen=8)
    >>> record.add(4, predicted_ms=2.0, measured_ms=2.2, factor=1.1)
    >>> record.add(64, predicted_ms=5.0, measured_ms=4.5)
    >>> s = record.summary()
    >>> s["count"], round(s["median_abs_rel_error"], 3), round(s["median_abs_rel_error_scaled"], 3)
    (2, 0.1, 0.05)
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gnnaas.stats import median

__all__ = ["DRIFT_BUCKETS", "DriftRecord", "DriftSample"]

DRIFT_BUCKETS = (1, 4, 16, 64, 256, 1024)
"""Upper bounds (batch nodes) of the summary's buckets; larger batches go to the last one."""


@dataclass(frozen=True)
class DriftSample:
    """One served batch.

    Args:
        batch_nodes (int): target nodes in the batch.
        predicted_ms (float): the profiled curve's time for it (no load factor applied).
        measured_ms (float): the handler's wall time.
        factor (float, optional): the device's speed at the batch's size in force while it ran (the
            router's prediction is ``factor * predicted_ms``). (default: ``1.0``)
    """

    batch_nodes: int
    predicted_ms: float
    measured_ms: float
    factor: float = 1.0

    @property
    def rel_error(self) -> float:
        """``measured / predicted - 1``: the curve alone."""
        return self.measured_ms / self.predicted_ms - 1.0

    @property
    def scaled_rel_error(self) -> float:
        """``measured / (factor * predicted) - 1``: the router's prediction."""
        return self.measured_ms / (self.factor * self.predicted_ms) - 1.0


def _stats(samples: Sequence[DriftSample], jitter: float) -> dict[str, Any]:
    errors = [s.rel_error for s in samples]
    scaled = [s.scaled_rel_error for s in samples]
    return {
        "count": len(samples),
        "median_abs_rel_error": median(abs(e) for e in errors),
        "median_rel_error": median(errors),
        "median_abs_rel_error_scaled": median(abs(e) for e in scaled),
        "median_rel_error_scaled": median(scaled),
        "factor_median": median(s.factor for s in samples),
        "predicted_ms_median": median(s.predicted_ms for s in samples),
        "measured_ms_median": median(s.measured_ms for s in samples),
        "jitter": jitter,
    }


def _jitter(samples: Sequence[DriftSample]) -> float:
    """Median ``|measured / median measured of its batch size - 1|``: the scatter of batches of
    equal size, the floor of ``median_abs_rel_error`` for any curve indexed by batch size."""
    by_size: dict[int, list[float]] = {}
    for s in samples:
        by_size.setdefault(s.batch_nodes, []).append(s.measured_ms)
    devs = []
    for times in by_size.values():
        mid = median(times)
        if mid > 0:
            devs += [abs(t / mid - 1.0) for t in times]
    return median(devs) if devs else math.nan


class DriftRecord:
    """The most recent batches of one variant with their predicted and measured times.

    Args:
        maxlen (int, optional): batches kept (older ones are dropped). (default: ``512``)

    Thread-safe: batches are added on the event loop and summaries may be read by a scrape.
    """

    def __init__(self, maxlen: int = 512) -> None:
        if isinstance(maxlen, bool) or not isinstance(maxlen, int) or maxlen < 1:
            raise ValueError(f"DriftRecord: maxlen must be an integer >= 1 (got {maxlen!r})")
        self._samples: deque[DriftSample] = deque(maxlen=maxlen)
        self._lock = threading.Lock()
        self.total = 0  # batches ever added, the kept ones included

    def __len__(self) -> int:
        return len(self._samples)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kept={len(self)}, total={self.total})"

    def add(
        self, batch_nodes: int, *, predicted_ms: float, measured_ms: float, factor: float = 1.0
    ) -> None:
        """Records one batch; one with a non-positive or non-finite time or factor is ignored."""
        if not (math.isfinite(predicted_ms) and math.isfinite(measured_ms)):
            return
        if predicted_ms <= 0 or measured_ms < 0 or batch_nodes < 1:
            return
        if not (math.isfinite(factor) and factor > 0):
            return
        with self._lock:
            self._samples.append(
                DriftSample(int(batch_nodes), predicted_ms, measured_ms, float(factor))
            )
            self.total += 1

    def samples(self) -> list[DriftSample]:
        """The kept batches, oldest first."""
        with self._lock:
            return list(self._samples)

    def summary(self) -> dict[str, Any]:
        """Median errors and times over the kept batches, overall and per batch-size bucket.

        Returns:
            dict: ``count`` (kept batches), ``total`` (batches ever recorded),
            ``median_abs_rel_error``, ``median_rel_error`` (the curve alone),
            ``median_abs_rel_error_scaled``, ``median_rel_error_scaled`` (the router's
            prediction: the curve times the device's speed at its size), ``factor_median``,
            ``predicted_ms_median``,
            ``measured_ms_median``, ``jitter`` (the median deviation of a batch's measured time
            from the median of batches of the same size: how far even a perfect curve would
            be from single batches) (``None`` without batches) and ``by_batch_nodes``:
            ``{"<=B": {same keys but total}}`` for the buckets that saw batches.
        """
        samples = self.samples()
        if not samples:
            return {
                "count": 0,
                "total": self.total,
                "median_abs_rel_error": None,
                "median_rel_error": None,
                "median_abs_rel_error_scaled": None,
                "median_rel_error_scaled": None,
                "factor_median": None,
                "predicted_ms_median": None,
                "measured_ms_median": None,
                "jitter": None,
                "by_batch_nodes": {},
            }
        buckets: dict[int, list[DriftSample]] = {}
        for s in samples:
            i = min(bisect.bisect_left(DRIFT_BUCKETS, s.batch_nodes), len(DRIFT_BUCKETS) - 1)
            buckets.setdefault(DRIFT_BUCKETS[i], []).append(s)
        last = DRIFT_BUCKETS[-1]
        return {
            **_stats(samples, _jitter(samples)),
            "total": self.total,
            "by_batch_nodes": {
                (f"<={b}" if b < last else f">{DRIFT_BUCKETS[-2]}"): _stats(
                    buckets[b], _jitter(buckets[b])
                )
                for b in sorted(buckets)
            },
        }
