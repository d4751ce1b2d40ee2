"""The report: markdown, seven plots, and the analysis helpers behind them."""

from __future__ import annotations

import math
import re
import stat
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gnnaas.errors import ArtifactError
from gnnaas.policy import (
    TIE_MARGIN,
    Candidate,
    DecisionTable,
    LoadSnapshot,
    PairedDiff,
    RequestSpec,
    Selection,
    ServiceCurve,
    describe_rule,
)
from gnnaas.profiling.analysis import (
    display_order,
    paired_width,
    perfmodel_caption,
    ranking_gaps,
    ratio_text,
    val_test_gaps,
)
from gnnaas.profiling.frontier import (
    frontier_table,
    read_router_view,
    router_view,
    tolerance_table,
)
from gnnaas.profiling.report import PLOT_FILES, _resolve_dir, write_report
from gnnaas.profiling.table import write_profiles
from gnnaas.profiling.uncertainty import add_accuracy_intervals


def _idle_pick(request: RequestSpec, candidates: Any, tie_margin: float = 0.1) -> Selection:
    """The router's decision on an idle device."""
    return DecisionTable(candidates, tie_margin=tie_margin).decide(request, LoadSnapshot(), now=0.0)


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
def interval_profiles_dir(fake_profiles_dir: Path, fake_rows: list[dict[str, Any]]) -> Path:
    """The fake profiles (with their service times), rewritten with accuracy intervals."""
    write_profiles(_with_intervals(fake_rows), fake_profiles_dir)
    return fake_profiles_dir


def _candidate(
    variant_id: str, accuracy: float, paired: tuple[float, float, float], times: tuple[float, float]
) -> Candidate:
    """A candidate with a paired difference to ``best`` and a service curve at 1 and 64 nodes."""
    diff, lo, hi = paired
    return Candidate(
        variant_id,
        accuracy,
        ServiceCurve((1, 64), times),
        PairedDiff(diff, lo, hi, tie_best=lo <= 0 <= hi, best_variant="best"),
    )


def _candidates() -> list[Candidate]:
    return [
        _candidate("best", 90.0, (0.0, 0.0, 0.0), (1.0, 10.0)),
        # tied with the best, 5 % faster: the fastest at N = 0, but within the router's tie margin
        _candidate("near", 89.8, (-0.2, -0.6, 0.2), (0.95, 9.5)),
        # admitted from N = 0.5; within 10 % of `small` and listed first: idle, the router would
        # take it over `small` (equal accuracy, a tie), but `small` dominates it
        _candidate("twin", 89.0, (-1.0, -1.5, -0.5), (0.33, 12.5)),
        _candidate("small", 89.0, (-1.0, -1.5, -0.5), (0.3, 12.0)),  # fast for 1 node
        _candidate("big", 89.0, (-1.0, -1.5, -0.5), (0.9, 3.0)),  # fast for 64 nodes
        _candidate("slow8", 88.0, (-2.0, -2.6, -1.4), (0.5, 13.0)),  # dominated by `small`
    ]


