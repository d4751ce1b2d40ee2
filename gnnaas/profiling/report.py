"""The profile report: ``profiles/<dataset>/report.md`` and up to seven PNG plots.

The report reads ``profiles.csv`` and ``service_times.csv`` only (never the variants), so it can
be rebuilt anywhere the tables are. Its sections follow the profile definitions of
docs/architecture.md §5:

1. the variant table per architecture (axes, accuracy with its 95% interval and paired interval
   width, latency, service times, comm/comp, size, memory, what dominates it) and
   ``latency_breakdown.png`` (comm and comp of every variant);
2. accuracy with its uncertainty: every variant's accuracy interval and paired difference to the
   most accurate variant (``accuracy_intervals.png``);
3. the router's pick per accuracy tolerance and request size, made by the router's own rule
   (:mod:`gnnaas.profiling.frontier`), and its loss measured on the test split
   (``tolerance.png``);
4. the frontier: how many variants are profiled and how many the router decides among, accuracy
   vs predicted service time (``pareto.png``);
5. the ranking comparison: accuracy of greedy and lasso minus random at 4× (or another prune
   factor with random-ranked variants) (``rankings.png``);
6. validation profile vs test results (``val_vs_test.png``), naming the variants whose accuracies
   differ by more than :data:`~gnnaas.profiling.analysis.VAL_TEST_TOLERANCE` points and why;
7. predicted vs measured comm and comp (``perfmodel.png``), with what the calibration covers.

A plot with nothing to show is not drawn (no random-ranked variant to compare with, no service
curve to pick by): its section says why instead, and a file of that name left by an earlier report
is removed. Generated text links only to files written next to ``report.md`` (the plots), so every
link resolves wherever the profiles folder lives. The tables behind the text are in
:mod:`gnnaas.profiling.analysis` and :mod:`gnnaas.profiling.frontier`, the figures in
:mod:`gnnaas.profiling.plots` and :mod:`gnnaas.profiling.frontier_plots`.

Example:
    >>> write_report("profiles/Cora")  # doctest: +SKIP
    PosixPath('profiles/Cora/report.md')
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from gnnaas.errors import ArtifactError
from gnnaas.policy import LOSS_MARGIN, TIE_MARGIN, describe_rule
from gnnaas.profiling.analysis import (
    VAL_TEST_TOLERANCE,
    comparable_prunes,
    display_order,
    paired_width,
    perfmodel_caption,
    ranking_gaps,
    trained,
    val_test_gaps,
)
from gnnaas.profiling.frontier import (
    REQUEST_SIZES,
    RouterView,
    frontier_table,
    read_router_view,
    tolerance_table,
)
from gnnaas.profiling.table import PROFILES_FILE, read_profiles
from gnnaas.typing import PathType
from gnnaas.utils import atomic_write_text

__all__ = ["PLOT_FILES", "REPORT_FILE", "write_report"]

_log = logging.getLogger(__name__)

REPORT_FILE = "report.md"
PLOT_FILES: tuple[str, ...] = (
    "latency_breakdown.png",
    "accuracy_intervals.png",
    "tolerance.png",
    "pareto.png",
    "rankings.png",
    "val_vs_test.png",
    "perfmodel.png",
)
"""The seven plots a report may draw, in report order (one with nothing to show is not)."""

_RANKING_PRUNE = 4  # the prune factor the ranking figure prefers: a middle one


def _resolve_dir(profiles_dir: PathType) -> Path:
    folder = Path(profiles_dir)
    if (folder / PROFILES_FILE).is_file() or folder.suffix == ".csv":
        return folder if folder.suffix != ".csv" else folder.parent
    parent = folder.parent
    if parent.is_dir():  # dataset names are case-insensitive (`--dataset cora`)
        for child in parent.iterdir():
            if child.name.lower() == folder.name.lower() and (child / PROFILES_FILE).is_file():
                return child
    raise ArtifactError(
        f"{folder / PROFILES_FILE} not found; run `gnnaas profile --dataset {folder.name}` first"
    )


def _fmt(value: float, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def _get(row: object, name: str) -> float:
    value = getattr(row, name, math.nan)
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _with_interval(value: float, lo: float, hi: float, digits: int = 1) -> str:
    if not math.isfinite(value):
        return "n/a"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return _fmt(value, digits + 1)
    value, lo, hi = (v + 0.0 if abs(v) >= 0.5 * 10**-digits else 0.0 for v in (value, lo, hi))
    return f"{value:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _text(value: object) -> str:
    """A table cell of text or a whole number; ``–`` where empty."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)) or value == "":
        return "–"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _nodes(n: int) -> str:
    return f"{n} node{'s' if n != 1 else ''}"


