"""The variant plots of the profile report: latency breakdown, rankings, validation vs test and
the analytical model (matplotlib, Agg canvas, no pyplot state).

Each function draws one figure with one message and writes it atomically as a PNG. matplotlib is
imported inside the functions, so importing this module (or the server) does not need it. The
plots of accuracy against speed (intervals, tolerance picks, the frontier) are in
:mod:`gnnaas.profiling.frontier_plots`.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from gnnaas.profiling._figures import (
    ARCH_MARKERS,
    MAX_WIDTH_IN,
    arch_handles,
    figure,
    plain_log_axis,
    prune_color,
    prune_handles,
    save_png,
    short_label,
)
from gnnaas.profiling.analysis import comparable_prunes, perfmodel_ratios, ratio_text

__all__ = ["latency_breakdown", "perfmodel", "rankings", "val_vs_test"]

_COMM_COLOR, _COMP_COLOR = "#4c72b0", "#dd8452"


def latency_breakdown(val: pd.DataFrame, path: Path, *, dataset: str) -> Path:
    """Stacked comm and comp p50 of every variant, one horizontal bar each, one panel per
    architecture.

    The variants run down the panels (their names read horizontally, however many there are);
    the figure is at most :data:`~gnnaas.profiling._figures.MAX_WIDTH_IN` wide and grows in
    height, and the legend sits under the panels, clear of the bars.

    Args:
        val (pandas.DataFrame): validation rows, in display order.
        path (Path): the PNG to write.
        dataset (str): for the title.

    Returns:
        Path: ``path``.
    """
    archs = sorted(val["arch"].unique())
    rows = max(int((val["arch"] == arch).sum()) for arch in archs)
    width = min(MAX_WIDTH_IN, 1.6 + 5.4 * len(archs))
    fig, axes = figure(width, 1.9 + 0.2 * rows, 1, len(archs), sharex=True)
    for ax, arch in zip(axes[0], archs, strict=True):
        part = val[val["arch"] == arch]
        ys = list(range(len(part)))
        comm, comp = part["comm_ms"].fillna(0.0), part["comp_ms"].fillna(0.0)
        ax.barh(ys, comm, height=0.75, color=_COMM_COLOR, label="comm (gather + copies)")
        bars = ax.barh(ys, comp, left=comm, height=0.75, color=_COMP_COLOR, label="comp (forward)")
        totals = [f"{v:.3g}" if math.isfinite(v) else "n/a" for v in part["latency_ms"]]
        ax.bar_label(bars, labels=totals, fontsize=7, padding=2)
        ax.set_yticks(ys, [short_label(r.variant, r.arch) for r in part.itertuples()], fontsize=8)
        ax.set_ylim(len(part) - 0.4, -0.6)  # the display order, top down
        ax.set_title(arch.upper())
        ax.set_xlabel("latency p50 (ms)")
        ax.grid(axis="x", alpha=0.3)
        ax.margins(x=0.12)  # room for the totals right of the longest bar
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    batch = int(val["batch_size"].iloc[0])
    fig.suptitle(
        f"{dataset}: latency per variant, batches of {batch} target nodes (validation, p50)",
        fontsize=11,
    )
    return save_png(fig, path)


def rankings(gaps: pd.DataFrame, path: Path, *, dataset: str, prune: int = 4) -> Path:
    """Accuracy of greedy and lasso minus random at one prune factor, per architecture.

    Args:
        gaps (pandas.DataFrame): ``ranking_gaps`` output.
        path (Path): the PNG to write.
        dataset (str): for the title.
        prune (int, optional): the prune factor compared. (default: ``4``)

    Returns:
        Path: ``path``.

    Raises:
        ValueError: no architecture has a random-ranked variant at ``prune`` to compare with
            (:func:`~gnnaas.profiling.analysis.comparable_prunes` lists those that do).
    """
    part = gaps[(gaps["prune"] == prune) & gaps["random"].notna()]
    if part.empty:
        raise ValueError(
            f"rankings: no random-ranked {prune}x variant to compare with (got prune={prune}; "
            f"comparable: {comparable_prunes(gaps) or 'none'})"
        )
    fig, axes = figure(6.0, 4.2)
    ax = axes[0][0]
    archs = list(part["arch"])
    for i, (column, color) in enumerate((("greedy_gain", "#4c72b0"), ("lasso_gain", "#55a868"))):
        xs = [j + (i - 0.5) * 0.38 for j in range(len(archs))]
        values = part[column].fillna(0.0)
        bars = ax.bar(xs, values, width=0.38, color=color, label=column.split("_")[0])
        ax.bar_label(
            bars,
            labels=["n/a" if math.isnan(v) else f"{v:+.1f}" for v in part[column].astype(float)],
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
    return save_png(fig, path)


def val_vs_test(val: pd.DataFrame, test: pd.DataFrame, path: Path, *, dataset: str) -> Path:
    """Validation profile (points) vs test results (mean ± 1 std) for accuracy and latency.

    One row per variant, down two panels side by side (accuracy, latency) that share the variant
    names; the legend sits under the panels.

    Args:
        val (pandas.DataFrame): validation rows, in display order.
        test (pandas.DataFrame): test rows.
        path (Path): the PNG to write.
        dataset (str): for the title.

    Returns:
        Path: ``path``.
    """
    test_by = test.set_index("variant").reindex(val["variant"])
    n = len(val)
    fig, axes = figure(min(MAX_WIDTH_IN, 11.0), 2.0 + 0.2 * n, 1, 2, sharey=True)
    ys = list(range(n))
    shifted = [y + 0.3 for y in ys]
    panels = (
        ("accuracy", "accuracy_std", "accuracy (%)"),
        ("latency_ms", "latency_std_ms", "latency p50 (ms)"),
    )
    for ax, (column, std, xlabel) in zip(axes[0], panels, strict=True):
        ax.errorbar(
            test_by[column],
            shifted,
            xerr=test_by[std],
            fmt="s",
            ms=3,
            color="#dd8452",
            ecolor="#dd8452",
            capsize=2,
            label="test: accuracy mean ± 1 std over batches, latency p50 ± 1 std over runs",
        )
        ax.scatter(val[column], ys, color="#4c72b0", s=18, zorder=3, label="validation profile")
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    left = axes[0][0]
    left.set_yticks(ys, list(val["variant"]), fontsize=8)
    left.set_ylim(n - 0.4, -0.7)  # the display order, top down
    handles, labels = left.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    fig.suptitle(f"{dataset}: validation profile vs test results, per variant", fontsize=11)
    return save_png(fig, path)


def perfmodel(val: pd.DataFrame, path: Path, *, dataset: str, caption: str = "") -> Path:
    """Predicted (analytical model) vs measured comm and comp, log-log with the diagonal.

    Each panel states the median predicted/measured ratio, written as ``caption`` writes it
    (:func:`~gnnaas.profiling.analysis.ratio_text`); ``caption`` (what the calibration covers
    and why the model may be off) is printed under the panels.

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
    ratios = dict(zip(("comm", "comp"), perfmodel_ratios(val), strict=True))  # as the caption's
    fig, axes = figure(10.0, 4.7 + 0.17 * wrapped.count("\n"), 1, 2)
    for ax, (measured, predicted, name) in zip(
        axes[0],
        (("comm_ms", "pred_comm_ms", "comm"), ("comp_ms", "pred_comp_ms", "comp")),
        strict=True,
    ):
        for arch, marker in ARCH_MARKERS.items():
            part = val[val["arch"] == arch]
            if part.empty:
                continue
            ax.scatter(
                part[measured],
                part[predicted],
                marker=marker,
                c=[prune_color(k) for k in part["prune"]],
                s=36,
            )
        values = pd.concat([val[measured], val[predicted]])
        values = values[values > 0]
        subs: tuple[float, ...] = (1.0, 2.0, 5.0)
        if not values.empty:
            lo, hi = float(values.min()) / 1.5, float(values.max()) * 1.5
            ax.plot([lo, hi], [lo, hi], color="gray", ls="--", lw=1, label="predicted = measured")
            ax.set_xlim(lo, hi)
            ax.set_ylim(lo, hi)
            if hi / lo > 1e3:  # 1-2-5 labels of over three decades run into each other
                subs = (1.0,)
        ax.set_xscale("log")
        ax.set_yscale("log")
        plain_log_axis(ax.xaxis, subs)
        plain_log_axis(ax.yaxis, subs)
        ax.set_xlabel(f"measured {name} p50 (ms)")
        ax.set_ylabel(f"predicted {name} (ms)")
        ax.set_title(f"{name}: median predicted/measured {ratio_text(ratios[name])}")
        ax.grid(alpha=0.3, which="both")
        handles = ax.get_legend_handles_labels()[0]
        handles += arch_handles(val["arch"]) + prune_handles(val["prune"])
        ax.legend(handles=handles, fontsize=8, loc="upper left", ncols=2)
    fig.suptitle(
        f"{dataset}: analytical model vs measurement (BW, OPS from micro-benchmarks, not fitted)"
    )
    if wrapped:
        fig.supxlabel(wrapped, fontsize=8, ha="center")
    return save_png(fig, path)
