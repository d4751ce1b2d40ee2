"""The report's plots of accuracy against speed: accuracy intervals, the router's picks under
tolerance, and the frontier (matplotlib, Agg canvas, no pyplot state).

Each function draws one figure and writes it atomically as a PNG; matplotlib is imported inside
them. They draw the tables of :mod:`gnnaas.profiling.frontier` (the router's own rule applied to
the profiles), so a plot shows the variant a request gets.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from gnnaas.policy import admissible
from gnnaas.profiling._figures import (
    ARCH_MARKERS,
    MAX_WIDTH_IN,
    arch_handles,
    figure,
    plain_log_axis,
    prune_color,
    prune_handles,
    save_png,
)

__all__ = ["accuracy_intervals", "pareto", "tolerance"]

_ADMIT_COLORS = ("#1b9e77", "#66a61e", "#e6ab02", "#d95f02")  # admitted from N = 0, 1, 2, 5
_NEVER_COLOR = "#999999"
_SIZE_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#8172b3")


def _first_admitting(row: Any, tolerances: Sequence[float]) -> int | None:
    """Index of the smallest tolerance that admits ``row`` (None: none does)."""
    for i, tol in enumerate(tolerances):
        if admissible(row.diff_best, row.diff_best_lo, row.diff_best_hi, float(tol)):
            return i
    return None


def _interval_errors(frame: pd.DataFrame) -> Any:
    lo = (frame["accuracy"] - frame["accuracy_lo"]).clip(lower=0).fillna(0)
    hi = (frame["accuracy_hi"] - frame["accuracy"]).clip(lower=0).fillna(0)
    return [lo.to_numpy(), hi.to_numpy()]


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
    variant (:func:`gnnaas.policy.admissible`); the tolerances are dotted lines
    at ``-N``, named on the top axis. The legend lists only the colours drawn.

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
    order = val.sort_values(["accuracy", "latency_ms"], ascending=[False, True])
    n = len(order)
    fig, axes = figure(11.0, max(3.8, 0.26 * n + 2.2), 1, 2, sharey=True, width_ratios=[1, 1.3])
    left, right = axes[0]
    _accuracy_panel(left, order, test.set_index("variant").reindex(order["variant"]))
    has_pairs = "diff_best_lo" in order.columns and order["diff_best_lo"].notna().any()
    if has_pairs:
        handles = _paired_difference_panel(right, order, tolerances)
        # under the panels: inside, it would cover the bars of the last (least accurate) rows
        fig.legend(
            handles=handles,
            loc="outside lower right",
            ncols=len(handles),
            fontsize=8,
            frameon=False,
        )
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
    fig.suptitle(f"{dataset}: accuracy with its uncertainty (validation split)")
    return save_png(fig, path)


def _accuracy_panel(ax: Any, order: pd.DataFrame, test_by: pd.DataFrame) -> None:
    """Validation and test accuracy with their intervals, one row per variant of ``order``
    (``test_by``: the test rows in that order)."""
    n = len(order)
    ys = list(range(n))
    style = {"capsize": 2, "lw": 1}
    ax.errorbar(
        order["accuracy"],
        ys,
        xerr=_interval_errors(order),
        fmt="o",
        ms=4,
        color="#4c72b0",
        label="validation",
        **style,
    )
    ax.errorbar(
        test_by["accuracy"],
        [y + 0.3 for y in ys],
        xerr=_interval_errors(test_by),
        fmt="s",
        ms=3,
        color="#dd8452",
        label="test",
        **style,
    )
    ax.set_xlabel("accuracy (%) with 95% interval")
    ax.set_yticks(ys, list(order["variant"]), fontsize=8)
    ax.set_ylim(n - 0.4, -0.7)  # most accurate on top
    ax.grid(axis="x", alpha=0.3)
    # the top rows are the most accurate: the upper left corner stays empty
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title("accuracy per variant")


def _paired_difference_panel(
    ax: Any, order: pd.DataFrame, tolerances: Sequence[float]
) -> list[Any]:
    """The forest plot of each variant's paired difference to the best, coloured by the smallest
    tolerance that admits it, with the tolerances as dotted lines named on a top axis; returns
    the legend entries of the colours drawn."""
    drawn: set[int | None] = set()
    for y, r in enumerate(order.itertuples()):
        first = _first_admitting(r, tolerances)
        drawn.add(first)
        color = _NEVER_COLOR if first is None else _ADMIT_COLORS[first % len(_ADMIT_COLORS)]
        ax.errorbar(
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
        ax.axvline(-tol, color="black" if tol == 0 else "gray", lw=0.8, ls="-" if tol == 0 else ":")
    # the tolerances as ticks of a top axis: one short number each, no overprinted labels
    top = ax.secondary_xaxis("top")
    top.set_xticks([-float(t) for t in tolerances], [f"{t:g}" for t in tolerances], fontsize=8)
    top.set_xlabel("tolerance N (points; dotted lines at −N)", fontsize=8)
    best = order["best_variant"].dropna()
    ax.set_title(f"paired difference to the best ({best.iloc[0] if len(best) else '?'})")
    ax.set_xlabel("validation accuracy minus the best's (points), paired 95% interval")
    lo = float(min(order["diff_best_lo"].min(), -max(tolerances))) - 0.5
    ax.set_xlim(lo, max(float(order["diff_best_hi"].max()), 0.0) + 0.5)
    return _admission_handles(drawn, tolerances)


def _admission_handles(drawn: set[int | None], tolerances: Sequence[float]) -> list[Any]:
    """Legend entries for the colours drawn: each admitting tolerance, and "not admitted"."""
    from matplotlib.lines import Line2D

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
        if i in drawn
    ]
    if None in drawn:
        handles.append(
            Line2D(
                [],
                [],
                marker="o",
                ls="",
                color=_NEVER_COLOR,
                label=f"not admitted at N ≤ {tolerances[-1]:g}",
            )
        )
    return handles


def tolerance(table: pd.DataFrame, path: Path, *, dataset: str, tie_margin: float) -> Path:
    """The router's pick per tolerance and request size, and its predicted time.

    One horizontal bar per tolerance and request size: the pick's predicted service time at that
    size as a percentage of the most accurate variant's, labelled with the pick.

    Args:
        table (pandas.DataFrame): :func:`gnnaas.profiling.frontier.tolerance_table`.
        path (Path): the PNG to write.
        dataset (str): for the title.
        tie_margin (float): the router's tie margin the picks were made with (for the title).

    Returns:
        Path: ``path``.

    Raises:
        ValueError: ``table`` is empty (no variant has a service curve: nothing is routed).
    """
    from matplotlib.patches import Patch

    if table.empty:
        raise ValueError(f"tolerance: table must hold a pick (got an empty one for {dataset!r})")
    tolerances = list(dict.fromkeys(table["tolerance"]))
    sizes = list(dict.fromkeys(table["num_nodes"]))
    step = len(sizes) + 0.8
    fig, axes = figure(8.0, 1.2 + 0.32 * step * len(tolerances) + 0.9)
    ax = axes[0][0]
    by_key = {(r.tolerance, r.num_nodes): r for r in table.itertuples()}
    longest = 0.0
    for i, tol in enumerate(tolerances):
        for j, n in enumerate(sizes):
            r = by_key[(tol, n)]
            pct = 100 * float(r.relative_time)
            y = i * step + j
            ax.barh(y, pct, height=0.8, color=_SIZE_COLORS[j % len(_SIZE_COLORS)])
            label = f"{pct:.0f} %  {r.variant}"
            ax.annotate(
                label, (pct, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8
            )
            longest = max(longest, pct)
    ax.axvline(100, color="gray", lw=0.8, ls="--")
    # room for the labels right of the longest bar (about 0.55 of the axis at this width)
    top = max(longest, 100.0)
    ax.set_xlim(0, top * 1.9)
    ax.set_xticks([t for t in range(0, int(top) + 1, 25)])  # no ticks over the labels' room
    ax.set_yticks(
        [i * step + (len(sizes) - 1) / 2 for i in range(len(tolerances))],
        [f"N = {t:g}" for t in tolerances],
    )
    ax.set_ylim(len(tolerances) * step - 0.8, -0.8)
    ax.set_xlabel(
        "predicted time at the request size, % of the most accurate variant's (dashed: 100 %)",
        fontsize=9,
    )
    ax.set_ylabel("accuracy tolerance (points)")
    ax.grid(axis="x", alpha=0.3)
    handles = [
        Patch(color=_SIZE_COLORS[j % len(_SIZE_COLORS)], label=f"{n} node{'s' if n != 1 else ''}")
        for j, n in enumerate(sizes)
    ]
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncols=len(handles),
        fontsize=8,
        title="request size",
        title_fontsize=8,
        frameon=False,
    )
    ax.set_title(
        f"{dataset}: the idle router's pick per tolerance (tie margin {tie_margin:g})", fontsize=11
    )
    return save_png(fig, path)


def _nodes(n: int) -> str:
    return f"{n} node{'s' if n != 1 else ''}"


def _number_points(ax: Any, front: pd.DataFrame, column: str, number: dict[str, int]) -> None:
    """Numbers the frontier points; points closer than about a label's size share one label
    (``1,2``) instead of printing over each other."""
    ax.get_xlim(), ax.get_ylim()  # settles the autoscaled limits the transform reads
    to_axes = ax.transData + ax.transAxes.inverted()  # data → axes fraction
    groups: list[tuple[float, float, list[str], tuple[float, float]]] = []
    for r in front.sort_values("accuracy", ascending=False).itertuples():
        xy = (float(getattr(r, column)), float(r.accuracy))
        fx, fy = to_axes.transform(xy)
        for gx, gy, labels, _ in groups:
            if abs(fx - gx) < 0.04 and abs(fy - gy) < 0.03:
                labels.append(str(number[r.variant]))
                break
        else:
            groups.append((fx, fy, [str(number[r.variant])], xy))
    for _, _, labels, xy in groups:
        ax.annotate(
            ",".join(sorted(labels, key=int)),
            xy,
            xytext=(4, 3),
            textcoords="offset points",
            fontsize=7,
            fontweight="bold",
            zorder=4,
        )


def _front_at(points: pd.DataFrame, column: str) -> pd.DataFrame:
    """The points no other beats on both accuracy and ``column`` (time), sorted by time."""
    ordered = points.sort_values([column, "accuracy"], ascending=[True, False])
    keep, best = [], -math.inf
    for index, accuracy in zip(ordered.index, ordered["accuracy"], strict=True):
        if accuracy > best:
            keep.append(index)
            best = accuracy
    return ordered.loc[keep]


def pareto(
    frontier: pd.DataFrame,
    val: pd.DataFrame,
    path: Path,
    *,
    dataset: str,
    sizes: Sequence[int] = (1, 64),
) -> Path:
    """Accuracy vs predicted service time at each request size, the router's frontier marked.

    Every routable variant is a point (marker: architecture, colour: prune factor); the frontier
    (:func:`gnnaas.profiling.frontier.frontier_table`, not dominated at any size or tolerance)
    is drawn solid and numbered, the dominated variants faded. The dashed line is the best
    accuracy reachable within each time at that size; a frontier variant off it is there for
    another size or for a narrower paired interval (admitted at a smaller tolerance). The side
    panel names the numbered variants.

    Args:
        frontier (pandas.DataFrame): :func:`gnnaas.profiling.frontier.frontier_table`, with a
            ``service_ms_<n>`` column per size.
        val (pandas.DataFrame): validation rows (``arch``, ``prune`` per variant).
        path (Path): the PNG to write.
        dataset (str): for the title.
        sizes (Sequence[int], optional): request sizes, one panel each. (default: ``(1, 64)``)

    Returns:
        Path: ``path``.

    Raises:
        ValueError: ``frontier`` is empty (no variant has a service curve).
    """

    if frontier.empty:
        raise ValueError(f"pareto: frontier must hold a variant (got an empty one for {dataset!r})")
    info = val.drop_duplicates("variant").set_index("variant")[["arch", "prune"]]
    points = frontier.join(info, on="variant")
    front = points[points["on_frontier"]].sort_values(f"service_ms_{sizes[-1]}")
    number = {v: i for i, v in enumerate(front["variant"], start=1)}
    fig, axes = figure(
        min(MAX_WIDTH_IN, 5.0 * len(sizes) + 3.6),
        max(5.4, 3.4 + 0.13 * len(front)),
        1,
        len(sizes) + 1,
        sharey=False,
        width_ratios=[*([3.0] * len(sizes)), 2.1],
    )
    panels, side = list(axes[0][:-1]), axes[0][-1]
    for ax, n in zip(panels, sizes, strict=True):
        _pareto_panel(ax, points, front, n, number)
    panels[0].set_ylabel("validation accuracy (%)")
    _pareto_side(side, points, front, sizes, number)
    fig.suptitle(
        f"{dataset}: accuracy vs predicted service time; {len(front)} of {len(points)} variants "
        "on the router's frontier"
    )
    return save_png(fig, path)


def _pareto_panel(
    ax: Any, points: pd.DataFrame, front: pd.DataFrame, n: int, number: dict[str, int]
) -> None:
    """One panel of :func:`pareto`: every variant at requests of ``n`` nodes, the frontier's
    numbered, the best accuracy within each time dashed."""
    column = f"service_ms_{n}"
    for r in points.itertuples():
        on = bool(r.on_frontier)
        ax.scatter(
            getattr(r, column),
            r.accuracy,
            marker=ARCH_MARKERS.get(str(r.arch), "^"),
            color=prune_color(int(r.prune) if math.isfinite(r.prune) else 0),
            s=46 if on else 30,
            alpha=1.0 if on else 0.25,
            edgecolor="black" if on else "none",
            lw=0.8,
            zorder=3 if on else 2,
        )
    best = _front_at(front, column)
    ax.step(best[column], best["accuracy"], where="post", color="black", lw=1.0, ls="--", zorder=1)
    times = points[column].dropna()
    if len(times) and float(times.max()) > 3 * float(times.min()):
        ax.set_xscale("log")
        plain_log_axis(ax.xaxis, subs=(1.0, 2.0, 3.0, 5.0))
        scale = "ms, log"
    else:  # a narrow range reads better on a linear axis (a log axis shows one tick)
        scale = "ms"
    _number_points(ax, front, column, number)
    ax.set_xlabel(f"predicted service time for {_nodes(n)} ({scale})")
    ax.grid(alpha=0.3, which="both")
    ax.set_title(f"request of {_nodes(n)}", fontsize=10)


def _pareto_side(
    side: Any,
    points: pd.DataFrame,
    front: pd.DataFrame,
    sizes: Sequence[int],
    number: dict[str, int],
) -> None:
    """The side panel of :func:`pareto`: the legend and the numbered frontier variants with
    their times at each size."""
    from matplotlib.lines import Line2D

    side.set_axis_off()
    handles = arch_handles(points["arch"].dropna()) + prune_handles(points["prune"].dropna())
    handles += [
        Line2D([], [], marker="o", ls="", color="gray", mec="black", label="frontier"),
        Line2D([], [], marker="o", ls="", color="gray", alpha=0.25, label="dominated"),
        Line2D([], [], ls="--", color="black", lw=1.0, label="best within the time"),
    ]
    side.legend(handles=handles, fontsize=7.5, loc="lower left", ncols=2, frameon=False)
    times = " / ".join(f"{n}" for n in sizes)
    width = max((len(v) for v in front["variant"]), default=0)
    listing = "\n".join(
        f"{number[r.variant]:>2} {r.variant:<{width}} {r.accuracy:5.1f} %  "
        + " / ".join(f"{getattr(r, f'service_ms_{n}'):.3g}" for n in sizes)
        for r in front.itertuples()
    )
    side.text(
        0.0,
        1.0,
        f"frontier (ms at {times} nodes)\n{listing}",
        fontsize=7,
        va="top",
        family="monospace",
        transform=side.transAxes,
    )
