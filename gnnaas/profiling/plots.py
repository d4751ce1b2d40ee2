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

from gnnaas import stats
from gnnaas.profiling._figures import (
    ARCH_MARKERS,
    arch_handles,
    figure,
    plain_log_axis,
    prune_color,
    prune_handles,
    save_png,
    short_label,
)
from gnnaas.profiling.analysis import trained

__all__ = ["latency_breakdown", "perfmodel", "rankings", "val_vs_test"]

_COMM_COLOR, _COMP_COLOR = "#4c72b0", "#dd8452"


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
    fig, axes = figure(max(7.0, 0.45 * len(val) + 3), 4.8, 1, len(archs), sharey=True)
    for ax, arch in zip(axes[0], archs, strict=True):
        part = val[val["arch"] == arch]
        labels = [short_label(r.variant, r.arch) for r in part.itertuples()]
        xs = range(len(part))
        ax.bar(xs, part["comm_ms"], color=_COMM_COLOR, label="comm (gather + copies)")
        ax.bar(xs, part["comp_ms"], bottom=part["comm_ms"], color=_COMP_COLOR, label="comp")
        ax.set_xticks(list(xs), labels, rotation=60, ha="right", fontsize=8)
        ax.set_title(arch.upper())
        ax.set_xlabel("variant")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("latency p50 (ms)")
    axes[0][0].legend(loc="upper right", fontsize=8)
    ratios = []
    for arch in archs:
        part = val[val["arch"] == arch]
        part = part[trained(part)]  # a derived variant changes more than the prune factor
        full, most = part[part["prune"] == 1], part[part["prune"] == part["prune"].max()]
        if not full.empty and int(part["prune"].max()) > 1:
            ratio = 100 * most["latency_ms"].mean() / full["latency_ms"].mean()
            ratios.append(f"{arch.upper()} {int(part['prune'].max())}x at {ratio:.0f} % of 1x")
    summary = f" ({', '.join(ratios)})" if ratios else ""
    fig.suptitle(f"{dataset}: latency = comm + comp per variant, validation batches{summary}")
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
    """
    fig, axes = figure(6.0, 4.2)
    ax = axes[0][0]
    part = gaps[gaps["prune"] == prune] if not gaps.empty else gaps
    if part.empty or part["random"].isna().all():
        what = "variants with rankings" if part.empty else "random-ranked variants to compare"
        ax.text(0.5, 0.5, f"no {prune}x {what}", ha="center", va="center")
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
    return save_png(fig, path)


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
    fig, axes = figure(max(8.0, 0.42 * len(val) + 2), 7.0, 2, 1, sharex=True)
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
    axes[1, 0].set_xticks(xs, list(val["variant"]), rotation=60, ha="right", fontsize=8)
    axes[1, 0].set_xlabel("variant")
    fig.suptitle(f"{dataset}: validation profile vs test results, per variant")
    return save_png(fig, path)


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
        subs = (1.0, 2.0, 5.0)
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
        ratios = (val[predicted] / val[measured].where(val[measured] > 0)).dropna()
        median = f"{stats.median(ratios.to_numpy()):.2g}x" if not ratios.empty else "n/a"
        ax.set_title(f"{name}: median predicted/measured {median}")
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