def _variant_intro() -> str:
    """What the variant tables' columns say and where each figure comes from."""
    times = " and ".join(f"t({n})" for n in REQUEST_SIZES)
    text = (
        "Validation profile (p50 over runs) at the profiled batch size. Latency = comm + comp "
        "(gather of the kept features, copies, forward); e2e adds sampling. "
        f"{times}: the service time (e2e) of a request of that many nodes, from "
        "service_times.csv, which the router decides by. Test accuracy for reference. Size: the "
        "weights file (int8: the weights as served). Mem: peak memory allocated while serving "
        "one batch (gathered inputs, activations, outputs), from torch's profiler memory "
        "accounting on the CPU or `torch.cuda.max_memory_allocated` on CUDA."
    )
    text += (
        " Axes: fanouts per layer (dotted), hidden width, precision, and the variant it derives "
        "from (– for a trained one). Accuracy: validation, with its 95% interval over the "
        "evaluation nodes in brackets; width: the width of its paired 95% interval against the "
        "most accurate variant (points; narrower admits at a smaller tolerance); Δ best: that "
        "paired difference (section 2). Dominated by: a variant the router prefers at every "
        "tolerance and load (section 4; – on the frontier)."
    )
    return text


def _variant_section(
    val: pd.DataFrame, test: pd.DataFrame, frontier: pd.DataFrame, view: RouterView
) -> list[str]:
    lines = ["## 1. Variants", "", _variant_intro()]
    test_acc = test.drop_duplicates("variant").set_index("variant")["accuracy"]
    by_id = frontier.set_index("variant")
    widths = paired_width(val)

    def dominated_by(variant: str) -> str:
        if variant in view.not_routed:
            return "not routed"
        return _text(by_id["dominated_by"].get(variant, ""))

    def service(variant: str, n: int) -> str:
        return _fmt(float(by_id[f"service_ms_{n}"].get(variant, math.nan)), 3)

    for arch, part in display_order(val).groupby("arch", sort=True):
        lines += ["", f"### {str(arch).upper()}", ""]
        rows = [
            [
                str(r.variant),
                str(int(r.features_kept)),
                _text(getattr(r, "fanouts", None)),
                _text(getattr(r, "hidden_channels", None)),
                _text(getattr(r, "precision", None)),
                _text(getattr(r, "base", None)),
                _with_interval(r.accuracy, _get(r, "accuracy_lo"), _get(r, "accuracy_hi")),
                _fmt(float(widths.get(r.Index, math.nan)), 1),
                _with_interval(
                    _get(r, "diff_best"), _get(r, "diff_best_lo"), _get(r, "diff_best_hi")
                ),
                _fmt(float(test_acc.get(r.variant, float("nan")))),
                _fmt(r.latency_ms, 3),
                _fmt(r.latency_p95_ms, 3),
                _fmt(r.e2e_ms, 3),
                *(service(str(r.variant), n) for n in REQUEST_SIZES),
                _fmt(r.comm_comp),
                _fmt(r.size_kb, 1),
                _fmt(r.mem_mb, 1),
                dominated_by(str(r.variant)),
            ]
            for r in part.itertuples()
        ]
        lines += _md_table(
            [
                "variant",
                "features",
                "fanouts",
                "hidden",
                "precision",
                "base",
                "accuracy % [95%]",
                "width",
                "Δ best [95%]",
                "test acc %",
                "latency ms",
                "p95 ms",
                "e2e ms",
                *(f"t({n}) ms" for n in REQUEST_SIZES),
                "comm/comp",
                "size KB",
                "mem MB",
                "dominated by",
            ],
            rows,
        )
    lines += ["", "![latency breakdown](latency_breakdown.png)", ""]
    pruning = _pruning_summary(val)
    if pruning:
        lines += [pruning, ""]
    return lines


