"""What the router chooses among: candidates, their curves, the tolerance rule, the frontier.

A :class:`Candidate` is one routable variant as the policy sees it: its accuracy, its profiled
:class:`ServiceCurve` and, with paired profiles, its :class:`PairedDiff` against the most accurate
variant. The functions here depend on the profiles only (never on the load), so the router
computes them once per dataset or tolerance: the admissible set of a tolerance
(:func:`candidates_within`, docs/architecture.md §6), the tolerance that first admits each
variant, the variants dominated at every batch size (left out of routing: the frontier) and those
fastest at every size. :mod:`gnnaas.serving.core.policy` chooses among them under load.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gnnaas.profiling.uncertainty import TIE_MARGIN, admissible

__all__ = [
    "Candidate",
    "PairedDiff",
    "ServiceCurve",
    "admitting_tolerances",
    "candidates_within",
    "dominated",
    "fastest_everywhere",
    "paired_comparable",
]

# Accuracies are compared with a small slack so that 81.0 - 2.0 admits a variant at 79.0 exactly
# despite floating-point noise in the profile table.
_ACC_EPS = 1e-9


@dataclass(frozen=True)
class ServiceCurve:
    """Profiled service time of one variant as a function of the batch size.

    Args:
        batch_sizes (tuple[int, ...]): strictly increasing batch sizes (target nodes), e.g.
            ``(1, 32, 256, 1024)``.
        times_ms (tuple[float, ...]): the service time (ms) at each batch size.

    A single point predicts a constant time below its batch size and a proportional one above.
    """

    batch_sizes: tuple[int, ...]
    times_ms: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.batch_sizes) == 0 or len(self.batch_sizes) != len(self.times_ms):
            raise ValueError(
                "ServiceCurve needs as many times_ms as batch_sizes, at least one "
                f"(got {len(self.batch_sizes)} batch sizes, {len(self.times_ms)} times)"
            )
        if any(b <= 0 for b in self.batch_sizes) or any(
            b1 >= b2 for b1, b2 in zip(self.batch_sizes, self.batch_sizes[1:], strict=False)
        ):
            raise ValueError(
                f"ServiceCurve batch_sizes must be positive and increasing (got {self.batch_sizes})"
            )
        if any(not math.isfinite(t) or t < 0 for t in self.times_ms):
            raise ValueError(f"ServiceCurve times_ms must be finite and >= 0 (got {self.times_ms})")
        # Every request predicts a few curves: each segment's slope once, here.
        bs, ts = self.batch_sizes, self.times_ms
        slopes = tuple((ts[i] - ts[i - 1]) / (bs[i] - bs[i - 1]) for i in range(1, len(bs)))
        object.__setattr__(self, "_slopes", (0.0, *slopes))
        object.__setattr__(self, "_last", len(bs) - 1)

    @classmethod
    def from_points(cls, points: Mapping[int, float]) -> ServiceCurve:
        """Builds a curve from ``{batch_size: time_ms}`` in any order."""
        items = sorted(points.items())
        return cls(tuple(int(b) for b, _ in items), tuple(float(t) for _, t in items))

    def predict(self, batch_size: float) -> float:
        """Predicted service time (ms) for ``batch_size`` target nodes, never negative."""
        bs, ts, last = self.batch_sizes, self.times_ms, self._last  # type: ignore[attr-defined]
        if last == 0:
            return ts[0] if batch_size <= bs[0] else ts[0] * batch_size / bs[0]
        # Segment [i - 1, i] that holds batch_size, clamped to the first/last for extrapolation.
        i = bisect.bisect_left(bs, batch_size)
        if i < 1:
            i = 1
        elif i > last:
            i = last
        t = ts[i - 1] + self._slopes[i] * (batch_size - bs[i - 1])  # type: ignore[attr-defined]
        return t if t > 0.0 else 0.0

    def predict_batched(self, nodes: int, max_batch: int | None = None) -> float:
        """Time (ms) to serve ``nodes`` in batches of at most ``max_batch`` (0 for no nodes)."""
        if nodes <= 0:
            return 0.0
        if max_batch is None or nodes <= max_batch:
            return self.predict(nodes)
        full, rest = divmod(nodes, max_batch)
        return full * self.predict(max_batch) + (self.predict(rest) if rest else 0.0)

    def scaled(self, factor: float) -> ServiceCurve:
        """The same curve with every time multiplied by ``factor``."""
        return ServiceCurve(self.batch_sizes, tuple(t * factor for t in self.times_ms))


@dataclass(frozen=True)
class PairedDiff:
    """A variant's paired accuracy difference to the most accurate variant on the same nodes.

    Read from ``profiles.csv`` (``diff_best``, ``diff_best_lo``, ``diff_best_hi``, ``tie_best``);
    the sign convention is that of :mod:`gnnaas.profiling.uncertainty`, which decides
    admissibility.

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
    ``admissible(diff_best, lo, hi, tolerance)`` holds;
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
    those shifted by the rule's margin) in increasing order. This reads the rule the policy
    applies instead of restating it.

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
                    points.update(max(v + d, 0.0) for d in (-TIE_MARGIN, 0.0, TIE_MARGIN))
    found: dict[str, float] = {}
    for tol in sorted(points):
        for c in candidates_within(candidates, tol):
            found.setdefault(c.variant_id, math.ceil(tol * 1e4 - 1e-6) / 1e4)  # not below the rule
        if len(found) == len(candidates):
            break
    return found


