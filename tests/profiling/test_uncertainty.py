"""Accuracy intervals, paired differences to the best, and the tolerance rule."""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

import numpy as np
import pytest

from gnnaas.policy import LOSS_MARGIN, admissible
from gnnaas.profiling.uncertainty import (
    INTERVAL_COLUMNS,
    accuracy_interval,
    add_accuracy_intervals,
    bootstrap_accuracies,
    paired_bootstrap,
    wilson_interval,
)

N_NODES = 5000


def _flip(correct: np.ndarray, lose: int, gain: int, rng: np.random.Generator) -> np.ndarray:
    """``correct`` with ``lose`` right answers turned wrong and ``gain`` wrong ones right."""
    out = correct.copy()
    right, wrong = np.flatnonzero(correct), np.flatnonzero(~correct)
    out[rng.choice(right, lose, replace=False)] = False
    out[rng.choice(wrong, gain, replace=False)] = True
    return out


@pytest.fixture(scope="module")
def planted() -> dict[str, np.ndarray]:
    """5000 nodes: best 90%, a near copy (0.5% of nodes differ), 3 and 8 points worse."""
    rng = np.random.default_rng(7)
    best = np.zeros(N_NODES, dtype=bool)
    best[rng.choice(N_NODES, 4500, replace=False)] = True
    return {
        "best": best,
        "near": _flip(best, 13, 12, rng),  # 25 nodes differ: 89.98 %
        "worse3": _flip(best, 250, 100, rng),  # 87.0 %, 350 nodes differ
        "worse8": _flip(best, 550, 150, rng),  # 82.0 %
    }


def _rows_and_parts(
    variants: dict[str, np.ndarray], split: str = "val"
) -> tuple[list[dict[str, Any]], dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]]:
    rows = [
        {"variant": v, "split": split, "accuracy": 100 * c.mean(), "latency_ms": float(i)}
        for i, (v, c) in enumerate(variants.items())
    ]
    parts = {(v, split): (c.astype(float), np.ones(c.size)) for v, c in variants.items()}
    return rows, parts


@pytest.mark.parametrize(
    ("k", "n", "lo", "hi"),
    [
        (8, 10, 49.016, 94.332),
        (0, 10, 0.0, 27.753),
        (10, 10, 72.247, 100.0),
        (50, 100, 40.383, 59.617),
        (450, 500, 87.058, 92.332),
    ],
)
def test_wilson_interval_known_values(k: int, n: int, lo: float, hi: float) -> None:
    assert wilson_interval(k, n) == pytest.approx((lo, hi), abs=1e-3)


def _wilson_formula(k: int, n: int, confidence: float) -> tuple[float, float]:
    """The score interval written out (Wilson 1927), the reference scipy's result must equal."""
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return 100.0 * max(centre - half, 0.0), 100.0 * min(centre + half, 1.0)