def test_tolerance_table_is_the_routers_pick() -> None:
    candidates = _candidates()
    view = router_view(candidates)
    assert dict(view.dominated_by) == {"twin": "small", "slow8": "small"}
    table = tolerance_table(view, (0, 1, 2, 5), (1, 64), tie_margin=0.1)
    assert list(zip(table["tolerance"], table["num_nodes"], strict=True)) == [
        (t, n) for t in (0.0, 1.0, 2.0, 5.0) for n in (1, 64)
    ]
    for r in table.itertuples():
        routed = _idle_pick(RequestSpec(r.num_nodes, tolerance=r.tolerance), view.frontier)
        assert r.variant == routed.variant_id
        pick = next(c for c in view.frontier if c.variant_id == r.variant)
        assert r.predicted_ms == pytest.approx(pick.service.predict_batched(r.num_nodes))
    picks = table.set_index(["tolerance", "num_nodes"])["variant"]
    # N = 0 admits best and near; the lowest-latency rule the report used to apply took `near`,
    # the router keeps the more accurate `best`, 5 % slower, within its tie margin
    assert picks[(0.0, 1)] == picks[(0.0, 64)] == "best"
    assert set(table.loc[table["tolerance"] == 0, "fastest"]) == {"near"}
    # one tolerance, two request sizes, two picks
    assert picks[(1.0, 1)] == "small" and picks[(1.0, 64)] == "big"
    row = table[(table["tolerance"] == 1) & (table["num_nodes"] == 64)].iloc[0]
    assert row["relative_time"] == pytest.approx(3.0 / 10.0)
    assert (row["val_loss"], row["val_loss_lo"], row["val_loss_hi"]) == pytest.approx(
        (1.0, 0.5, 1.5)
    )
    assert set(table["rule"]) == {"paired interval"} and set(table["baseline"]) == {"best"}
    # without its tie margin the router, and the report, take the fastest
    assert set(tolerance_table(view, (0,), (1, 64), tie_margin=0.0)["variant"]) == {"near"}


def test_dominated_variants_are_marked_and_never_picked() -> None:
    candidates = _candidates()
    view = router_view(candidates)
    # idle, the router would take `twin` over the whole list: the frontier is what excludes it
    everything = _idle_pick(RequestSpec(1, tolerance=1.0), candidates)
    assert everything.variant_id == "twin"
    table = tolerance_table(view, (0, 1, 2, 5), (1, 64))
    assert not set(table["variant"]) & {"twin", "slow8"}
    front = frontier_table(view, (1, 64)).set_index("variant")
    assert list(front.index[~front["on_frontier"]]) == ["twin", "slow8"]
    assert front.loc["slow8", "dominated_by"] == "small" and front.loc["big", "dominated_by"] == ""
    assert front.loc["small", "admitted_from"] == pytest.approx(0.5)
    assert front.loc["big", "service_ms_64"] == pytest.approx(3.0)


def test_tolerance_table_point_rule_and_test_losses() -> None:
    curve = ServiceCurve((1, 64), (1.0, 10.0))
    view = router_view(
        [
            Candidate("a", 90.0, curve),
            Candidate("b", 89.6, curve.scaled(0.6)),
            Candidate("c", 88.0, curve.scaled(0.3)),
            Candidate("d", 80.0, curve.scaled(0.1)),
        ]
    )
    test = pd.DataFrame(
        {"variant": ["a", "b", "c", "d"], "accuracy": [88.0, 88.5, 87.0, 79.0]}
    ).assign(best_variant=float("nan"))
    table = tolerance_table(view, (0, 0.5, 2, 5), (1,), test=test)
    assert list(table["variant"]) == ["a", "b", "c", "c"]
    assert list(table["relative_time"]) == pytest.approx([1.0, 0.6, 0.3, 0.3])
    assert set(table["rule"]) == {"point estimate"}
    assert table["val_loss_lo"].isna().all()
    assert table["test_loss"].to_list() == pytest.approx([0.0, -0.5, 1.0, 1.0])
    assert set(table["test_best"]) == {"b"}
    assert table["test_loss_vs_best"].to_list() == pytest.approx([0.5, 0.0, 1.5, 1.5])


def test_paired_width() -> None:
    rows = pd.DataFrame({"diff_best_lo": [-2.5, 0.0, float("nan")], "diff_best_hi": [0.5, 0, 1]})
    assert paired_width(rows).to_list()[:2] == pytest.approx([3.0, 0.0])
    assert math.isnan(paired_width(rows).iloc[2])
    assert paired_width(pd.DataFrame({"accuracy": [1.0]})).isna().all()


def test_report_tie_margin_is_the_servers_default() -> None:
    from gnnaas.serving.core.settings import Settings

    assert Settings.model_fields["tie_margin"].default == TIE_MARGIN


