"""The decision: which variant answers a request, given its tolerance, the load and the time.

One pure step, :meth:`DecisionTable.decide` ``(request, load snapshot, now) -> Selection``, used
by every process, worker or Ray replica that serves (on its own measured load) and by the report
(on an idle load). Pure Python, no FastAPI, no torch. A :class:`DecisionTable` is built once per
dataset and generation of served variants from the dataset's candidates (its frontier); what a
decision can reuse is memoized inside it (the admissible set of a tolerance, the variants a busy
stream stays on whatever the load, the choice of an idle device per request size, the profiled
times per stream size), so the fast paths are memoization, not other doors.

The rule (docs/architecture.md §6):

* **admissible** candidates: those :func:`~gnnaas.policy.rule.candidates_within` admits for the
  tolerance (:mod:`gnnaas.policy.rule`);
* the tolerance is the request's ``X-Accuracy-Tolerance``; without one it is 0 (the most accurate
  variant), **except when the request gives only an SLO or a deadline**: then every variant is
  admissible, so the target alone picks the most accurate variant predicted to meet it, else the
  fastest;
* each candidate's predicted completion time is the work queued ahead of the dataset's next batch
  plus the time that candidate would take to serve the dataset's stream together with the
  request: ``ahead + slowdown · T(stream + n)`` (in batches of at most ``max_batch_nodes``), where
  ``T`` is the profiled :class:`~gnnaas.policy.curve.ServiceCurve` and ``stream = max(waiting,
  running)``: the dataset's nodes waiting now, or, when more, those in its running batch. Under
  steady load the next batch gathers about as many nodes as the running one while it runs, so
  right after a batch has closed the stream is still judged at its real batch size; judging it by
  the few nodes waiting at that instant would make a variant with a small fixed cost look faster
  and pull every other batch onto it (a limit cycle that splits the stream and loses to a fixed
  choice);
* without a target the candidate with the smallest predicted completion time wins; times within
  ``tie_margin`` (relative) of the smallest count as ties and go to the most accurate of them,
  unless the snapshot's ``current`` variant (the one the dataset's stream is on, while it goes
  on) is among the ties: then it stays (hysteresis), on a busy device as on an idle one. A stream
  therefore moves only to a variant that is faster by more than the margin, also across the idle
  instants between its batches (the most accurate tie taken at every such instant would move a
  stream that load had moved to a faster variant back for one batch each time: a limit cycle
  that splits it over two lanes), and the chosen time is never worse than the best admissible
  fixed choice by more than the margin; with a target (the SLO, or the time left to the deadline
  at ``now``, the smaller) the most accurate candidate predicted to meet it wins, else the
  fastest.

Example:
    >>> from gnnaas.policy.curve import ServiceCurve
    >>> curve = ServiceCurve((1, 32), (1.0, 4.1))
    >>> fast = Candidate("sage-lasso-8x", accuracy=80.0, service=curve)
    >>> slow = Candidate("sage-full-1x", accuracy=81.0, service=curve.scaled(3.0))
    >>> table = DecisionTable([fast, slow])
    >>> table.decide(RequestSpec(1, tolerance=2.0), LoadSnapshot(), now=0.0).variant_id
    'sage-lasso-8x'
"""

from __future__ import annotations

import math
import sys
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import NamedTuple, Protocol

from gnnaas.policy.curve import ServiceCurve
from gnnaas.policy.dominance import compared_up_to, fastest_everywhere
from gnnaas.policy.rule import Candidate, candidates_within

__all__ = [
    "TIE_MARGIN",
    "DecisionTable",
    "LoadSnapshot",
    "LoadView",
    "RequestSpec",
    "Selection",
    "VariantLoad",
    "describe_selection",
    "effective_tolerance",
]

TIE_MARGIN = 0.1
"""The default tie band (``GNNAAS_TIE_MARGIN``): predicted completion times within this fraction
of the smallest are ties, won by the stream's current variant while busy, else the most
accurate."""

# Tolerances and request sizes are numbers clients choose: the memos are emptied when they reach
# these sizes instead of growing without bound.
_TOLERANCES_KEPT = 256
_SIZES_KEPT = 1024


