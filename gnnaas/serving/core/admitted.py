"""The router's admissible sets, kept per (dataset, tolerance), and what each keeps per size.

The admissible set of a tolerance depends on the profiles only (:func:`~gnnaas.serving.core.policy.
candidates_within`), so the router computes it once per (dataset, tolerance) and keeps it with
what its decisions reuse: the variants fastest at every size, the variants that compute (not
precomputed, for stale nodes), an idle device's choice per request size and the profiled times
per stream size (every request reads these; docs/architecture.md §5).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

from gnnaas.serving.core.policy import (
    Candidate,
    LoadSnapshot,
    RequestSpec,
    Selection,
    candidates_within,
    fastest_everywhere,
    select_admitted,
)
from gnnaas.serving.core.registry import ServedDataset

if TYPE_CHECKING:
    from gnnaas.serving.core.lane import Speed

__all__ = ["AdmittedSet", "AdmittedSets"]

# Admissible sets kept per (dataset, tolerance); tolerances are numbers clients choose, so the
# cache is emptied when it reaches this size instead of growing without bound.
_ADMITTED_CACHE_SIZE = 256
_SIZES_KEPT = 1024  # request (or stream) sizes whose choice (or times) one admitted set keeps


class AdmittedSet(NamedTuple):
    """What the router keeps per (dataset, tolerance): derived from the candidates only."""

    source: tuple[Candidate, ...]  # the dataset's candidates it was computed from
    admitted: tuple[Candidate, ...]  # most accurate first
    ids: tuple[str, ...]  # their variant ids, in that order
    fastest: frozenset[str]  # policy.fastest_everywhere(admitted)
    computed: tuple[Candidate, ...]  # admitted minus precomputed variants (for stale nodes)
    computed_ids: tuple[str, ...]  # their variant ids, in that order
    # the choice for n nodes when no lane has work (speed 1), its batch size, whether a lookup
    idle: dict[int, tuple[Selection, int, bool]]
    service: dict[int, list[float]]  # the admitted's profiled times for a stream of n nodes
    kept: dict[str, Selection]  # the choice of a stream kept on a variant (no load read)


class AdmittedSets:
    """The admissible sets of the served datasets, computed on first use.

    Args:
        max_batch_nodes (int | None): the batchers' most nodes per batch.
        tie_margin (float): the policy's tie band (:func:`~gnnaas.serving.core.policy.
            select_admitted`).
    """

    def __init__(self, max_batch_nodes: int | None, tie_margin: float) -> None:
        self.max_batch_nodes = max_batch_nodes
        self.tie_margin = tie_margin
        self._requests: dict[tuple[int, float | None], RequestSpec] = {}
        self._sets: dict[tuple[str, float], AdmittedSet] = {}

    def __len__(self) -> int:
        return len(self._sets)

    def clear(self) -> None:
        """Forgets every set (the served variants were replaced)."""
        self._sets.clear()

    def get(self, dataset: ServedDataset, tolerance: float) -> AdmittedSet:
        """``dataset``'s set at ``tolerance``, recomputed when its candidates were replaced."""
        key = (dataset.name, tolerance)
        hit = self._sets.get(key)
        if hit is not None and hit.source is dataset.candidates:
            return hit
        admitted = tuple(candidates_within(dataset.candidates, tolerance))
        computed = tuple(c for c in admitted if dataset.variants[c.variant_id].answers is None)
        if len(self._sets) >= _ADMITTED_CACHE_SIZE:
            self._sets.clear()
        entry = self._sets[key] = AdmittedSet(
            dataset.candidates,
            admitted,
            tuple(c.variant_id for c in admitted),
            fastest_everywhere(admitted),
            computed,
            tuple(c.variant_id for c in computed),
            {},
            {},
            {},
        )
        return entry

    def request(self, num_nodes: int, tolerance: float | None) -> RequestSpec:
        """The :class:`RequestSpec` of a request without SLO or deadline, kept per (size,
        tolerance): every decision needs one and clients repeat both (building and checking one
        is a measurable part of a decision)."""
        key = (num_nodes, tolerance)
        hit = self._requests.get(key)
        if hit is None:
            if len(self._requests) >= _SIZES_KEPT:
                self._requests.clear()
            hit = self._requests[key] = RequestSpec(num_nodes, tolerance)
        return hit

    def kept(self, entry: AdmittedSet, variant_id: str) -> Selection:
        """The selection of a request that keeps the stream on ``variant_id`` (nothing
        predicted: :func:`~gnnaas.serving.core.policy.choice_without_load`)."""
        hit = entry.kept.get(variant_id)
        if hit is None:
            hit = entry.kept[variant_id] = Selection(
                variant_id, math.nan, math.nan, None, entry.ids
            )
        return hit

    def idle_choice(
        self, entry: AdmittedSet, num_nodes: int, speed: Speed, lookups: frozenset[str]
    ) -> Selection:
        """:func:`~gnnaas.serving.core.policy.select_admitted` on an idle device (nothing
        queued or running anywhere): the predicted times are the curves at ``num_nodes`` times
        the device's ``speed`` at that size, one factor for every computed variant, whose order
        it does not change, so the choice is computed once per request size. A precomputed
        variant (in ``lookups``) is predicted at a lookup's speed; the choice compares it as
        profiled (a lookup's time is a fraction of a computed batch's)."""
        kept = entry.idle.get(num_nodes)
        if kept is None:
            if len(entry.idle) >= _SIZES_KEPT:
                entry.idle.clear()
            spec = RequestSpec(num_nodes, math.inf)
            snapshot = LoadSnapshot(max_batch_nodes=self.max_batch_nodes)
            hit = select_admitted(spec, entry.admitted, snapshot, tie_margin=self.tie_margin)
            cap = self.max_batch_nodes
            size = num_nodes if cap is None else min(num_nodes, cap)
            kept = entry.idle[num_nodes] = (hit, size, hit.variant_id in lookups)
        hit, size, lookup = kept
        factor = speed.at(size, lookup)
        return Selection(hit.variant_id, hit.predicted_ms * factor, 0.0, None, entry.ids)

    def service_ms(self, entry: AdmittedSet, stream_nodes: int) -> list[float]:
        """The admitted variants' profiled times for a stream of ``stream_nodes`` nodes, kept
        per size (:func:`~gnnaas.serving.core.policy.select_timed` applies the load)."""
        hit = entry.service.get(stream_nodes)
        if hit is None:
            if len(entry.service) >= _SIZES_KEPT:
                entry.service.clear()
            cap = self.max_batch_nodes
            hit = entry.service[stream_nodes] = [
                c.service.predict_batched(stream_nodes, cap) for c in entry.admitted
            ]
        return hit