def _pruning_summary(val: pd.DataFrame) -> str:
    """What pruning buys per architecture: the trained variants at the largest prune factor
    against those at 1x (mean latency; precomputed lookups left out, they run no forward)."""
    parts = []
    for arch in sorted(val["arch"].unique()):
        part = val[(val["arch"] == arch) & ~val["variant"].str.contains("@", regex=False)]
        part = part[trained(part)]  # a derived variant changes more than the prune factor
        top = int(part["prune"].max()) if not part.empty else 1
        full = part[part["prune"] == 1]
        if full.empty or top <= 1:
            continue
        pct = 100 * part[part["prune"] == top]["latency_ms"].mean() / full["latency_ms"].mean()
        parts.append(f"{str(arch).upper()} at {top}x takes {pct:.0f} % of the latency at 1x")
    if not parts:
        return ""
    return "Pruning alone (trained variants, mean latency): " + "; ".join(parts) + "."


def _uncertainty_section(val: pd.DataFrame, test: pd.DataFrame) -> list[str]:
    lines = ["## 2. Accuracy with its uncertainty", ""]
    if val["diff_best_lo"].isna().all():
        return lines + [
            "This profile has no accuracy intervals (written before they existed); run "
            "`gnnaas profile` again to get them. Section 3 falls back to point estimates.",
            "",
            "![accuracy intervals](accuracy_intervals.png)",
            "",
        ]
    best = str(val["best_variant"].dropna().iloc[0])
    ties = val[val["tie_best"].astype(bool) & (val["variant"] != best)]
    lines.append(
        "Every accuracy carries its 95% interval over the evaluation nodes (Wilson score "
        "interval; percentile bootstrap over nodes for multi-label F1-micro). Every variant's "
        "difference to the most accurate one is *paired*: a bootstrap resamples the evaluation "
        "nodes and applies the same resample to both variants, so the many nodes on which they "
        "agree cancel and the interval is much tighter than the two accuracy intervals suggest."
    )
    lines.append("")
    others = val["variant"].nunique() - 1
    lines.append(
        f"Most accurate on validation: {best}. Statistically tied with it (paired interval "
        f"contains 0): {len(ties)} of the {others} others"
        + (f": {', '.join(ties['variant'])}." if not ties.empty else ".")
    )
    lines += ["", "![accuracy intervals](accuracy_intervals.png)", ""]
    return lines


def _tolerance_section(table: pd.DataFrame, tie_margin: float) -> list[str]:
    lines = ["## 3. The router's pick under accuracy tolerance", ""]
    if table.empty:
        return lines + [
            "No variant has a service curve (service_times.csv), so the router would route to "
            "none and there is no pick to plot (tolerance.png is not drawn); run `gnnaas "
            "profile` again.",
            "",
        ]
    sizes = " and ".join(_nodes(int(n)) for n in dict.fromkeys(table["num_nodes"]))
    lines.append(
        "The router's own rule (gnnaas.policy), applied to the candidates the server "
        "builds from profiles.csv and service_times.csv, on validation accuracies. "
        + describe_rule()
        + " Among the admissible variants on the frontier (section 4) the router "
        "predicts each one's time from its service curve at the request's size; times within "
        f"{100 * tie_margin:g} % of the smallest (GNNAAS_TIE_MARGIN) are ties, which go to the "
        "most accurate."
    )
    lines.append("")
    lines.append(
        f"**These are the picks of an idle router** (nothing queued) for requests of {sizes}. "
        "Under load the router adds the queued work to each prediction and may move to a "
        "faster admissible variant (or keep a busy stream on the variant it is on). Relative "
        "time = the pick's predicted time / the most accurate variant's, at the same size."
    )
    lines.append("")
    lines.append(
        "Test columns: *test loss vs baseline* = the validation baseline's test accuracy minus "
        "the pick's (what a client gives up relative to the variant the router treats as best); "
        "*test loss vs test best* = the most accurate variant on the test split minus the pick "
        "(a stricter figure, with its paired 95% interval: the best of many variants on the "
        "test split is also the luckiest there). *Promise kept*: test loss vs baseline "
        f"≤ N + {LOSS_MARGIN:g}, the promise a tolerance makes (against the most accurate "
        "variant, on data like the validation split)."
    )
    base = table.iloc[0]
    note = "" if base.rule == "paired interval" else "; point estimates (no paired intervals)"
    at = ", ".join(
        f"{_fmt(r.baseline_ms, 3)} ms for {_nodes(int(r.num_nodes))}"
        for r in table.drop_duplicates("num_nodes").itertuples()
    )
    test_best = getattr(base, "test_best", None)
    lines += [
        "",
        f"Baseline (most accurate on validation): {base.baseline}, "
        f"{_fmt(base.baseline_accuracy)} %, {at}; test best: {_text(test_best)}{note}.",
        "",
    ]
    lines += _pick_table(table)
    passed = table[table["variant"] != table["fastest"]]
    if not passed.empty:
        lines += ["", "Where the tie margin chose a more accurate variant than the fastest:", ""]
        lines += [
            f"- N = {r.tolerance:g}, {_nodes(int(r.num_nodes))}: {r.variant} "
            f"({_fmt(r.accuracy)} %) instead of {r.fastest}, predicted within "
            f"{100 * tie_margin:g} % of it."
            for r in passed.itertuples()
        ]
    lines += ["", "![latency under tolerance](tolerance.png)", ""]
    return lines