def describe_selection(tie_margin: float = TIE_MARGIN) -> str:
    """The choice among admissible variants in words, its tie band written from ``tie_margin``
    (the README and docs/architecture.md print this with the default).

    Example:
        >>> "within 10%" in describe_selection()
        True
    """
    return (
        "Among the admissible variants on the frontier the router picks the one with the "
        "smallest predicted completion time (the work queued ahead, plus its service time for "
        "the request and the stream it joins, scaled by how much slower than profiled the "
        f"device runs now); predicted times within {tie_margin:.0%} of the smallest "
        "(`GNNAAS_TIE_MARGIN`) count as ties and go to the more accurate variant, and a busy "
        "stream stays on its variant while it remains within that band, so batches keep "
        "merging. With an SLO or a deadline, the most accurate variant predicted to meet it."
    )


@dataclass(frozen=True)
class RequestSpec:
    """What one request asks of the decision.

    Args:
        num_nodes (int): its number of target nodes.
        tolerance (float, optional): accuracy points it accepts to lose versus the most accurate
            variant; ``math.inf`` admits every variant. (default: ``None``: 0, or unbounded when
            a target is given)
        slo_ms (float, optional): its latency target. (default: ``None``)
        deadline_at (float, optional): when its deadline passes, on the clock ``now`` is read
            from (seconds). Chosen like an SLO of the time left; a variant not predicted to meet
            it is refused by the router. (default: ``None``)

    Raises:
        ValueError: ``num_nodes < 1``, a negative or NaN tolerance, an ``slo_ms`` that is not
            a finite number > 0, or a ``deadline_at`` that is not finite.
    """

    num_nodes: int
    tolerance: float | None = None
    slo_ms: float | None = None
    deadline_at: float | None = None

    def __post_init__(self) -> None:
        if self.num_nodes < 1:
            raise ValueError(f"RequestSpec needs num_nodes >= 1 (got {self.num_nodes})")
        if self.tolerance is not None and not self.tolerance >= 0:  # also rejects NaN
            raise ValueError(f"RequestSpec tolerance must be a number >= 0 (got {self.tolerance})")
        if self.slo_ms is not None and (not math.isfinite(self.slo_ms) or self.slo_ms <= 0):
            raise ValueError(f"RequestSpec slo_ms must be a finite number > 0 (got {self.slo_ms})")
        if self.deadline_at is not None and not math.isfinite(self.deadline_at):
            raise ValueError(f"RequestSpec deadline_at must be finite (got {self.deadline_at})")

    def left_ms(self, now: float) -> float | None:
        """The time left to the deadline at ``now`` (ms; <= 0 once passed), ``None`` without."""
        at = self.deadline_at
        return None if at is None else (at - now) * 1e3

    def target_ms(self, now: float) -> float | None:
        """The time the choice aims at: the deadline left at ``now``, or the SLO, the smaller."""
        slo, at = self.slo_ms, self.deadline_at  # every decision reads this: no list built
        if at is None:
            return slo
        left = (at - now) * 1e3
        return left if slo is None else min(slo, left)

    @cached_property
    def effective_tolerance(self) -> float:
        """The tolerance applied (:func:`effective_tolerance`), computed once (a decision table
        keeps the spec of a request without targets, which every such decision reads)."""
        return effective_tolerance(self.tolerance, self.slo_ms, self.deadline_at)

    @cached_property
    def targeted(self) -> bool:
        """Whether it has an SLO or a deadline (:meth:`target_ms` is not ``None``)."""
        return self.slo_ms is not None or self.deadline_at is not None


def effective_tolerance(
    tolerance: float | None, slo_ms: float | None = None, deadline: float | None = None
) -> float:
    """The tolerance a request is decided under: as given; else unbounded with an SLO or a
    deadline (the target decides, among every variant), else 0 (the most accurate).

    Example:
        >>> effective_tolerance(None), effective_tolerance(None, deadline=5.0)
        (0.0, inf)
    """
    if tolerance is not None:
        return tolerance
    return math.inf if slo_ms is not None or deadline is not None else 0.0


