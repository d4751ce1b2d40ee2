"""The seven plots of the profile report (matplotlib, Agg canvas, no pyplot state).

Each function draws one figure with one message and writes it atomically as a PNG. matplotlib is
imported inside the functions, so importing this module (or the server) does not need it.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from gnnaas.profiling.uncertainty import admissible
from gnnaas.utils import atomic_write_bytes

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "accuracy_intervals",
    "latency_breakdown",
    "pareto",
    "perfmodel",
    "rankings",
    "tolerance",
    "val_vs_test",
]

_DPI = 120
_ARCH_MARKERS = {"sage": "o", "gin": "s"}
_PRUNE_COLORS = {1: "#1b9e77", 2: "#d95f02", 4: "#7570b3", 8: "#e7298a"}
_COMM_COLOR, _COMP_COLOR = "#4c72b0", "#dd8452"


def _figure(width: float, height: float, nrows: int = 1, ncols: int = 1, **kw: Any) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def _save(fig: Figure, path: Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI)
    atomic_write_bytes(path, buf.getvalue())
    return path


def _plain_log_axis(axis: Any, subs: tuple[float, ...] = (1.0, 2.0, 5.0)) -> None:
    """Log-scale ticks at ``subs`` × 10^k written as plain numbers (no 2×10⁰)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _prune_handles(prunes: Any) -> list[Any]:
    from matplotlib.lines import Line2D

    return [
        Line2D([], [], marker="o", ls="", color=_prune_color(k), label=f"{int(k)}x")
        for k in sorted(set(prunes))
    ]


def _arch_handles(archs: Any) -> list[Any]:
    from matplotlib.lines import Line2D

    return [
        Line2D([], [], marker=m, ls="", color="gray", label=a.upper())
        for a, m in _ARCH_MARKERS.items()
        if a in set(archs)
    ]


def _label(row: Any) -> str:
    return f"{row.ranking} {int(row.prune)}x" if row.ranking != "full" else "full 1x"


def _prune_color(prune: int) -> str:
    return _PRUNE_COLORS.get(int(prune), "#666666")


def latency_breakdown(val: pd.DataFrame, path: Path, *, dataset: str) -> Path:
    """Stacked comm and comp p50 of every variant, one panel per architecture.

    Args:
        val (pandas.DataFrame): validation rows, in display order.
        path (Path): the PNG to write.
        dataset (str): for the title.

    Returns:
        Path: ``path``.
    """
    archs = sorted(val["arch"].unique())
    fig, axes = _figure(max(7.0, 0.45 * len(val) + 3), 4.8, 1, len(archs), sharey=True)
    for ax, arch in zip(axes[0], archs, strict=True):
        part = val[val["arch"] == arch]
        labels = [_label(r) for r in part.itertuples()]
        xs = range(len(part))
        ax.bar(xs, part["comm_ms"], color=_COMM_COLOR, label="comm (gather + copies)")
        ax.bar(xs, part["comp_ms"], bottom=part["comm_ms"], color=_COMP_COLOR, label="comp")
        ax.set_xticks(list(xs), labels, rotation=60, ha="right", fontsize=8)
        ax.set_title(arch.upper())
        ax.set_xlabel("variant (ranking, prune factor)")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("latency p50 (ms)")
    axes[0][0].legend(loc="upper right", fontsize=8)
    ratios = []
    for arch in archs:
        part = val[val["arch"] == arch]
        full, most = part[part["prune"] == 1], part[part["prune"] == part["prune"].max()]
        if not full.empty and int(part["prune"].max()) > 1:
            ratio = 100 * most["latency_ms"].mean() / full["latency_ms"].mean()
            ratios.append(f"{arch.upper()} {int(part['prune'].max())}x at {ratio:.0f} % of 1x")
    summary = f" ({', '.join(ratios)})" if ratios else ""
    fig.suptitle(f"{dataset}: latency = comm + comp per variant, validation batches{summary}")
    return _save(fig, path)


_ADMIT_COLORS = ("#1b9e77", "#66a61e", "#e6ab02", "#d95f02")  # admitted from N = 0, 1, 2, 5
_NEVER_COLOR = "#999999"


