"""A variant's lane: its executor and batcher, and the device's measured speed.

The router (:mod:`gnnaas.serving.core.router`) keeps one :class:`Lane` per served variant; a lane
turns the variant's profiled service curve into the predictions the router and the batcher read
(its running batch's time left, its queue's time), scaled by the :class:`Speed` of the device
at the batch's size, and records each batch's predicted against measured time (:attr:`Lane.drift`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from gnnaas.inference.cache import FeatureCache
from gnnaas.inference.executor import ExecRequest, ExecResult, Executor
from gnnaas.serving.core.batcher import Batcher, BatchStats
from gnnaas.serving.core.clock import MONOTONIC, Clock
from gnnaas.serving.core.drift import DriftRecord
from gnnaas.serving.core.metrics import ServingMetrics
from gnnaas.serving.core.registry import ServedDataset, ServingVariant, VariantRegistry
from gnnaas.serving.core.settings import Settings

__all__ = [
    "ExecutorFactory",
    "Lane",
    "Speed",
    "build_lanes",
    "default_executor_factory",
    "discard_lanes",
]

_log = logging.getLogger(__name__)

ExecutorFactory = Callable[
    [ServedDataset, ServingVariant], Callable[[Sequence[ExecRequest]], list[ExecResult]]
]
"""Builds the blocking batch handler of one variant (default: :class:`Executor`)."""

_BOUNDS = (0.1, 20.0)  # the machine's factor stays within these
_MAX_ERROR = 0.25  # one batch's log error against its prediction counts at most this much
_SIZE_BUCKETS = 6  # batch sizes around 1, 4, 16, 64, 256 and 1,024 nodes and more


def _bucket(nodes: int) -> int:
    """The size bucket of a batch of ``nodes`` nodes: the nearest power of 4 (2 to 7 nodes go
    with 4, 8 to 31 with 16, ...), the last bucket taking every size from 512 on."""
    return min(nodes.bit_length() >> 1, _SIZE_BUCKETS - 1)


def default_executor_factory(
    device: Any,
) -> ExecutorFactory:
    """Builds an :class:`Executor` per variant on ``device``, with the variant's device feature
    cache when it has planned ``cache_nodes``."""

    def build(
        dataset: ServedDataset, variant: ServingVariant
    ) -> Callable[[Sequence[ExecRequest]], list[ExecResult]]:
        live = dataset.live
        features = dataset.features(variant.kept_features)
        nodes = variant.cache_nodes
        return Executor(
            variant.model,
            features,
            dataset.sampler(variant.fanouts),
            device=device,
            multi_label=bool(dataset.store.multi_label),
            name=f"{dataset.name}/{variant.variant_id}",
            graph_version=None if live is None else (lambda: live.graph.version),
            answers=variant.answers,
            cache=None if nodes is None else FeatureCache(features, nodes, device),
        )

    return build


class Speed:
    """Measured speed of a device: observed / profiled batch time (1.0 = as profiled).

    :attr:`factor` is the machine's: how much slower (or faster) than profiled this device runs
    now, moved by every computed batch. :meth:`at` is the factor for one batch: :attr:`factor`
    times a *shape* learned per batch-size bucket (around the profiled sizes 1, 4, 16, 64, 256
    and 1,024 nodes: powers of 4) and kind (a computed batch, or a precomputed variant's table
    lookup). A curve timed in one regime and served in another is off by a factor that depends
    on the batch size, which one factor cannot follow (``benchmarks/results/drift.md``: on a
    2-core VM, a server on 2 torch threads serving one request at a time runs its large batches
    well over their curve timed back-to-back, its small ones close to it); and a lookup costs
    Python work where a computed batch costs compute, so their ratios to the profile move apart.
    Each batch's error against its prediction, ``log(ratio / at(nodes))`` (the ratio of its
    measured time to its curve's), is clipped to ``±0.25`` (about ±28%), so one stalled or
    interrupted batch moves the speed by a few percent where a lasting change is followed within
    a few dozen batches; a computed batch then moves :attr:`factor` by ``alpha`` and its bucket's
    shape by ``alpha / 4`` of that error (in log space: the speeds track a geometric mean, the
    median of a noisy batch time more closely than its mean): a change seen in one bucket is
    taken mostly as the machine's (it moves every bucket), a lasting difference between buckets
    becomes their shapes. The computed shapes are kept at a geometric mean of 1 over the buckets
    that saw batches, so :attr:`factor` stays the machine's (what an unseen bucket is predicted
    with). A lookup moves only its own bucket's shape, by ``alpha``.

    Args:
        alpha (float): weight of the newest batch in :attr:`factor`.
    """

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self.shape_alpha = alpha / 4
        self.reset()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(factor={self.factor:.3f})"

    def reset(self, factor: float = 1.0) -> None:
        """Forgets what was measured: every batch is predicted at ``factor`` times its curve."""
        self.factor = factor
        self._shapes = ([1.0] * _SIZE_BUCKETS, [1.0] * _SIZE_BUCKETS)  # computed, lookup
        self._seen: set[int] = set()  # computed buckets that saw a batch

    def at(self, nodes: int, lookup: bool = False) -> float:
        """The factor a batch of ``nodes`` nodes is predicted with (``lookup``: a precomputed
        variant's)."""
        return self.factor * self._shapes[lookup][_bucket(nodes)]

    def observe(
        self, duration_ms: float, predicted_ms: float, nodes: int = 1, lookup: bool = False
    ) -> None:
        """Folds one batch of ``nodes`` nodes that took ``duration_ms`` against a profiled
        ``predicted_ms`` (``lookup``: a precomputed variant's)."""
        if not predicted_ms > 0 or not math.isfinite(duration_ms):
            return
        b, shape = _bucket(nodes), self._shapes[lookup]
        ratio = duration_ms / (predicted_ms * self.factor * shape[b])
        error = min(max(math.log(ratio), -_MAX_ERROR), _MAX_ERROR) if ratio > 0 else -_MAX_ERROR
        if lookup:
            shape[b] *= math.exp(self.alpha * error)
            return
        self.factor = min(max(self.factor * math.exp(self.alpha * error), _BOUNDS[0]), _BOUNDS[1])
        shape[b] *= math.exp(self.shape_alpha * error)
        seen = self._seen
        seen.add(b)
        mean = math.prod(shape[i] for i in seen) ** (1.0 / len(seen))
        for i in seen:  # the machine's factor is the seen buckets' geometric mean
            shape[i] /= mean


class Lane:
    """One variant's executor and batcher, with the device's measured speed.

    Every served batch is also recorded as (batch nodes, time predicted by the variant's
    unscaled profiled curve, measured time, the device's speed at its size in force while it
    ran) in :attr:`drift` (a :class:`~gnnaas.serving.core.drift.DriftRecord`, published by
    ``/metrics``), so a curve that is wrong for this variant or batch size shows, whatever the
    device's :class:`Speed`.
    """

    def __init__(
        self,
        dataset: ServedDataset,
        variant: ServingVariant,
        handler: Callable[[Sequence[ExecRequest]], list[ExecResult]],
        settings: Settings,
        metrics: ServingMetrics,
        *,
        speed: Speed,
        gate: asyncio.Semaphore | None = None,
        clock: Clock = MONOTONIC,
    ) -> None:
        self.dataset = dataset
        self.variant = variant
        self.handler = handler
        self.speed = speed
        self.lookup = variant.answers is not None  # a precomputed variant: its own speed shape
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
        )

    def _predict_s(self, nodes: int) -> float:
        """The predicted time (s) of a batch of ``nodes`` on this lane: its profiled curve times
        the device's measured speed (0 without a profile: only passed deadlines drop)."""
        profile = self.variant.profile
        if profile is None:
            return 0.0
        return self.speed.at(nodes, self.lookup) * profile.service.predict(nodes) / 1e3

    def speed_at(self, nodes: int) -> float:
        """The measured observed / profiled time factor of a batch of ``nodes`` on this lane
        (its device's :meth:`Speed.at`)."""
        return self.speed.at(nodes, self.lookup)

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
        # in force while the batch ran (this batch not yet folded in)
        factor = self.speed.at(nodes, self.lookup)
        self.speed.observe(measured_ms, predicted_ms, nodes, self.lookup)
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
        """Predicted time left of the running batch (0 when idle or unprofiled)."""
        profile, since = self.variant.profile, self.batcher.in_flight_since
        if profile is None or since is None:
            return 0.0
        nodes = self.batcher.in_flight_nodes
        expected = self.speed_at(nodes) * profile.service.predict(nodes)
        return max(expected - (now - since) * 1e3, 0.0)

    def queued_ms(self) -> float:
        """Predicted time to serve the nodes waiting in this lane (0 when unprofiled)."""
        profile = self.variant.profile
        if profile is None:
            return 0.0
        b = self.batcher
        nodes, cap = b.queued_nodes, b.max_batch_size
        return self.speed_at(min(nodes, cap)) * profile.service.predict_batched(nodes, cap)