@dataclass(frozen=True)
class VariantLoad:
    """One variant's load in a :class:`LoadSnapshot`.

    Args:
        wait_ms (float, optional): predicted wait of a new request of the dataset on this
            variant: the work ahead plus this variant's time for the dataset's stream
            (:meth:`LoadSnapshot.completion_ms` with no new nodes). (default: ``0.0``)
        queued_nodes (int, optional): nodes waiting on this variant's own lane. (default: ``0``)
        running_ms (float, optional): predicted time left of its running batch. (default: ``0.0``)
        slowdown (float, optional): the device's slowdown for this variant: observed / profiled
            batch time, applied to its profiled service times. (default: ``1.0``)
        room_nodes (int, optional): nodes its queue accepts now. (default: unlimited)
    """

    wait_ms: float = 0.0
    queued_nodes: int = 0
    running_ms: float = 0.0
    slowdown: float = 1.0
    room_nodes: int = sys.maxsize

    @classmethod
    def busy(cls, queued_nodes: int, slowdown: float, room_nodes: int) -> VariantLoad:
        """A busy lane's load in a decision (no wait or running time predicted), built without
        the frozen dataclass's per-field checks (a decision may build a few per request)."""
        self = object.__new__(cls)
        self.__dict__.update(
            wait_ms=0.0,
            queued_nodes=queued_nodes,
            running_ms=0.0,
            slowdown=slowdown,
            room_nodes=room_nodes,
        )
        return self


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
        variants (Mapping[str, VariantLoad], optional): the load of the variants with work (a
            readout lists every variant); the others are idle at :attr:`slowdown` (a computed
            variant) or :attr:`lookup_slowdown` (a precomputed one). (default: ``{}``)
        max_batch_nodes (int, optional): most nodes per batch; more waiting nodes are served in
            several batches. (default: ``None``: one batch of any size)
        current (str, optional): the variant the dataset's stream is on (its last routed
            request), kept among near-ties. (default: ``None``)
        slowdown (float, optional): the device's slowdown (observed / profiled time) at the size of
            the batch decided on, for a computed variant. (default: ``1.0``)
        lookup_slowdown (float, optional): the same for a precomputed variant's table lookup, whose
            time moves apart from a computed batch's. (default: ``1.0``)
        idle (bool, optional): nothing runs or waits on the device (any dataset, any
            generation): every variant is predicted at its curve times the speeds.
            (default: derived from the other fields)
    """

    ahead_ms: float = 0.0
    waiting_nodes: int = 0
    running_nodes: int = 0
    variants: Mapping[str, VariantLoad] = field(default_factory=dict)
    max_batch_nodes: int | None = None
    current: str | None = None
    slowdown: float = 1.0
    lookup_slowdown: float = 1.0
    idle: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "variants", MappingProxyType(dict(self.variants)))
        if self.idle is None:
            idle = not (self.busy or self.variants)
            object.__setattr__(self, "idle", idle)

    @classmethod
    def measured(
        cls,
        ahead_ms: float,
        waiting_nodes: int,
        running_nodes: int,
        variants: dict[str, VariantLoad],
        max_batch_nodes: int | None,
        current: str | None,
        slowdown: float,
        lookup_slowdown: float,
        idle: bool,
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
            slowdown=slowdown,
            lookup_slowdown=lookup_slowdown,
            idle=idle,
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

    def room(self, variant_id: str) -> int | None:
        """The room of ``variant_id``'s queue when its lane has work, ``None`` when idle."""
        own = self.variants.get(variant_id)
        return None if own is None else own.room_nodes

    def alone(self, lookup: bool) -> float:
        """The slowdown of a computed batch, or of a lookup with ``lookup`` (:class:`LoadView`;
        the request's batch alone on an idle device)."""
        return self.lookup_slowdown if lookup else self.slowdown

    def snapshot(self, variants: Container[str] | None = None) -> LoadSnapshot:
        """Itself: a snapshot is the :class:`LoadView` of a load measured in full."""
        return self

    def load(self, variant_id: str, lookup: bool = False) -> VariantLoad:
        """The load of ``variant_id`` (idle at the snapshot's slowdown when not listed;
        ``lookup``: a precomputed variant's)."""
        load = self.variants.get(variant_id)
        if load is not None:
            return load
        return VariantLoad(slowdown=self.lookup_slowdown if lookup else self.slowdown)

    def completion_ms(
        self, variant_id: str, service: ServiceCurve, num_nodes: int, lookup: bool = False
    ) -> float:
        """Predicted completion of ``num_nodes`` more nodes served by ``variant_id``.

        ``ahead + slowdown · T(stream_nodes + num_nodes)``; with ``num_nodes=0`` it is the
        variant's predicted wait (:attr:`VariantLoad.wait_ms`).
        """
        return self.completion_at(service, num_nodes, self.load(variant_id, lookup).slowdown)

    def completion_at(self, service: ServiceCurve, num_nodes: int, slowdown: float) -> float:
        """:meth:`completion_ms` for a curve measured at ``slowdown`` (observed / profiled)."""
        serve = service.predict_batched(self.stream_nodes + num_nodes, self.max_batch_nodes)
        return max(0.0, self.ahead_ms) + slowdown * serve

    def leading_at(self, service: ServiceCurve, num_nodes: int, slowdown: float) -> float:
        """Predicted completion of ``num_nodes`` more nodes that lead a batch of their own:
        ``ahead + slowdown · T(waiting + num_nodes)``, the nodes waiting ahead of them but not a
        batch the size of the running one (a high-priority request, whose batch is formed around
        it: what joins it stays within its deadline, :func:`~gnnaas.serving.core.deadlines.
        fit_batch`)."""
        serve = service.predict_batched(self.waiting_nodes + num_nodes, self.max_batch_nodes)
        return max(0.0, self.ahead_ms) + slowdown * serve


