"""The report: markdown, seven plots, and the analysis helpers behind them."""

from __future__ import annotations

import re
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gnnaas.errors import ArtifactError
from gnnaas.profiling.report import (
    PLOT_FILES,
    _resolve_dir,
    pareto_front,
    perfmodel_caption,
    ranking_gaps,
    tolerance_table,
    val_test_gaps,
    write_report,
)
from gnnaas.profiling.table import write_profiles
from gnnaas.profiling.uncertainty import add_accuracy_intervals


def _with_intervals(rows: list[dict[str, Any]], n: int = 1000) -> list[dict[str, Any]]:
    """The fake rows, accuracies redrawn from per-node scores, with the interval columns."""
    rng = np.random.default_rng(0)
    parts = {}
    for split in ("val", "test"):
        difficulty = rng.random(n)  # a variant of accuracy a gets the easiest a % right
        for row in (r for r in rows if r["split"] == split):
            correct = (difficulty < row["accuracy"] / 100) ^ (rng.random(n) < 0.02)
            parts[(row["variant"], split)] = (correct.astype(float), np.ones(n))
            row["accuracy"] = 100 * correct.mean()
    add_accuracy_intervals(rows, parts, resamples=500)
    return rows


@pytest.fixture
def interval_profiles_dir(tmp_path: Path, fake_rows: list[dict[str, Any]]) -> Path:
    folder = tmp_path / "profiles" / "Fake"
    write_profiles(_with_intervals(fake_rows), folder)
    return folder


