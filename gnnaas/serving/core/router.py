"""The serving core: policy + one batcher and executor per variant, with measured load.

:class:`Router` is plain Python (no FastAPI types); the same object serves in one process, in each
``--workers`` process and in each Ray Serve replica (ARCHITECTURE.md §7). For every request it
takes a load snapshot from its own batchers (one frozen
:class:`~gnnaas.serving.core.policy.LoadSnapshot`, the same object that
``GET /v1/datasets/{dataset}/variants`` shows), asks the pure
:func:`~gnnaas.serving.core.policy.select_variant` for a variant (or honours a pinned one), and
queues the request on that variant's batcher.

All variants of a process share one device, and at most ``max_concurrent_batches`` batches run on
it at once (a shared gate; on a CPU one batch already uses every intra-op thread, so two batches
of different variants would only slow each other down). A batcher takes the gate only once its
batch is full or has waited ``max_wait_ms``, and requests keep merging into it while other batches
run. The load model follows: before a
new batch of any variant can start, the running batches must finish and the nodes already
waiting must be served. The policy therefore scores each candidate by the time *it* would take to
serve the dataset's waiting nodes together with the new request (in batches of at most
``max_batch_nodes``): idle, every variant costs about the same for a few nodes and the most
accurate near-tie wins; under load, the backlog makes a fast variant's advantage large and traffic
moves to it, in one batch stream rather than split over many variants. While the device is busy
the variant of the last routed request is kept as long as it stays a near-tie (hysteresis), so a
backlog that hovers around the switching point does not alternate batches between two variants.

Times come from the profiled service curves times a *measured* factor: an EWMA of observed batch
time / profiled time over every batch on the device, so a machine slower or busier than the one
that profiled is noticed after a few batches.

:meth:`Router.reload` replaces the served set (a new *generation*) without failing a request: the
new lanes are built and warmed up off to the side, swapped in on the event loop, and the old ones
drain what was queued on them (:mod:`gnnaas.serving.core.reload` drives it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from gnnaas.errors import ConfigError, OverloadedError
from gnnaas.inference.cache import FeatureCache
from gnnaas.inference.executor import ExecRequest, ExecResult, Executor, Output
from gnnaas.serving.core.batcher import Batcher, BatchStats
from gnnaas.serving.core.drift import DriftRecord
from gnnaas.serving.core.metrics import QueueDepth, ServingMetrics
from gnnaas.serving.core.policy import (
    Candidate,
    LoadSnapshot,
    RequestSpec,
    Selection,
    VariantLoad,
    candidates_within,
    choice_without_load,
    fastest_everywhere,
    select_admitted,
)
from gnnaas.serving.core.registry import ServedDataset, ServingVariant, VariantRegistry
from gnnaas.serving.core.settings import Settings

__all__ = [
    "ExecutorFactory",
    "Lane",
    "NotFoundError",
    "Prediction",
    "Router",
    "Speed",
    "default_executor_factory",
]

_log = logging.getLogger(__name__)

ExecutorFactory = Callable[
    [ServedDataset, ServingVariant], Callable[[Sequence[ExecRequest]], list[ExecResult]]
]
"""Builds the blocking batch handler of one variant (default: :class:`Executor`)."""

_SCALE_BOUNDS = (0.1, 20.0)
# Admissible sets kept per (dataset, tolerance); tolerances are numbers clients choose, so the
# cache is emptied when it reaches this size instead of growing without bound.
_ADMITTED_CACHE_SIZE = 256


class _Admitted(NamedTuple):
    """What the router keeps per (dataset, tolerance): derived from the candidates only."""

    source: tuple[Candidate, ...]  # the dataset's candidates it was computed from
    admitted: tuple[Candidate, ...]  # most accurate first
    ids: tuple[str, ...]  # their variant ids, in that order
    fastest: frozenset[str]  # policy.fastest_everywhere(admitted)
    computed: tuple[Candidate, ...]  # admitted minus precomputed variants (for stale nodes)
    computed_ids: tuple[str, ...]  # their variant ids, in that order


class NotFoundError(ConfigError, LookupError):
    """An unknown dataset or variant name in a request."""


@dataclass(frozen=True)
class Prediction:
    """One answered request.

    Args:
        variant (ServingVariant): the variant that served it.
        predictions (list): one entry per requested node.
        queue_ms (float): time in the batcher's queue.
        sample_ms (float): sampling time of its batch.
        gather_ms (float): moving data of its batch: feature gather, host→device copy and outputs
            back (§5 comm_ms; the copies are 0 on the CPU).
        compute_ms (float): forward time of its batch.
        batch_size (int): nodes in its batch.
        batch_requests (int): requests in its batch.
        selection (Selection, optional): the policy's decision, ``None`` when pinned.
        graph_version (int, optional): version of the graph its batch read (0 for a graph that
            takes no writes). (default: ``0``)
    """

    variant: ServingVariant
    predictions: list[Any]
    queue_ms: float
    sample_ms: float
    gather_ms: float
    compute_ms: float
    batch_size: int
    batch_requests: int
    selection: Selection | None = None
    graph_version: int = 0


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
    """Measured speed of a device: an EWMA of observed / profiled batch time (1.0 = as profiled).

    Args:
        alpha (float): weight of the newest batch.
    """

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self.factor = 1.0

    def __repr__(self) -> str:
        return f"{type(self).__name__}(factor={self.factor:.3f})"

    def observe(self, duration_ms: float, predicted_ms: float) -> None:
        """Folds one batch that took ``duration_ms`` against a profiled ``predicted_ms``."""
        if predicted_ms <= 0:
            return
        ratio = min(max(duration_ms / predicted_ms, _SCALE_BOUNDS[0]), _SCALE_BOUNDS[1])
        self.factor += self.alpha * (ratio - self.factor)


class Lane:
    """One variant's executor and batcher, with the device's measured speed.

    Every served batch is also recorded as (batch nodes, time predicted by the variant's
    unscaled profiled curve, measured time, the device factor in force while it ran) in
    :attr:`drift` (a
    :class:`~gnnaas.serving.core.drift.DriftRecord`, published by ``/metrics``), so a curve that is
    wrong for this variant or batch size shows, whatever the device-wide :class:`Speed` factor.
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
    ) -> None:
        self.dataset = dataset
        self.variant = variant
        self.handler = handler
        self.speed = speed
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
        )

    @property
    def scale(self) -> float:
        """The measured observed / profiled time factor of this lane's device."""
        return self.speed.factor

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
        factor = self.speed.factor  # in force while the batch ran (this batch not yet folded in)
        self.speed.observe(measured_ms, predicted_ms)
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
        expected = self.scale * profile.service.predict(self.batcher.in_flight_nodes)
        return max(expected - (now - since) * 1e3, 0.0)

    def queued_ms(self) -> float:
        """Predicted time to serve the nodes waiting in this lane (0 when unprofiled)."""
        profile = self.variant.profile
        if profile is None:
            return 0.0
        b = self.batcher
        return self.scale * profile.service.predict_batched(b.queued_nodes, b.max_batch_size)


