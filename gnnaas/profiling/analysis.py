"""The report's tables: plain pandas over ``profiles.csv``, tested on their own.

:func:`ranking_gaps` and :func:`comparable_prunes` (greedy and lasso against random),
:func:`val_test_gaps` (validation profile against the test split, with the sampling noise of
each), :func:`perfmodel_ratios`, :func:`perfmodel_caption` and :func:`ratio_text` (the analytical
model against the measurements), :func:`paired_width`, :func:`trained` (which rows are trained,
not derived, variants) and :func:`display_order`, the order the report lists variants in. The
router's picks and frontier are in :mod:`gnnaas.profiling.frontier`.
"""

from __future__ import annotations

import math

import pandas as pd

from gnnaas.stats import median

__all__ = [
    "VAL_TEST_TOLERANCE",
    "comparable_prunes",
    "display_order",
    "paired_width",
    "perfmodel_caption",
    "perfmodel_ratios",
    "ranking_gaps",
    "ratio_text",
    "trained",
    "val_test_gaps",
]

VAL_TEST_TOLERANCE = 3.0
"""Validation and test accuracy may differ by this many points before the report flags it."""

_RANKING_ORDER = {"full": 0, "random": 1, "greedy": 2, "lasso": 3}


def display_order(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` sorted by architecture, prune factor, ranking, then id: a variant derived from
    another (narrower, int8, other fanouts) follows it, since its id extends the other's.

    Args:
        df (pandas.DataFrame): rows with ``arch``, ``prune``, ``ranking`` and ``variant``.

    Returns:
        pandas.DataFrame: the rows, reordered.
    """
    key = df["ranking"].map(_RANKING_ORDER).fillna(9)
    ordered = df.assign(_r=key).sort_values(["arch", "prune", "_r", "variant"])
    return ordered.drop(columns="_r")


def paired_width(df: pd.DataFrame) -> pd.Series:
    """Width in points of each row's paired 95% interval (``diff_best_hi - diff_best_lo``).

    Args:
        df (pandas.DataFrame): rows with the paired columns (NaN where a row has none).

    Returns:
        pandas.Series: the widths, NaN without paired columns.
    """
    if "diff_best_lo" not in df.columns or "diff_best_hi" not in df.columns:
        return pd.Series(math.nan, index=df.index)
    return df["diff_best_hi"] - df["diff_best_lo"]


def trained(df: pd.DataFrame) -> pd.Series:
    """Which rows are trained variants, not derived from another (``base`` empty or absent).

    Args:
        df (pandas.DataFrame): profile rows.

    Returns:
        pandas.Series: a boolean mask.
    """
    if "base" not in df.columns:
        return pd.Series(True, index=df.index)
    return df["base"].isna() | (df["base"].astype(str).str.strip() == "")


def ranking_gaps(df: pd.DataFrame, *, split: str = "test") -> pd.DataFrame:
    """Accuracy of greedy and lasso minus random, per architecture and prune factor.

    Only trained variants count: a distilled, int8 or other-fanouts variant shares its base's
    kept features.

    Args:
        df (pandas.DataFrame): the profile table (all splits).
        split (str, optional): which accuracy to compare. (default: ``"test"``)

    Returns:
        pandas.DataFrame: columns ``arch, prune, random, greedy, lasso, greedy_gain,
        lasso_gain`` (accuracy points; NaN where a variant is missing).
    """
    part = df[(df["split"] == split) & (df["ranking"].isin(["random", "greedy", "lasso"]))]
    part = part[trained(part)]  # a narrower or int8 twin of a variant ranks nothing new
    if part.empty:
        return pd.DataFrame(
            columns=["arch", "prune", "random", "greedy", "lasso", "greedy_gain", "lasso_gain"]
        )
    wide = part.pivot_table(index=["arch", "prune"], columns="ranking", values="accuracy")
    for ranking in ("random", "greedy", "lasso"):
        if ranking not in wide.columns:
            wide[ranking] = float("nan")
    wide = wide[["random", "greedy", "lasso"]].reset_index()
    wide.columns.name = None
    wide["greedy_gain"] = wide["greedy"] - wide["random"]
    wide["lasso_gain"] = wide["lasso"] - wide["random"]
    return wide


def comparable_prunes(gaps: pd.DataFrame) -> list[int]:
    """The prune factors at which some architecture has a random-ranked variant and a greedy or
    lasso one: those a ranking comparison can be drawn at.

    Args:
        gaps (pandas.DataFrame): :func:`ranking_gaps` output.

    Returns:
        list[int]: sorted prune factors (empty: nothing to compare).
    """
    if gaps.empty:
        return []
    both = gaps["random"].notna() & (gaps["greedy"].notna() | gaps["lasso"].notna())
    return sorted({int(k) for k in gaps.loc[both, "prune"]})


def val_test_gaps(df: pd.DataFrame) -> pd.DataFrame:
    """Validation vs test accuracy per variant, with the sampling noise of each split.

    The standard error of a split's accuracy is ``accuracy_std / sqrt(num_batches)`` (the
    profiler's ``accuracy_std`` of a one-batch split already is that batch's binomial standard
    error); ``z`` is the gap over the standard error of the difference.

    Args:
        df (pandas.DataFrame): the profile table (both splits).

    Returns:
        pandas.DataFrame: ``variant, val, test, gap, se, z, flagged`` where ``flagged`` marks
        ``|gap| > VAL_TEST_TOLERANCE``.
    """
    cols = ["variant", "accuracy", "accuracy_std", "num_batches"]
    val = df[df["split"] == "val"][cols].set_index("variant")
    test = df[df["split"] == "test"][cols].set_index("variant")
    both = val.add_suffix("_val").join(test.add_suffix("_test"), how="inner")
    se_val = both["accuracy_std_val"] / both["num_batches_val"].clip(lower=1) ** 0.5
    se_test = both["accuracy_std_test"] / both["num_batches_test"].clip(lower=1) ** 0.5
    out = pd.DataFrame(
        {
            "val": both["accuracy_val"],
            "test": both["accuracy_test"],
            "gap": both["accuracy_val"] - both["accuracy_test"],
            "se": (se_val**2 + se_test**2) ** 0.5,
        }
    )
    out["z"] = out["gap"].abs() / out["se"].where(out["se"] > 0)
    out["flagged"] = out["gap"].abs() > VAL_TEST_TOLERANCE
    return out.reset_index()


def perfmodel_ratios(val: pd.DataFrame) -> tuple[float, float]:
    """Median predicted/measured ratio of comm and of comp over the variants.

    Args:
        val (pandas.DataFrame): validation rows with ``pred_comm_ms``, ``comm_ms``,
            ``pred_comp_ms`` and ``comp_ms``.

    Returns:
        tuple[float, float]: ``(comm, comp)`` (NaN where nothing was measured).
    """

    def ratio(pred: str, meas: str) -> float:
        values = (val[pred] / val[meas].where(val[meas] > 0)).dropna()
        return median(values.to_numpy()) if not values.empty else math.nan

    return ratio("pred_comm_ms", "comm_ms"), ratio("pred_comp_ms", "comp_ms")


def ratio_text(ratio: float) -> str:
    """A predicted/measured ratio as the report and its plot both write it: two significant
    digits and an ``x`` (``0.011x``, ``1.3x``, ``12x``), ``n/a`` when nothing was measured.

    Args:
        ratio (float): the ratio.

    Returns:
        str: its text.

    Example:
        >>> ratio_text(0.01074), ratio_text(1.25), ratio_text(float("nan"))
        ('0.011x', '1.2x', 'n/a')
    """
    if not math.isfinite(ratio):
        return "n/a"
    return f"{ratio:.2g}x" if abs(ratio) < 100 else f"{ratio:.0f}x"


def perfmodel_caption(val: pd.DataFrame) -> str:
    """What the perf-model plot compares and why predicted and measured may differ.

    Args:
        val (pandas.DataFrame): validation rows.

    Returns:
        str: one paragraph, shared by the report and the plot.
    """
    comm, comp = perfmodel_ratios(val)
    text = (
        "BW and OPS are calibrated on this machine by micro-benchmarks (a feature gather plus "
        "host-to-device copy for BW, one large dense matmul for OPS), not fitted to these "
        "measurements. Median predicted/measured: "
        f"comm {ratio_text(comm)}, comp {ratio_text(comp)}."
    )
    if math.isfinite(comp) and comp < 0.5:
        text += (
            " Predicted compute is far below measured because the model counts each layer's "
            "multiply-adds at the dense-matmul rate OPS and ignores per-operator dispatch "
            "overhead (a forward runs dozens of small ops), the memory-bound scatter/gather of "
            "neighbour aggregation and small matrices that run below peak; at these batch sizes "
            "that overhead (operator dispatch on a CPU, kernel launches on a GPU) dominates. "
            "Read the compute prediction as a lower bound and for how compute scales with the "
            "kept features, not as absolute time."
        )
    if math.isfinite(comm) and not 0.5 <= comm <= 2.0:
        text += (
            " Predicted comm is off by more than 2x: the model moves the sampled rows at the "
            "calibrated bandwidth only, without per-copy latency or the cache effects of "
            "gathering scattered rows."
        )
    return text
