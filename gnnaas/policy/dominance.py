"""The frontier: which candidates no request should consider, and which are fastest everywhere.

One comparison of service curves, :func:`at_most_everywhere` (one curve at most another at every
batch size, or within a margin of it), decides both: a candidate *dominated* by another
(:func:`dominated`) is profiled and reported but never considered per request, and a candidate
within the decision's tie margin of every other admissible one everywhere
(:func:`fastest_everywhere`) keeps its stream under any load, which lets a decision skip reading
it (:class:`~gnnaas.policy.decision.DecisionTable`). Both depend on the profiles only, so they are
computed once per dataset or tolerance.

Example:
    >>> from gnnaas.policy.curve import ServiceCurve
    >>> curve = ServiceCurve((1, 64), (1.0, 4.0))
    >>> fast = Candidate("sage-lasso-2x-int8", accuracy=80.0, service=curve)
    >>> slow = Candidate("sage-lasso-2x", accuracy=80.0, service=curve.scaled(1.5))
    >>> dominated([slow, fast]), sorted(fastest_everywhere([slow, fast]))
    ({'sage-lasso-2x': 'sage-lasso-2x-int8'}, ['sage-lasso-2x-int8'])
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gnnaas.policy.curve import ServiceCurve
from gnnaas.policy.rule import Candidate, admitting_tolerances

__all__ = ["at_most_everywhere", "compared_up_to", "dominated", "fastest_everywhere"]

_ACC_EPS = 1e-9  # accuracies from the profile table compare with a hair of slack


def at_most_everywhere(a: ServiceCurve, b: ServiceCurve, margin: float = 0.0) -> tuple[bool, bool]:
    """``(a <= b · (1 + margin) at every batch size, a < b somewhere)`` for the piecewise-linear
    curves, at the whole batch sizes a request makes (from one node up).

    Both curves are linear between their points, below the first and beyond the last, except
    where an extrapolation reaches zero (a prediction is never negative: it bends there:
    :meth:`ServiceCurve.bends`), so the points of both, one node, the whole sizes around each
    bend and twice the largest of them decide, exactly up to that size (:func:`compared_up_to`;
    the largest batch a server runs is usually the last profiled size,
    :data:`~gnnaas.profiling.table.SERVICE_TIME_BATCH_SIZES`; past twice the last point, a
    curve that grows faster may cross the other). With a margin, ``b · (1 + margin)`` is shrunk
    by a few units of rounding: a decision compares predictions that carry the same slowdown
    and wait, whose rounding must not turn a tie at the band's edge the other way.
    """
    sizes = sorted({1, *a.batch_sizes, *b.batch_sizes, *a.bends(), *b.bends()})
    sizes.append(2 * sizes[-1])
    pairs = [(a.predict(n), b.predict(n)) for n in sizes]
    scale = (1.0 + margin) * (1.0 - _ROUNDING) if margin > 0 else 1.0
    return all(x <= y * scale for x, y in pairs), any(x < y for x, y in pairs)


_ROUNDING = 1e-9  # relative slack on a margin's edge (far above a few float64 roundings)


def compared_up_to(curves: Iterable[ServiceCurve]) -> int:
    """The batch size up to which :func:`at_most_everywhere` compares any two of ``curves``
    exactly: it reads up to twice the largest size of a pair, so twice the smallest last
    point."""
    return 2 * min(c.batch_sizes[-1] for c in curves)


def dominated(
    candidates: Sequence[Candidate], *, lookups: frozenset[str] = frozenset()
) -> dict[str, str]:
    """The candidates no request should consider, each with one candidate that dominates it.

    ``a`` dominates ``b`` when ``a`` is admissible whenever ``b`` is (its smallest admitting
    tolerance, :func:`admitting_tolerances`, is not larger), is at least as accurate, and its
    service curve is at most ``b``'s at every batch size (and below somewhere, or, on equal
    curves, ``a`` comes first in ``candidates``). Computed candidates of a dataset share the
    device's speed at each batch size and the work ahead, so under any load ``b``'s predicted
    completion is never smaller than ``a``'s: a decision
    (:meth:`~gnnaas.policy.decision.DecisionTable.decide`) would pick ``b`` only on a tie that
    the more accurate or earlier ``a`` also wins, or when ``a``'s queue is full. The
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
            below, strictly = at_most_everywhere(a.service, b.service)
            if below and (strictly or i < j):
                out[b.variant_id] = a.variant_id
                break
    return out


def fastest_everywhere(admitted: Sequence[Candidate], margin: float = 0.0) -> frozenset[str]:
    """The candidates whose service curve is at most every other's at every batch size, or
    within ``margin`` (relative) of it (:func:`at_most_everywhere`, the comparison
    :func:`dominated` makes without a margin).

    Computed candidates of one dataset share the device (its speed at each batch size) and the
    work ahead, so such a candidate's predicted completion is within ``margin`` of the smallest
    for any stream and request size: with the decision's tie margin, a stream on it is kept
    under any load (a precomputed one is compared as profiled: a lookup's time is a fraction of
    a computed batch's, and the comparison holds while a lookup's learned slowdown is at most a
    computed batch's).
    """
    return frozenset(
        c.variant_id
        for c in admitted
        if all(at_most_everywhere(c.service, o.service, margin)[0] for o in admitted if o is not c)
    )
