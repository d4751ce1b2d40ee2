"""Stage clocks, percentile summaries and peak memory."""

from __future__ import annotations

import pytest
import torch

from gnnaas.profiling.timers import StageClock, peak_memory_bytes, summarize


def test_summarize_orders_percentiles() -> None:
    stats = summarize([5.0, 1.0, 3.0, 2.0, 4.0, 100.0])
    assert stats.p50 == pytest.approx(3.5)
    assert stats.p50 <= stats.p95 <= stats.p99 <= 100.0
    assert stats.count == 6
    assert stats.std > 0


def test_summarize_rejects_empty() -> None:
    with pytest.raises(ValueError, match="at least one timing"):
        summarize([])


def test_stage_clock_accumulates() -> None:
    clock = StageClock("cpu")
    with clock.stage("a"):
        torch.ones(10).sum()
    with clock.stage("a"):
        pass
    with clock.stage("b"):
        pass
    assert set(clock.times_ms) == {"a", "b"}
    assert all(v >= 0 for v in clock.times_ms.values())


def test_peak_memory_counts_new_allocations_only() -> None:
    x = torch.randn(1000, 100)  # exists before: not counted

    def work() -> torch.Tensor:
        y = x[:500] * 2  # 200 kB
        return y.sum()

    peak = peak_memory_bytes(work, "cpu")
    assert 500 * 100 * 4 <= peak < 2 * 500 * 100 * 4
