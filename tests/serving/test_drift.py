"""Predicted vs measured batch time per variant: the record, the lane and ``/metrics``."""

from __future__ import annotations

import pytest
import torch
from serving_fakes import FakeModel

from gnnaas.serving import Router, Settings, VariantRegistry
from gnnaas.serving.core.drift import DriftRecord
from gnnaas.serving.core.slowdown import Slowdown


def _serve(speed: Slowdown, ratios: dict[int, float], rounds: int, lookup: bool = False) -> None:
    """Batches of each size in turn, 5 in a row, each ``ratios[size]`` times its curve."""
    for _ in range(rounds):
        for nodes, ratio in ratios.items():
            for _ in range(5):
                speed.observe(ratio * 2.0, 2.0, nodes, lookup)


def test_speed_learns_a_factor_per_batch_size() -> None:
    """Large batches 1.5x their curve and small ones as profiled, served in turn (a 2-thread
    server off its curve's regime): one factor would swing between them; each size is predicted
    at its own, and the machine's factor is their geometric mean."""
    speed = Slowdown(alpha=0.2)
    assert speed.at(1) == speed.at(4096) == speed.factor == 1.0
    _serve(speed, {16: 1.0, 256: 1.5}, rounds=40)
    assert speed.at(16) == pytest.approx(1.0, rel=0.03)
    assert speed.at(256) == pytest.approx(1.5, rel=0.03)
    assert speed.at(200) == speed.at(256) and speed.at(8) == speed.at(16)  # same buckets
    assert speed.factor == pytest.approx(1.5**0.5, rel=0.03)
    assert speed.at(1024) == speed.factor  # a size never served: the machine's factor
    # The machine slows down 2x, seen on small batches only: large ones are predicted slower too.
    _serve(speed, {16: 2.0}, rounds=6)
    assert speed.at(16) == pytest.approx(2.0, rel=0.05)
    assert speed.at(256) > 1.5 * 1.6
    speed.reset(0.5)
    assert speed.at(16) == speed.at(256) == speed.factor == 0.5


def test_speed_of_lookups_is_their_own() -> None:
    """A precomputed variant's lookups (Python work, not compute) keep their own shape and do
    not move the machine's factor."""
    speed = Slowdown(alpha=0.2)
    _serve(speed, {64: 0.7}, rounds=10)
    factor = speed.factor
    _serve(speed, {64: 1.1}, rounds=10, lookup=True)
    assert speed.factor == factor
    assert speed.at(64) == pytest.approx(0.7, rel=0.03)
    assert speed.at(64, lookup=True) == pytest.approx(1.1, rel=0.03)
    speed.observe(3.0, 0.0, 64)  # no profiled time: nothing to learn
    speed.observe(float("nan"), 1.0, 64)
    assert speed.factor == factor


def test_speed_shrugs_off_one_stalled_batch_and_follows_a_lasting_change() -> None:
    speed = Slowdown(alpha=0.2)
    _serve(speed, {64: 1.0}, rounds=4)
    speed.observe(1e6, 1.0, 64)  # one batch stalled (a page fault, a descheduled thread)
    assert 1.0 < speed.at(64) < 1.1
    speed.observe(0.0, 1.0, 64)
    assert speed.at(64) == pytest.approx(1.0, rel=0.01)
    _serve(speed, {64: 2.0}, rounds=6)  # the machine is twice as slow from now on
    assert speed.at(64) == pytest.approx(2.0, rel=0.05)


def test_empty_record() -> None:
    summary = DriftRecord().summary()
    assert summary["count"] == 0 and summary["median_abs_rel_error"] is None
    assert summary["by_batch_nodes"] == {}


def test_summary_overall_and_by_batch_size() -> None:
    record = DriftRecord(maxlen=16)
    for predicted, measured in ((1.0, 1.2), (1.0, 0.9), (1.0, 1.1)):
        record.add(1, predicted_ms=predicted, measured_ms=measured)
    record.add(50, predicted_ms=10.0, measured_ms=20.0)
    record.add(3000, predicted_ms=100.0, measured_ms=100.0)
    s = record.summary()
    assert s["count"] == s["total"] == 5
    assert s["median_abs_rel_error"] == pytest.approx(0.1)
    assert s["median_rel_error"] == pytest.approx(0.1)
    assert s["measured_ms_median"] == pytest.approx(1.2)
    by = s["by_batch_nodes"]
    assert list(by) == ["<=1", "<=64", ">256"]
    assert by["<=1"]["count"] == 3 and by["<=1"]["median_abs_rel_error"] == pytest.approx(0.1)
    assert by["<=64"]["median_rel_error"] == pytest.approx(1.0)  # twice as slow as profiled
    assert by[">256"]["median_abs_rel_error"] == 0.0


