"""Profiles as the router reads them: accuracy intervals and paired differences when present."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import pytest

from gnnaas.policy import PairedDiff
from gnnaas.profiling.profiles import profile_of

CURVES = {"sage-full-1x": [{"batch_size": 1, "e2e_ms": 2.0}, {"batch_size": 64, "e2e_ms": 5.0}]}


def _rows(**extra: Any) -> pd.DataFrame:
    base = {"variant": "sage-full-1x", "accuracy": 81.5, "batch_size": 1024}
    return pd.DataFrame(
        [{**base, "split": "val", **extra}, {**base, "split": "test", "accuracy": 80.0, **extra}]
    )


def test_older_profiles_without_interval_columns_still_load() -> None:
    profile, reason = profile_of("sage-full-1x", _rows(), CURVES, "val")
    assert reason is None and profile is not None
    assert (profile.accuracy, profile.test_accuracy) == (81.5, 80.0)
    assert profile.accuracy_lo is None and profile.accuracy_hi is None and profile.paired is None
    assert "diff_best" not in profile.summary
    assert profile.service.predict(64) == 5.0


@pytest.mark.parametrize("tie", [True, "True", 1])
def test_interval_and_paired_columns_are_read_and_shown(tie: object) -> None:
    columns = {
        "accuracy_lo": 79.0,
        "accuracy_hi": 83.8,
        "best_variant": "sage-full-1x",
        "diff_best": -0.4,
        "diff_best_lo": -1.1,
        "diff_best_hi": 0.2,
        "tie_best": tie,
    }
    profile, _ = profile_of("sage-full-1x", _rows(**columns), CURVES, "val")
    assert profile is not None
    assert (profile.accuracy_lo, profile.accuracy_hi) == (79.0, 83.8)
    assert profile.paired == PairedDiff(-0.4, -1.1, 0.2, True, "sage-full-1x")
    shown = {k: profile.summary[k] for k in columns}
    assert shown == {**columns, "tie_best": True}


def test_a_missing_paired_difference_means_no_paired_rule() -> None:
    rows = _rows(accuracy_lo=79.0, accuracy_hi=83.8, diff_best=math.nan, best_variant="")
    profile, _ = profile_of("sage-full-1x", rows, CURVES, "val")
    assert profile is not None and profile.paired is None and profile.accuracy_lo == 79.0
    assert profile.summary["diff_best"] is None  # JSON-safe: NaN becomes null


def test_a_curve_measured_with_another_sampler_is_not_routed() -> None:
    stamped = {
        "sage-full-1x": [
            {**p, "sampling": "depth", "sampler_seed": 0} for p in CURVES["sage-full-1x"]
        ]
    }
    ok, reason = profile_of(
        "sage-full-1x", _rows(), stamped, "val", sampling="depth", sampler_seed=0
    )
    assert ok is not None and reason is None
    for sampling, seed in (("shared", 0), ("depth", 7)):
        profile, reason = profile_of(
            "sage-full-1x", _rows(), stamped, "val", sampling=sampling, sampler_seed=seed
        )
        assert profile is None
        assert reason is not None and "the server's GNNAAS_SEED" in reason
