"""The serving core: policy + one batcher and executor per variant, with measured load.

:class:`Router` is plain Python (no FastAPI types); the same object serves in one process, in each
``--workers`` process and in each Ray Serve replica (docs/architecture.md §7). For every request it
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

Each variant's executor and batcher form a :class:`~gnnaas.serving.core.lane.Lane`; the admissible
sets per tolerance and what decisions reuse are kept in
:class:`~gnnaas.serving.core.admitted.AdmittedSets`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gnnaas.errors import ConfigError, DeadlineExceeded, OverloadedError
from gnnaas.inference.executor import ExecRequest, Output
from gnnaas.serving.core.admitted import AdmittedSets
from gnnaas.serving.core.clock import MONOTONIC, Clock
from gnnaas.serving.core.deadlines import admit, late_answer
from gnnaas.serving.core.lane import (
    ExecutorFactory,
    Lane,
    Speed,
    build_lanes,
    default_executor_factory,
    discard_lanes,
)
from gnnaas.serving.core.metrics import QueueDepth, ServingMetrics
from gnnaas.serving.core.policy import (
    Candidate,
    LoadSnapshot,
    RequestSpec,
    Selection,
    VariantLoad,
    choice_without_load,
    select_admitted,
    select_timed,
)
from gnnaas.serving.core.registry import ServedDataset, ServingVariant, VariantRegistry
from gnnaas.serving.core.settings import Settings

__all__ = ["NotFoundError", "Prediction", "Router"]

_log = logging.getLogger(__name__)


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
            back (docs/architecture.md §5 comm_ms; the copies are 0 on the CPU).
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


class Router:
    """Routes requests to variants and batches them.

    Args:
        registry (VariantRegistry): what to serve.
        settings (Settings): batching and queue limits.
        metrics (ServingMetrics, optional): where to record; a fresh one by default.
            (default: ``None``)
        executor_factory (ExecutorFactory, optional): builds each variant's batch handler; by
            default an :class:`Executor` on ``registry.device``. (default: ``None``)
        clock (Clock, optional): the time of every decision, deadline and batch (its batchers
            run on it; ``arrived`` of :meth:`predict` is read on it). (default:
            :data:`~gnnaas.serving.core.clock.MONOTONIC`)
    """

    def __init__(
        self,
        registry: VariantRegistry,
        settings: Settings,
        *,
        metrics: ServingMetrics | None = None,
        executor_factory: ExecutorFactory | None = None,
        clock: Clock = MONOTONIC,
    ) -> None:
        self.registry = registry
        self.clock = clock
        self.settings = settings
        self.metrics = metrics or ServingMetrics()
        self._factory = executor_factory or default_executor_factory(registry.device)
        self._lanes: dict[tuple[str, str], Lane] = {}
        self.speed = Speed(settings.load_ewma_alpha)
        self._last: dict[str, str] = {}  # dataset -> variant of its last routed request
        self._active: set[Lane] = set()  # lanes given work and not yet seen idle
        self._admitted = AdmittedSets(settings.max_batch_nodes, settings.tie_margin)
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
        # 1, or under the workers' supervisor 1 + the SIGHUPs that replaced the workers.
        self.generation = self.settings.generation
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
            int: the new generation (``settings.generation``, 1 by default, after :meth:`start`;
            +1 per reload).

        Raises:
            OverloadedError: the router is not started or is shutting down.
            Exception: whatever building or warming up a variant raised; the old set stays.
        """
        if not self.started or self.stopping:
            raise OverloadedError("the server is starting or shutting down; reload later")
        lanes = await self._build_lanes(registry)
        if self.stopping:
            await discard_lanes(lanes)
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
        self._active.difference_update(retired)  # counted among the draining lanes instead
        self._draining.extend(retired)
        drain = asyncio.ensure_future(self._drain(retired))
        self._drains.add(drain)
        drain.add_done_callback(self._drains.discard)
        # Shielded: a reload whose caller goes away still finishes draining the old lanes.
        await asyncio.shield(drain)
        return self.generation

    async def _build_lanes(self, registry: VariantRegistry) -> dict[tuple[str, str], Lane]:
        return await build_lanes(
            registry,
            self._factory,
            self.settings,
            self.metrics,
            speed=self.speed,
            gate=self._gate,
            serving=self.started,
            clock=self.clock,
        )

    def _go_live(self, lanes: dict[tuple[str, str], Lane]) -> None:
        for (dataset, variant), lane in lanes.items():
            self.metrics.track_drift(dataset, variant, lane.drift)
            lane.batcher.start()

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
        self,
        dataset: ServedDataset,
        variant_ids: Collection[str] | None = None,
        priority: str = "low",
        num_nodes: int = 0,
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
            variant_ids (Collection[str], optional): only these variants' loads, without
                ``wait_ms`` and ``running_ms`` (what a decision reads: speed and room).
                (default: ``None``: every variant, in full)
            priority (str, optional): the dataset's queued nodes counted are those a request
                of this priority waits behind (its own and higher priorities), and the room
                is its own (:meth:`Batcher.room_with_eviction`). (default: ``"low"``: all)
            num_nodes (int, optional): the nodes of the request decided on: the speeds are the
                device's at the size of the batch the stream and the request make
                (:meth:`Speed.at`). (default: ``0``)
        """
        now = self.clock.now()
        ahead, waiting, running = 0.0, 0, 0
        for lane in self._draining:  # only during a reload: the last batches of the old lanes
            ahead += lane.running_ms(now) + lane.queued_ms()
        # Every request reads this: only the lanes with work (few, whatever the number of
        # variants) are visited; a lane that went idle since is dropped from the set here.
        this = dataset.name
        busy: dict[str, Lane] = {}
        for lane in list(self._active):
            b = lane.batcher
            if not b.busy:
                self._active.discard(lane)
                continue
            if b.in_flight_since is not None:
                ahead += lane.running_ms(now)
            if lane.dataset.name == this and lane.dataset is dataset:
                waiting += b.queued_ahead(priority)
                running += b.in_flight_nodes
                busy[lane.variant.variant_id] = lane
            elif b.queued_nodes:
                ahead += lane.queued_ms()
        # The size of the batch the stream and the request make: the device's speed there.
        size = min(max(waiting, running) + num_nodes, self.settings.max_batch_nodes)
        loads = {}
        if variant_ids is not None:
            for v in variant_ids:
                own = busy.get(v)
                if own is not None:  # an idle computed variant's load is the snapshot's default
                    b = own.batcher
                    loads[v] = VariantLoad(
                        queued_nodes=b.queued_nodes,
                        speed=own.speed_at(size),
                        room_nodes=b.room_with_eviction(priority),
                    )
            for v in dataset.precomputed:  # an idle one (few: 0 or 1), at a lookup's speed
                if v not in loads and v in variant_ids:
                    loads[v] = VariantLoad.idle_at(self.speed.at(size, lookup=True))
        base = LoadSnapshot.measured(
            ahead / self.settings.max_concurrent_batches,
            waiting,
            running,
            loads if variant_ids is not None else {},  # the full snapshot's loads come below
            self.settings.max_batch_nodes,
            self._last.get(dataset.name),
            self.speed.at(size),
        )
        if variant_ids is not None:
            return base
        for v, variant in dataset.variants.items():
            own = self._lanes.get((dataset.name, v))
            if own is None:
                continue
            profile, speed = variant.profile, own.speed_at(size)
            loads[v] = VariantLoad(
                # the policy's own prediction, with no new nodes
                wait_ms=0.0 if profile is None else base.completion_at(profile.service, 0, speed),
                queued_nodes=own.batcher.queued_nodes,
                running_ms=own.running_ms(now),
                speed=speed,
                room_nodes=own.batcher.room_nodes,
            )
        return dataclasses.replace(base, variants=loads)

    def _any_busy(self) -> bool:
        """Whether a lane runs or holds work; the lanes found idle leave the busy set.

        A lane answering inline (few nodes, on the event loop) is idle again by the next
        request, so the set often holds only idle lanes: the idle choice then holds."""
        for lane in list(self._active):
            if lane.batcher.busy:
                return True
            self._active.discard(lane)
        return False

    def admitted(self, dataset: ServedDataset, tolerance: float) -> tuple[Candidate, ...]:
        """``dataset``'s candidates admissible under ``tolerance``, most accurate first (cached).

        The set depends on the profiles and the tolerance only, so it is computed once per
        tolerance (and again when the dataset's candidates are replaced).
        """
        return self._admitted.get(dataset, tolerance).admitted

    def _busy_with_room(self, dataset: ServedDataset, variant_id: str, num_nodes: int) -> bool:
        """Whether ``variant_id``'s lane runs or holds work (the stream is on it) and its queue
        takes ``num_nodes`` more."""
        lane = self._lanes.get((dataset.name, variant_id))
        if lane is None:
            return False
        b = lane.batcher
        return b.busy and b.room_nodes >= num_nodes

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
        deadline_ms: float | None = None,
        priority: str = "normal",
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
        request = (
            self._admitted.request(num_nodes, tolerance)
            if slo_ms is None and deadline_ms is None
            else RequestSpec(num_nodes, tolerance, slo_ms, deadline_ms)
        )
        entry = self._admitted.get(dataset, request.effective_tolerance)
        # Every request runs this: a choice that no load can change reads none.
        keep = choice_without_load(
            request,
            entry.admitted,
            entry.fastest,
            self._last.get(dataset.name),
            lambda v: self._busy_with_room(dataset, v, num_nodes),
        )
        if keep is not None:
            selection = self._admitted.kept(entry, keep)
        elif request.target_ms is None and not self._draining and not self._any_busy():
            selection = self._admitted.idle_choice(
                entry, num_nodes, self.speed, dataset.precomputed
            )
        else:
            snapshot = self.load_snapshot(dataset, entry.ids, priority, num_nodes)
            selection = select_timed(
                request,
                entry.admitted,
                self._admitted.service_ms(entry, snapshot.stream_nodes + num_nodes),
                snapshot,
                tie_margin=self.settings.tie_margin,
                considered=entry.ids,
            )
        variant = dataset.variants[selection.variant_id]
        answers = variant.answers
        if (
            answers is not None
            and nodes is not None
            and entry.computed
            and selection.variant_id not in dataset.covered
            and not answers.covers(dataset.num_nodes)
        ):
            ids = nodes.numpy() if isinstance(nodes, Tensor) else np.asarray(nodes, np.int64)
            if answers.any_stale(ids):
                selection = select_admitted(
                    request,
                    entry.computed,
                    self.load_snapshot(dataset, entry.computed_ids, priority, num_nodes),
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
        deadline_ms: float | None = None,
        priority: str = "normal",
        arrived: float | None = None,
    ) -> Prediction:
        """Serves one request of validated node ids.

        ``output`` is what it returns per node: ``"class"``, ``"proba"`` or ``"embedding"``
        (:class:`~gnnaas.inference.executor.ExecRequest`). With ``deadline_ms`` (counted from
        ``arrived``, when it reached the server on :attr:`clock`) the variant is chosen as
        for an SLO, the request is refused at once when no admissible variant is predicted to
        answer in time, and it is never computed after its deadline. ``priority`` orders it in
        its variant's queue and decides who is shed first under overload
        (:class:`~gnnaas.serving.core.batcher.Batcher`).

        Raises:
            NotFoundError: unknown pinned variant.
            OverloadedError: the chosen variant's queue is full (for this priority), the request
                was shed for higher-priority traffic, no admissible variant is predicted to meet
                its deadline, or the router is stopping.
            DeadlineExceeded: its deadline passed (or would have in its batch) before it ran,
                or its answer was ready only after it (discarded).
        """
        num_nodes = len(nodes)
        expires = left_ms = None
        if deadline_ms is not None:
            now = self.clock.now()
            left_ms = deadline_ms - (now - (arrived if arrived is not None else now)) * 1e3
            expires = now + left_ms / 1e3
        variant, selection = self.select(
            dataset,
            num_nodes,
            tolerance=tolerance,
            slo_ms=slo_ms,
            pinned=pinned,
            nodes=nodes,
            deadline_ms=left_ms,
            priority=priority,
        )
        if left_ms is not None and deadline_ms is not None:
            try:
                admit(
                    variant,
                    selection,
                    num_nodes,
                    deadline_ms,
                    left_ms,
                    priority,
                    load=lambda: self.load_snapshot(
                        dataset, [variant.variant_id], priority, num_nodes
                    ),
                    speed=self.speed.at(
                        min(num_nodes, self.settings.max_batch_nodes), variant.answers is not None
                    ),
                    max_batch_nodes=self.settings.max_batch_nodes,
                    retry_after_s=self.settings.retry_after_s,
                )
            except OverloadedError:
                self.metrics.admitted(dataset.name, priority, "shed_deadline")
                raise
        lane = self._lanes.get((dataset.name, variant.variant_id))
        if lane is None or lane.dataset is not dataset:
            # `dataset` is from a registry a reload has replaced: its caller awaited something
            # between looking it up and calling this (the predict route never does).
            raise OverloadedError(
                f"the variants of {dataset.name!r} were reloaded while this request was routed; "
                "retry",
                self.settings.retry_after_s,
            )
        self._active.add(lane)  # busy from now until load_snapshot finds it idle
        try:
            out = await lane.batcher.submit(
                ExecRequest(nodes, output), num_nodes, priority=priority, expires=expires
            )
        except DeadlineExceeded:
            self.metrics.admitted(dataset.name, priority, "expired")
            raise
        except OverloadedError as exc:
            shed = "shed_evicted" if "shed for higher-priority" in str(exc) else "shed_queue_full"
            self.metrics.admitted(dataset.name, priority, shed)
            raise
        if expires is not None and deadline_ms is not None:  # set together
            over_ms = (self.clock.now() - expires) * 1e3
            if over_ms > 0:  # a late answer is worth nothing
                self.metrics.admitted(dataset.name, priority, "late")
                raise late_answer(
                    deadline_ms, over_ms, out.queue_s * 1e3, out.batch_size, variant.variant_id
                )
        self.metrics.admitted(dataset.name, priority, "admitted")
        times = out.value.times
        return Prediction(
            variant=variant,
            predictions=out.value.predictions,
            queue_ms=out.queue_s * 1e3,
            sample_ms=times.sample_ms,
            gather_ms=times.comm_ms,  # gather + host→device copy + outputs back (comm)
            compute_ms=times.compute_ms,
            batch_size=out.batch_size,
            batch_requests=out.batch_requests,
            selection=selection,
            graph_version=out.value.graph_version,
        )