def test_ranking_gaps_and_val_test_gaps(fake_rows: list[dict[str, Any]]) -> None:
    df = pd.DataFrame(fake_rows).assign(base=float("nan"))
    twin = df[df["variant"] == "sage-greedy-4x"].assign(
        variant="sage-greedy-4x-int8", base="sage-greedy-4x", accuracy=50.0
    )
    assert ranking_gaps(pd.concat([df, twin])).equals(ranking_gaps(df))  # trained ones only
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
        "## 3. The router's pick under accuracy tolerance",
        "## 4. The frontier",
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
    section = text.split("## 3. The router's pick under accuracy tolerance")[1].split("## 4.")[0]
    assert describe_rule() in section  # the rule in the words of gnnaas.policy
    assert "idle router" in section and "under load" in section.lower()
    assert "test loss vs baseline" in section and "test loss vs test best [95%]" in section
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0].startswith("| N (points) | nodes | pick |")
    assert [r.split(" | ")[:2] for r in rows[1:]] == [
        [f"| {n}", size] for n in ("0", "1", "2", "5") for size in ("1", "64")
    ]
    assert all(r.rstrip(" |").endswith(("yes", "no")) for r in rows[1:])
    # the picks are the router's, on the same candidates
    view = read_router_view(interval_profiles_dir)
    table = tolerance_table(view)
    for row, pick in zip(rows[1:], table.itertuples(), strict=True):
        routed = _idle_pick(RequestSpec(pick.num_nodes, tolerance=pick.tolerance), view.frontier)
        assert row.split(" | ")[2] == routed.variant_id
    frontier = text.split("## 4. The frontier")[1].split("## 5.")[0]
    front = len(view.frontier)
    assert (
        f"20 variants profiled, 20 routable (with a service curve), **{front} on the " in frontier
    )
    assert 0 < front < 20
    variants = text.split("## 1. Variants")[1].split("## 2.")[0]
    header = next(line for line in variants.splitlines() if line.startswith("| variant |"))
    for column in ("fanouts", "hidden", "precision", "base", "width", "dominated by"):
        assert f"| {column} |" in header
    columns = header.split(" | ")
    assert columns.index("width") == columns.index("accuracy % [95%]") + 1
    dominated = next(v for v in view.dominated_by)
    line = next(r for r in variants.splitlines() if r.startswith(f"| {dominated} |"))
    assert line.rstrip(" |").endswith(view.dominated_by[dominated])
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


def _png_size(path: Path) -> tuple[int, int]:
    """``(width, height)`` in pixels, from the PNG's header."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The figures the variant plots save, in order."""
    from gnnaas.profiling import plots

    figures: list[Any] = []
    save = plots.save_png

    def keep(fig: Any, path: Path) -> Path:
        figures.append(fig)
        return save(fig, path)

    monkeypatch.setattr(plots, "save_png", keep)
    return figures


def _many_variants(rows: list[dict[str, Any]], copies: int) -> pd.DataFrame:
    """The validation rows repeated ``copies`` times under longer ids (as many derived variants
    as the default plan makes)."""
    val = pd.DataFrame([r for r in rows if r["split"] == "val"])
    parts = [val.assign(variant=val["variant"] + f"-f5.5-h{64 * i}-int8") for i in range(copies)]
    return display_order(pd.concat([val, *parts], ignore_index=True))


