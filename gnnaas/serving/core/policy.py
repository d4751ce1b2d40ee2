"""Variant selection: the fastest variant within a request's accuracy tolerance, given the load.

Pure Python (no FastAPI, no torch) so that it can be unit-tested on its own; every process,
worker or Ray replica that serves runs it on its own measured load. :func:`select_variant` takes
three structured arguments: the :class:`RequestSpec` (nodes, tolerance, SLO), the routable
:class:`Candidate` s, and one frozen :class:`LoadSnapshot` that the router measures once per
request (and that ``GET /v1/datasets/{dataset}/variants`` shows).

The rule (docs/architecture.md §6):

* **admissible** candidates: with paired-difference columns in the profiles (every candidate has
  a :class:`PairedDiff`), those that
  :func:`gnnaas.profiling.uncertainty.admissible` admits for the tolerance (their paired loss
  against the most accurate variant, at the stated confidence); otherwise (older profiles) those
  whose point accuracy is within ``tolerance`` points of the most accurate;
* the tolerance is the request's ``X-Accuracy-Tolerance``; without one it is 0 (the most accurate
  variant), **except when the request gives only an SLO**: then every variant is admissible, so
  ``X-Latency-SLO-Ms`` alone picks the most accurate variant predicted to meet it, else the
  fastest;
* each candidate's predicted completion time is the work queued ahead of the dataset's next batch
  plus the time that candidate would take to serve the dataset's stream together with the
  request: ``ahead + speed · T(stream + n)`` (in batches of at most ``max_batch_nodes``), where
  ``T`` interpolates the profiled batch sizes piecewise-linearly (linear extrapolation beyond)
  and ``stream = max(waiting, running)``: the dataset's nodes waiting now, or, when more, those in
  its running batch. Under steady load the next batch gathers about as many nodes as the running
  one while it runs, so right after a batch has closed the stream is still judged at its real
  batch size; judging it by the few nodes waiting at that instant would make a variant with a
  small fixed cost look faster and pull every other batch onto it (a limit cycle that splits the
  stream and loses to a fixed choice);
* without an SLO the candidate with the smallest predicted completion time wins; times within
  ``tie_margin`` (relative) of the smallest count as ties and go to the most accurate of them,
  unless the snapshot's ``current`` variant (the one the busy dataset's stream is on) is among the
  ties: then it stays (hysteresis). A stream therefore moves only to a variant that is faster by
  more than the margin, and the chosen time is never worse than the best admissible fixed choice
  by more than the margin; with an SLO the most accurate candidate predicted to meet it wins,
  else the fastest.

Example:
    >>> curve = ServiceCurve((1, 32), (1.0, 4.1))
    >>> fast = Candidate("sage-lasso-8x", accuracy=80.0, service=curve)
    >>> slow = Candidate("sage-full-1x", accuracy=81.0, service=curve.scaled(3.0))
    >>> select_variant(RequestSpec(1, tolerance=2.0), [fast, slow]).variant_id
    'sage-lasso-8x'
"""

from __future__ import annotations

import bisect
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from gnnaas.profiling.uncertainty import TIE_MARGIN, admissible