def _at_most_everywhere(a: ServiceCurve, b: ServiceCurve) -> tuple[bool, bool]:
    """``(a <= b at every batch size, a < b somewhere)`` for the piecewise-linear curves: both
    are linear between their points and beyond the last one, so the points of both and one size
    past the last decide."""
    sizes = sorted({*a.batch_sizes, *b.batch_sizes})
    sizes.append(2 * sizes[-1])
    pairs = [(a.predict(n), b.predict(n)) for n in sizes]
    return all(x <= y for x, y in pairs), any(x < y for x, y in pairs)


def dominated(
    candidates: Sequence[Candidate], *, lookups: frozenset[str] = frozenset()
) -> dict[str, str]:
    """The candidates no request should consider, each with one candidate that dominates it.

    ``a`` dominates ``b`` when ``a`` is admissible whenever ``b`` is (its smallest admitting
    tolerance, :func:`admitting_tolerances`, is not larger), is at least as accurate, and its
    service curve is at most ``b``'s at every batch size (and below somewhere, or, on equal
    curves, ``a`` comes first in ``candidates``). Computed candidates of a dataset share the
    device's speed at each batch size and the work ahead, so under any load ``b``'s predicted
    completion is never smaller than ``a``'s: :func:`select_variant` would pick ``b`` only on a
    tie that the more accurate or earlier ``a`` also wins, or when ``a``'s queue is full. The
    most accurate candidate the paired differences are taken against is never dominated, and
    ``lookups`` (the precomputed variants, which cannot answer nodes a write made stale, and
    whose speed is learned apart) neither dominate nor are dominated.

    Args:
        candidates (Sequence[Candidate]): a dataset's routable variants.
        lookups (frozenset[str], optional): ids of precomputed variants. (default: none)

    Returns:
        dict[str, str]: dominated id → an id that dominates it.

    Example:
        >>> curve = ServiceCurve((1, 64), (1.0, 4.0))
        >>> fast = Candidate("sage-lasso-2x-int8", accuracy=80.0, service=curve)
        >>> slow = Candidate("sage-lasso-2x", accuracy=80.0, service=curve.scaled(1.5))
        >>> dominated([slow, fast])
        {'sage-lasso-2x': 'sage-lasso-2x-int8'}
    """
    if len(candidates) < 2:
        return {}
    tolerances = admitting_tolerances(candidates)
    # The paired rule needs its reference among the candidates; the point rule only the best
    # accuracy, which a dominating candidate keeps.
    protected = {c.paired.best_variant for c in candidates if c.paired is not None}
    out: dict[str, str] = {}
    for j, b in enumerate(candidates):
        if b.variant_id in protected or b.variant_id in lookups:
            continue
        for i, a in enumerate(candidates):
            if i == j or a.variant_id in lookups or a.variant_id in out:
                continue
            if tolerances[a.variant_id] > tolerances[b.variant_id] + _ACC_EPS:
                continue
            if a.accuracy < b.accuracy - _ACC_EPS:
                continue
            below, strictly = _at_most_everywhere(a.service, b.service)
            if below and (strictly or i < j):
                out[b.variant_id] = a.variant_id
                break
    return out


def fastest_everywhere(admitted: Sequence[Candidate]) -> frozenset[str]:
    """The candidates whose service curve is at most every other's at every batch size.

    Computed candidates of one dataset share the device (its speed at each batch size) and the
    work ahead, so such a candidate has the smallest predicted completion for any stream and
    request size (a precomputed one is compared as profiled: a lookup's time is a fraction of a
    computed batch's).
    """
    out = set()
    for c in admitted:
        mine = c.service
        if all(
            all(
                mine.predict(b) <= o.service.predict(b)
                for b in (*mine.batch_sizes, *o.service.batch_sizes)
            )
            for o in admitted
            if o is not c
        ):
            out.add(c.variant_id)
    return frozenset(out)