def _overlap(a: Any, b: Any) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_latency_breakdown_fits_a_page(
    fake_rows: list[dict[str, Any]], drawn: list[Any], tmp_path: Path
) -> None:
    from gnnaas.profiling import plots

    val = _many_variants(fake_rows, copies=2)  # 30 variants per architecture
    path = plots.latency_breakdown(val, tmp_path / "b.png", dataset="Fake")
    width, height = _png_size(path)
    assert width <= 1600 and height > width / 2  # grows down the page, not across it
    (fig,) = drawn
    assert fig._suptitle.get_text() == (
        "Fake: latency per variant, batches of 512 target nodes (validation, p50)"
    )
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    (legend,) = fig.legends
    axes = fig.get_axes()
    assert [ax.get_title() for ax in axes] == ["GIN", "SAGE"]
    for ax in axes:
        assert ax.get_legend() is None
        assert not _overlap(legend.get_window_extent(renderer), ax.get_window_extent(renderer))
        labels = [t for t in ax.get_yticklabels() if t.get_text()]
        assert len(labels) == 30 and min(t.get_fontsize() for t in labels) >= 8
        boxes = [t.get_window_extent(renderer) for t in labels]
        assert not any(_overlap(a, b) for a, b in zip(boxes, boxes[1:], strict=False))


def test_perfmodel_title_and_caption_agree(
    fake_rows: list[dict[str, Any]], drawn: list[Any], tmp_path: Path
) -> None:
    from gnnaas.profiling import plots

    val = pd.DataFrame([r for r in fake_rows if r["split"] == "val"])
    val["pred_comp_ms"] = val["comp_ms"] * 0.01074
    caption = perfmodel_caption(val)
    plots.perfmodel(val, tmp_path / "p.png", dataset="Fake", caption=caption)
    titles = [ax.get_title() for ax in drawn[0].get_axes()]
    assert titles == [
        "comm: median predicted/measured 0.8x",
        "comp: median predicted/measured 0.011x",
    ]
    assert "comm 0.8x, comp 0.011x." in caption
    assert [ratio_text(v) for v in (0.01074, 1.25, 12.6, 1234.0, math.nan)] == [
        "0.011x",
        "1.2x",
        "13x",
        "1234x",
        "n/a",
    ]


def test_report_without_random_rankings_draws_no_ranking_figure(
    fake_profiles_dir: Path, fake_rows: list[dict[str, Any]]
) -> None:
    write_report(fake_profiles_dir)
    assert (fake_profiles_dir / "rankings.png").is_file()  # random variants: compared at 4x
    write_profiles([r for r in fake_rows if r["ranking"] != "random"], fake_profiles_dir)
    text = write_report(fake_profiles_dir).read_text()
    assert not (fake_profiles_dir / "rankings.png").exists()  # the earlier one is gone too
    section = text.split("## 5. Feature rankings")[1].split("## 6.")[0]
    assert "nothing to subtract and rankings.png is not drawn" in section
    assert "](rankings.png)" not in text
    links = _links(text)
    assert links == [name for name in PLOT_FILES if name != "rankings.png"]
    assert all((fake_profiles_dir / link).is_file() for link in links)


def test_ranking_figure_at_another_prune_factor(
    fake_profiles_dir: Path, fake_rows: list[dict[str, Any]]
) -> None:
    kept = [r for r in fake_rows if r["ranking"] != "random" or r["prune"] == 8]
    write_profiles(kept, fake_profiles_dir)
    text = write_report(fake_profiles_dir).read_text()
    assert "The figure compares them at 8x." in text and "](rankings.png)" in text
    assert _png_size(fake_profiles_dir / "rankings.png")[0] > 0
    from gnnaas.profiling import plots

    with pytest.raises(ValueError, match=r"rankings: no random-ranked 4x .*comparable: \[8\]"):
        plots.rankings(ranking_gaps(pd.DataFrame(kept)), fake_profiles_dir / "r.png", dataset="F")


def test_report_without_service_curves_draws_no_pick_or_frontier(fake_profiles_dir: Path) -> None:
    write_report(fake_profiles_dir)
    (fake_profiles_dir / "service_times.csv").unlink()
    text = write_report(fake_profiles_dir).read_text()
    for name in ("tolerance.png", "pareto.png"):
        assert not (fake_profiles_dir / name).exists()
        assert f"({name} is not drawn)" in text and f"]({name})" not in text
    assert all((fake_profiles_dir / link).is_file() for link in _links(text))