__all__ = [
    "Candidate",
    "LoadSnapshot",
    "PairedDiff",
    "RequestSpec",
    "Selection",
    "ServiceCurve",
    "VariantLoad",
    "admitting_tolerances",
    "candidates_within",
    "choice_without_load",
    "dominated",
    "fastest_everywhere",
    "paired_comparable",
    "select_admitted",
    "select_variant",
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


@dataclass(frozen=True)
class RequestSpec:
    """What one request asks of the policy.

    Args:
        num_nodes (int): its number of target nodes.
        tolerance (float, optional): accuracy points it accepts to lose versus the most accurate
            variant; ``math.inf`` admits every variant. (default: ``None``: 0, or unbounded when
            ``slo_ms`` is given)
        slo_ms (float, optional): its latency target. (default: ``None``)
        deadline_ms (float, optional): the time left to its deadline (``X-Deadline-Ms`` minus
            the time since it arrived; may be <= 0 once passed). Chosen like an SLO, but a
            variant not predicted to meet it is refused by the router. (default: ``None``)

    Raises:
        ValueError: ``num_nodes < 1``, a negative or NaN tolerance, an ``slo_ms`` that is not
            a finite number > 0, or a ``deadline_ms`` that is not finite.
    """

    num_nodes: int
    tolerance: float | None = None
    slo_ms: float | None = None
    deadline_ms: float | None = None

    def __post_init__(self) -> None:
        if self.num_nodes < 1:
            raise ValueError(f"RequestSpec needs num_nodes >= 1 (got {self.num_nodes})")
        if self.tolerance is not None and not self.tolerance >= 0:  # also rejects NaN
            raise ValueError(f"RequestSpec tolerance must be a number >= 0 (got {self.tolerance})")
        if self.slo_ms is not None and (not math.isfinite(self.slo_ms) or self.slo_ms <= 0):
            raise ValueError(f"RequestSpec slo_ms must be a finite number > 0 (got {self.slo_ms})")
        if self.deadline_ms is not None and not math.isfinite(self.deadline_ms):
            raise ValueError(f"RequestSpec deadline_ms must be finite (got {self.deadline_ms})")

    @property
    def target_ms(self) -> float | None:
        """The time the choice aims at: the deadline left, or the SLO, the smaller."""
        given = [t for t in (self.slo_ms, self.deadline_ms) if t is not None]
        return min(given) if given else None

    @property
    def effective_tolerance(self) -> float:
        """The tolerance applied: as given; else unbounded with an SLO or a deadline, else 0."""
        if self.tolerance is not None:
            return self.tolerance
        return math.inf if self.target_ms is not None else 0.0


@dataclass(frozen=True)
class VariantLoad:
    """One variant's load in a :class:`LoadSnapshot`.

    Args:
        wait_ms (float, optional): predicted wait of a new request of the dataset on this
            variant: the work ahead plus this variant's time for the dataset's stream
            (:meth:`LoadSnapshot.completion_ms` with no new nodes). (default: ``0.0``)
        queued_nodes (int, optional): nodes waiting on this variant's own lane. (default: ``0``)
        running_ms (float, optional): predicted time left of its running batch. (default: ``0.0``)
        speed (float, optional): measured observed / profiled time factor applied to its
            profiled service times. (default: ``1.0``)
        room_nodes (int, optional): nodes its queue accepts now. (default: unlimited)
    """

    wait_ms: float = 0.0
    queued_nodes: int = 0
    running_ms: float = 0.0
    speed: float = 1.0
    room_nodes: int = sys.maxsize


_IDLE = VariantLoad()


@dataclass(frozen=True)
class LoadSnapshot:
    """The load of one dataset's variants, measured once for one decision (or one readout).

    Args:
        ahead_ms (float, optional): work ahead of any new batch of the dataset: what is left of
            the running batches plus other datasets' waiting work, per device slot.
            (default: ``0.0``)
        waiting_nodes (int, optional): the dataset's nodes waiting over all its variants.
            (default: ``0``)
        running_nodes (int, optional): the dataset's nodes in batches running now.
            (default: ``0``)
        variants (Mapping[str, VariantLoad], optional): per-variant load; missing ids are idle.
            (default: ``{}``)
        max_batch_nodes (int, optional): most nodes per batch; more waiting nodes are served in
            several batches. (default: ``None``: one batch of any size)
        current (str, optional): the variant the dataset's stream is on (its last routed
            request), kept among near-ties while the device is busy. (default: ``None``)
        speed (float, optional): the device's measured speed factor, the load of every variant
            ``variants`` does not list (an idle one). (default: ``1.0``)
    """

    ahead_ms: float = 0.0
    waiting_nodes: int = 0
    running_nodes: int = 0
    variants: Mapping[str, VariantLoad] = field(default_factory=dict)
    max_batch_nodes: int | None = None
    current: str | None = None
    speed: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "variants", MappingProxyType(dict(self.variants)))

    @classmethod
    def measured(
        cls,
        ahead_ms: float,
        waiting_nodes: int,
        running_nodes: int,
        variants: dict[str, VariantLoad],
        max_batch_nodes: int | None,
        current: str | None,
        speed: float,
    ) -> LoadSnapshot:
        """The snapshot of these fields, built for a decision: ``variants`` is taken over (a
        fresh dict the caller no longer changes) instead of copied, and the fields are set
        without the frozen dataclass's per-field checks (the router builds one per request)."""
        self = object.__new__(cls)
        self.__dict__.update(
            ahead_ms=ahead_ms,
            waiting_nodes=waiting_nodes,
            running_nodes=running_nodes,
            variants=MappingProxyType(variants),
            max_batch_nodes=max_batch_nodes,
            current=current,
            speed=speed,
        )
        return self

    @property
    def busy(self) -> bool:
        """Whether anything runs or waits ahead of the dataset's next batch.

        A running batch counts even when it has overrun its predicted time (``ahead_ms`` 0).
        """
        return self.ahead_ms > 0 or self.waiting_nodes > 0 or self.running_nodes > 0

    @property
    def stream_nodes(self) -> int:
        """The dataset's stream as the next batch will see it: ``max(waiting, running)``."""
        return max(self.waiting_nodes, self.running_nodes, 0)

    def load(self, variant_id: str) -> VariantLoad:
        """The load of ``variant_id`` (idle when unknown)."""
        load = self.variants.get(variant_id)
        if load is not None:
            return load
        return _IDLE if self.speed == 1.0 else VariantLoad(speed=self.speed)

    def completion_ms(self, variant_id: str, service: ServiceCurve, num_nodes: int) -> float:
        """Predicted completion of ``num_nodes`` more nodes served by ``variant_id``.

        ``ahead + speed · T(stream_nodes + num_nodes)``; with ``num_nodes=0`` it is the
        variant's predicted wait (:attr:`VariantLoad.wait_ms`).
        """
        return self.completion_at(service, num_nodes, self.load(variant_id).speed)

    def completion_at(self, service: ServiceCurve, num_nodes: int, speed: float) -> float:
        """:meth:`completion_ms` for a curve measured at ``speed`` (observed / profiled)."""
        serve = service.predict_batched(self.stream_nodes + num_nodes, self.max_batch_nodes)
        return max(0.0, self.ahead_ms) + speed * serve