class LoadView(Protocol):
    """What a decision reads of the load, measured only as far as it needs.

    A decision whose answer no load can change (one admissible variant; a busy stream kept on
    a variant within the tie margin of the fastest everywhere while its queue has room) reads
    only :attr:`current`, :attr:`idle` and :meth:`room`; on an idle device it reads the
    slowdowns of the request's batch alone (:meth:`alone`); any other takes the
    :meth:`snapshot`, of the variants it chooses among. A :class:`LoadSnapshot` is its own view;
    the router's view measures its lanes only when a snapshot is asked for, once per request.
    """

    @property
    def current(self) -> str | None:
        """The variant the dataset's stream is on (its last routed request)."""
        ...

    @property
    def idle(self) -> bool:
        """Nothing runs or waits on the device."""
        ...

    def room(self, variant_id: str) -> int | None:
        """The room of ``variant_id``'s queue when its lane has work, ``None`` when idle."""
        ...

    @property
    def max_batch_nodes(self) -> int | None:
        """The largest batch a lane runs (``None``: unbounded)."""
        ...

    def alone(self, lookup: bool) -> float:
        """The device's slowdown for a batch of the request alone (what an idle device runs):
        a computed batch's, or a lookup's with ``lookup``."""
        ...

    def snapshot(self, variants: Container[str] | None = None) -> LoadSnapshot:
        """The load, measured in full; with ``variants``, the busy lanes' own loads of those
        variants only (a decision among them reads no other; the stream and the work ahead
        count every lane)."""
        ...


class Selection(NamedTuple):
    """A decision (a named tuple: immutable, and built in one call where a frozen dataclass sets
    each field through ``object.__setattr__``: most decisions build one).

    Args:
        variant_id (str): the chosen variant.
        predicted_ms (float): its predicted completion time (queue wait + service time); NaN
            when the choice needed no load (one admissible variant, or a busy stream kept on a
            variant within the tie margin of the fastest everywhere: nothing was predicted).
        wait_ms (float): the queue wait part of ``predicted_ms`` (NaN likewise).
        meets_slo (bool | None): whether the prediction meets the target (the SLO or the
            deadline left, the smaller); ``None`` without either.
        considered (tuple[str, ...]): the admissible candidates, most accurate first.
    """

    variant_id: str
    predicted_ms: float
    wait_ms: float
    meets_slo: bool | None = None
    considered: tuple[str, ...] = ()


