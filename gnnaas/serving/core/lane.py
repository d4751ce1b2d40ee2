"""A variant's lane: its executor and batcher, and the predictions made from its curve.

The router keeps one :class:`Lane` per served variant (in its
:class:`~gnnaas.serving.core.generation.Generation`); a lane turns the variant's profiled service
curve into the predictions the router and the batcher read (its running batch's time left, its
queue's time), scaled by the device's :class:`~gnnaas.serving.core.slowdown.Slowdown` at the
batch's size, and records each batch's predicted against measured time (:attr:`Lane.drift`).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from typing import Any

from gnnaas.inference.executor import ExecRequest, ExecResult
from gnnaas.serving.core.batcher import Batcher, BatchStats
from gnnaas.serving.core.clock import MONOTONIC, Clock
from gnnaas.serving.core.drift import DriftRecord
from gnnaas.serving.core.looplag import ComputeTime
from gnnaas.serving.core.metrics import ServingMetrics
from gnnaas.serving.core.registry import ServedDataset, ServingVariant
from gnnaas.serving.core.settings import Settings
from gnnaas.serving.core.slowdown import Slowdown

__all__ = ["Handler", "Lane"]

Handler = Callable[[Sequence[ExecRequest]], list[ExecResult]]
"""A variant's blocking batch handler (:class:`~gnnaas.inference.Executor` fits)."""


class Lane:
    """One variant's executor and batcher, with the device's slowdown.

    Every served batch is also recorded as (batch nodes, time predicted by the variant's
    unscaled profiled curve, measured time, the device's slowdown at its size in force while it
    ran) in :attr:`drift` (a :class:`~gnnaas.serving.core.drift.DriftRecord`, published by
    ``/metrics``), so a curve that is wrong for this variant or batch size shows, whatever the
    device's :class:`~gnnaas.serving.core.slowdown.Slowdown`.

    Args:
        dataset (ServedDataset): the variant's dataset.
        variant (ServingVariant): the variant.
        handler (Handler): its blocking batch handler.
        settings (Settings): batching and queue limits.
        metrics (ServingMetrics): where batches are counted.
        slowdown (Slowdown): the device's, shared by its lanes.
        gate (asyncio.Semaphore, optional): the device gate shared by every lane.
            (default: ``None``)
        clock (Clock, optional): the router's, which its batcher runs on.
            (default: :data:`~gnnaas.serving.core.clock.MONOTONIC`)
        busy (set[Lane], optional): the device's lanes with work: the lane is in it exactly
            while its batcher is :attr:`~gnnaas.serving.core.batcher.Batcher.busy` (the batcher
            says when that changes). (default: ``None``: not tracked)
        computing (ComputeTime, optional): the device's computing time, shared by its lanes
            (its batcher says when each batch starts and ends). (default: ``None``)
    """

    def __init__(
        self,
        dataset: ServedDataset,
        variant: ServingVariant,
        handler: Handler,
        settings: Settings,
        metrics: ServingMetrics,
        *,
        slowdown: Slowdown,
        gate: asyncio.Semaphore | None = None,
        clock: Clock = MONOTONIC,
        busy: set[Lane] | None = None,
        computing: ComputeTime | None = None,
    ) -> None:
        self.dataset = dataset
        self.variant = variant
        self.handler = handler
        self.slowdown = slowdown
        self._metrics = metrics
        self.drift = DriftRecord()  # published by the router when the lane goes live
        self.batcher: Batcher[ExecRequest, ExecResult] = Batcher(
            handler,
            name=f"{dataset.name}/{variant.variant_id}",
            max_batch_size=settings.max_batch_nodes,
            max_wait_s=settings.max_wait_ms / 1e3,
            max_queue_size=settings.max_queue_nodes,
            on_batch=self._on_batch,
            retry_after_s=settings.retry_after_s,
            gate=gate,
            inline_max_size=settings.inline_max_nodes,
            predict_s=self._predict_s,
            clock=clock,
            on_busy=None
            if busy is None
            else (lambda is_busy: (busy.add if is_busy else busy.discard)(self)),
            computing=computing,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dataset.name}/{self.variant.variant_id})"

    def slowdown_at(self, nodes: int) -> float:
        """The device's slowdown for a batch of ``nodes`` on this lane (:meth:`Slowdown.at`)."""
        return self.slowdown.at(nodes, self.variant.lookup)

    def _predict_s(self, nodes: int) -> float:
        """The predicted time (s) of a batch of ``nodes`` on this lane: its profiled curve times
        the device's slowdown (0 without a profile: only passed deadlines drop)."""
        profile = self.variant.profile
        if profile is None:
            return 0.0
        return self.slowdown_at(nodes) * profile.service.predict(nodes) / 1e3

    def _on_batch(self, stats: BatchStats) -> None:
        self._metrics.batch(
            self.dataset.name,
            self.variant.variant_id,
            stats.batch_size,
            failed=stats.error is not None,
        )
        profile = self.variant.profile
        if stats.error is not None or profile is None:
            return
        # The curve is indexed by unique nodes; requests of one batch may share some.
        nodes = getattr(self.handler, "last_batch_seeds", None) or stats.batch_size
        predicted_ms = profile.service.predict(nodes)
        # The handler's own time (worker thread), the call the profile timed; the hand-off to
        # and from the thread is the router's overhead, not the variant's.
        measured_s = stats.handler_s if math.isfinite(stats.handler_s) else stats.duration_s
        measured_ms = measured_s * 1e3
        factor = self.slowdown_at(nodes)  # in force while the batch ran (not yet folded in)
        self.slowdown.observe(measured_ms, predicted_ms, nodes, self.variant.lookup)
        self.drift.add(nodes, predicted_ms=predicted_ms, measured_ms=measured_ms, factor=factor)
        self._metrics.batch_time(
            self.dataset.name,
            self.variant.variant_id,
            predicted_s=predicted_ms / 1e3,
            measured_s=measured_s,
        )

    def drift_summary(self) -> dict[str, Any]:
        """Predicted (unscaled profiled curve) vs measured batch time of recent batches.

        Returns:
            dict: :meth:`~gnnaas.serving.core.drift.DriftRecord.summary` (``count``,
            ``median_abs_rel_error``, ``median_rel_error``, ``predicted_ms_median``,
            ``measured_ms_median``, ``by_batch_nodes``).
        """
        return self.drift.summary()

    def running_ms(self, now: float) -> float:
        """Predicted time left of the running batch at ``now`` (0 when idle or unprofiled)."""
        profile, since = self.variant.profile, self.batcher.in_flight_since
        if profile is None or since is None:
            return 0.0
        nodes = self.batcher.in_flight_nodes
        expected = self.slowdown_at(nodes) * profile.service.predict(nodes)
        return max(expected - (now - since) * 1e3, 0.0)

    def queued_ms(self) -> float:
        """Predicted time to serve the nodes waiting in this lane (0 when unprofiled)."""
        profile = self.variant.profile
        if profile is None:
            return 0.0
        b = self.batcher
        nodes, cap = b.queued_nodes, b.max_batch_size
        return self.slowdown_at(min(nodes, cap)) * profile.service.predict_batched(nodes, cap)