def _val(rows: list[tuple[str, float, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["variant", "accuracy", "latency_ms"])


def test_tolerance_table_picks_fastest_within_tolerance() -> None:
    val = _val([("a", 90.0, 10.0), ("b", 89.6, 6.0), ("c", 88.0, 3.0), ("d", 80.0, 1.0)])
    table = tolerance_table(val, (0, 0.5, 2, 5))
    assert list(table["variant"]) == ["a", "b", "c", "c"]
    assert list(table["relative_latency"]) == pytest.approx([1.0, 0.6, 0.3, 0.3])
    assert set(table["baseline"]) == {"a"}


def test_tolerance_table_uses_the_paired_rule() -> None:
    nan = float("nan")
    val = pd.DataFrame(
        [
            # variant, accuracy, latency, diff_best, lo, hi
            ("best", 90.0, 10.0, 0.0, 0.0, 0.0),
            ("near", 89.9, 6.0, -0.1, -0.5, 0.3),  # tied and narrow: admitted at N = 0
            ("wide", 89.8, 5.0, -0.2, -1.8, 1.4),  # tied but could lose 1.8 > 0 + 1
            ("worse3", 87.0, 2.0, -3.0, -3.6, -2.4),
        ],
        columns=["variant", "accuracy", "latency_ms", "diff_best", "diff_best_lo", "diff_best_hi"],
    ).assign(best_variant="best")
    test = pd.DataFrame(
        {"variant": ["best", "near", "wide", "worse3"], "accuracy": [88.0, 88.5, 87.0, 85.0]}
    ).assign(best_variant=nan)
    table = tolerance_table(val, (0, 1, 2, 5), test=test)
    assert list(table["variant"]) == ["near", "wide", "wide", "worse3"]
    assert set(table["rule"]) == {"paired interval"}
    assert table["val_loss_hi"].iloc[0] == pytest.approx(0.5)
    assert table["test_loss"].to_list() == pytest.approx([-0.5, 1.0, 1.0, 3.0])  # vs baseline
    assert set(table["test_best"]) == {"near"}
    assert table["test_loss_vs_best"].to_list() == pytest.approx([0.0, 1.5, 1.5, 3.5])
    # without paired columns (older profiles) the point rule applies
    point = tolerance_table(val[["variant", "accuracy", "latency_ms"]], (0, 1))
    assert list(point["variant"]) == ["best", "wide"]
    assert set(point["rule"]) == {"point estimate"}


def test_pareto_front() -> None:
    val = _val([("a", 90.0, 10.0), ("b", 85.0, 12.0), ("c", 88.0, 3.0), ("d", 80.0, 1.0)])
    assert list(pareto_front(val)["variant"]) == ["d", "c", "a"]


def test_ranking_gaps_and_val_test_gaps(fake_rows: list[dict[str, Any]]) -> None:
    df = pd.DataFrame(fake_rows)
    gaps = ranking_gaps(df).set_index(["arch", "prune"])
    assert gaps.loc[("sage", 4), "greedy_gain"] == pytest.approx(4.0)
    assert gaps.loc[("sage", 4), "lasso_gain"] == pytest.approx(5.0)
    vt = val_test_gaps(df).set_index("variant")
    assert list(vt.index[vt["flagged"]]) == ["gin-random-8x"]
    assert vt.loc["gin-random-8x", "se"] == pytest.approx((2 * 1.5**2) ** 0.5)


def test_write_report(fake_profiles_dir: Path) -> None:
    path = write_report(fake_profiles_dir)
    assert path == fake_profiles_dir / "report.md"
    text = path.read_text()
    for heading in (
        "## 1. Variants",
        "### SAGE",
        "### GIN",
        "tolerance",
        "Pareto front",
        "## 5. Feature rankings",
        "## 6. Validation profile vs test",
        "## 7. Analytical model",
    ):
        assert heading in text
    assert "gin-random-8x: validation 76.00 %, test 71.30 %" in text
    assert len(PLOT_FILES) == 7
    for name in PLOT_FILES:
        png = fake_profiles_dir / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert f"]({name})" in text
    assert "no accuracy intervals" in text  # this older profile has none: said, not hidden


@pytest.mark.usefixtures("umask_022")
def test_report_and_tables_are_readable_by_others(
    fake_profiles_dir: Path, fake_rows: list[dict[str, Any]]
) -> None:
    write_profiles(fake_rows, fake_profiles_dir)  # rewritten under umask 022
    report = write_report(fake_profiles_dir)
    for path in (report, fake_profiles_dir / "profiles.csv", fake_profiles_dir / PLOT_FILES[0]):
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path.name  # not mkstemp's 0600


def _links(text: str) -> list[str]:
    return re.findall(r"\]\(([^)]+)\)", text)


def test_report_with_intervals_and_local_links(interval_profiles_dir: Path) -> None:
    text = write_report(interval_profiles_dir).read_text()
    assert "## 2. Accuracy with its uncertainty" in text
    assert "accuracy % [95%]" in text and "Δ best [95%]" in text
    section = text.split("## 3. Latency under accuracy tolerance")[1].split("## 4.")[0]
    assert "L_lo ≤ N" in section and "L_hi ≤ N + 1" in section
    assert "test loss vs baseline" in section and "test loss vs test best [95%]" in section
    table = section.split("**all**")[1].split("**gin**")[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r.split(" | ")[0] for r in rows[1:]] == ["| 0", "| 1", "| 2", "| 5"]
    assert all(r.rstrip(" |").endswith(("yes", "no")) for r in rows[1:])
    assert "[-0.0" not in text  # no negative zeros
    png = interval_profiles_dir / "accuracy_intervals.png"
    assert png.stat().st_size > 20_000  # a drawn figure, not an empty canvas
    # every link resolves next to the report, wherever the profiles folder lives
    links = _links(text)
    assert len(links) == len(PLOT_FILES)
    for link in links:
        assert not link.startswith(("/", "..", "http")), link
        assert (interval_profiles_dir / link).is_file(), link
    assert "ARCHITECTURE" not in text and "../" not in text


def test_perfmodel_caption_explains_the_gap(fake_rows: list[dict[str, Any]]) -> None:
    val = pd.DataFrame([r for r in fake_rows if r["split"] == "val"])
    assert "dispatch" not in perfmodel_caption(val)  # 1.3x: nothing to explain
    val["pred_comp_ms"] = val["comp_ms"] * 0.03
    caption = perfmodel_caption(val)
    assert "comp 0.03x" in caption
    assert "per-operator dispatch" in caption and "lower bound" in caption


def test_report_folder_is_found_case_insensitively(fake_profiles_dir: Path) -> None:
    assert _resolve_dir(fake_profiles_dir.parent / "fake") == fake_profiles_dir


def test_write_report_without_profiles(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="run `gnnaas profile --dataset Cora` first"):
        write_report(tmp_path / "Cora")