def _first_admitting(row: Any, tolerances: Sequence[float]) -> int | None:
    """Index of the smallest tolerance that admits ``row`` (None: none does)."""
    for i, tol in enumerate(tolerances):
        if admissible(row.diff_best, row.diff_best_lo, row.diff_best_hi, float(tol)):
            return i
    return None


def accuracy_intervals(
    val: pd.DataFrame,
    test: pd.DataFrame,
    path: Path,
    *,
    dataset: str,
    tolerances: Sequence[float] = (0.0, 1.0, 2.0, 5.0),
) -> Path:
    """Accuracy with its 95% interval, and the paired difference to the best, per variant.

    Left: validation and test accuracy with their intervals. Right: a forest plot of the paired
    difference to the most accurate variant, coloured by the smallest tolerance that admits the
    variant (:func:`gnnaas.profiling.uncertainty.admissible`).

    Args:
        val (pandas.DataFrame): validation rows (with the interval columns).
        test (pandas.DataFrame): test rows.
        path (Path): the PNG to write.
        dataset (str): for the title.
        tolerances (Sequence[float], optional): tolerances marked on the forest plot.
            (default: ``(0, 1, 2, 5)``)

    Returns:
        Path: ``path``.
    """
    from matplotlib.lines import Line2D

    order = val.sort_values(["accuracy", "latency_ms"], ascending=[False, True])
    n = len(order)
    fig, axes = _figure(11.0, max(3.6, 0.3 * n + 1.9), 1, 2, sharey=True, width_ratios=[1, 1.3])
    left, right = axes[0]
    ys = list(range(n))
    test_by = test.set_index("variant").reindex(order["variant"])

    def err(frame: pd.DataFrame) -> Any:
        lo = (frame["accuracy"] - frame["accuracy_lo"]).clip(lower=0).fillna(0)
        hi = (frame["accuracy_hi"] - frame["accuracy"]).clip(lower=0).fillna(0)
        return [lo.to_numpy(), hi.to_numpy()]

    left.errorbar(
        order["accuracy"],
        ys,
        xerr=err(order),
        fmt="o",
        ms=4,
        color="#4c72b0",
        capsize=2,
        lw=1,
        label="validation",
    )
    left.errorbar(
        test_by["accuracy"],
        [y + 0.3 for y in ys],
        xerr=err(test_by),
        fmt="s",
        ms=3,
        color="#dd8452",
        capsize=2,
        lw=1,
        label="test",
    )
    left.set_xlabel("accuracy (%) with 95% interval")
    left.set_yticks(ys, list(order["variant"]), fontsize=8)
    left.invert_yaxis()
    left.grid(axis="x", alpha=0.3)
    # rows run from most to least accurate: the lower right corner stays empty
    left.legend(fontsize=8, loc="lower right")
    left.set_title("accuracy per variant")

    has_pairs = "diff_best_lo" in order.columns and order["diff_best_lo"].notna().any()
    if has_pairs:
        for y, r in zip(ys, order.itertuples(), strict=True):
            first = _first_admitting(r, tolerances)
            color = _NEVER_COLOR if first is None else _ADMIT_COLORS[first % len(_ADMIT_COLORS)]
            right.errorbar(
                [r.diff_best],
                [y],
                xerr=[
                    [max(r.diff_best - r.diff_best_lo, 0)],
                    [max(r.diff_best_hi - r.diff_best, 0)],
                ],
                fmt="o",
                ms=5,
                color=color,
                capsize=3,
                lw=1.5,
            )
        for tol in tolerances:
            right.axvline(
                -tol, color="black" if tol == 0 else "gray", lw=0.8, ls="-" if tol == 0 else ":"
            )
            right.annotate(
                f"N={tol:g}",
                (-tol, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(0, 2),
                textcoords="offset points",
                ha="center",
                fontsize=7,
                color="dimgray",
            )
        handles = [
            Line2D(
                [],
                [],
                marker="o",
                ls="",
                color=_ADMIT_COLORS[i % len(_ADMIT_COLORS)],
                label=f"admitted from N = {t:g}",
            )
            for i, t in enumerate(tolerances)
        ]
        handles.append(
            Line2D(
                [],
                [],
                marker="o",
                ls="",
                color=_NEVER_COLOR,
                label=f"not admitted at N <= {tolerances[-1]:g}",
            )
        )
        right.legend(handles=handles, fontsize=8, loc="lower right")
        best = order["best_variant"].dropna()
        right.set_title(
            f"paired difference to the best ({best.iloc[0] if len(best) else '?'})", pad=12
        )
        right.set_xlabel("validation accuracy minus the best's (points), paired 95% interval")
        lo = float(min(order["diff_best_lo"].min(), -max(tolerances))) - 0.5
        right.set_xlim(lo, max(float(order["diff_best_hi"].max()), 0.0) + 0.5)
    else:
        right.text(
            0.5,
            0.5,
            "no paired intervals in this profile\n(profiled before they existed)",
            ha="center",
            va="center",
            transform=right.transAxes,
        )
    right.grid(axis="x", alpha=0.3)
    fig.suptitle(
        f"{dataset}: accuracy with its uncertainty (validation split; dotted lines: "
        f"tolerances N = {', '.join(f'{t:g}' for t in tolerances)})"
    )
    return _save(fig, path)


def tolerance(groups: Mapping[str, pd.DataFrame], path: Path, *, dataset: str) -> Path:
    """Relative latency of the fastest variant within each accuracy tolerance.

    Args:
        groups (Mapping[str, pandas.DataFrame]): tolerance tables (``tolerance_table``) by group
            (``all`` and each architecture).
        path (Path): the PNG to write.
        dataset (str): for the title.

    Returns:
        Path: ``path``.
    """
    fig, axes = _figure(7.5, 4.5)
    ax = axes[0][0]
    names = list(groups)
    tolerances = list(next(iter(groups.values()))["tolerance"])
    width = 0.8 / max(len(names), 1)
    colors = ["#333333", "#4c72b0", "#dd8452", "#55a868"]
    for i, name in enumerate(names):
        table = groups[name]
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(tolerances))]
        values = 100 * table["relative_latency"]
        point = "rule" in table.columns and (table["rule"] == "point estimate").any()
        label = f"{name} (point estimates)" if point else name
        bars = ax.bar(xs, values, width=width, label=label, color=colors[i % len(colors)])
        ax.bar_label(bars, labels=[f"{v:.0f}" for v in values], fontsize=7, padding=1)
    ax.axhline(100, color="gray", lw=0.8, ls="--")
    ax.set_xticks(range(len(tolerances)), [f"{t:g}" for t in tolerances])
    ax.set_xlabel(
        "accuracy tolerance N (points below the most accurate variant)\nadmissible: paired loss "
        "interval overlaps [0, N] and its upper end is ≤ N + 1",
        fontsize=9,
    )
    ax.set_ylabel("latency of fastest variant within tolerance\n(% of most accurate variant)")
    ax.set_ylim(0, 118)
    ax.legend(title="variants", fontsize=8, loc="upper right")
    ax.grid(axis="y", alpha=0.3)
    first = groups[names[0]]
    at2 = first[first["tolerance"] == 2.0]
    note = (
        f" ({names[0]}: {100 * float(at2['relative_latency'].iloc[0]):.0f} % at 2 points)"
        if not at2.empty
        else ""
    )
    ax.set_title(f"{dataset}: latency of the fastest variant within tolerance{note}")
    return _save(fig, path)