@pytest.mark.parametrize("confidence", [0.5, 0.9, 0.95, 0.99])
@pytest.mark.parametrize("n", [1, 2, 3, 7, 10, 31, 100, 540, 1543])
def test_wilson_interval_is_the_score_formula(n: int, confidence: float) -> None:
    for k in sorted({0, 1, n // 3, n // 2, n - 1, n}):
        expected = _wilson_formula(k, n, confidence)
        assert wilson_interval(k, n, confidence) == pytest.approx(expected, abs=1e-9)
        # accuracy_interval passes sums of 0/1 floats: whole numbers as floats give the same
        assert wilson_interval(float(k), float(n), confidence) == wilson_interval(k, n, confidence)
    assert wilson_interval(0, n, confidence)[0] == 0.0  # exact ends, no rounding residue
    assert wilson_interval(n, n, confidence)[1] == 100.0


def test_wilson_interval_edges() -> None:
    assert all(math.isnan(v) for v in wilson_interval(0, 0))
    narrow, wide = wilson_interval(90, 100, 0.5), wilson_interval(90, 100, 0.99)
    assert wide[0] < narrow[0] < 90 < narrow[1] < wide[1]
    with pytest.raises(ValueError, match="0 <= k <= n"):
        wilson_interval(11, 10)
    with pytest.raises(ValueError, match=r"whole numbers \(got k=2.5, n=10\)"):
        wilson_interval(2.5, 10)
    with pytest.raises(ValueError, match="confidence must be in"):
        wilson_interval(1, 10, 1.5)


def test_paired_interval_much_tighter_than_separate(planted: dict[str, np.ndarray]) -> None:
    best, near = planted["best"].astype(float), planted["near"].astype(float)
    num = np.stack([best, near])
    diff, lo, hi = paired_bootstrap(num, np.ones_like(num), 0, resamples=1000)
    assert diff[1] == pytest.approx(-0.02)
    assert lo[1] <= diff[1] <= hi[1]
    separate = [wilson_interval(c.sum(), c.size) for c in (best, near)]
    separate_width = sum(h - lo_ for lo_, h in separate)  # the range of the difference
    assert hi[1] - lo[1] < 0.15 * separate_width
    assert (diff[0], lo[0], hi[0]) == (0.0, 0.0, 0.0)


def test_bootstrap_is_vectorized_and_centred(planted: dict[str, np.ndarray]) -> None:
    num = np.stack([c.astype(float) for c in planted.values()])
    samples = bootstrap_accuracies(num, np.ones_like(num), resamples=400, seed=3)
    assert samples.shape == (400, 4)
    assert samples.mean(axis=0) == pytest.approx(100 * num.mean(axis=1), abs=0.2)
    # binomial spread of a 90 % accuracy on 5000 nodes: 0.42 points
    assert samples[:, 0].std() == pytest.approx(100 * math.sqrt(0.09 / N_NODES), rel=0.2)
    again = bootstrap_accuracies(num, np.ones_like(num), resamples=400, seed=3)
    np.testing.assert_array_equal(samples, again)


@pytest.mark.parametrize(
    ("tolerance", "expected"),
    [
        (0.0, {"best", "near"}),
        (1.0, {"best", "near"}),
        (2.0, {"best", "near"}),
        (5.0, {"best", "near", "worse3"}),
    ],
)
def test_rule_admits_planted_variants(
    planted: dict[str, np.ndarray], tolerance: float, expected: set[str]
) -> None:
    rows, parts = _rows_and_parts(planted)
    add_accuracy_intervals(rows, parts, resamples=1000)
    admitted = {
        r["variant"]
        for r in rows
        if admissible(r["diff_best"], r["diff_best_lo"], r["diff_best_hi"], tolerance)
    }
    assert admitted == expected


def test_add_accuracy_intervals_columns(planted: dict[str, np.ndarray]) -> None:
    rows, parts = _rows_and_parts(planted)
    rows.append({"variant": "unprofiled", "split": "val"})
    add_accuracy_intervals(rows, parts, resamples=500)
    by = {r["variant"]: r for r in rows}
    for variant in planted:
        row = by[variant]
        assert set(INTERVAL_COLUMNS) <= set(row)
        assert row["best_variant"] == "best"
        assert row["accuracy_lo"] < row["accuracy"] < row["accuracy_hi"]
        assert row["diff_best_lo"] <= row["diff_best"] <= row["diff_best_hi"]
        assert row["diff_best"] <= 0
    assert by["near"]["tie_best"] and by["best"]["tie_best"]
    assert not by["worse3"]["tie_best"] and not by["worse8"]["tie_best"]
    assert by["worse3"]["diff_best"] == pytest.approx(-3.0)
    assert -3.8 < by["worse3"]["diff_best_lo"] < -3.2 < -2.8 < by["worse3"]["diff_best_hi"] < -2.2
    lo, hi = wilson_interval(int(planted["worse8"].sum()), N_NODES)
    assert (by["worse8"]["accuracy_lo"], by["worse8"]["accuracy_hi"]) == (lo, hi)
    assert all(math.isnan(by["unprofiled"][c]) for c in INTERVAL_COLUMNS)


def test_small_split_needs_a_narrow_interval() -> None:
    """200 nodes, two variants equally accurate but disagreeing on 20 %: tied, yet not admitted
    at N = 0, because the loss could be up to ~5 points (the margin condition)."""
    rng = np.random.default_rng(1)
    a = rng.random(200) < 0.8
    b = _flip(a, 20, 20, rng)
    rows, parts = _rows_and_parts({"a": a, "b": b})
    add_accuracy_intervals(rows, parts, resamples=1000)
    other = next(r for r in rows if r["variant"] != r["best_variant"])
    assert other["tie_best"]
    assert -other["diff_best_lo"] > LOSS_MARGIN
    args = (other["diff_best"], other["diff_best_lo"], other["diff_best_hi"])
    assert not admissible(*args, 0.0)
    assert admissible(*args, 5.0)


def test_best_ties_go_to_the_faster() -> None:
    same = np.arange(100) % 3 > 0
    rows, parts = _rows_and_parts({"slow": same, "fast": same.copy()})
    rows[0]["latency_ms"], rows[1]["latency_ms"] = 9.0, 1.0
    add_accuracy_intervals(rows, parts, resamples=50)
    assert {r["best_variant"] for r in rows} == {"fast"}
    assert all(r["diff_best"] == 0.0 and r["tie_best"] for r in rows)


def test_splits_are_separate(planted: dict[str, np.ndarray]) -> None:
    val_rows, val_parts = _rows_and_parts({"x": planted["best"], "y": planted["worse3"]})
    test_rows, test_parts = _rows_and_parts(
        {"x": planted["worse3"][:1000], "y": planted["best"][:1000]}, "test"
    )
    rows = val_rows + test_rows
    add_accuracy_intervals(rows, {**val_parts, **test_parts}, resamples=200)
    assert [r["best_variant"] for r in rows] == ["x", "x", "y", "y"]


def test_multi_label_uses_bootstrap() -> None:
    rng = np.random.default_rng(0)
    tp = rng.integers(0, 4, size=(2, 3000)).astype(float)
    wrong = rng.integers(0, 3, size=(2, 3000)).astype(float)
    num, den = 2 * tp, 2 * tp + wrong
    point = 100 * num[0].sum() / den[0].sum()
    lo, hi = accuracy_interval(num[0], den[0], resamples=1000)
    assert lo < point < hi
    assert 0.3 < hi - lo < 5.0
    rows = [{"variant": v, "split": "val", "latency_ms": 1.0} for v in ("a", "b")]
    parts = {("a", "val"): (num[0], den[0]), ("b", "val"): (num[1], den[1])}
    add_accuracy_intervals(rows, parts, resamples=500)
    assert rows[0]["accuracy_lo"] < point < rows[0]["accuracy_hi"]
    assert rows[0]["diff_best_lo"] <= rows[0]["diff_best"] <= rows[0]["diff_best_hi"]


def test_admissible_fallback_and_errors() -> None:
    nan = math.nan
    assert admissible(-0.5, nan, nan, 1.0)  # no intervals: the point rule
    assert not admissible(-1.5, nan, nan, 1.0)
    assert not admissible(nan, nan, nan, 5.0)
    assert admissible(0.0, 0.0, 0.0, 0.0)  # the best is always admissible
    assert admissible(-1.5, -2.0, -1.0, 1.0)  # loss in [1, 2]: compatible with 1, at most 2
    assert not admissible(-1.5, -2.5, -1.0, 1.0)  # could lose 2.5 > 1 + margin
    assert admissible(-1.5, -2.5, -1.0, 1.0, margin=2.0)
    with pytest.raises(ValueError, match="tolerance must be a number >= 0"):
        admissible(0.0, 0.0, 0.0, -1.0)


def test_rule_is_monotone_in_tolerance() -> None:
    rng = np.random.default_rng(5)
    for _ in range(200):
        diff = -rng.uniform(0, 8)
        half = rng.uniform(0, 3)
        lo, hi = diff - half * rng.uniform(0.5, 1.5), diff + half * rng.uniform(0.5, 1.5)
        admitted = [admissible(diff, lo, hi, n) for n in (0.0, 0.5, 1.0, 2.0, 5.0, 10.0)]
        assert admitted == sorted(admitted)  # once admitted, admitted at every larger N


def test_parts_errors() -> None:
    rows = [{"variant": "a", "split": "val"}, {"variant": "b", "split": "val"}]
    with pytest.raises(ValueError, match="has 3 nodes.*every variant of a split"):
        add_accuracy_intervals(
            rows, {("a", "val"): (np.ones(4), np.ones(4)), ("b", "val"): (np.ones(3), np.ones(3))}
        )
    with pytest.raises(ValueError, match="0 <= num <= den"):
        add_accuracy_intervals(rows, {("a", "val"): (np.full(3, 2.0), np.ones(3))})
    with pytest.raises(ValueError, match="reference must index"):
        paired_bootstrap(np.ones((2, 3)), np.ones((2, 3)), 2)