def test_the_routers_prediction_carries_the_device_factor() -> None:
    record = DriftRecord()
    # The machine runs 25% slower than profiled, alike for every size: the curve alone is 25%
    # off, the router's prediction (curve x factor 1.25) is right.
    for nodes, predicted in ((1, 2.0), (16, 4.0), (256, 20.0)):
        record.add(nodes, predicted_ms=predicted, measured_ms=1.25 * predicted, factor=1.25)
    s = record.summary()
    assert s["median_abs_rel_error"] == pytest.approx(0.25)
    assert s["median_abs_rel_error_scaled"] == pytest.approx(0.0)
    assert s["factor_median"] == 1.25
    # A curve of the wrong shape stays wrong with the factor: one size 2x slow.
    record.add(16, predicted_ms=4.0, measured_ms=10.0, factor=1.25)
    assert record.summary()["by_batch_nodes"]["<=16"]["median_rel_error_scaled"] == pytest.approx(
        0.5
    )
    record.add(1, predicted_ms=1.0, measured_ms=1.0, factor=0.0)  # no usable factor
    assert record.total == 4


def test_record_is_bounded_and_skips_unusable_batches() -> None:
    record = DriftRecord(maxlen=3)
    for i in range(5):
        record.add(4, predicted_ms=1.0, measured_ms=1.0 + i)
    record.add(4, predicted_ms=0.0, measured_ms=1.0)  # no profiled time
    record.add(4, predicted_ms=float("nan"), measured_ms=1.0)
    assert len(record) == 3 and record.total == 5
    assert [s.measured_ms for s in record.samples()] == [3.0, 4.0, 5.0]
    with pytest.raises(ValueError, match=r"DriftRecord: maxlen must be an integer >= 1 \(got 0\)"):
        DriftRecord(maxlen=0)


async def test_lane_records_served_batches_and_metrics_show_them(
    toy: tuple[VariantRegistry, dict[str, FakeModel]],
) -> None:
    router = Router(toy[0], Settings(warmup=False))
    await router.start()
    try:
        ds = router.registry.get("toy")
        assert ds is not None
        lane = router.lane("toy", "sage-lasso-2x")
        assert lane.drift_summary()["count"] == 0
        for n in (1, 3, 32):
            await router.predict(ds, torch.arange(n), pinned="sage-lasso-2x")
        summary = lane.drift_summary()
        curve = ds.variants["sage-lasso-2x"].profile
        assert curve is not None
        assert summary["count"] == 3
        predicted = sorted(s.predicted_ms for s in lane.drift.samples())
        # unscaled profiled curve {1: 2, 32: 4}: what the batches were predicted to take
        assert predicted == pytest.approx([2.0, 2.0 + 2.0 * 2 / 31, 4.0])
        assert summary["measured_ms_median"] > 0
        # Each batch also keeps the device factor the router predicted it with: the factor
        # before the batch, so the first batch of a fresh router was predicted at 1.0.
        factors = [s.factor for s in lane.drift.samples()]
        assert factors[0] == 1.0 and factors[1:] != [1.0, 1.0]
        assert lane.slowdown_at(32) not in factors  # the last batch moved it again
        assert router.lane("toy", "sage-full-1x").drift_summary()["count"] == 0
        text = router.metrics.render().decode()
    finally:
        await router.stop()
    labels = 'dataset="toy",variant="sage-lasso-2x"'
    assert f"gnnaas_batch_predicted_seconds_count{{{labels}}} 3.0" in text
    assert f"gnnaas_batch_measured_seconds_count{{{labels}}} 3.0" in text
    rel = 'gnnaas_batch_time_rel_error{dataset="toy",stat="median_abs",variant="sage-lasso-2x"}'
    assert rel in text
    assert rel.replace("median_abs", "median_abs_scaled") in text
    assert f"gnnaas_batch_time_samples{{{labels}}} 3.0" in text
    assert 'gnnaas_batch_time_samples{dataset="toy",variant="sage-full-1x"} 0.0' in text


def test_jitter_is_the_scatter_of_equal_sizes_whatever_the_curve() -> None:
    record = DriftRecord()
    for measured in (9.0, 10.0, 11.0, 10.0, 10.0):  # size 4: median 10, deviations 0.1,0,0.1,0,0
        record.add(4, predicted_ms=20.0, measured_ms=measured)  # a curve 2x off
    for measured in (1.0, 1.0, 1.5):  # size 64: median 1, deviations 0, 0, 0.5
        record.add(64, predicted_ms=1.0, measured_ms=measured)
    s = record.summary()
    assert s["jitter"] == pytest.approx(0.0)  # median of [.1, 0, .1, 0, 0, 0, 0, .5]
    assert s["by_batch_nodes"]["<=4"]["jitter"] == pytest.approx(0.0)
    assert s["by_batch_nodes"]["<=4"]["median_abs_rel_error"] == pytest.approx(0.5)
    assert s["by_batch_nodes"]["<=64"]["jitter"] == pytest.approx(0.0)
    record.add(64, predicted_ms=1.0, measured_ms=2.0)  # 1, 1, 1.5, 2: median 1.25
    assert record.summary()["by_batch_nodes"]["<=64"]["jitter"] == pytest.approx(0.2)
    assert DriftRecord().summary()["jitter"] is None