def _pick_table(table: pd.DataFrame) -> list[str]:
    """The picks of :func:`_tolerance_section` as a table, one row per tolerance and size."""
    nan = math.nan
    return _md_table(
        [
            "N (points)",
            "nodes",
            "pick",
            "admissible",
            "val loss [95%]",
            "predicted ms",
            "relative time",
            "test loss vs baseline",
            "test loss vs test best [95%]",
            "promise kept",
        ],
        [
            [
                _fmt(r.tolerance, 0),
                str(int(r.num_nodes)),
                str(r.variant),
                str(int(r.admissible)),
                _with_interval(r.val_loss, r.val_loss_lo, r.val_loss_hi),
                _fmt(r.predicted_ms, 3),
                f"{100 * r.relative_time:.0f} %",
                _fmt(getattr(r, "test_loss", nan)),
                _with_interval(
                    getattr(r, "test_loss_vs_best", nan),
                    getattr(r, "test_loss_lo", nan),
                    getattr(r, "test_loss_hi", nan),
                ),
                _kept(getattr(r, "test_loss", nan), r.tolerance),
            ]
            for r in table.itertuples()
        ],
    )


def _kept(loss: float, tolerance: float) -> str:
    if not math.isfinite(loss):
        return "n/a"
    return "yes" if loss <= tolerance + LOSS_MARGIN + 1e-9 else "no"


def _frontier_section(val: pd.DataFrame, frontier: pd.DataFrame, view: RouterView) -> list[str]:
    lines = ["## 4. The frontier", ""]
    profiled = val["variant"].nunique()
    if frontier.empty:
        return lines + [
            f"{profiled} variants profiled, none routable: no variant has a service curve "
            "(service_times.csv), so there is no frontier to plot (pareto.png is not drawn); "
            "run `gnnaas profile` again.",
            "",
        ]
    routable = len(view.candidates)
    front = frontier[frontier["on_frontier"]]
    lines.append(
        f"{profiled} variants profiled, {routable} routable (with a service curve), "
        f"**{len(front)} on the frontier**, {routable - len(front)} dominated. A variant is "
        "dominated when another one is admitted at every tolerance that admits it, is at least "
        "as accurate, and is at most as slow at every batch size of its service curve "
        "(gnnaas.policy.dominated): under any load the router would not prefer "
        "it. The server lists dominated variants (with the variant that dominates each, as "
        "section 1 does) but decides each request among the frontier only."
    )
    if view.not_routed:
        lines += ["", "Not routed:", ""]
        lines += [f"- {v}: {why}" for v, why in view.not_routed.items()]
    if not front.empty:
        last = REQUEST_SIZES[-1]
        ordered = front.sort_values(f"service_ms_{last}")
        lines += ["", f"Frontier, fastest for {_nodes(last)} first:", ""]
        lines += [
            f"- {r.variant}: {_fmt(r.accuracy)} %, admitted from N = {_fmt(r.admitted_from, 2)}; "
            + ", ".join(
                f"{_fmt(getattr(r, f'service_ms_{n}'), 3)} ms for {_nodes(n)}"
                for n in REQUEST_SIZES
            )
            for r in ordered.itertuples()
        ]
    lines += [
        "",
        "The plot shows accuracy against the predicted service time at each request size; the "
        "frontier is solid and numbered, dominated variants are faded, and the dashed line is "
        "the best accuracy reachable within each time at that size. A frontier variant below "
        "that line is there for another size, or because its narrower paired interval admits "
        "it at a smaller tolerance.",
        "",
        "![accuracy vs service time](pareto.png)",
        "",
    ]
    return lines