async def build_lanes(
    registry: VariantRegistry,
    factory: ExecutorFactory,
    settings: Settings,
    metrics: ServingMetrics,
    *,
    speed: Speed,
    gate: asyncio.Semaphore | None,
    serving: bool,
    clock: Clock = MONOTONIC,
) -> dict[tuple[str, str], Lane]:
    """Every variant's lane (batchers not started), warmed up when ``settings`` say so, with the
    curves measured under other execution settings re-timed (:mod:`.retime`).

    Re-timing runs on this (the event loop's) thread at start-up, when nothing is served yet, as
    the server runs small batches; while ``serving`` (a reload) in a worker thread, beside the
    current set's traffic (the figures are then a little noisier). On an error the lanes built
    so far are released and the error is raised, with a note naming the variant.
    """
    from gnnaas.inference.settings import execution_settings
    from gnnaas.serving.core.retime import needs_retime, retime_curves

    lanes: dict[tuple[str, str], Lane] = {}
    try:
        for ds in registry.datasets.values():
            for v in ds.variants.values():
                try:
                    handler = await asyncio.to_thread(factory, ds, v)
                except Exception as exc:
                    exc.add_note(f"while building variant {ds.name}/{v.variant_id}")
                    raise
                lanes[(ds.name, v.variant_id)] = Lane(
                    ds, v, handler, settings, metrics, speed=speed, gate=gate, clock=clock
                )
        if settings.warmup:
            _log.info("warming up %d variants (one forward each)", len(lanes))
            for (ds_name, v_id), lane in lanes.items():
                warm = [ExecRequest(torch.zeros(1, dtype=torch.long), output="proba")]
                try:
                    async with gate or contextlib.nullcontext():
                        await asyncio.to_thread(lane.handler, warm)
                except Exception as exc:
                    exc.add_note(f"while warming up variant {ds_name}/{v_id}")
                    raise
        for ds in [ds for ds in registry.datasets.values() if needs_retime(ds)]:
            here = settings.inline_max_nodes
            current = execution_settings(registry.device, inline_max_nodes=here)
            handlers = {v: lane.handler for (d, v), lane in lanes.items() if d == ds.name}
            if serving:
                await asyncio.to_thread(retime_curves, ds, handlers, settings, current)
            else:
                retime_curves(ds, handlers, settings, current)
    except Exception:
        await discard_lanes(lanes)
        raise
    return lanes


async def discard_lanes(lanes: dict[tuple[str, str], Lane]) -> None:
    """Releases lanes that never went live (their batchers have no task to drain)."""
    for lane in lanes.values():
        await lane.batcher.stop(0.0)
