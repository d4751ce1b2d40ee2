"""The tolerance rule: which variants may answer a request that accepts to lose N accuracy points.

A profiled accuracy is an estimate from a few hundred or thousand evaluation nodes, so the rule
reads the paired difference of every variant to the most accurate one on the same nodes
(:mod:`gnnaas.profiling.uncertainty` measures it). Write the loss against the best as
``L = -diff_best`` with paired 95% interval ``[L_lo, L_hi] = [-diff_best_hi, -diff_best_lo]``. A
variant is admissible under tolerance ``N`` points when both

1. ``L_lo <= N``: its loss is not measurably larger than ``N`` (the interval overlaps ``[0, N]``;
   at ``N = 0`` this is exactly ``tie_best``), and
2. ``L_hi <= N + LOSS_MARGIN``: with 95% confidence it loses at most ``N`` plus
   :data:`LOSS_MARGIN` points.

So a client asking for ``N`` gets a variant whose validation loss is statistically compatible with
``N`` and, at the stated confidence, at most ``N + LOSS_MARGIN`` points on data like the validation
split. ``N = 0`` means "no measurable loss": it admits the best and every variant tied with it
whose interval is narrow enough, not only the single best estimate, which is partly chance.
Condition 2 stops small splits from admitting anything: with wide intervals only variants close to
the best survive; with large splits the intervals shrink and the rule tends to the point rule
``L <= N``. The rule is monotone in ``N`` and always admits the best. Without interval columns
(profiles written before they existed) the point rule ``L <= N`` applies.

A :class:`Candidate` is one routable variant as the rule sees it: its accuracy, its profiled
:class:`~gnnaas.policy.curve.ServiceCurve` and, with paired profiles, its :class:`PairedDiff`.
:func:`candidates_within` is the rule over a set of candidates (the one place it is applied:
the router, the report and ``GET /v1/datasets/{d}/variants`` all call it), and
:func:`admitting_tolerances` the smallest tolerance that admits each candidate.

Example:
    >>> admissible(-0.2, -0.6, 0.2, 0.0)  # tied with the best, interval narrow
    True
    >>> admissible(-3.0, -3.5, -2.5, 2.0)  # measurably more than 2 points worse
    False
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gnnaas.policy.curve import ServiceCurve

__all__ = [
    "LOSS_MARGIN",
    "Candidate",
    "PairedDiff",
    "admissible",
    "admitting_tolerances",
    "candidates_within",
    "describe_rule",
    "paired_comparable",
]

LOSS_MARGIN = 1.0
"""Points the 95% upper bound of a variant's loss may exceed the tolerance by (condition 2)."""

_EPS = 1e-9  # accuracies are sums of node scores / n: compare with a hair of slack
# Accuracies are compared with a small slack so that 81.0 - 2.0 admits a variant at 79.0 exactly
# despite floating-point noise in the profile table.
_ACC_EPS = 1e-9


def admissible(
    diff_best: float,
    diff_best_lo: float,
    diff_best_hi: float,
    tolerance: float,
    *,
    margin: float = LOSS_MARGIN,
) -> bool:
    """Whether a variant may serve a request with accuracy tolerance ``tolerance`` points.

    The rule of this module's docstring: with loss ``L = -diff_best`` and paired interval
    ``[L_lo, L_hi] = [-diff_best_hi, -diff_best_lo]``, admit when ``L_lo <= tolerance`` (the
    loss is not measurably above the tolerance) and ``L_hi <= tolerance + margin`` (with 95%
    confidence it loses at most ``tolerance + margin`` points). When the interval is unknown
    (NaN, profiles from before intervals existed) the point rule ``L <= tolerance`` applies.

    Args:
        diff_best (float): accuracy minus the best variant's (points, ≤ 0).
        diff_best_lo (float): lower end of its paired 95% interval.
        diff_best_hi (float): upper end of its paired 95% interval.
        tolerance (float): the client's tolerance in accuracy points (≥ 0).
        margin (float, optional): how far the upper loss bound may exceed the tolerance.
            (default: :data:`LOSS_MARGIN`)

    Returns:
        bool: whether the variant is admissible. False when ``diff_best`` is NaN.

    Example:
        >>> admissible(-0.2, -0.6, 0.2, 0.0)  # tied with the best, interval narrow
        True
        >>> admissible(-3.0, -3.5, -2.5, 2.0)  # measurably more than 2 points worse
        False
    """
    if not tolerance >= 0:  # also rejects NaN
        raise ValueError(f"admissible: tolerance must be a number >= 0 (got {tolerance})")
    if diff_best is None or not math.isfinite(diff_best):
        return False
    loss = -float(diff_best)
    if (
        diff_best_lo is None
        or diff_best_hi is None
        or not math.isfinite(diff_best_lo)
        or not math.isfinite(diff_best_hi)
    ):
        return loss <= tolerance + _EPS
    loss_lo, loss_hi = -float(diff_best_hi), -float(diff_best_lo)
    return loss_lo <= tolerance + _EPS and loss_hi <= tolerance + margin + _EPS


