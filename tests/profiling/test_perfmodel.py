"""The analytical model reproduces the reference example; calibration gives usable rates."""

from __future__ import annotations

import math

import pytest

from gnnaas.profiling.perfmodel import (
    Calibration,
    calibrate,
    comm_time_ms,
    comp_time_ms,
    estimate,
    input_nodes,
)

# docs/architecture.md §5: t=1024, L=2, s=25, f=128, c=0.5, b=4 B, BW=30 GB/s, OPS=0.7e12 op/s
REF = {"batch_size": 1024, "fanouts": (25, 25), "unique_frac": 0.5}
REF_CHANNELS = (128, 128, 128)  # f_0 (input), f_1 (hidden), f_2 (output) all 128


def test_reference_example() -> None:
    est = estimate(**REF, channels=REF_CHANNELS, bw=30e9, ops=0.7e12)
    assert est.num_input_nodes == pytest.approx(320_000)
    assert est.input_comm_ms == pytest.approx(5.46, abs=0.005)
    assert est.comp_ms == pytest.approx(0.375, abs=0.0005)
    assert est.output_comm_ms == pytest.approx(0.017, abs=0.0005)
    assert est.comm_ms == pytest.approx(est.input_comm_ms + est.output_comm_ms)


def test_reference_exact_terms() -> None:
    # layer 1 over c·t·s_2 = 12800 nodes, layer 2 over c·t = 512, each 25·128 + 128² + 128 ops
    per_node = 25 * 128 + 128 * 128 + 128
    expected_ms = 1e3 * (12_800 + 512) * per_node / 0.7e12
    got = comp_time_ms(1024, (25, 25), REF_CHANNELS, unique_frac=0.5, ops=0.7e12)
    assert got == pytest.approx(expected_ms, rel=1e-12)
    t_in, t_out = comm_time_ms(1024, (25, 25), 128, 128, unique_frac=0.5, bw=30e9)
    assert t_in == pytest.approx(1e3 * 320_000 * 128 * 4 / 30e9, rel=1e-12)
    assert t_out == pytest.approx(1e3 * 1024 * 128 * 4 / 30e9, rel=1e-12)


def test_fanouts_are_pyg_order() -> None:
    # PyG (25, 10): the last layer aggregates 25 neighbors of each seed, the first layer 10.
    got = comp_time_ms(100, (25, 10), (8, 4, 2), unique_frac=1.0, ops=1.0)
    layer1 = 100 * 25 * (10 * 8 + 8 * 4 + 4)
    layer2 = 100 * (25 * 4 + 4 * 2 + 2)
    assert got == pytest.approx(1e3 * (layer1 + layer2))
    assert input_nodes(100, (25, 10), 0.5) == pytest.approx(0.5 * 100 * 250)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"fanouts": (25, -1)}, "fanouts must be >= 1"),
        ({"unique_frac": 0.0}, "unique_frac must be > 0"),
        ({"batch_size": 0}, "batch_size must be >= 1"),
        ({"channels": (128, 128)}, "channels must have"),
        ({"bw": 0.0}, "bw must be a positive"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {**REF, "channels": REF_CHANNELS, "bw": 30e9, "ops": 0.7e12}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        estimate(**args)  # type: ignore[arg-type]


def test_calibrate_gives_positive_rates() -> None:
    cal = calibrate("cpu", repeats=2)
    assert isinstance(cal, Calibration)
    assert cal.device == "cpu"
    for rate in (cal.bw, cal.ops):
        assert math.isfinite(rate) and rate > 0
    # any real CPU gathers > 10 MB/s and multiply-adds > 10 M/s
    assert cal.bw > 1e7 and cal.ops > 1e7
