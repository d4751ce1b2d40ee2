"""profiles.csv / service_times.csv: schema, round trip, has_profiles."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from gnnaas.errors import ArtifactError
from gnnaas.profiling.table import (
    CACHE_COLUMNS,
    PROFILE_COLUMNS,
    PROFILE_INTERVAL_COLUMNS,
    SERVICE_CACHE_COLUMNS,
    SERVICE_TIME_COLUMNS,
    has_profiles,
    read_profiles,
    read_service_times,
    write_profiles,
    write_service_times,
)
from gnnaas.profiling.uncertainty import INTERVAL_COLUMNS

# the schema docs/internals.md fixes
DOC_PROFILE_COLUMNS = (
    "dataset, variant, arch, ranking, prune, features_kept, split, batch_size, num_batches, "
    "accuracy, accuracy_std, accuracy_lo, accuracy_hi, best_variant, diff_best, diff_best_lo, "
    "diff_best_hi, tie_best, sample_ms, comm_ms, comp_ms, latency_ms, latency_p95_ms, "
    "latency_p99_ms, latency_std_ms, e2e_ms, comm_comp, size_kb, mem_mb, unique_frac, "
    "cache_nodes, hit_ratio, copied_kb, pred_comm_ms, pred_comp_ms, device, threads, "
    "torch_version, date, fanouts, hidden_channels, precision, base"
)


@dataclass
class _Manifest:
    variant_id: str
    created: str = "2026-11-23T09:00:00Z"


def test_schema_matches_docs() -> None:
    assert PROFILE_COLUMNS == tuple(c.strip() for c in DOC_PROFILE_COLUMNS.split(","))
    assert SERVICE_TIME_COLUMNS == (
        "variant",
        "batch_size",
        "sample_ms",
        "gather_ms",
        "compute_ms",
        "e2e_ms",
        "hit_ratio",
        "copied_kb",
        "sampling",
        "sampler_seed",
        "threads",
        "inline_max_nodes",
        "device",
        "torch_version",
        "gnnaas_version",
    )


def test_interval_columns_match_uncertainty() -> None:
    assert PROFILE_INTERVAL_COLUMNS == INTERVAL_COLUMNS
    assert set(PROFILE_INTERVAL_COLUMNS) <= set(PROFILE_COLUMNS)


def _with_intervals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for i, row in enumerate(rows):
        row.update(
            accuracy_lo=row["accuracy"] - 2.0,
            accuracy_hi=row["accuracy"] + 1.5,
            best_variant="sage-full-1x",
            diff_best=-0.1 * i,
            diff_best_lo=-0.1 * i - 0.4,
            diff_best_hi=-0.1 * i + 0.3,
            tie_best=-0.1 * i + 0.3 >= 0,
        )
    return rows


def test_interval_columns_round_trip(tmp_path: Path, fake_rows: list[dict[str, Any]]) -> None:
    rows = _with_intervals(fake_rows)
    df = read_profiles(write_profiles(rows, tmp_path))
    assert df["tie_best"].dtype == bool
    assert list(df["tie_best"]) == [r["tie_best"] for r in rows]
    assert set(df["best_variant"]) == {"sage-full-1x"}
    assert df["diff_best_lo"].to_numpy() == pytest.approx([r["diff_best_lo"] for r in rows])


def test_older_files_without_interval_columns(
    tmp_path: Path, fake_rows: list[dict[str, Any]]
) -> None:
    optional = PROFILE_INTERVAL_COLUMNS + CACHE_COLUMNS
    old = [c for c in PROFILE_COLUMNS if c not in optional]
    pd.DataFrame(fake_rows, columns=old).to_csv(tmp_path / "profiles.csv", index=False)
    df = read_profiles(tmp_path)
    assert list(df.columns) == list(PROFILE_COLUMNS)
    for column in optional:
        assert df[column].isna().all(), column
    # rows without them also write (empty cells) and read back as NaN
    df2 = read_profiles(write_profiles(fake_rows, tmp_path / "again"))
    assert df2["diff_best"].isna().all() and df2["tie_best"].isna().all()


def test_read_rejects_a_bad_boolean(tmp_path: Path, fake_rows: list[dict[str, Any]]) -> None:
    rows = _with_intervals(fake_rows)
    rows[0]["tie_best"] = "maybe"
    write_profiles(rows, tmp_path)
    with pytest.raises(ArtifactError, match="malformed value.*maybe"):
        read_profiles(tmp_path)


def test_round_trip(tmp_path: Path, fake_rows: list[dict[str, Any]]) -> None:
    rows = fake_rows
    path = write_profiles(rows, tmp_path / "profiles.csv")
    assert path.read_text().splitlines()[0] == ",".join(PROFILE_COLUMNS)
    assert not list(tmp_path.glob(".*.tmp"))  # atomic write leaves no temporary
    df = read_profiles(tmp_path)  # the folder works too
    assert list(df.columns) == list(PROFILE_COLUMNS)
    assert len(df) == len(rows)
    expected = pd.DataFrame(rows)
    pd.testing.assert_series_equal(df["accuracy"], expected["accuracy"], rtol=1e-5)
    assert df["prune"].dtype == "int64"
    assert pd.api.types.is_string_dtype(df["date"])
    assert df["variant"].iloc[0] == rows[0]["variant"]


def test_service_times_round_trip(fake_profiles_dir: Path) -> None:
    df = read_service_times(fake_profiles_dir)
    assert list(df.columns) == list(SERVICE_TIME_COLUMNS)
    assert sorted(df["batch_size"].unique()) == [1, 32, 256, 1024]
    for column in SERVICE_CACHE_COLUMNS:  # the fixture predates them: empty cells read NaN
        assert df[column].isna().all(), column


def test_write_rejects_missing_columns(tmp_path: Path, fake_rows: list[dict[str, Any]]) -> None:
    row = fake_rows[0]
    del row["mem_mb"]
    with pytest.raises(ValueError, match="lacks columns \\['mem_mb'\\]"):
        write_profiles([row], tmp_path / "profiles.csv")


def test_read_errors(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="not found; run `gnnaas profile"):
        read_profiles(tmp_path)
    (tmp_path / "profiles.csv").write_text("dataset,variant\nCora,x\n")
    with pytest.raises(ArtifactError, match="lacks columns"):
        read_profiles(tmp_path / "profiles.csv")


def test_has_profiles(
    fake_profiles_dir: Path, tmp_path: Path, fake_rows: list[dict[str, Any]]
) -> None:
    variants = sorted({r["variant"] for r in fake_rows})
    manifests = [_Manifest(v) for v in variants]
    # Profiles written before accuracy intervals existed are stale.
    assert not has_profiles(fake_profiles_dir, manifests)
    for r in fake_rows:
        best = max(x["accuracy"] for x in fake_rows if x["split"] == r["split"])
        r["diff_best"] = r["accuracy"] - best
    write_profiles(fake_rows, fake_profiles_dir)
    assert has_profiles(fake_profiles_dir, manifests)
    # Curves measured with another serving sampler (or seed) are stale too.
    assert not has_profiles(fake_profiles_dir, manifests, sampler_seed=1)
    curves = read_service_times(fake_profiles_dir)
    curves["sampling"] = "shared"  # a sampler gnnaas no longer serves with
    write_service_times(curves.to_dict("records"), fake_profiles_dir)
    assert not has_profiles(fake_profiles_dir, manifests)
    curves["sampling"] = "depth"
    write_service_times(curves.to_dict("records"), fake_profiles_dir)
    assert not has_profiles(fake_profiles_dir, [])
    assert not has_profiles(fake_profiles_dir, [*manifests, _Manifest("sage-lasso-16x")])
    # a variant regenerated after profiling needs a new profile
    assert not has_profiles(fake_profiles_dir, [_Manifest(variants[0], "2026-11-24T00:00:00Z")])
    assert not has_profiles(tmp_path / "nowhere", manifests)
