"""The report: markdown, six plots, and the analysis helpers behind them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from gnnaas.errors import ArtifactError
from gnnaas.profiling.report import (
    PLOT_FILES,
    _resolve_dir,
    pareto_front,
    ranking_gaps,
    tolerance_table,
    val_test_gaps,
    write_report,
)


def _val(rows: list[tuple[str, float, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["variant", "accuracy", "latency_ms"])


def test_tolerance_table_picks_fastest_within_tolerance() -> None:
    val = _val([("a", 90.0, 10.0), ("b", 89.6, 6.0), ("c", 88.0, 3.0), ("d", 80.0, 1.0)])
    table = tolerance_table(val, (0, 0.5, 2, 5))
    assert list(table["variant"]) == ["a", "b", "c", "c"]
    assert list(table["relative_latency"]) == pytest.approx([1.0, 0.6, 0.3, 0.3])
    assert set(table["baseline"]) == {"a"}


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
        "## 4. Feature rankings",
        "## 5. Validation profile vs test",
        "## 6.",
    ):
        assert heading in text
    assert "gin-random-8x: validation 76.00 %, test 71.30 %" in text
    assert len(PLOT_FILES) == 6
    for name in PLOT_FILES:
        png = fake_profiles_dir / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert f"]({name})" in text


def test_report_folder_is_found_case_insensitively(fake_profiles_dir: Path) -> None:
    assert _resolve_dir(fake_profiles_dir.parent / "fake") == fake_profiles_dir


def test_write_report_without_profiles(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="run `gnnaas profile --dataset Cora` first"):
        write_report(tmp_path / "Cora")
