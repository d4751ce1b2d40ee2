"""Profiling: timers and latency breakdown, analytical performance model, profile tables, reports.

- :mod:`~gnnaas.profiling.profiler`: :func:`profile_dataset` measures every variant of a dataset.
- :mod:`~gnnaas.profiling.perfmodel`: the analytical model of ARCHITECTURE.md §5, :func:`calibrate`.
- :mod:`~gnnaas.profiling.table`: ``profiles.csv`` / ``service_times.csv`` readers and writers
  (no matplotlib, no training code: the server imports it).
- :mod:`~gnnaas.profiling.report`: :func:`write_report` (``report.md`` + six plots; matplotlib is
  imported only when a report is written).
"""

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