class _Admissible:
    """What one table keeps per tolerance: derived from the candidates only, plus memos."""

    __slots__ = (
        "admitted",
        "any_lookup",
        "idle",
        "ids",
        "kept",
        "keeps_stream",
        "kept_up_to",
        "lookup",
        "mixed",
        "only",
        "service",
    )

    def __init__(
        self, admitted: tuple[Candidate, ...], lookups: frozenset[str], tie_margin: float
    ) -> None:
        self.admitted = admitted  # most accurate first
        self.ids = tuple(c.variant_id for c in admitted)
        self.lookup = tuple(v in lookups for v in self.ids)
        self.any_lookup = any(self.lookup)
        self.mixed = self.any_lookup and not all(self.lookup)  # lookups and computed batches
        # The variants a busy stream stays on whatever the load: their profiled time is within
        # the tie margin of every other's at every batch size. Every admitted variant is then
        # predicted at one slowdown after the same wait, so the stream's stays within the tie
        # band of the smallest prediction (_timed keeps it). Lookups beside computed batches
        # run at another slowdown: only the fastest everywhere, as profiled (the rule's choice
        # while a lookup's slowdown is at most a computed batch's).
        self.keeps_stream = fastest_everywhere(admitted, 0.0 if self.mixed else tie_margin)
        # ...as far as their curves are compared: a stream kept only when its batches are capped
        # there (the cap is the last profiled size by default)
        self.kept_up_to = compared_up_to(c.service for c in admitted)
        # the idle device's near-ties per (request size, batch cap), of the profiled times
        self.idle: dict[tuple[int, int | None], _Ties] = {}
        # profiled times for a stream of n nodes, per (n, batch cap)
        self.service: dict[tuple[int, int | None], list[float]] = {}
        self.kept: dict[str, Selection] = {}  # a choice that read no load
        # the choice when one variant is admitted: nothing to compare, whatever the load
        self.only: Selection | None = None
        if len(self.ids) == 1:
            self.only = self.kept[self.ids[0]] = Selection(
                self.ids[0], math.nan, math.nan, None, self.ids
            )


_Ties = tuple[tuple[int, float], dict[str, tuple[int, float]] | None]
"""Near-ties of a decision, most accurate first: the first's (index, time), and all of them by id
when there is more than one (only then is the stream's variant looked up among them)."""


def _ties(ids: tuple[str, ...], times: list[float], tie_margin: float) -> _Ties:
    """The variants (``ids``, most accurate first) whose ``times`` lie within ``tie_margin`` of
    the smallest."""
    band = min(times) * (1.0 + tie_margin)
    ties = {ids[i]: (i, t) for i, t in enumerate(times) if t <= band}
    first = next(iter(ties.values()))
    return first, ties if len(ties) > 1 else None