def _ranking_section(gaps: pd.DataFrame, drawn_at: int | None) -> list[str]:
    lines = ["## 5. Feature rankings", ""]
    if gaps.empty:
        return lines + [
            "No pruned variants with rankings were profiled, so there is nothing to compare "
            "(rankings.png is not drawn).",
            "",
        ]
    lines.append(
        "Test accuracy of greedy and lasso minus random at the same prune factor "
        "(points; positive = the ranking keeps more useful features than chance; trained "
        "variants only)."
    )
    if drawn_at is None:
        lines[-1] += (
            " No random-ranked variant was profiled at a prune factor that greedy or lasso was, "
            "so there is nothing to subtract and rankings.png is not drawn (`gnnaas generate "
            "--ranking random greedy lasso` adds them)."
        )
    lines.append("")
    lines += _md_table(
        ["arch", "prune", "random %", "greedy %", "lasso %", "greedy - random", "lasso - random"],
        [
            [
                str(r.arch),
                f"{int(r.prune)}x",
                _fmt(r.random),
                _fmt(r.greedy),
                _fmt(r.lasso),
                _fmt(r.greedy_gain),
                _fmt(r.lasso_gain),
            ]
            for r in gaps.itertuples()
        ],
    )
    if drawn_at is not None:
        lines += ["", f"The figure compares them at {drawn_at}x.", ""]
        lines += ["![ranking comparison](rankings.png)", ""]
    else:
        lines.append("")
    return lines


def _val_test_section(df: pd.DataFrame) -> list[str]:
    gaps = val_test_gaps(df)
    lines = ["## 6. Validation profile vs test results", ""]
    lines.append(
        "Points: validation profile. Bars: test results, mean ± 1 std over batches (accuracy; "
        "for a split that fits in one batch, the binomial standard error of its accuracy) and "
        "p50 ± 1 std over runs (latency)."
    )
    flagged = gaps[gaps["flagged"]]
    lines.append("")
    if flagged.empty:
        lines.append(
            f"Every variant's validation accuracy is within {VAL_TEST_TOLERANCE:g} points of its "
            f"test accuracy (largest gap {_fmt(float(gaps['gap'].abs().max()))} points)."
        )
    else:
        lines.append(
            f"{len(flagged)} of {len(gaps)} variants differ by more than "
            f"{VAL_TEST_TOLERANCE:g} points between validation and test accuracy:"
        )
        lines.append("")
        for r in flagged.itertuples():
            if math.isfinite(r.z) and r.z < 2.0:
                why = (
                    f"within sampling noise: the standard error of the difference is "
                    f"{_fmt(r.se)} points (z = {_fmt(r.z, 1)}), as expected of small splits "
                    "whose accuracy varies from batch to batch"
                )
            else:
                why = (
                    f"beyond sampling noise (standard error {_fmt(r.se)} points, z = "
                    f"{_fmt(r.z, 1)}): validation overestimates this variant (early stopping "
                    "chose it on validation) or the splits differ"
                )
            lines.append(
                f"- {r.variant}: validation {_fmt(r.val)} %, test {_fmt(r.test)} % "
                f"(gap {r.gap:+.2f}); {why}."
            )
    lines += ["", "![validation vs test](val_vs_test.png)", ""]
    return lines


def _perfmodel_section(val: pd.DataFrame) -> list[str]:
    lines = ["## 7. Analytical model", ""]
    lines.append(
        "Predicted comm and comp (the analytical model of gnnaas.profiling.perfmodel, "
        "c = the measured unique fraction) against the measured p50. " + perfmodel_caption(val)
    )
    lines += ["", "![predicted vs measured](perfmodel.png)", ""]
    return lines


