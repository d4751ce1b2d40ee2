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

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from gnnaas.serving.core.candidates import (
    Candidate,
    PairedDiff,
    ServiceCurve,
    admitting_tolerances,
    candidates_within,
    dominated,
    fastest_everywhere,
    paired_comparable,
)

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
    "select_timed",
    "select_variant",
]


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
        slo, left = self.slo_ms, self.deadline_ms  # every decision reads this: no list built
        if slo is None:
            return left
        return slo if left is None else min(slo, left)

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

    @classmethod
    def idle_at(cls, speed: float) -> VariantLoad:
        """An idle variant's load at ``speed``, built without the frozen dataclass's per-field
        checks (a decision may build one per request)."""
        self = object.__new__(cls)
        self.__dict__.update(
            wait_ms=0.0, queued_nodes=0, running_ms=0.0, speed=speed, room_nodes=sys.maxsize
        )
        return self


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
        speed (float, optional): the device's measured speed at the size of the batch decided
            on, the load of every variant ``variants`` does not list (an idle computed one).
            (default: ``1.0``)
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