class DecisionTable:
    """The decisions of one dataset's candidates (built once per generation of served variants).

    Args:
        candidates (Sequence[Candidate]): the dataset's routable, undominated variants (its
            frontier, :func:`~gnnaas.policy.dominance.dominated`).
        lookups (frozenset[str], optional): ids of precomputed variants: predicted at a lookup's
            slowdown, and left out of a decision ``computed_only`` (nodes they cannot answer).
            (default: none)
        tie_margin (float, optional): predicted times within this fraction of the smallest are
            ties (``GNNAAS_TIE_MARGIN``). (default: ``0.0``)

    Raises:
        ValueError: no candidates, or a ``tie_margin`` that is not a finite number >= 0.
    """

    def __init__(
        self,
        candidates: Sequence[Candidate],
        *,
        lookups: frozenset[str] = frozenset(),
        tie_margin: float = 0.0,
    ) -> None:
        if not candidates:
            raise ValueError("DecisionTable needs at least one candidate (got none)")
        if not math.isfinite(tie_margin) or tie_margin < 0:
            raise ValueError(
                f"DecisionTable tie_margin must be a finite number >= 0 (got {tie_margin})"
            )
        self.candidates = tuple(candidates)
        self.lookups = lookups
        self.tie_margin = tie_margin
        self._requests: dict[tuple[int, float | None], RequestSpec] = {}
        self._sets: dict[tuple[float, bool], _Admissible] = {}

    def __repr__(self) -> str:
        ids = ", ".join(c.variant_id for c in self.candidates)
        return f"{type(self).__name__}([{ids}], tie_margin={self.tie_margin})"

    def request(self, num_nodes: int, tolerance: float | None = None) -> RequestSpec:
        """The :class:`RequestSpec` of a request without SLO or deadline, kept per (size,
        tolerance): clients repeat both, and building and checking one is a measurable part of
        a decision.

        Raises:
            ValueError: as :class:`RequestSpec`.
        """
        key = (num_nodes, tolerance)
        hit = self._requests.get(key)
        if hit is None:
            if len(self._requests) >= _SIZES_KEPT:
                self._requests.clear()
            hit = self._requests[key] = RequestSpec(num_nodes, tolerance)
        return hit

    def admissible(self, tolerance: float, computed_only: bool = False) -> tuple[Candidate, ...]:
        """The candidates admissible under ``tolerance``, most accurate first (computed once).

        ``computed_only`` leaves the precomputed variants out (for nodes they cannot answer);
        should that leave none, every admissible candidate is kept.
        """
        return self._set(tolerance, computed_only).admitted

    def _set(self, tolerance: float, computed_only: bool) -> _Admissible:
        key = (tolerance, computed_only)
        hit = self._sets.get(key)
        if hit is None:
            admitted = tuple(candidates_within(self.candidates, tolerance))
            if computed_only:
                admitted = tuple(c for c in admitted if c.variant_id not in self.lookups) or (
                    admitted
                )
            if len(self._sets) >= _TOLERANCES_KEPT:
                self._sets.clear()
            hit = self._sets[key] = _Admissible(admitted, self.lookups, self.tie_margin)
        return hit

    def decide(
        self,
        request: RequestSpec,
        load: LoadView,
        now: float,
        *,
        computed_only: bool = False,
    ) -> Selection:
        """The variant for ``request`` under ``load`` at ``now`` (the clock of its deadline).

        Args:
            request (RequestSpec): nodes, tolerance and targets.
            load (LoadView): the load of this decision (a :class:`LoadSnapshot`, or a view
                that measures it only when the decision needs it).
            now (float): the time on the clock of ``request.deadline_at``.
            computed_only (bool, optional): choose among the variants that compute (a request
                with nodes a precomputed variant cannot answer). (default: ``False``)

        Returns:
            Selection: the chosen variant and its prediction. Variants whose queue has no room
            for the request are skipped unless every admissible one is full.
        """
        # the memo read here rather than through _set: a frame less on every decision
        key = (request.effective_tolerance, computed_only)
        entry = self._sets.get(key) or self._set(*key)
        target = request.target_ms(now) if request.targeted else None
        if target is None:
            if entry.only is not None:  # nothing to compare
                return entry.only
            if load.idle:
                return self._idle(entry, request.num_nodes, load)
            current, cap = load.current, load.max_batch_nodes
            # kept under any load while its lane has room, its batches within the compared sizes
            if current in entry.keeps_stream and cap is not None and cap <= entry.kept_up_to:
                room = load.room(current)  # type: ignore[arg-type]
                if room is not None and room >= request.num_nodes:
                    return self._kept(entry, current)  # type: ignore[arg-type]
        return self._timed(entry, request.num_nodes, target, load.snapshot(entry.ids))

    def _kept(self, entry: _Admissible, variant_id: str) -> Selection:
        """A choice that read no load (nothing predicted), one object per variant."""
        hit = entry.kept.get(variant_id)
        if hit is None:
            hit = entry.kept[variant_id] = Selection(
                variant_id, math.nan, math.nan, None, entry.ids
            )
        return hit

    def _idle(self, entry: _Admissible, num_nodes: int, load: LoadView) -> Selection:
        """The choice on an idle device: every variant predicted at one slowdown, which changes
        neither their order nor the tie band, so the ties are found once per request size and
        the prediction scaled by that slowdown; the stream's current variant wins them, else
        the most accurate. When a lookup runs at another slowdown than a computed batch and
        both kinds are admitted, the order can change: the same choice is then made per
        request, from the cached curve times (no snapshot: nothing waits)."""
        cap, slowdown = load.max_batch_nodes, load.alone(False)
        lookup_slowdown = load.alone(True) if entry.any_lookup else slowdown
        per_request = lookup_slowdown != slowdown and entry.mixed
        if per_request:
            times = self._service(entry, num_nodes, cap)
            hit = _ties(
                entry.ids,
                [
                    (lookup_slowdown if lk else slowdown) * t
                    for t, lk in zip(times, entry.lookup, strict=True)
                ],
                self.tie_margin,
            )
        else:
            key = (num_nodes, cap)
            hit = entry.idle.get(key)
            if hit is None:
                if len(entry.idle) >= _SIZES_KEPT:
                    entry.idle.clear()
                hit = entry.idle[key] = _ties(
                    entry.ids, self._service(entry, num_nodes, cap), self.tie_margin
                )
        first, ties = hit
        # the stream's current variant wins the ties, else the most accurate (no frame)
        i, predicted = first if ties is None else ties.get(load.current, first)  # type: ignore[arg-type]
        if not per_request:  # a profiled time: the one slowdown scales it
            predicted *= lookup_slowdown if entry.lookup[i] else slowdown
        return Selection(entry.ids[i], predicted, 0.0, None, entry.ids)

    def _service(self, entry: _Admissible, stream_nodes: int, cap: int | None) -> list[float]:
        """The admitted variants' profiled times for a stream of ``stream_nodes`` nodes served in
        batches of at most ``cap``."""
        key = (stream_nodes, cap)
        hit = entry.service.get(key)
        if hit is None:
            if len(entry.service) >= _SIZES_KEPT:
                entry.service.clear()
            hit = entry.service[key] = [
                c.service.predict_batched(stream_nodes, cap) for c in entry.admitted
            ]
        return hit

    def _timed(
        self, entry: _Admissible, num_nodes: int, target: float | None, load: LoadSnapshot
    ) -> Selection:
        """The choice that reads the load: predicted completions, then the target or the tie
        band (the module docstring)."""
        ids = entry.ids
        wait = load.ahead_ms if load.ahead_ms > 0.0 else 0.0
        scored = self._scored(entry, num_nodes, wait, load)
        if target is not None:
            for predicted, c in scored:  # most accurate first
                if predicted <= target:
                    return Selection(c.variant_id, predicted, wait, True, ids)
        # `scored` is most accurate first, so the first within the band is the most accurate tie.
        band = min([s[0] for s in scored]) * (1.0 + self.tie_margin)
        keep = load.current
        first = None
        for s in scored:
            if s[0] <= band:
                if s[1].variant_id == keep:
                    first = s
                    break
                if first is None:
                    first = s
        predicted, c = first  # type: ignore[misc]
        meets = None if target is None else False
        return Selection(c.variant_id, predicted, wait, meets, ids)

    def _scored(
        self, entry: _Admissible, num_nodes: int, wait: float, load: LoadSnapshot
    ) -> list[tuple[float, Candidate]]:
        """(predicted completion, candidate), most accurate first, without the variants whose
        queue has no room for the request (unless no queue has: the choice is then made as if
        every queue took it, and it waits or is refused there)."""
        admitted, ids = entry.admitted, entry.ids
        service_ms = self._service(entry, load.stream_nodes + num_nodes, load.max_batch_nodes)
        slowdown, lookup_slowdown = load.slowdown, load.lookup_slowdown
        # A variant the snapshot does not list is idle, so only the listed ones (the busy
        # lanes: few) are looked up.
        scored = [
            (wait + (lookup_slowdown if lk else slowdown) * t, c)
            for c, t, lk in zip(admitted, service_ms, entry.lookup, strict=True)
        ]
        full = []
        for v, own in load.variants.items():
            if v in ids:
                i = ids.index(v)
                scored[i] = (wait + own.slowdown * service_ms[i], admitted[i])
                if own.room_nodes < num_nodes:
                    full.append(i)
        if full and len(full) < len(scored):
            scored = [s for i, s in enumerate(scored) if i not in full]
        return scored