@dataclass(frozen=True)
class PairedDiff:
    """A variant's paired accuracy difference to the most accurate variant on the same nodes.

    Read from ``profiles.csv`` (``diff_best``, ``diff_best_lo``, ``diff_best_hi``, ``tie_best``);
    the sign convention is that of :mod:`gnnaas.profiling.uncertainty`, which measures it
    (``diff_best <= 0``); :func:`admissible` decides with it.

    Args:
        diff_best (float): the paired difference in accuracy points.
        lo (float): lower end of its 95% interval.
        hi (float): upper end of its 95% interval.
        tie_best (bool, optional): statistically indistinguishable from the most accurate
            variant. (default: ``False``)
        best_variant (str, optional): the variant the difference is taken against; the paired
            rule applies only when every candidate names the same one and it is a candidate.
            (default: ``None``: not recorded)
    """

    diff_best: float
    lo: float
    hi: float
    tie_best: bool = False
    best_variant: str | None = None


@dataclass(frozen=True)
class Candidate:
    """A routable variant as the policy sees it.

    Args:
        variant_id (str): the variant's id, e.g. ``sage-lasso-4x``.
        accuracy (float): profiled validation accuracy in percent.
        service (ServiceCurve): profiled service time by batch size.
        paired (PairedDiff, optional): paired difference to the most accurate variant; when every
            candidate has one, admissibility uses it. (default: ``None``)
    """

    variant_id: str
    accuracy: float
    service: ServiceCurve
    paired: PairedDiff | None = None


def paired_comparable(candidates: Sequence[Candidate]) -> bool:
    """Whether :func:`candidates_within` admits by the paired rule: every candidate has a
    paired difference, all against one best variant that is among them."""
    bests = set()
    for c in candidates:
        if c.paired is None:
            return False
        bests.add(c.paired.best_variant)
    if len(bests) != 1:
        return False
    (best,) = bests
    return best is None or any(c.variant_id == best for c in candidates)


def candidates_within(candidates: Sequence[Candidate], tolerance: float) -> list[Candidate]:
    """The candidates admissible under ``tolerance``, most accurate first.

    With a :class:`PairedDiff` on every candidate, all against the same routable best variant
    a candidate is admitted when
    :func:`admissible` holds;
    otherwise when its point accuracy is within ``tolerance`` points of the most accurate one.
    ``math.inf`` admits every candidate. Should the paired rule admit none, the point rule
    applies (the most accurate variant is always admissible).

    Raises:
        ValueError: when ``candidates`` is empty or ``tolerance`` is not a number >= 0.
    """
    if not candidates:
        raise ValueError("candidates_within needs at least one candidate (got none)")
    if not tolerance >= 0:  # also rejects NaN
        raise ValueError(f"candidates_within tolerance must be a number >= 0 (got {tolerance})")
    kept: list[Candidate] = []
    if math.isinf(tolerance):
        kept = list(candidates)
    else:
        if paired_comparable(candidates):
            kept = [
                c
                for c in candidates
                if c.paired is not None
                and admissible(c.paired.diff_best, c.paired.lo, c.paired.hi, tolerance)
            ]
        if not kept:
            best = max(c.accuracy for c in candidates)
            kept = [c for c in candidates if c.accuracy >= best - tolerance - _ACC_EPS]
    # Stable sort: equal accuracies keep the caller's order, so selection is deterministic.
    return sorted(kept, key=lambda c: -c.accuracy)


def admitting_tolerances(candidates: Sequence[Candidate]) -> dict[str, float]:
    """The smallest tolerance under which :func:`candidates_within` admits each candidate.

    Admission only grows with the tolerance, so it is enough to try the tolerances where some
    candidate's admission can change (its point loss, the ends of its paired loss interval and
    those shifted by :data:`LOSS_MARGIN`) in increasing order. This reads the rule instead of
    restating it.

    Returns:
        dict[str, float]: variant id → smallest admitting tolerance (points, ``>= 0``).
    """
    if not candidates:
        return {}
    best = max(c.accuracy for c in candidates)
    points = {0.0}
    for c in candidates:
        points.add(max(best - c.accuracy, 0.0))
        if c.paired is not None:
            for v in (-c.paired.hi, -c.paired.lo, -c.paired.diff_best):
                if math.isfinite(v):
                    points.update(max(v + d, 0.0) for d in (-LOSS_MARGIN, 0.0, LOSS_MARGIN))
    found: dict[str, float] = {}
    for tol in sorted(points):
        for c in candidates_within(candidates, tol):
            found.setdefault(c.variant_id, math.ceil(tol * 1e4 - 1e-6) / 1e4)  # not below the rule
        if len(found) == len(candidates):
            break
    return found


def describe_rule() -> str:
    """The rule in words, its margin written from :data:`LOSS_MARGIN` (the README and
    docs/architecture.md print this, so the prose cannot drift from the code).

    Example:
        >>> "at most N + 1 points" in describe_rule()
        True
    """
    m = f"{LOSS_MARGIN:g}"
    point = "point" if LOSS_MARGIN == 1 else "points"
    return (
        "A variant is admissible under tolerance N when its loss against the most accurate "
        "variant is not measurably above N (the lower end of its paired 95% loss interval is "
        f"≤ N) and, with 95% confidence, it loses at most N + {m} points (the upper end is "
        f"≤ N + {m}). So tolerance 0 admits the most accurate variant and the variants "
        "statistically tied with it whose paired interval is narrow enough (upper loss ≤ "
        f"{m} {point}): a tied variant with a wide interval is admitted only from a larger "
        "tolerance, which `admissible_at` gives. Without interval columns (older profiles) the "
        "point rule, a loss ≤ N, applies."
    )