def pareto(val: pd.DataFrame, front: pd.DataFrame, path: Path, *, dataset: str) -> Path:
    """Accuracy vs latency of every variant, the Pareto front marked.

    Args:
        val (pandas.DataFrame): validation rows.
        front (pandas.DataFrame): the Pareto-optimal rows (``pareto_front``).
        path (Path): the PNG to write.
        dataset (str): for the title.

    Returns:
        Path: ``path``.
    """
    from matplotlib.lines import Line2D

    fig, axes = _figure(10.0, 5.2, 1, 2, width_ratios=[3, 1.15])
    ax, side = axes[0]
    if "accuracy_lo" in val.columns and val["accuracy_lo"].notna().any():
        yerr = [
            (val["accuracy"] - val["accuracy_lo"]).clip(lower=0).fillna(0).to_numpy(),
            (val["accuracy_hi"] - val["accuracy"]).clip(lower=0).fillna(0).to_numpy(),
        ]
        ax.errorbar(
            val["latency_ms"],
            val["accuracy"],
            yerr=yerr,
            fmt="none",
            ecolor="#bbbbbb",
            elinewidth=0.8,
            capsize=0,
            zorder=0,
            label="95% interval",
        )
    for r in val.itertuples():
        ax.scatter(
            r.latency_ms,
            r.accuracy,
            marker=_ARCH_MARKERS.get(r.arch, "^"),
            color=_prune_color(r.prune),
            s=40,
            alpha=0.85,
            edgecolor="none",
        )
    ax.step(
        front["latency_ms"],
        front["accuracy"],
        where="post",
        color="black",
        lw=1.2,
        ls="--",
        zorder=1,
    )
    ax.scatter(
        front["latency_ms"], front["accuracy"], s=140, facecolor="none", edgecolor="black", lw=1.2
    )
    # numbers on the plot, names in the side panel: neighbouring front points stay legible
    for i, r in enumerate(front.itertuples(), start=1):
        ax.annotate(
            str(i),
            (r.latency_ms, r.accuracy),
            textcoords="offset points",
            xytext=(7, -11 if i % 2 else 5),
            fontsize=8,
            fontweight="bold",
        )
    ax.set_xscale("log")
    _plain_log_axis(ax.xaxis, subs=(1.0, 2.0, 3.0, 5.0))
    ax.set_xlabel("latency p50 (ms, log scale; comm + comp)")
    ax.set_ylabel("validation accuracy (%)")
    ax.grid(alpha=0.3, which="both")
    ax.set_title(f"{dataset}: accuracy (95% interval) vs latency, Pareto front marked")

    side.set_axis_off()
    handles = _arch_handles(val["arch"]) + _prune_handles(val["prune"])
    handles.append(
        Line2D([], [], marker="o", ls="--", color="black", mfc="none", label="Pareto front")
    )
    if "accuracy_lo" in val.columns and val["accuracy_lo"].notna().any():
        handles.append(
            Line2D([], [], marker="|", ms=10, ls="", color="#bbbbbb", label="95% interval")
        )
    side.legend(handles=handles, fontsize=8, loc="upper left", ncols=2, frameon=False)
    listing = "\n".join(
        f"{i}  {r.variant}\n    {r.accuracy:.1f} %, {r.latency_ms:.3g} ms"
        for i, r in enumerate(front.itertuples(), start=1)
    )
    side.text(0.0, 0.62, "Pareto front\n" + listing, fontsize=8, va="top", family="monospace")
    return _save(fig, path)


