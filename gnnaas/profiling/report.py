"""The profile report: ``profiles/<dataset>/report.md`` and six PNG plots.

The report reads ``profiles.csv`` only (never the variants), so it can be rebuilt anywhere the
table is. Its sections follow ARCHITECTURE.md §5:

1. the variant table per architecture (prune, accuracy, latency, comm/comp, size, memory) and
   ``latency_breakdown.png`` (comm and comp of every variant);
2. latency under accuracy tolerance (``tolerance.png``);
3. accuracy vs latency with the Pareto front (``pareto.png``);
4. the ranking comparison: 4× accuracy of greedy and lasso minus random (``rankings.png``);
5. validation profile vs test results (``val_vs_test.png``), naming the variants whose accuracies
   differ by more than :data:`VAL_TEST_TOLERANCE` points and why;
6. predicted vs measured comm and comp (``perfmodel.png``).

The analysis helpers (:func:`tolerance_table`, :func:`pareto_front`, :func:`ranking_gaps`,
:func:`val_test_gaps`) are plain pandas and tested on their own.

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
from gnnaas.profiling.table import PROFILES_FILE, read_profiles
from gnnaas.typing import PathType
from gnnaas.utils import atomic_write_text

__all__ = [
    "PLOT_FILES",
    "REPORT_FILE",
    "TOLERANCES",
    "VAL_TEST_TOLERANCE",
    "pareto_front",
    "ranking_gaps",
    "tolerance_table",
    "val_test_gaps",
    "write_report",
]

_log = logging.getLogger(__name__)

REPORT_FILE = "report.md"
TOLERANCES: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0, 5.0)
"""Accuracy tolerances (points) of the tolerance table and plot."""
VAL_TEST_TOLERANCE = 3.0
"""Validation and test accuracy may differ by this many points before the report flags it."""
PLOT_FILES: tuple[str, ...] = (
    "latency_breakdown.png",
    "tolerance.png",
    "pareto.png",
    "rankings.png",
    "val_vs_test.png",
    "perfmodel.png",
)
"""The six plots, in report order."""

_RANKING_ORDER = {"full": 0, "random": 1, "greedy": 2, "lasso": 3}


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    key = df["ranking"].map(_RANKING_ORDER).fillna(9)
    return df.assign(_r=key).sort_values(["arch", "prune", "_r"]).drop(columns="_r")


def tolerance_table(val: pd.DataFrame, tolerances: Sequence[float] = TOLERANCES) -> pd.DataFrame:
    """The fastest variant within each tolerance of the most accurate one (ARCHITECTURE.md §5).

    The baseline is the most accurate variant (ties: the faster). For tolerance ``N`` the pick is
    the lowest-latency variant whose accuracy is at least ``baseline - N``.

    Args:
        val (pandas.DataFrame): one row per variant (the validation profile).
        tolerances (Sequence[float], optional): in accuracy points. (default: :data:`TOLERANCES`)

    Returns:
        pandas.DataFrame: per tolerance the baseline, the pick, its accuracy, latency and
        ``relative_latency`` (pick latency / baseline latency).
    """
    if val.empty:
        raise ValueError("tolerance_table: no variants (got an empty table)")
    base = val.sort_values(["accuracy", "latency_ms"], ascending=[False, True]).iloc[0]
    rows = []
    for tol in tolerances:
        within = val[val["accuracy"] >= base["accuracy"] - tol - 1e-9]
        pick = within.sort_values(["latency_ms", "accuracy"], ascending=[True, False]).iloc[0]
        rows.append(
            {
                "tolerance": float(tol),
                "baseline": base["variant"],
                "baseline_accuracy": float(base["accuracy"]),
                "baseline_latency_ms": float(base["latency_ms"]),
                "variant": pick["variant"],
                "accuracy": float(pick["accuracy"]),
                "latency_ms": float(pick["latency_ms"]),
                "relative_latency": float(pick["latency_ms"] / base["latency_ms"]),
            }
        )
    return pd.DataFrame(rows)


def pareto_front(val: pd.DataFrame) -> pd.DataFrame:
    """Variants no other variant beats on both accuracy (higher) and latency (lower).

    Args:
        val (pandas.DataFrame): one row per variant with ``accuracy`` and ``latency_ms``.

    Returns:
        pandas.DataFrame: the front, sorted by latency.
    """
    ordered = val.sort_values(["latency_ms", "accuracy"], ascending=[True, False])
    keep, best = [], -math.inf
    for index, row in ordered.iterrows():
        if row["accuracy"] > best:
            keep.append(index)
            best = row["accuracy"]
    return ordered.loc[keep]


def ranking_gaps(df: pd.DataFrame, *, split: str = "test") -> pd.DataFrame:
    """Accuracy of greedy and lasso minus random, per architecture and prune factor.

    Args:
        df (pandas.DataFrame): the profile table (all splits).
        split (str, optional): which accuracy to compare. (default: ``"test"``)

    Returns:
        pandas.DataFrame: columns ``arch, prune, random, greedy, lasso, greedy_gain,
        lasso_gain`` (accuracy points; NaN where a variant is missing).
    """
    part = df[(df["split"] == split) & (df["ranking"].isin(["random", "greedy", "lasso"]))]
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


def _variant_section(val: pd.DataFrame, test: pd.DataFrame) -> list[str]:
    lines = ["## 1. Variants", ""]
    lines.append(
        "Validation profile (p50 over runs). Latency = comm + comp (gather of the kept features, "
        "copies, forward); e2e adds sampling. Test accuracy for reference. Size: the weights "
        "file. Mem: peak memory allocated while serving one batch (gathered inputs, activations, "
        "outputs), from torch's profiler memory accounting on the CPU or "
        "`torch.cuda.max_memory_allocated` on CUDA."
    )
    test_acc = test.set_index("variant")["accuracy"]
    for arch, part in _sorted(val).groupby("arch", sort=True):
        lines += ["", f"### {str(arch).upper()}", ""]
        rows = [
            [
                f"{int(r.prune)}x",
                str(r.ranking),
                str(int(r.features_kept)),
                _fmt(r.accuracy),
                _fmt(float(test_acc.get(r.variant, float("nan")))),
                _fmt(r.latency_ms, 3),
                _fmt(r.latency_p95_ms, 3),
                _fmt(r.e2e_ms, 3),
                _fmt(r.comm_comp),
                _fmt(r.size_kb, 1),
                _fmt(r.mem_mb, 1),
            ]
            for r in part.itertuples()
        ]
        lines += _md_table(
            [
                "prune",
                "ranking",
                "features",
                "accuracy %",
                "test acc %",
                "latency ms",
                "p95 ms",
                "e2e ms",
                "comm/comp",
                "size KB",
                "mem MB",
            ],
            rows,
        )
    lines += ["", "![latency breakdown](latency_breakdown.png)", ""]
    return lines


def _tolerance_section(val: pd.DataFrame) -> list[str]:
    lines = ["## 2. Latency under accuracy tolerance", ""]
    lines.append(
        "Baseline: the most accurate variant (validation profile). For tolerance N: the fastest "
        "variant within N accuracy points of it; relative latency = its latency / the baseline's."
    )
    groups = [("all", val)] + [(str(a), p) for a, p in val.groupby("arch", sort=True)]
    for name, part in groups:
        table = tolerance_table(part)
        base = table.iloc[0]
        lines += [
            "",
            f"**{name}** (baseline {base.baseline}: {_fmt(base.baseline_accuracy)} %, "
            f"{_fmt(base.baseline_latency_ms, 3)} ms)",
            "",
        ]
        lines += _md_table(
            ["tolerance (points)", "variant", "accuracy %", "latency ms", "relative latency"],
            [
                [
                    _fmt(r.tolerance, 1),
                    str(r.variant),
                    _fmt(r.accuracy),
                    _fmt(r.latency_ms, 3),
                    f"{100 * r.relative_latency:.0f} %",
                ]
                for r in table.itertuples()
            ],
        )
    lines += ["", "![latency under tolerance](tolerance.png)", ""]
    return lines


def _pareto_section(val: pd.DataFrame) -> list[str]:
    front = pareto_front(val)
    lines = ["## 3. Accuracy vs latency", ""]
    lines.append(
        "Pareto front (no variant is both faster and more accurate): "
        + ", ".join(
            f"{r.variant} ({_fmt(r.accuracy)} %, {_fmt(r.latency_ms, 3)} ms)"
            for r in front.itertuples()
        )
        + "."
    )
    lines += ["", "![accuracy vs latency](pareto.png)", ""]
    return lines


def _ranking_section(df: pd.DataFrame) -> list[str]:
    gaps = ranking_gaps(df)
    lines = ["## 4. Feature rankings", ""]
    if gaps.empty:
        return lines + ["No pruned variants with rankings were profiled.", ""]
    lines.append(
        "Test accuracy of greedy and lasso minus random at the same prune factor "
        "(points; positive = the ranking keeps more useful features than chance)."
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
    lines += ["", "![ranking comparison](rankings.png)", ""]
    return lines


def _val_test_section(df: pd.DataFrame) -> list[str]:
    gaps = val_test_gaps(df)
    lines = ["## 5. Validation profile vs test results", ""]
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
    lines = ["## 6. Analytical model", ""]
    ratio_comm = (val["pred_comm_ms"] / val["comm_ms"]).median()
    ratio_comp = (val["pred_comp_ms"] / val["comp_ms"]).median()
    lines.append(
        "Predicted comm and comp (ARCHITECTURE.md §5 with BW and OPS calibrated on this machine, "
        "c = the measured unique fraction) against the measured p50. Median predicted/measured: "
        f"comm {_fmt(ratio_comm)}, comp {_fmt(ratio_comp)}."
    )
    lines += ["", "![predicted vs measured](perfmodel.png)", ""]
    return lines


def write_report(profiles_dir: PathType) -> Path:
    """Writes ``report.md`` and the six plots of :data:`PLOT_FILES` next to ``profiles.csv``.

    Args:
        profiles_dir (str or PathLike): ``profiles/<dataset>`` (the dataset name's case may
            differ from the folder's).

    Returns:
        Path: the ``report.md`` written.

    Raises:
        ArtifactError: ``profiles.csv`` is missing, unreadable, or has no validation rows.
    """
    from gnnaas.profiling import plots

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

    plots.latency_breakdown(_sorted(val), folder / PLOT_FILES[0], dataset=dataset)
    groups = {"all": tolerance_table(val)}
    groups.update({str(a): tolerance_table(p) for a, p in val.groupby("arch", sort=True)})
    plots.tolerance(groups, folder / PLOT_FILES[1], dataset=dataset)
    plots.pareto(val, pareto_front(val), folder / PLOT_FILES[2], dataset=dataset)
    plots.rankings(ranking_gaps(df), folder / PLOT_FILES[3], dataset=dataset)
    plots.val_vs_test(_sorted(val), test, folder / PLOT_FILES[4], dataset=dataset)
    plots.perfmodel(val, folder / PLOT_FILES[5], dataset=dataset)

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
    lines += _variant_section(val, test)
    lines += _tolerance_section(val)
    lines += _pareto_section(val)
    lines += _ranking_section(df)
    lines += _val_test_section(df)
    lines += _perfmodel_section(val)
    path = folder / REPORT_FILE
    atomic_write_text(path, "\n".join(lines).rstrip() + "\n")
    _log.info("report: %s", path)
    return path
