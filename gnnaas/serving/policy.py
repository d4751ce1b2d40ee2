"""Variant selection: the fastest variant within a request's accuracy tolerance, given the load.

Pure Python (no FastAPI, no torch) so that it can be unit-tested on its own and later run inside an
ingress deployment that asks each replica for its queue.

The rule (ARCHITECTURE.md §6):

* candidates are the variants whose profiled validation accuracy is within ``tolerance`` points
  of the most accurate variant;
* each candidate's predicted completion time is the work queued ahead of its next batch plus
  the profiled service time of that batch with this request in it: ``wait + T(queued + n)``,
  where ``queued`` are the nodes already waiting for the variant (a request joins their batch
  rather than paying for one of its own) and ``T`` interpolates the profiled batch sizes
  piecewise-linearly (linear extrapolation beyond them);
* without an SLO the candidate with the smallest predicted completion time wins; times within
  ``tie_margin`` (relative) of the smallest count as ties and go to the most accurate of them, so
  that profiling noise between variants of nearly equal speed does not scatter requests (and
  their batches) over several variants, unless the caller names a variant to ``keep`` among the
  ties (hysteresis under load); with an SLO the most accurate candidate predicted to meet
  it wins, else the fastest.

Example:
    >>> curve = ServiceCurve((1, 32), (1.0, 4.1))
    >>> fast = Candidate("sage-lasso-8x", accuracy=80.0, service=curve)
    >>> slow = Candidate("sage-full-1x", accuracy=81.0, service=curve.scaled(3.0))
    >>> select_variant([fast, slow], num_nodes=1, tolerance=2.0).variant_id
    'sage-lasso-8x'
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["Candidate", "Selection", "ServiceCurve", "candidates_within", "select_variant"]

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

    @classmethod
    def from_points(cls, points: Mapping[int, float]) -> ServiceCurve:
        """Builds a curve from ``{batch_size: time_ms}`` in any order."""
        items = sorted(points.items())
        return cls(tuple(int(b) for b, _ in items), tuple(float(t) for _, t in items))

    def predict(self, batch_size: float) -> float:
        """Predicted service time (ms) for ``batch_size`` target nodes, never negative."""
        bs, ts = self.batch_sizes, self.times_ms
        if len(bs) == 1:
            return ts[0] if batch_size <= bs[0] else ts[0] * batch_size / bs[0]
        # Segment [i - 1, i] that holds batch_size, clamped to the first/last for extrapolation.
        i = min(max(bisect.bisect_left(bs, batch_size), 1), len(bs) - 1)
        b0, b1, t0, t1 = bs[i - 1], bs[i], ts[i - 1], ts[i]
        return max(0.0, t0 + (t1 - t0) * (batch_size - b0) / (b1 - b0))

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
class Candidate:
    """A routable variant as the policy sees it.

    Args:
        variant_id (str): the variant's id, e.g. ``sage-lasso-4x``.
        accuracy (float): profiled validation accuracy in percent.
        service (ServiceCurve): profiled service time by batch size.
    """

    variant_id: str
    accuracy: float
    service: ServiceCurve


@dataclass(frozen=True)
class Selection:
    """The policy's answer.

    Args:
        variant_id (str): the chosen variant.
        predicted_ms (float): its predicted completion time (queue wait + service time).
        wait_ms (float): the queue wait part of ``predicted_ms``.
        meets_slo (bool | None): whether the prediction meets the SLO (``None`` without an SLO).
        considered (tuple[str, ...]): the candidates within tolerance, most accurate first.
    """

    variant_id: str
    predicted_ms: float
    wait_ms: float
    meets_slo: bool | None = None
    considered: tuple[str, ...] = field(default=())


def candidates_within(candidates: Sequence[Candidate], tolerance: float) -> list[Candidate]:
    """The candidates within ``tolerance`` points of the most accurate one, most accurate first.

    Raises:
        ValueError: when ``candidates`` is empty or ``tolerance`` is not a finite number >= 0.
    """
    if not candidates:
        raise ValueError("candidates_within needs at least one candidate (got none)")
    if not math.isfinite(tolerance) or tolerance < 0:
        raise ValueError(f"tolerance must be a finite number >= 0 (got {tolerance})")
    best = max(c.accuracy for c in candidates)
    kept = [c for c in candidates if c.accuracy >= best - tolerance - _ACC_EPS]
    # Stable sort: equal accuracies keep the caller's order, so selection is deterministic.
    return sorted(kept, key=lambda c: -c.accuracy)


def select_variant(
    candidates: Sequence[Candidate],
    *,
    num_nodes: int,
    tolerance: float = 0.0,
    wait_ms: Mapping[str, float] | None = None,
    queued_nodes: Mapping[str, int] | None = None,
    slo_ms: float | None = None,
    tie_margin: float = 0.0,
    max_batch_nodes: int | None = None,
    full: Collection[str] = (),
    keep: str | None = None,
    speed: float = 1.0,
) -> Selection:
    """Picks the variant for one request.

    Args:
        candidates (Sequence[Candidate]): the routable variants of the dataset.
        num_nodes (int): the request's number of target nodes (its batch size).
        tolerance (float, optional): accuracy points the client accepts to lose versus the most
            accurate candidate. (default: ``0.0``)
        wait_ms (Mapping[str, float], optional): work (ms) queued ahead of each variant's next
            batch (the load snapshot); missing ids count as idle. (default: ``None``)
        queued_nodes (Mapping[str, int], optional): nodes already waiting for each variant's next
            batch, which this request would join; missing ids count as none. (default: ``None``)
        slo_ms (float, optional): the client's latency target. (default: ``None``)
        tie_margin (float, optional): predicted times within this fraction of the smallest are
            ties, won by the most accurate. (default: ``0.0``)
        max_batch_nodes (int, optional): most nodes per batch; more queued nodes are served in
            several batches. (default: ``None``: one batch of any size)
        full (Collection[str], optional): variants whose queue cannot take the request; skipped
            unless every candidate is full. (default: ``()``)
        keep (str, optional): the variant that served the dataset's last requests; under load
            the caller passes it so that it stays chosen while its predicted time is within
            ``tie_margin`` of the fastest (hysteresis: a stream is not split over two variants
            whose times cross back and forth). (default: ``None``)
        speed (float, optional): the device's measured observed / profiled time factor; every
            profiled service time is multiplied by it. (default: ``1.0``)

    Returns:
        Selection: the chosen variant and its prediction.

    Raises:
        ValueError: on no candidates, a bad tolerance, ``num_nodes < 1``, a bad ``slo_ms`` or
            a negative ``tie_margin``.
    """
    if num_nodes < 1:
        raise ValueError(f"select_variant needs num_nodes >= 1 (got {num_nodes})")
    if slo_ms is not None and (not math.isfinite(slo_ms) or slo_ms <= 0):
        raise ValueError(f"slo_ms must be a finite number > 0 (got {slo_ms})")
    if not math.isfinite(tie_margin) or tie_margin < 0:
        raise ValueError(f"tie_margin must be a finite number >= 0 (got {tie_margin})")
    within = candidates_within(candidates, tolerance)
    considered = tuple(c.variant_id for c in within)
    if full:
        within = [c for c in within if c.variant_id not in full] or within
    waits, queued = wait_ms or {}, queued_nodes or {}
    # (predicted, wait, candidate) in most-accurate-first order.
    scored = []
    for c in within:
        wait = max(0.0, waits.get(c.variant_id, 0.0))
        batch = max(0, queued.get(c.variant_id, 0)) + num_nodes
        serve = speed * c.service.predict_batched(batch, max_batch_nodes)
        scored.append((wait + serve, wait, c))

    if slo_ms is not None:
        for predicted, wait, c in scored:  # most accurate first
            if predicted <= slo_ms:
                return Selection(c.variant_id, predicted, wait, True, considered)

    # `scored` is most accurate first, so the first within the tie band is the most accurate tie.
    band = min(s[0] for s in scored) * (1.0 + tie_margin)
    ties = [s for s in scored if s[0] <= band]
    predicted, wait, c = next((s for s in ties if s[2].variant_id == keep), ties[0])
    return Selection(
        c.variant_id, predicted, wait, False if slo_ms is not None else None, considered
    )