def rankings(gaps: pd.DataFrame, path: Path, *, dataset: str, prune: int = 4) -> Path:
    """Accuracy of greedy and lasso minus random at one prune factor, per architecture.

    Args:
        gaps (pandas.DataFrame): ``ranking_gaps`` output.
        path (Path): the PNG to write.
        dataset (str): for the title.
        prune (int, optional): the prune factor compared. (default: ``4``)

    Returns:
        Path: ``path``.
    """
    fig, axes = _figure(6.0, 4.2)
    ax = axes[0][0]
    part = gaps[gaps["prune"] == prune] if not gaps.empty else gaps
    if part.empty:
        ax.text(0.5, 0.5, f"no {prune}x variants with rankings", ha="center", va="center")
        ax.set_axis_off()
    else:
        archs = list(part["arch"])
        for i, (column, color) in enumerate(
            (("greedy_gain", "#4c72b0"), ("lasso_gain", "#55a868"))
        ):
            xs = [j + (i - 0.5) * 0.38 for j in range(len(archs))]
            values = part[column].fillna(0.0)
            bars = ax.bar(xs, values, width=0.38, color=color, label=column.split("_")[0])
            ax.bar_label(
                bars,
                labels=[
                    "n/a" if math.isnan(v) else f"{v:+.1f}" for v in part[column].astype(float)
                ],
                fontsize=8,
                padding=2,
            )
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(range(len(archs)), [a.upper() for a in archs])
        ax.set_xlabel("architecture")
        ax.set_ylabel(f"{prune}x test accuracy minus random {prune}x (points)")
        ax.legend(title="ranking", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        ax.margins(y=0.2)
    ax.set_title(f"{dataset}: feature rankings vs random at {prune}x pruning")
    return _save(fig, path)


def val_vs_test(val: pd.DataFrame, test: pd.DataFrame, path: Path, *, dataset: str) -> Path:
    """Validation profile (points) vs test results (mean ± 1 std) for accuracy and latency.

    Args:
        val (pandas.DataFrame): validation rows, in display order.
        test (pandas.DataFrame): test rows.
        path (Path): the PNG to write.
        dataset (str): for the title.

    Returns:
        Path: ``path``.
    """
    test_by = test.set_index("variant").reindex(val["variant"])
    fig, axes = _figure(max(8.0, 0.42 * len(val) + 2), 7.0, 2, 1, sharex=True)
    xs = list(range(len(val)))
    shifted = [x + 0.18 for x in xs]
    panels = (
        ("accuracy", "accuracy_std", "accuracy (%)", "test mean ± 1 std over batches"),
        ("latency_ms", "latency_std_ms", "latency p50 (ms)", "test p50 ± 1 std over runs"),
    )
    for ax, (column, std, ylabel, test_label) in zip(axes[:, 0], panels, strict=True):
        ax.errorbar(
            shifted,
            test_by[column],
            yerr=test_by[std],
            fmt="s",
            ms=4,
            color="#dd8452",
            ecolor="#dd8452",
            capsize=3,
            label=test_label,
        )
        ax.scatter(xs, val[column], color="#4c72b0", s=28, zorder=3, label="validation profile")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    axes[1, 0].set_xticks(
        xs, [f"{r.arch} {_label(r)}" for r in val.itertuples()], rotation=60, ha="right", fontsize=8
    )
    axes[1, 0].set_xlabel("variant")
    fig.suptitle(f"{dataset}: validation profile vs test results, per variant")
    return _save(fig, path)


def perfmodel(val: pd.DataFrame, path: Path, *, dataset: str, caption: str = "") -> Path:
    """Predicted (analytical model) vs measured comm and comp, log-log with the diagonal.

    Each panel states the median predicted/measured ratio; ``caption`` (what the calibration
    covers and why the model may be off) is printed under the panels.

    Args:
        val (pandas.DataFrame): validation rows.
        path (Path): the PNG to write.
        dataset (str): for the title.
        caption (str, optional): explanation printed under the plot. (default: ``""``)

    Returns:
        Path: ``path``.
    """
    import textwrap

    wrapped = textwrap.fill(caption, 120) if caption else ""
    fig, axes = _figure(10.0, 4.7 + 0.17 * wrapped.count("\n"), 1, 2)
    for ax, (measured, predicted, name) in zip(
        axes[0],
        (("comm_ms", "pred_comm_ms", "comm"), ("comp_ms", "pred_comp_ms", "comp")),
        strict=True,
    ):
        for arch, marker in _ARCH_MARKERS.items():
            part = val[val["arch"] == arch]
            if part.empty:
                continue
            ax.scatter(
                part[measured],
                part[predicted],
                marker=marker,
                c=[_prune_color(k) for k in part["prune"]],
                s=36,
            )
        values = pd.concat([val[measured], val[predicted]])
        values = values[values > 0]
        if not values.empty:
            lo, hi = float(values.min()) / 1.5, float(values.max()) * 1.5
            ax.plot([lo, hi], [lo, hi], color="gray", ls="--", lw=1, label="predicted = measured")
            ax.set_xlim(lo, hi)
            ax.set_ylim(lo, hi)
        ax.set_xscale("log")
        ax.set_yscale("log")
        _plain_log_axis(ax.xaxis)
        _plain_log_axis(ax.yaxis)
        ax.set_xlabel(f"measured {name} p50 (ms)")
        ax.set_ylabel(f"predicted {name} (ms)")
        ratios = (val[predicted] / val[measured].where(val[measured] > 0)).dropna()
        median = f"{ratios.median():.2g}x" if not ratios.empty else "n/a"
        ax.set_title(f"{name}: median predicted/measured {median}")
        ax.grid(alpha=0.3, which="both")
        handles = ax.get_legend_handles_labels()[0]
        handles += _arch_handles(val["arch"]) + _prune_handles(val["prune"])
        ax.legend(handles=handles, fontsize=8, loc="upper left", ncols=2)
    fig.suptitle(
        f"{dataset}: analytical model vs measurement (BW, OPS from micro-benchmarks, not fitted)"
    )
    if wrapped:
        fig.supxlabel(wrapped, fontsize=8, ha="center")
    return _save(fig, path)