@dataclass(frozen=True)
class Selection:
    """The policy's answer.

    Args:
        variant_id (str): the chosen variant.
        predicted_ms (float): its predicted completion time (queue wait + service time); NaN
            when the choice needed no load (:func:`choice_without_load`: nothing was predicted).
        wait_ms (float): the queue wait part of ``predicted_ms`` (NaN likewise).
        meets_slo (bool | None): whether the prediction meets the SLO or the deadline left, the
            smaller (``None`` without either).
        considered (tuple[str, ...]): the admissible candidates, most accurate first.
    """

    variant_id: str
    predicted_ms: float
    wait_ms: float
    meets_slo: bool | None = None
    considered: tuple[str, ...] = field(default=())


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
    curves, ``a`` comes first in ``candidates``). Candidates of a dataset share the device's
    speed factor and the work ahead, so under any load ``b``'s predicted completion is never
    smaller than ``a``'s: :func:`select_variant` would pick ``b`` only on a tie that the more
    accurate or earlier ``a`` also wins, or when ``a``'s queue is full. The most accurate
    candidate the paired differences are taken against is never dominated, and ``lookups`` (the
    precomputed variants, which cannot answer nodes a write made stale) dominate nothing.

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
        if b.variant_id in protected:
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


def select_variant(
    request: RequestSpec,
    candidates: Sequence[Candidate],
    snapshot: LoadSnapshot | None = None,
    *,
    tie_margin: float = 0.0,
) -> Selection:
    """Picks the variant for one request.

    Args:
        request (RequestSpec): nodes, tolerance and SLO of the request.
        candidates (Sequence[Candidate]): the routable variants of the dataset.
        snapshot (LoadSnapshot, optional): the load measured for this decision.
            (default: ``None``: idle)
        tie_margin (float, optional): predicted times within this fraction of the smallest are
            ties, won by the snapshot's ``current`` variant while busy, else by the most
            accurate. (default: ``0.0``)

    Returns:
        Selection: the chosen variant and its prediction. Variants whose queue has no room for
        the request are skipped unless every admissible one is full.

    Raises:
        ValueError: on no candidates or a negative ``tie_margin``.
    """
    admitted = candidates_within(candidates, request.effective_tolerance)
    return select_admitted(request, admitted, snapshot, tie_margin=tie_margin)


