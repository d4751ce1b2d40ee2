"""Accuracy with its uncertainty, and the rule that turns a tolerance into a promise.

A profiled accuracy is an estimate from a few hundred or thousand evaluation nodes: on a split of
a few hundred nodes (Cora's validation set) its standard error, ``100·sqrt(p(1-p)/n)`` points, is
as large as the tolerances clients ask for. This module attaches to every profile row

- ``accuracy_lo``, ``accuracy_hi``: the 95% interval of the accuracy over the evaluation nodes
  (Wilson score interval for single-label accuracy; percentile bootstrap over nodes of the ratio
  ``Σnum / Σden`` for multi-label F1-micro);
- ``best_variant``: the most accurate variant of the split (ties: the lower ``latency_ms``, then
  the variant id);
- ``diff_best`` (≤ 0), ``diff_best_lo``, ``diff_best_hi``: the variant's accuracy minus the best
  one's, in points, with its 95% *paired* bootstrap interval: every resample draws node indices
  once and applies them to both variants, so the nodes on which both are right (or both wrong)
  cancel and the interval is much tighter than two separate ones;
- ``tie_best``: whether that paired interval contains 0 (the variant is statistically
  indistinguishable from the best).

These columns are what the tolerance rule reads (:mod:`gnnaas.policy.rule`: a variant is
admissible under tolerance ``N`` when its loss is not measurably above ``N`` and, with 95%
confidence, at most ``N`` plus a margin); the report shows the router's choices
(:mod:`gnnaas.profiling.frontier`).

Example:
    >>> import numpy as np
    >>> correct = np.array([1, 1, 1, 0, 1, 1, 0, 1, 1, 1], dtype=float)
    >>> rows = [{"variant": "a", "split": "val", "accuracy": 80.0}]
    >>> add_accuracy_intervals(rows, {("a", "val"): (correct, np.ones(10))}, resamples=200)
    >>> round(rows[0]["accuracy_lo"], 1), rows[0]["best_variant"], rows[0]["tie_best"]
    (49.0, 'a', True)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = [
    "INTERVAL_COLUMNS",
    "accuracy_interval",
    "add_accuracy_intervals",
    "bootstrap_accuracies",
    "paired_bootstrap",
    "wilson_interval",
]

INTERVAL_COLUMNS: tuple[str, ...] = (
    "accuracy_lo",
    "accuracy_hi",
    "best_variant",
    "diff_best",
    "diff_best_lo",
    "diff_best_hi",
    "tie_best",
)
"""The profile columns this module adds, in file order."""

_EPS = 1e-9  # accuracies are sums of node scores / n: compare with a hair of slack
_CHUNK_ELEMENTS = 2_000_000  # resampled node indices held at once (16 MB of int64)


def wilson_interval(k: float, n: float, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion, in percent.

    Computed by :func:`scipy.stats.binomtest` (``proportion_ci(method="wilson")``), whose ends
    are exactly 0 when ``k == 0`` and 100 when ``k == n``.

    Args:
        k (float): successes (correct nodes), a whole number.
        n (float): trials (evaluation nodes), a whole number.
        confidence (float, optional): two-sided coverage. (default: ``0.95``)

    Returns:
        tuple[float, float]: ``(lo, hi)`` in percent; ``(nan, nan)`` when ``n == 0``.

    Example:
        >>> [round(v, 2) for v in wilson_interval(8, 10)]
        [49.02, 94.33]
    """
    # imported on first use: the server imports this module (profiling.table reads its column
    # names) and should not pay for loading scipy.stats, which only the profiler needs
    from scipy.stats import binomtest

    _check_confidence(confidence)
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"wilson_interval: need 0 <= k <= n (got k={k}, n={n})")
    if not (float(k).is_integer() and float(n).is_integer()):
        raise ValueError(f"wilson_interval: k and n must be whole numbers (got k={k}, n={n})")
    if n == 0:
        return math.nan, math.nan
    ci = binomtest(int(k), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return 100.0 * float(ci.low), 100.0 * float(ci.high)


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"uncertainty: confidence must be in (0, 1) (got {confidence})")


