"""Timing and memory helpers of the profiler: synchronized clocks, percentiles, peak memory.

On CUDA every clock reading is preceded by ``torch.cuda.synchronize`` (synchronize-then-clock,
docs/architecture.md §5), so a stage's time covers the kernels it launched. On the CPU the work is
synchronous and the clock is read directly.

Example:
    >>> clock = StageClock("cpu")
    >>> with clock.stage("sample"):
    ...     _ = sum(range(1000))
    >>> sorted(clock.times_ms)
    ['sample']
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from gnnaas.stats import percentile
from gnnaas.typing import Device

__all__ = ["LatencyStats", "StageClock", "peak_memory_bytes", "summarize", "synchronize"]


def synchronize(device: Device) -> None:
    """Waits for the device's queued work (a no-op on the CPU)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)  # intended sync: the clock must see finished kernels


class StageClock:
    """Times named stages of one run, synchronizing the device at both ends of each.

    Args:
        device (str or torch.device): the device whose work is timed.

    Example:
        >>> clock = StageClock("cpu")
        >>> with clock.stage("comp"):
        ...     pass
        >>> clock.times_ms["comp"] >= 0
        True
    """

    def __init__(self, device: Device) -> None:
        self.device = torch.device(device)
        self.times_ms: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Adds the wall time of the ``with`` body to ``times_ms[name]``."""
        synchronize(self.device)
        start = time.perf_counter_ns()
        try:
            yield
        finally:
            synchronize(self.device)
            elapsed_ms = (time.perf_counter_ns() - start) / 1e6
            self.times_ms[name] = self.times_ms.get(name, 0.0) + elapsed_ms


@dataclass(frozen=True)
class LatencyStats:
    """Summary of repeated timings, in ms.

    Args:
        p50 (float): median.
        p95 (float): 95th percentile.
        p99 (float): 99th percentile.
        mean (float): mean.
        std (float): population standard deviation.
        count (int): number of samples.
    """

    p50: float
    p95: float
    p99: float
    mean: float
    std: float
    count: int


def summarize(samples_ms: Sequence[float]) -> LatencyStats:
    """Percentiles (:func:`gnnaas.stats.percentile`), mean and std of timings.

    Args:
        samples_ms (Sequence[float]): one timing per run, in ms.

    Returns:
        LatencyStats: the summary; ``p50 <= p95 <= p99`` always holds.

    Example:
        >>> summarize([1.0, 2.0, 3.0]).p50
        2.0
    """
    if len(samples_ms) == 0:
        raise ValueError("summarize: samples_ms must hold at least one timing (got none)")
    arr = np.asarray(samples_ms, dtype=np.float64)
    return LatencyStats(
        p50=percentile(arr, 50),
        p95=percentile(arr, 95),
        p99=percentile(arr, 99),
        mean=float(arr.mean()),
        std=float(arr.std()),
        count=int(arr.size),
    )


@contextmanager
def _quiet_stderr_fd() -> Iterator[None]:
    """Silences file descriptor 2 (C++ writes) for the body; Python objects are untouched.

    torch's profiler (kineto) prints a ``USDT ... profiler_start/stop`` line to fd 2 at each start
    and stop, which would interleave with progress bars; only those two calls are wrapped.
    """
    try:
        sys.stderr.flush()
    except (AttributeError, ValueError):
        pass
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _cpu_peak_bytes(fn: Callable[[], object]) -> int:
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _quiet_stderr_fd():
        prof.start()
    try:
        fn()
    finally:
        with _quiet_stderr_fd():
            prof.stop()
    results = prof.profiler.kineto_results if prof.profiler is not None else None
    if results is None:
        return 0
    # Allocation (+) and free (-) records in time order; the running sum's maximum is the peak
    # of memory allocated during fn() over what was allocated before it.
    deltas = sorted(
        (int(event.start_ns()), int(event.nbytes()))  # type: ignore[attr-defined]  # not in stubs
        for event in results.events()
        if event.name() == "[memory]"
    )
    current = peak = 0
    for _, nbytes in deltas:
        current += nbytes
        peak = max(peak, current)
    return peak


def peak_memory_bytes(fn: Callable[[], object], device: Device) -> int:
    """Peak bytes newly allocated while ``fn()`` runs (inputs, activations, outputs).

    On CUDA: ``torch.cuda.max_memory_allocated`` after a reset, minus what was allocated before.
    On the CPU: torch's profiler memory accounting (``profile_memory=True``): the maximum of the
    running sum of the allocation and free records taken during the call. Tensors that ``fn``
    keeps alive count; tensors that existed before it (the model's weights, the feature matrix)
    do not.

    Args:
        fn (Callable[[], object]): the work, e.g. one batch of gather + forward.
        device (str or torch.device): where ``fn`` runs.

    Returns:
        int: peak allocated bytes (``>= 0``).
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
        fn()
        synchronize(dev)
        return max(0, int(torch.cuda.max_memory_allocated(dev)) - int(base))
    return max(0, _cpu_peak_bytes(fn))