def fastest_everywhere(admitted: Sequence[Candidate]) -> frozenset[str]:
    """The candidates whose service curve is at most every other's at every batch size.

    Candidates of one dataset share the device (one speed factor) and the work ahead, so such a
    candidate has the smallest predicted completion for any stream and request size.
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


def choice_without_load(
    request: RequestSpec,
    admitted: Sequence[Candidate],
    fastest: frozenset[str],
    current: str | None,
    busy_with_room: Callable[[str], bool],
) -> str | None:
    """The variant :func:`select_admitted` picks under any load, when the load cannot matter.

    Without an SLO that is the one admissible variant, or the dataset's current stream variant
    when it is among ``fastest`` (:func:`fastest_everywhere` of ``admitted``) and
    ``busy_with_room(current)`` says its lane is busy (so the stream is kept) and takes the
    request's nodes: it is then the smallest predicted completion, within any tie band, and kept.
    ``None`` when the load must be read. A router deciding many requests skips the load snapshot
    for these (tested against :func:`select_admitted` over a grid of loads).
    """
    if request.target_ms is not None:
        return None
    if len(admitted) == 1:
        return admitted[0].variant_id
    if current is not None and current in fastest and busy_with_room(current):
        return current
    return None


def select_admitted(
    request: RequestSpec,
    admitted: Sequence[Candidate],
    snapshot: LoadSnapshot | None = None,
    *,
    tie_margin: float = 0.0,
) -> Selection:
    """:func:`select_variant` given its admissible candidates, most accurate first.

    The admissible set depends only on the profiles and the tolerance, so a caller that decides
    many requests (the router) computes it once per tolerance with :func:`candidates_within` and
    keeps it; this part reads the load.

    Raises:
        ValueError: on no candidates or a negative ``tie_margin``.
    """
    if not admitted:
        raise ValueError("select_admitted needs at least one candidate (got none)")
    snap = snapshot or LoadSnapshot()
    stream, cap = snap.stream_nodes + request.num_nodes, snap.max_batch_nodes
    service_ms = [c.service.predict_batched(stream, cap) for c in admitted]
    return select_timed(request, admitted, service_ms, snap, tie_margin=tie_margin)


def select_timed(
    request: RequestSpec,
    admitted: Sequence[Candidate],
    service_ms: Sequence[float],
    snapshot: LoadSnapshot,
    *,
    tie_margin: float = 0.0,
    considered: tuple[str, ...] | None = None,
) -> Selection:
    """:func:`select_admitted` given each candidate's profiled service time for the stream.

    ``service_ms[i]`` is ``admitted[i].service.predict_batched(snapshot.stream_nodes +
    request.num_nodes, snapshot.max_batch_nodes)``: it depends on the stream's size only, so a
    router keeps it per size and admitted set; this part applies the load (the work ahead, each
    variant's speed and room). ``considered`` is the admitted variants' ids (computed when not
    given).

    Raises:
        ValueError: on no candidates, a negative ``tie_margin`` or ``service_ms`` not one per
            candidate.
    """
    if not math.isfinite(tie_margin) or tie_margin < 0:
        raise ValueError(
            f"select_variant tie_margin must be a finite number >= 0 (got {tie_margin})"
        )
    if not admitted or len(service_ms) != len(admitted):
        raise ValueError(
            f"select_timed needs one service time per candidate (got {len(service_ms)} for "
            f"{len(admitted)} candidates)"
        )
    snap, n, slo_ms = snapshot, request.num_nodes, request.target_ms
    if considered is None:
        considered = tuple(c.variant_id for c in admitted)
    loads = snap.variants
    wait = snap.ahead_ms if snap.ahead_ms > 0.0 else 0.0
    # (predicted, candidate) in most-accurate-first order: snap.completion_ms, unrolled (every
    # request runs this); a variant the snapshot does not list is idle (the device's speed), so
    # only the listed ones (the busy lanes: few) are looked up.
    speed = snap.speed
    scored = [(wait + speed * t, c) for c, t in zip(admitted, service_ms, strict=True)]
    if loads:
        full = []
        for v, load in loads.items():
            if v in considered:
                i = considered.index(v)
                scored[i] = (wait + load.speed * service_ms[i], admitted[i])
                if load.room_nodes < n:
                    full.append(i)
        # Variants whose queue cannot take the request are left out, unless no queue can (the
        # choice is then made as if every queue could: the request waits or is refused there).
        if full and len(full) < len(scored):
            scored = [s for i, s in enumerate(scored) if i not in full]

    if slo_ms is not None:
        for predicted, c in scored:  # most accurate first
            if predicted <= slo_ms:
                return Selection(c.variant_id, predicted, wait, True, considered)

    # `scored` is most accurate first, so the first within the tie band is the most accurate tie.
    band = min([s[0] for s in scored]) * (1.0 + tie_margin)
    keep = snap.current if snap.busy else None
    first = None
    for s in scored:
        if s[0] <= band:
            if s[1].variant_id == keep:
                first = s
                break
            if first is None:
                first = s
    predicted, c = first
    return Selection(
        c.variant_id, predicted, wait, False if slo_ms is not None else None, considered
    )