def _draw_plots(
    folder: Path,
    dataset: str,
    val: pd.DataFrame,
    test: pd.DataFrame,
    frontier: pd.DataFrame,
    picks: pd.DataFrame,
    gaps: pd.DataFrame,
    ranking_prune: int | None,
    tie_margin: float,
) -> set[str]:
    """Draws every plot that has something to show into ``folder``; returns their file names."""
    from gnnaas.profiling import frontier_plots, plots

    names = dict(
        zip(
            ("breakdown", "intervals", "tolerance", "pareto", "rankings", "vt", "model"),
            PLOT_FILES,
            strict=True,
        )
    )
    plots.latency_breakdown(display_order(val), folder / names["breakdown"], dataset=dataset)
    frontier_plots.accuracy_intervals(val, test, folder / names["intervals"], dataset=dataset)
    drawn = {names["breakdown"], names["intervals"]}
    if not picks.empty:
        frontier_plots.tolerance(
            picks, folder / names["tolerance"], dataset=dataset, tie_margin=tie_margin
        )
        drawn.add(names["tolerance"])
    if not frontier.empty:
        frontier_plots.pareto(
            frontier, val, folder / names["pareto"], dataset=dataset, sizes=REQUEST_SIZES
        )
        drawn.add(names["pareto"])
    if ranking_prune is not None:
        plots.rankings(gaps, folder / names["rankings"], dataset=dataset, prune=ranking_prune)
        drawn.add(names["rankings"])
    plots.val_vs_test(display_order(val), test, folder / names["vt"], dataset=dataset)
    caption = perfmodel_caption(val)
    plots.perfmodel(val, folder / names["model"], dataset=dataset, caption=caption)
    return drawn | {names["vt"], names["model"]}


def write_report(profiles_dir: PathType, *, tie_margin: float = TIE_MARGIN) -> Path:
    """Writes ``report.md`` and the plots of :data:`PLOT_FILES` next to ``profiles.csv``.

    A plot with nothing to show is not drawn (its section says why) and an earlier report's file
    of that name is removed.

    Args:
        profiles_dir (str or PathLike): ``profiles/<dataset>`` (the dataset name's case may
            differ from the folder's).
        tie_margin (float, optional): the router's ``GNNAAS_TIE_MARGIN`` the picks are made
            with. (default: :data:`~gnnaas.policy.TIE_MARGIN`, the server's
            default)

    Returns:
        Path: the ``report.md`` written.

    Raises:
        ArtifactError: ``profiles.csv`` is missing, unreadable, or has no validation rows.
    """
    folder = _resolve_dir(profiles_dir)
    df = read_profiles(folder)
    val = df[df["split"] == "val"].reset_index(drop=True)
    test = df[df["split"] == "test"].reset_index(drop=True)
    if val.empty:
        raise ArtifactError(
            f"{folder / PROFILES_FILE} has no validation rows; run `gnnaas profile` again"
        )
    dataset = str(val["dataset"].iloc[0])
    first = val.iloc[0]
    view = read_router_view(folder, "val")
    frontier = frontier_table(view)
    picks = (
        tolerance_table(view, tie_margin=tie_margin, test=test)
        if view.candidates
        else pd.DataFrame()
    )

    gaps = ranking_gaps(df)
    prunes = comparable_prunes(gaps)
    ranking_prune = (_RANKING_PRUNE if _RANKING_PRUNE in prunes else prunes[-1]) if prunes else None
    drawn = _draw_plots(
        folder, dataset, val, test, frontier, picks, gaps, ranking_prune, tie_margin
    )
    for name in set(PLOT_FILES) - drawn:  # an earlier report's figure would contradict this one
        (folder / name).unlink(missing_ok=True)

    test_batches = int(test["num_batches"].iloc[0]) if len(test) else 0
    lines = [
        f"# Profiles of {dataset}",
        "",
        f"{val['variant'].nunique()} variants profiled on {first.device} "
        f"(torch {first.torch_version}, intra-op threads: {int(first.threads)}) on {first.date}. "
        f"Timed batches: {int(first.batch_size)} target nodes (validation: "
        f"{int(first.num_batches)} batch(es); test: {test_batches}).",
        "",
    ]
    lines += _variant_section(val, test, frontier, view)
    lines += _uncertainty_section(val, test)
    lines += _tolerance_section(picks, tie_margin)
    lines += _frontier_section(val, frontier, view)
    lines += _ranking_section(gaps, ranking_prune)
    lines += _val_test_section(df)
    lines += _perfmodel_section(val)
    path = folder / REPORT_FILE
    atomic_write_text(path, "\n".join(lines).rstrip() + "\n")
    _log.info("report: %s", path)
    return path
