"""Profiling: timers and latency breakdown, analytical performance model, profile tables, reports.

- :mod:`~gnnaas.profiling.profiler`: :func:`profile_dataset` measures every variant of a dataset,
  opened through the runtime as the server opens it (the measuring in
  :mod:`~gnnaas.profiling.measurement`, the service curves' timer in
  :mod:`~gnnaas.profiling.curves`).
- :mod:`~gnnaas.profiling.perfmodel`: the analytical model of docs/architecture.md §5,
  :func:`calibrate`.
- :mod:`~gnnaas.profiling.table`: ``profiles.csv`` / ``service_times.csv`` readers and writers
  (no matplotlib, no training code: the server imports it).
- :mod:`~gnnaas.profiling.report`: :func:`write_report` (``report.md`` + plots; matplotlib is
  imported only when a report is written).
- :mod:`~gnnaas.profiling.profiles`: the profiles as the router reads them (no matplotlib, no
  training code: the server imports it, and :mod:`~gnnaas.profiling.curves` to re-time a curve).
- :mod:`~gnnaas.profiling.cacheplan`: device feature-cache planning (``gnnaas cache-plan``); the
  caches themselves are planned from its ranking by :mod:`gnnaas.runtime.caches`.

Names resolve lazily (PEP 562): importing ``gnnaas.profiling.table`` does not load the profiler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gnnaas._lazy import attach

if TYPE_CHECKING:
    from gnnaas.profiling.perfmodel import Calibration, PerfEstimate, calibrate, estimate
    from gnnaas.profiling.profiler import ProfileResult, profile_dataset
    from gnnaas.profiling.report import write_report
    from gnnaas.profiling.table import (
        has_profiles,
        read_profiles,
        read_service_times,
        write_profiles,
        write_service_times,
    )
    from gnnaas.profiling.timers import LatencyStats, StageClock, peak_memory_bytes, summarize

_SOURCES = {
    "perfmodel": ("Calibration", "PerfEstimate", "calibrate", "estimate"),
    "profiler": ("ProfileResult", "profile_dataset"),
    "report": ("write_report",),
    "table": (
        "has_profiles",
        "read_profiles",
        "read_service_times",
        "write_profiles",
        "write_service_times",
    ),
    "timers": ("LatencyStats", "StageClock", "peak_memory_bytes", "summarize"),
}

__all__ = [
    "Calibration",
    "LatencyStats",
    "PerfEstimate",
    "ProfileResult",
    "StageClock",
    "calibrate",
    "estimate",
    "has_profiles",
    "peak_memory_bytes",
    "profile_dataset",
    "read_profiles",
    "read_service_times",
    "summarize",
    "write_profiles",
    "write_report",
    "write_service_times",
]


__getattr__, __dir__, _MODULE_OF = attach(__name__, _SOURCES)