def _as_matrix(values: np.ndarray, name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2:
        raise ValueError(f"uncertainty: {name} must be [variants, nodes] (got shape {array.shape})")
    return array


def bootstrap_accuracies(
    num: np.ndarray,
    den: np.ndarray,
    *,
    resamples: int = 2000,
    seed: int = 0,
) -> np.ndarray:
    """Accuracies ``100·Σnum/Σden`` of every variant on the same bootstrap resamples of nodes.

    Each resample draws ``n`` node indices with replacement, once, and applies them to every
    variant (a paired bootstrap). Work is vectorized: a chunk of resamples becomes a matrix of
    per-node draw counts ``[b, n]`` (one ``bincount``), multiplied by the per-node parts
    ``[n, V]``; no Python loop runs over nodes.

    Args:
        num (numpy.ndarray): score numerators ``[V, n]`` (or ``[n]`` for one variant).
        den (numpy.ndarray): score denominators, same shape.
        resamples (int, optional): bootstrap resamples. (default: ``2000``)
        seed (int, optional): seeds the resampling. (default: ``0``)

    Returns:
        numpy.ndarray: ``[resamples, V]`` accuracies in percent (NaN where a resample's
        denominator is 0).

    Shapes:
        - **num**, **den**: ``[V, n]``
        - **output**: ``[resamples, V]``
    """
    num_m, den_m = _as_matrix(num, "num"), _as_matrix(den, "den")
    if num_m.shape != den_m.shape:
        raise ValueError(
            f"bootstrap_accuracies: num {num_m.shape} and den {den_m.shape} differ in shape"
        )
    if resamples < 1:
        raise ValueError(f"bootstrap_accuracies: resamples must be >= 1 (got {resamples})")
    variants, n = num_m.shape
    out = np.full((resamples, variants), np.nan)
    if n == 0:
        return out
    # single-label scores have den = 1 everywhere: every resample's Σden is n, skip that product
    unit_den = bool(np.all(den_m == 1.0))
    parts = num_m.T if unit_den else np.concatenate([num_m, den_m]).T  # [n, V] or [n, 2V]
    # integer parts whose sums stay below 2**24 are exact in float32, at half the matmul cost
    exact32 = bool(np.all(parts == np.round(parts))) and n * float(np.abs(parts).max()) < 2**24
    dtype = np.float32 if exact32 else np.float64
    parts = np.ascontiguousarray(parts, dtype=dtype)
    rng = np.random.default_rng(seed)
    chunk = max(1, _CHUNK_ELEMENTS // n)
    for start in range(0, resamples, chunk):
        b = min(chunk, resamples - start)
        idx = rng.integers(0, n, size=(b, n))  # [b, n] node indices
        idx += np.arange(b)[:, None] * n  # one bincount for the whole chunk
        counts = np.bincount(idx.ravel(), minlength=b * n).reshape(b, n)
        sums = (counts.astype(dtype) @ parts).astype(np.float64)  # [b, V] or [b, 2V]
        if unit_den:
            out[start : start + b] = 100.0 * sums / n
        else:
            totals = sums[:, variants:]
            with np.errstate(invalid="ignore", divide="ignore"):
                out[start : start + b] = np.where(
                    totals > 0, 100.0 * sums[:, :variants] / totals, np.nan
                )
    return out


def _percentiles(samples: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    alpha = 1.0 - confidence
    finite = np.isfinite(samples).any(axis=0)
    lo = np.full(samples.shape[1], np.nan)
    hi = np.full(samples.shape[1], np.nan)
    if finite.any():
        q = np.nanquantile(samples[:, finite], [alpha / 2, 1 - alpha / 2], axis=0)
        lo[finite], hi[finite] = q[0], q[1]
    return lo, hi


def _is_single_label(num: np.ndarray, den: np.ndarray) -> bool:
    return bool(np.all(den == 1.0) and np.all((num == 0.0) | (num == 1.0)))


def _accuracy(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    totals = den.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(totals > 0, 100.0 * num.sum(axis=-1) / totals, np.nan)


def accuracy_interval(
    num: np.ndarray,
    den: np.ndarray,
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    samples: np.ndarray | None = None,
) -> tuple[float, float]:
    """The interval of one variant's accuracy: Wilson when single-label, else bootstrap.

    Args:
        num (numpy.ndarray): per-node numerators ``[n]``.
        den (numpy.ndarray): per-node denominators ``[n]``.
        confidence (float, optional): two-sided coverage. (default: ``0.95``)
        resamples (int, optional): bootstrap resamples (multi-label only). (default: ``2000``)
        seed (int, optional): seeds the bootstrap. (default: ``0``)
        samples (numpy.ndarray, optional): bootstrap accuracies ``[resamples]`` already drawn
            (reused instead of drawing new ones).

    Returns:
        tuple[float, float]: ``(lo, hi)`` in percent.
    """
    _check_confidence(confidence)
    num_v, den_v = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    if _is_single_label(num_v, den_v):
        return wilson_interval(float(num_v.sum()), float(den_v.sum()), confidence)
    if samples is None:
        samples = bootstrap_accuracies(num_v, den_v, resamples=resamples, seed=seed)[:, 0]
    lo, hi = _percentiles(np.asarray(samples, dtype=np.float64).reshape(-1, 1), confidence)
    point = float(_accuracy(num_v, den_v))
    return float(min(lo[0], point)), float(max(hi[0], point))


def paired_bootstrap(
    num: np.ndarray,
    den: np.ndarray,
    reference: int,
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    samples: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Accuracy of every variant minus the reference's, with paired bootstrap intervals.

    Args:
        num (numpy.ndarray): per-node numerators ``[V, n]``, the same node order in every row.
        den (numpy.ndarray): per-node denominators ``[V, n]``.
        reference (int): row of the variant compared against (usually the most accurate).
        confidence (float, optional): two-sided coverage. (default: ``0.95``)
        resamples (int, optional): bootstrap resamples. (default: ``2000``)
        seed (int, optional): seeds the bootstrap. (default: ``0``)
        samples (numpy.ndarray, optional): ``bootstrap_accuracies`` output ``[resamples, V]``
            already drawn for these parts.

    Returns:
        tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray]: ``(diff, lo, hi)``, each ``[V]``,
        in points; the reference's row is ``(0, 0, 0)``. The interval is widened to contain
        the point estimate when a percentile interval would miss it.
    """
    _check_confidence(confidence)
    num_m, den_m = _as_matrix(num, "num"), _as_matrix(den, "den")
    if not 0 <= reference < num_m.shape[0]:
        raise ValueError(
            f"paired_bootstrap: reference must index one of {num_m.shape[0]} variants "
            f"(got {reference})"
        )
    if samples is None:
        samples = bootstrap_accuracies(num_m, den_m, resamples=resamples, seed=seed)
    diffs = samples - samples[:, [reference]]  # [B, V], the same nodes on both sides
    point = _accuracy(num_m, den_m)
    diff = point - point[reference]
    lo, hi = _percentiles(diffs, confidence)
    lo, hi = np.fmin(lo, diff), np.fmax(hi, diff)
    diff[reference] = lo[reference] = hi[reference] = 0.0
    return diff, lo, hi


def _nan_columns(row: dict[str, Any]) -> None:
    for column in INTERVAL_COLUMNS:
        row[column] = math.nan


def add_accuracy_intervals(
    rows: list[dict[str, Any]],
    parts: Mapping[tuple[str, str], tuple[np.ndarray, np.ndarray]],
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> None:
    """Adds :data:`INTERVAL_COLUMNS` to profile rows, in place.

    ``parts[(variant, split)] = (num, den)`` are per-node score parts in the same node order for
    every variant of a split: single-label ``num`` = 1 if correct else 0 and ``den`` = 1;
    multi-label F1-micro ``num = 2·tp`` and ``den = 2·tp + fp + fn`` per node. A variant's
    accuracy is ``100·Σnum/Σden`` (the profiler's ``accuracy``). Rows without parts get NaN in
    the new columns. Every split is resampled with the same ``seed``.

    Args:
        rows (list[dict[str, Any]]): profile rows with ``variant`` and ``split`` (and
            ``latency_ms``, used to break accuracy ties for ``best_variant``).
        parts (Mapping[tuple[str, str], tuple[numpy.ndarray, numpy.ndarray]]): per-node parts.
        confidence (float, optional): two-sided coverage of every interval. (default: ``0.95``)
        resamples (int, optional): bootstrap resamples. (default: ``2000``)
        seed (int, optional): seeds the bootstrap. (default: ``0``)

    Raises:
        ValueError: the parts of a split disagree in node count, or hold negative values or
            ``num > den``.
    """
    _check_confidence(confidence)
    by_split: dict[str, list[str]] = {}
    for variant, split in parts:
        by_split.setdefault(split, []).append(variant)
    latency = {
        (str(r.get("variant")), str(r.get("split"))): r.get("latency_ms", math.nan) for r in rows
    }
    columns: dict[tuple[str, str], dict[str, Any]] = {}
    for split, variants in by_split.items():
        num, den = _stack(parts, split, variants)
        samples = bootstrap_accuracies(num, den, resamples=resamples, seed=seed)
        accuracy = _accuracy(num, den)
        best = _best(variants, accuracy, [latency.get((v, split), math.nan) for v in variants])
        diff, lo, hi = paired_bootstrap(num, den, best, confidence=confidence, samples=samples)
        for i, variant in enumerate(variants):
            acc_lo, acc_hi = accuracy_interval(
                num[i], den[i], confidence=confidence, samples=samples[:, i]
            )
            columns[(variant, split)] = {
                "accuracy_lo": acc_lo,
                "accuracy_hi": acc_hi,
                "best_variant": variants[best],
                "diff_best": float(diff[i]),
                "diff_best_lo": float(lo[i]),
                "diff_best_hi": float(hi[i]),
                "tie_best": bool(lo[i] <= 0.0 <= hi[i]),
            }
    for row in rows:
        found = columns.get((str(row.get("variant")), str(row.get("split"))))
        if found is None:
            _nan_columns(row)
        else:
            row.update(found)


def _stack(
    parts: Mapping[tuple[str, str], tuple[np.ndarray, np.ndarray]], split: str, variants: list[str]
) -> tuple[np.ndarray, np.ndarray]:
    nums: list[np.ndarray] = []
    dens: list[np.ndarray] = []
    for variant in variants:
        num, den = (np.asarray(a, dtype=np.float64).ravel() for a in parts[(variant, split)])
        if num.shape != den.shape:
            raise ValueError(
                f"add_accuracy_intervals: parts[({variant!r}, {split!r})] has {num.size} "
                f"numerators but {den.size} denominators"
            )
        if nums and num.size != nums[0].size:
            raise ValueError(
                f"add_accuracy_intervals: parts[({variant!r}, {split!r})] has {num.size} nodes, "
                f"parts[({variants[0]!r}, {split!r})] has {nums[0].size}; every variant of a "
                "split must be scored on the same nodes in the same order"
            )
        if np.any(num < 0) or np.any(den < 0) or np.any(num > den + _EPS):
            raise ValueError(
                f"add_accuracy_intervals: parts[({variant!r}, {split!r})] need 0 <= num <= den "
                "per node"
            )
        nums.append(num)
        dens.append(den)
    return np.stack(nums), np.stack(dens)


def _best(variants: list[str], accuracy: np.ndarray, latency: list[Any]) -> int:
    def key(i: int) -> tuple[float, float, str]:
        acc = float(accuracy[i]) if math.isfinite(accuracy[i]) else -math.inf
        try:
            lat = float(latency[i])
        except (TypeError, ValueError):
            lat = math.inf
        return (-acc, lat if math.isfinite(lat) else math.inf, variants[i])

    return min(range(len(variants)), key=key)