class Router:
    """Routes requests to variants and batches them.

    Args:
        registry (VariantRegistry): what to serve.
        settings (Settings): batching and queue limits.
        metrics (ServingMetrics, optional): where to record; a fresh one by default.
            (default: ``None``)
        executor_factory (ExecutorFactory, optional): builds each variant's batch handler; by
            default an :class:`Executor` on ``registry.device``. (default: ``None``)
    """

    def __init__(
        self,
        registry: VariantRegistry,
        settings: Settings,
        *,
        metrics: ServingMetrics | None = None,
        executor_factory: ExecutorFactory | None = None,
    ) -> None:
        self.registry = registry
        self.settings = settings
        self.metrics = metrics or ServingMetrics()
        self._factory = executor_factory or default_executor_factory(registry.device)
        self._lanes: dict[tuple[str, str], Lane] = {}
        # (the lanes they were computed from, {dataset: (its lanes, the other lanes)})
        self._groups: tuple[dict[tuple[str, str], Lane], dict[str, Any]] = ({}, {})
        self.speed = Speed(settings.load_ewma_alpha)
        self._last: dict[str, str] = {}  # dataset -> variant of its last routed request
        self._admitted: dict[tuple[str, float], _Admitted] = {}  # by (dataset, tolerance)
        self._gate: asyncio.Semaphore | None = None
        # Lanes of a previous generation still serving the requests queued on them.
        self._draining: list[Lane] = []
        self._drains: set[asyncio.Future[None]] = set()
        self.generation = 0
        self.started = False
        self.stopping = False
        self.metrics.bind_queues(self.queue_depths)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.registry!r}, lanes={len(self._lanes)})"

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Builds each variant's executor and batcher, warms them up, starts the batch loops."""
        if self.started:
            return
        if self.settings.torch_threads is not None:
            torch.set_num_threads(self.settings.torch_threads)
        # One gate for every generation of lanes: during a reload the old lanes' last batches
        # and the new lanes' first ones still share the device's max_concurrent_batches.
        self._gate = asyncio.Semaphore(self.settings.max_concurrent_batches)
        self._lanes = await self._build_lanes(self.registry)
        self._go_live(self._lanes)
        self.generation = 1
        self.metrics.generation.set(self.generation)
        self.started = True
        _log.info("router started: %d variants", len(self._lanes))

    async def stop(self) -> None:
        """Refuses new requests and drains the accepted ones (bounded by the shutdown timeout);
        then closes the live graphs' logs."""
        self.stopping = True
        await asyncio.gather(
            *(lane.batcher.stop(self.settings.shutdown_timeout_s) for lane in self._lanes.values()),
            *list(self._drains),  # lanes retired by a reload still draining
        )
        for dataset in self.registry.datasets.values():
            if dataset.live is not None:
                if dataset.live.writer is not None:
                    await dataset.live.writer.drain()
                dataset.live.close()
        _log.info("router stopped")

    def exclusive(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Holds the device gate entirely: no batch runs meanwhile (live graph writes apply
        under it, so every forward pass reads one version of the graph)."""
        from gnnaas.serving.core.live import all_permits

        if self._gate is None:
            return contextlib.nullcontext()
        return all_permits(self._gate, self.settings.max_concurrent_batches)

    async def reload(self, registry: VariantRegistry) -> int:
        """Serves ``registry`` from now on, without failing or dropping a request.

        The new lanes are built and warmed up off to the side (executors built in worker
        threads, each warm-up forward taking the device gate like a batch), then swapped in with
        no ``await`` in between: a request routed before the swap is already queued on an old
        lane, one routed after it sees only the new registry and lanes. The old lanes then stop
        taking requests and serve the ones queued on them (bounded by ``shutdown_timeout_s``)
        before this returns. If building fails, nothing changes.

        Args:
            registry (VariantRegistry): the new set to serve (device of the current one).

        Returns:
            int: the new generation (1 after :meth:`start`, +1 per reload).

        Raises:
            OverloadedError: the router is not started or is shutting down.
            Exception: whatever building or warming up a variant raised; the old set stays.
        """
        if not self.started or self.stopping:
            raise OverloadedError("the server is starting or shutting down; reload later")
        lanes = await self._build_lanes(registry)
        if self.stopping:
            await self._discard(lanes)
            raise OverloadedError("the server is shutting down; reload abandoned")
        # -- the swap: no await from here until the old lanes are handed to the drain ----------
        old = self._lanes
        self._go_live(lanes)
        self.registry, self._lanes = registry, lanes
        self.generation += 1
        self.metrics.generation.set(self.generation)
        self._last = {d: v for d, v in self._last.items() if (d, v) in lanes}
        self._admitted.clear()
        for dataset, variant in old.keys() - lanes.keys():
            self.metrics.untrack_drift(dataset, variant)
        retired = list(old.values())
        self._draining.extend(retired)
        drain = asyncio.ensure_future(self._drain(retired))
        self._drains.add(drain)
        drain.add_done_callback(self._drains.discard)
        # Shielded: a reload whose caller goes away still finishes draining the old lanes.
        await asyncio.shield(drain)
        return self.generation

    async def _build_lanes(self, registry: VariantRegistry) -> dict[tuple[str, str], Lane]:
        """Every variant's executor and batcher (not started), warmed up when configured."""
        lanes: dict[tuple[str, str], Lane] = {}
        try:
            for ds in registry.datasets.values():
                for v in ds.variants.values():
                    try:
                        handler = await asyncio.to_thread(self._factory, ds, v)
                    except Exception as exc:
                        exc.add_note(f"while building variant {ds.name}/{v.variant_id}")
                        raise
                    lanes[(ds.name, v.variant_id)] = Lane(
                        ds,
                        v,
                        handler,
                        self.settings,
                        self.metrics,
                        speed=self.speed,
                        gate=self._gate,
                    )
            if self.settings.warmup:
                for (ds_name, v_id), lane in lanes.items():
                    warm = [ExecRequest(torch.zeros(1, dtype=torch.long), output="proba")]
                    try:
                        async with self._gate or contextlib.nullcontext():
                            await asyncio.to_thread(lane.handler, warm)
                    except Exception as exc:
                        exc.add_note(f"while warming up variant {ds_name}/{v_id}")
                        raise
            await self._retime(registry, lanes)
        except Exception:
            await self._discard(lanes)
            raise
        return lanes

    async def _retime(self, registry: VariantRegistry, lanes: dict[tuple[str, str], Lane]) -> None:
        """Re-times the curves measured under other execution settings (:mod:`.retime`).

        At start-up nothing is served yet, so the curves are timed on this (the event loop's)
        thread, as the server runs small batches; during a reload in a worker thread, beside the
        previous set's traffic (the figures are then a little noisier).
        """
        from gnnaas.inference.settings import execution_settings
        from gnnaas.serving.core.retime import needs_retime, retime_curves

        todo = [ds for ds in registry.datasets.values() if needs_retime(ds)]
        if not todo:
            return
        current = execution_settings(
            registry.device, inline_max_nodes=self.settings.inline_max_nodes
        )
        for ds in todo:
            handlers = {v: lane.handler for (d, v), lane in lanes.items() if d == ds.name}
            if self.started:
                await asyncio.to_thread(retime_curves, ds, handlers, self.settings, current)
            else:
                retime_curves(ds, handlers, self.settings, current)

    def _go_live(self, lanes: dict[tuple[str, str], Lane]) -> None:
        for (dataset, variant), lane in lanes.items():
            self.metrics.track_drift(dataset, variant, lane.drift)
            lane.batcher.start()

    async def _discard(self, lanes: dict[tuple[str, str], Lane]) -> None:
        """Releases lanes that never went live (their batchers have no task to drain)."""
        for lane in lanes.values():
            await lane.batcher.stop(0.0)

    async def _drain(self, lanes: list[Lane]) -> None:
        try:
            await asyncio.gather(
                *(lane.batcher.stop(self.settings.shutdown_timeout_s) for lane in lanes)
            )
        finally:
            self._draining = [lane for lane in self._draining if lane not in lanes]

    # -- load and selection ----------------------------------------------------------------------

    def lane(self, dataset: str, variant_id: str) -> Lane:
        """The lane of one variant (``KeyError`` when unknown)."""
        return self._lanes[(dataset, variant_id)]

    def load_snapshot(
        self, dataset: ServedDataset, variant_ids: Iterable[str] | None = None
    ) -> LoadSnapshot:
        """The load of ``dataset``'s variants, measured now: one frozen object per decision.

        The work ahead of a new batch of ``dataset`` is what is left of the running batches plus
        the waiting work of other datasets' variants, shared among the
        ``max_concurrent_batches`` slots; the dataset's stream (its waiting nodes, or its running
        batch's when more) counts for every variant (a variant that takes the stream serves it).
        Each variant's ``wait_ms`` is the policy's predicted completion with no new nodes (0 for
        unprofiled variants, which are never routed to). The policy and
        ``GET /v1/datasets/{dataset}/variants`` both read this object.

        Args:
            dataset (ServedDataset): the dataset.
            variant_ids (Iterable[str], optional): only these variants' loads, without
                ``wait_ms`` and ``running_ms`` (what a decision reads: speed and room).
                (default: ``None``: every variant, in full)
        """
        now = time.monotonic()
        ahead, waiting, running = 0.0, 0, 0
        for lane in self._draining:  # only during a reload: the last batches of the old lanes
            ahead += lane.running_ms(now) + lane.queued_ms()
        # Every request reads this: idle lanes (most of them) cost a check, not a prediction.
        this = dataset.name
        own, others = self._lane_groups(this)
        for lane in own:
            b = lane.batcher
            if b.in_flight_since is not None:
                ahead += lane.running_ms(now)
            waiting += b.queued_nodes
            running += b.in_flight_nodes
        for lane in others:
            b = lane.batcher
            if b.in_flight_since is not None:
                ahead += lane.running_ms(now)
            if b.queued_nodes:
                ahead += lane.queued_ms()
        loads = {}
        if variant_ids is not None:
            for v in variant_ids:
                own = self._lanes.get((this, v))
                if own is not None:
                    b = own.batcher
                    loads[v] = VariantLoad(
                        queued_nodes=b.queued_nodes, speed=own.scale, room_nodes=b.room_nodes
                    )
        base = LoadSnapshot(
            ahead_ms=ahead / self.settings.max_concurrent_batches,
            waiting_nodes=waiting,
            running_nodes=running,
            variants=loads,
            max_batch_nodes=self.settings.max_batch_nodes,
            current=self._last.get(dataset.name),
        )
        if variant_ids is not None:
            return base
        for v, variant in dataset.variants.items():
            own = self._lanes.get((dataset.name, v))
            if own is None:
                continue
            profile, speed = variant.profile, own.scale
            loads[v] = VariantLoad(
                # the policy's own prediction, with no new nodes
                wait_ms=0.0 if profile is None else base.completion_at(profile.service, 0, speed),
                queued_nodes=own.batcher.queued_nodes,
                running_ms=own.running_ms(now),
                speed=speed,
                room_nodes=own.batcher.room_nodes,
            )
        return dataclasses.replace(base, variants=loads)

    def _lane_groups(self, dataset: str) -> tuple[tuple[Lane, ...], tuple[Lane, ...]]:
        """``dataset``'s lanes and every other dataset's (cached until the lanes are replaced)."""
        lanes, groups = self._groups
        if lanes is not self._lanes:
            groups = {}
            self._groups = (self._lanes, groups)
        hit = groups.get(dataset)
        if hit is None:
            own = tuple(lane for (name, _), lane in self._lanes.items() if name == dataset)
            others = tuple(lane for (name, _), lane in self._lanes.items() if name != dataset)
            hit = groups[dataset] = (own, others)
        return hit

    def admitted(self, dataset: ServedDataset, tolerance: float) -> tuple[Candidate, ...]:
        """``dataset``'s candidates admissible under ``tolerance``, most accurate first (cached).

        The set depends on the profiles and the tolerance only, so it is computed once per
        tolerance (and again when the dataset's candidates are replaced).
        """
        return self._admitted_entry(dataset, tolerance).admitted

    def _admitted_entry(self, dataset: ServedDataset, tolerance: float) -> _Admitted:
        key = (dataset.name, tolerance)
        hit = self._admitted.get(key)
        if hit is not None and hit.source is dataset.candidates:
            return hit
        admitted = tuple(candidates_within(dataset.candidates, tolerance))
        computed = tuple(c for c in admitted if dataset.variants[c.variant_id].answers is None)
        if len(self._admitted) >= _ADMITTED_CACHE_SIZE:
            self._admitted.clear()
        entry = self._admitted[key] = _Admitted(
            dataset.candidates,
            admitted,
            tuple(c.variant_id for c in admitted),
            fastest_everywhere(admitted),
            computed,
            tuple(c.variant_id for c in computed),
        )
        return entry

    def _busy_with_room(self, dataset: ServedDataset, variant_id: str, num_nodes: int) -> bool:
        """Whether ``variant_id``'s lane runs or holds work (the stream is on it) and its queue
        takes ``num_nodes`` more."""
        lane = self._lanes.get((dataset.name, variant_id))
        if lane is None:
            return False
        b = lane.batcher
        busy = b.in_flight_since is not None or b.queued_nodes > 0
        return busy and b.room_nodes >= num_nodes

    def queue_depths(self) -> Iterator[QueueDepth]:
        """Queued and running nodes of every variant (read by ``/metrics``)."""
        for (ds, v), lane in self._lanes.items():
            yield QueueDepth(ds, v, lane.batcher.queued_nodes, lane.batcher.in_flight_nodes)

    def select(
        self,
        dataset: ServedDataset,
        num_nodes: int,
        *,
        tolerance: float | None = None,
        slo_ms: float | None = None,
        pinned: str | None = None,
        nodes: Sequence[int] | Tensor | None = None,
    ) -> tuple[ServingVariant, Selection | None]:
        """The variant for a request: ``pinned`` if given, else the policy's choice.

        ``tolerance=None`` means none was given: 0 (the most accurate variant), or every variant
        when ``slo_ms`` is given (see :mod:`gnnaas.serving.core.policy`). A precomputed variant is
        chosen only for ``nodes`` whose answers are all fresh: for a stale node (changed by a
        write since) the policy chooses among the other admissible variants, if any (else the
        precomputed variant computes it exactly, slower than its profile).

        Raises:
            NotFoundError: ``pinned`` names no variant of the dataset.
        """
        if pinned is not None:
            variant = dataset.variants.get(pinned)
            if variant is None:
                known = ", ".join(dataset.variants)
                raise NotFoundError(
                    f"unknown variant {pinned!r} for dataset {dataset.name!r}; "
                    f"known variants: {known}"
                )
            return variant, None
        request = RequestSpec(num_nodes, tolerance, slo_ms)
        entry = self._admitted_entry(dataset, request.effective_tolerance)
        # Every request runs this: a choice that no load can change reads none.
        keep = choice_without_load(
            request,
            entry.admitted,
            entry.fastest,
            self._last.get(dataset.name),
            lambda v: self._busy_with_room(dataset, v, num_nodes),
        )
        if keep is not None:
            selection = Selection(keep, math.nan, math.nan, None, entry.ids)
        else:
            selection = select_admitted(
                request,
                entry.admitted,
                self.load_snapshot(dataset, entry.ids),
                tie_margin=self.settings.tie_margin,
            )
        variant = dataset.variants[selection.variant_id]
        answers = variant.answers
        if answers is not None and nodes is not None and entry.computed:
            ids = nodes.numpy() if isinstance(nodes, Tensor) else np.asarray(nodes, np.int64)
            if answers.any_stale(ids):
                selection = select_admitted(
                    request,
                    entry.computed,
                    self.load_snapshot(dataset, entry.computed_ids),
                    tie_margin=self.settings.tie_margin,
                )
                variant = dataset.variants[selection.variant_id]
        self._last[dataset.name] = selection.variant_id
        return variant, selection

    async def predict(
        self,
        dataset: ServedDataset,
        nodes: Sequence[int] | Tensor,
        *,
        output: Output = "class",
        tolerance: float | None = None,
        slo_ms: float | None = None,
        pinned: str | None = None,
    ) -> Prediction:
        """Serves one request of validated node ids.

        ``output`` is what it returns per node: ``"class"``, ``"proba"`` or ``"embedding"``
        (:class:`~gnnaas.inference.executor.ExecRequest`).

        Raises:
            NotFoundError: unknown pinned variant.
            OverloadedError: the chosen variant's queue is full, or the router is stopping.
        """
        num_nodes = len(nodes)
        variant, selection = self.select(
            dataset, num_nodes, tolerance=tolerance, slo_ms=slo_ms, pinned=pinned, nodes=nodes
        )
        lane = self._lanes.get((dataset.name, variant.variant_id))
        if lane is None or lane.dataset is not dataset:
            # `dataset` is from a registry a reload has replaced: its caller awaited something
            # between looking it up and calling this (the predict route never does).
            raise OverloadedError(
                f"the variants of {dataset.name!r} were reloaded while this request was routed; "
                "retry",
                self.settings.retry_after_s,
            )
        out = await lane.batcher.submit(ExecRequest(nodes, output), num_nodes)
        times = out.value.times
        return Prediction(
            variant=variant,
            predictions=out.value.predictions,
            queue_ms=out.queue_s * 1e3,
            sample_ms=times.sample_ms,
            gather_ms=times.comm_ms,  # gather + host→device copy + outputs back (§5 comm)
            compute_ms=times.compute_ms,
            batch_size=out.batch_size,
            batch_requests=out.batch_requests,
            selection=selection,
            graph_version=out.value.graph_version,
        )
