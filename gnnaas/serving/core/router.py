"""The router: for every request, one decision on the measured load, then the chosen lane.

:class:`Router` is plain Python (no FastAPI types); the same object serves in one process, in each
``--workers`` process and in each Ray Serve replica (docs/architecture.md §7). It serves one
:class:`~gnnaas.serving.core.generation.Generation` at a time (the registry, its lanes, its
decision tables) and a reload swaps the next one in with one assignment. For a request it measures
the load of the dataset's lanes once (a frozen :class:`~gnnaas.policy.LoadSnapshot`; the full one
is what ``GET /v1/datasets/{dataset}/variants`` shows), asks the dataset's
:class:`~gnnaas.policy.DecisionTable` for a variant (the pure decision ``(request, load, now)``;
or honours a pinned one), applies the deadline admission (:func:`.deadlines.admit`) and queues the
request on that variant's lane.

All variants of a process share one device, and at most ``max_concurrent_batches`` batches run on
it at once (a shared gate; on a CPU one batch already uses every intra-op thread, so two batches
of different variants would only slow each other down). A batcher takes the gate only once its
batch is full or has waited ``max_wait_ms``, and requests keep merging into it while other batches
run. The load model follows: before a new batch of any variant can start, the running batches must
finish and the nodes already waiting must be served. The decision therefore scores each candidate
by the time *it* would take to serve the dataset's waiting nodes together with the new request:
idle, every variant costs about the same for a few nodes and the most accurate near-tie wins
(the stream's current variant, when it is one);
under load, the backlog makes a fast variant's advantage large and traffic moves to it, in one
batch stream rather than split over many variants (the stream's current variant is kept among
near-ties, busy or idle).

Times come from the profiled service curves times the device's measured
:class:`~gnnaas.serving.core.slowdown.Slowdown` at the batch's size, so a machine slower or busier
than the one that profiled is noticed after a few batches.

:meth:`Router.reload` replaces the served set without failing a request: the new generation is
built and warmed up off to the side, swapped in on the event loop, and the old lanes drain what
was queued on them (:mod:`gnnaas.serving.core.reload` drives it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
from collections.abc import Container, Iterator, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gnnaas.errors import ConfigError, DeadlineExceeded, OverloadedError, UnmeetableDeadline
from gnnaas.inference.executor import ExecRequest, Output
from gnnaas.policy import (
    Candidate,
    DecisionTable,
    LoadSnapshot,
    RequestSpec,
    Selection,
    VariantLoad,
    effective_tolerance,
)
from gnnaas.serving.core.batcher import Batched
from gnnaas.serving.core.clock import MONOTONIC, Clock
from gnnaas.serving.core.deadlines import admit, late_answer
from gnnaas.serving.core.generation import (
    ExecutorFactory,
    Generation,
    build_generation,
    decision_tables,
    default_executor_factory,
    discard,
)
from gnnaas.serving.core.lane import Lane
from gnnaas.serving.core.looplag import ComputeTime, LoopLag
from gnnaas.serving.core.metrics import QueueDepth, ServingMetrics
from gnnaas.serving.core.protect import LowerRates
from gnnaas.serving.core.registry import ServedDataset, ServingVariant, VariantRegistry
from gnnaas.serving.core.settings import Settings
from gnnaas.serving.core.shedding import Asked, Shed, ShedBook, shed_outcome
from gnnaas.serving.core.slowdown import Slowdown

__all__ = ["STREAM_GAP_S", "NotFoundError", "Prediction", "Router"]

STREAM_GAP_S = 0.5
"""A dataset's stream is over once the device has been idle and none of its requests routed for
this long: a decision then keeps none of its variants (the most accurate near-tie wins again);
until then the stream's variant is kept among near-ties also in the idle instants between its
batches (:mod:`gnnaas.policy.decision`)."""

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
        comm_ms (float): moving data of its batch: feature gather, host→device copy and outputs
            back (docs/architecture.md §5 ``comm_ms``; the copies are 0 on the CPU).
        compute_ms (float): forward time of its batch.
        batch_size (int): nodes in its batch.
        batch_requests (int): requests in its batch.
        selection (Selection, optional): the decision, ``None`` when pinned.
        graph_version (int, optional): version of the graph its batch read (0 for a graph that
            takes no writes). (default: ``0``)
    """

    variant: ServingVariant
    predictions: list[Any]
    queue_ms: float
    sample_ms: float
    comm_ms: float
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
            default the runtime's executor on ``registry.device``. (default: ``None``)
        clock (Clock, optional): the time of every decision, deadline and batch (its batchers
            run on it; ``arrived`` of :meth:`predict` is read on it). (default:
            :data:`~gnnaas.serving.core.clock.MONOTONIC`)
        watch_loop (bool, optional): measure the event loop's lag while requests with a
            deadline arrive and count it against their deadlines (:mod:`.looplag`); ``None``:
            on a real clock (``clock.real``), off on a
            :class:`~gnnaas.serving.core.clock.FakeClock` (a test's time is its own).
            (default: ``None``)
    """

    def __init__(
        self,
        registry: VariantRegistry,
        settings: Settings,
        *,
        metrics: ServingMetrics | None = None,
        executor_factory: ExecutorFactory | None = None,
        clock: Clock = MONOTONIC,
        watch_loop: bool | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or ServingMetrics()
        self.clock = clock
        if watch_loop is None:
            watch_loop = clock.real
        # The device's computing time, told by every lane's batcher; a batch in a worker
        # thread keeps the loop from running on a CPU (its threads take the cores), not on an
        # accelerator.
        self.computing = ComputeTime(threads_compete=registry.device.type == "cpu")
        self.loop_lag = (
            LoopLag(observe=self.metrics.loop_lag.observe, computing=self.computing.total)
            if watch_loop
            else None
        )
        self._watching: asyncio.Task[None] | None = None
        self._factory = executor_factory or default_executor_factory(registry.device)
        self.slowdown = Slowdown(settings.load_ewma_alpha)
        # Not served until start(): no lanes yet.
        self._gen = Generation(0, registry, {}, decision_tables(registry, settings))
        # The device's lanes with work, of every generation (a retired lane draining its queue
        # included): each lane's batcher keeps its own membership (Lane, busy=).
        self._busy: set[Lane] = set()
        self._gate: asyncio.Semaphore | None = None
        self._drains: set[asyncio.Future[None]] = set()  # retired generations still draining
        self._reloading = asyncio.Lock()  # one reload at a time: each numbers the next generation
        self.shed = ShedBook()  # admission's refusals that still hold (the edge applies them)
        self.lower = LowerRates()  # the rates of normal and low kept while high misses
        self.started = False
        self.stopping = False
        self.metrics.bind_queues(self.queue_depths)
        self.metrics.bind_limits(lambda: self.lower.limits(self.clock.now()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.registry!r}, lanes={len(self._gen.lanes)})"

    @property
    def registry(self) -> VariantRegistry:
        """The served registry (of the current generation)."""
        return self._gen.registry

    @property
    def generation(self) -> int:
        """The current generation (``settings.generation`` after :meth:`start`, +1 per reload;
        0 before start)."""
        return self._gen.number

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
        # 1, or under the workers' supervisor 1 + the SIGHUPs that replaced the workers.
        gen = await self._build(self.settings.generation, self.registry)
        self._go_live(gen)
        self._gen = gen
        self.metrics.generation.set(gen.number)
        if self.loop_lag is not None:
            self._watching = asyncio.create_task(self.loop_lag.watch(self.clock))
        self.started = True
        _log.info("router started: %d variants", len(gen.lanes))

    async def stop(self) -> None:
        """Refuses new requests and drains the accepted ones (bounded by the shutdown timeout);
        then closes the live graphs' logs."""
        self.stopping = True
        if self._watching is not None:
            self._watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watching
            self._watching = None
        timeout = self.settings.shutdown_timeout_s
        await asyncio.gather(
            *(lane.batcher.stop(timeout) for lane in self._gen.lanes.values()),
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

        The new generation is built and warmed up off to the side (executors built in worker
        threads, each warm-up forward taking the device gate like a batch), then swapped in with
        no ``await`` in between: a request routed before the swap is already queued on an old
        lane, one routed after it sees only the new generation. The old lanes then stop taking
        requests and serve the ones queued on them (bounded by ``shutdown_timeout_s``) before
        this returns. If building fails, nothing changes. Reloads run one at a time (a second
        waits for the first), so each generation has its own number.

        Args:
            registry (VariantRegistry): the new set to serve (device of the current one).

        Returns:
            int: the new generation.

        Raises:
            OverloadedError: the router is not started or is shutting down.
            Exception: whatever building or warming up a variant raised; the old set stays.
        """
        async with self._reloading:
            return await self._reload(registry)

    async def _reload(self, registry: VariantRegistry) -> int:
        if not self.started or self.stopping:
            raise OverloadedError("the server is starting or shutting down; reload later")
        gen = await self._build(self.generation + 1, registry)
        if self.stopping:
            await discard(gen.lanes)
            raise OverloadedError("the server is shutting down; reload abandoned")
        # -- the swap: no await from here until the old lanes are handed to the drain ----------
        old = self._gen
        self._go_live(gen)
        gen.current.update((d, s) for d, s in old.current.items() if (d, s[0]) in gen.lanes)
        self._gen = gen
        self.shed.clear()  # made on the old lanes' load
        self.lower.clear()
        self.metrics.generation.set(gen.number)
        for dataset, variant in old.lanes.keys() - gen.lanes.keys():
            self.metrics.untrack_drift(dataset, variant)
        retired = list(old.lanes.values())
        drain = asyncio.ensure_future(self._drain(retired))
        self._drains.add(drain)
        drain.add_done_callback(self._drains.discard)
        # Shielded: a reload whose caller goes away still finishes draining the old lanes.
        await asyncio.shield(drain)
        return gen.number

    async def _build(self, number: int, registry: VariantRegistry) -> Generation:
        return await build_generation(
            number,
            registry,
            self._factory,
            self.settings,
            self.metrics,
            slowdown=self.slowdown,
            gate=self._gate,
            serving=self.started,
            clock=self.clock,
            busy=self._busy,
            computing=self.computing,
        )

    def _go_live(self, gen: Generation) -> None:
        for (dataset, variant), lane in gen.lanes.items():
            self.metrics.track_drift(dataset, variant, lane.drift)
            lane.batcher.start()

    async def _drain(self, lanes: list[Lane]) -> None:
        await asyncio.gather(
            *(lane.batcher.stop(self.settings.shutdown_timeout_s) for lane in lanes)
        )

    # -- load ------------------------------------------------------------------------------------

    def lane(self, dataset: str, variant_id: str) -> Lane:
        """The lane of one variant (``KeyError`` when unknown)."""
        return self._gen.lanes[(dataset, variant_id)]

    def queue_depths(self) -> Iterator[QueueDepth]:
        """Queued and running nodes of every variant (read by ``/metrics``)."""
        for (ds, v), lane in self._gen.lanes.items():
            yield QueueDepth(ds, v, lane.batcher.queued_nodes, lane.batcher.in_flight_nodes)

    def decision_load(
        self,
        dataset: ServedDataset,
        num_nodes: int,
        priority: str = "normal",
        now: float | None = None,
        variants: Container[str] | None = None,
    ) -> LoadSnapshot:
        """The load a decision on ``dataset`` for ``num_nodes`` more nodes reads, measured at
        ``now`` (the router's clock; default: now); with ``variants``, the busy lanes' own
        loads of those variants only (the ones the decision may choose).

        The work ahead of a new batch of ``dataset`` is what is left of the running batches plus
        the waiting work of other datasets' variants (and of a retired generation's lanes still
        draining), shared among the ``max_concurrent_batches`` slots; the dataset's stream (its
        nodes queued ahead of a request of ``priority``, or its running batch's when more)
        counts for every variant (a variant that takes the stream serves it). Only the lanes
        with work are visited (few, whatever the number of variants); the slowdowns are the
        device's at the size of the batch the stream and the request make.
        """
        now = self.clock.now() if now is None else now
        return self._measure(self._view(dataset, num_nodes, priority, now), variants)

    def _view(self, dataset: ServedDataset, num_nodes: int, priority: str, now: float) -> _Load:
        """The load view of a request at ``now`` (``_decide`` builds the same inline: a frame
        less on every decision)."""
        cap = self.settings.max_batch_nodes
        return _Load((self, dataset, num_nodes, priority, now, not self._busy, cap))

    def _measure(self, load: _Load, variants: Container[str] | None) -> LoadSnapshot:
        """:meth:`decision_load` of the request ``load`` describes."""
        dataset, num_nodes, priority, now = load.dataset, load.num_nodes, load.priority, load.now
        cap, current = load.max_batch_nodes, load.current
        slowdown = self.slowdown
        lookups = bool(dataset.precomputed)
        if load.idle:
            size = min(num_nodes, cap)
            lookup = slowdown.at(size, True) if lookups else 1.0
            return LoadSnapshot.measured(
                0.0, 0, 0, _NO_LOADS, cap, current, slowdown.at(size), lookup, True
            )
        ahead, waiting, running = 0.0, 0, 0
        busy: dict[str, Lane] = {}
        lanes = self._gen.lanes
        for lane in self._busy:
            b = lane.batcher
            if b.in_flight_since is not None:
                ahead += lane.running_ms(now)
            v = lane.variant.variant_id
            if lane.dataset is dataset and lanes.get((dataset.name, v)) is lane:
                waiting += b.queued_ahead(priority)
                running += b.in_flight_nodes
                if variants is None or v in variants:
                    busy[v] = lane
            elif b.queued_nodes:  # other datasets' work, or a retired lane's still draining
                ahead += lane.queued_ms()
        size = min(max(waiting, running) + num_nodes, cap)
        computed = slowdown.at(size)
        lookup = slowdown.at(size, True) if lookups else 1.0
        loads = (
            {
                v: VariantLoad.busy(
                    lane.batcher.queued_nodes,
                    lookup if lane.variant.answers is not None else computed,
                    lane.batcher.room_with_eviction(priority),
                )
                for v, lane in busy.items()
            }
            if busy
            else _NO_LOADS
        )
        return LoadSnapshot.measured(
            ahead / self.settings.max_concurrent_batches,
            waiting,
            running,
            loads,
            cap,
            current,
            computed,
            lookup,
            False,
        )

    def load_snapshot(self, dataset: ServedDataset) -> LoadSnapshot:
        """The load of every variant of ``dataset`` now, with each one's predicted wait (what
        ``GET /v1/datasets/{dataset}/variants`` shows; a decision reads the same measurement,
        restricted to the lanes with work)."""
        now = self.clock.now()
        base = self.decision_load(dataset, 0, "low", now)
        size = min(base.stream_nodes, self.settings.max_batch_nodes)
        loads = {}
        for v, variant in dataset.variants.items():
            own = self._gen.lanes.get((dataset.name, v))
            if own is None:
                continue
            profile, slowdown = variant.profile, own.slowdown_at(size)
            loads[v] = VariantLoad(
                # the decision's own prediction, with no new nodes
                wait_ms=0.0
                if profile is None
                else base.completion_at(profile.service, 0, slowdown),
                queued_nodes=own.batcher.queued_nodes,
                running_ms=own.running_ms(now),
                slowdown=slowdown,
                room_nodes=own.batcher.room_nodes,
            )
        return dataclasses.replace(base, variants=loads)

    # -- decisions -------------------------------------------------------------------------------

    def admissible(self, dataset: ServedDataset, tolerance: float) -> tuple[Candidate, ...]:
        """``dataset``'s candidates admissible under ``tolerance``, most accurate first (the
        decision table computes each tolerance's set once).

        Raises:
            OverloadedError: ``dataset`` is of a replaced generation, or has no routable variant.
        """
        return self._table(dataset).admissible(tolerance)

    def _table(self, dataset: ServedDataset) -> DecisionTable:
        gen = self._gen
        table = gen.tables.get(dataset)
        if table is not None:
            return table
        if gen.registry.datasets.get(dataset.name) is not dataset:
            raise self._reloaded(dataset)
        raise OverloadedError(
            f"dataset {dataset.name!r} has no routable variant (every variant lacks a "
            f"profile); run `gnnaas profile --dataset {dataset.name}`, or pin a variant "
            "with X-Variant",
            self.settings.retry_after_s,
        )

    def _reloaded(self, dataset: ServedDataset) -> OverloadedError:
        """The refusal of a request routed on ``dataset`` after a reload replaced it (retry)."""
        return OverloadedError(
            f"the variants of {dataset.name!r} were reloaded while this request was routed; retry",
            self.settings.retry_after_s,
            cause="stopping",
        )

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
        now: float | None = None,
    ) -> tuple[ServingVariant, Selection | None]:
        """The variant for a request: ``pinned`` if given, else the decision.

        ``tolerance=None`` means none was given: 0 (the most accurate variant), or every variant
        when ``slo_ms`` or ``deadline_ms`` (the time left at ``now``) is given
        (:mod:`gnnaas.policy.decision`). A precomputed variant is chosen only for ``nodes`` whose
        answers are all fresh: for a stale node (changed by a write since) the decision is made
        among the variants that compute, if any (else the precomputed variant computes it
        exactly, slower than its profile).

        Raises:
            NotFoundError: ``pinned`` names no variant of the dataset.
            OverloadedError: nothing is pinned and the dataset has no routable variant.
        """
        if pinned is not None:
            return _pinned(dataset, pinned), None
        variant, selection, _ = self._decide(
            dataset, num_nodes, tolerance, slo_ms, nodes, deadline_ms, priority, now
        )
        return variant, selection

    def _decide(
        self,
        dataset: ServedDataset,
        num_nodes: int,
        tolerance: float | None,
        slo_ms: float | None,
        nodes: Sequence[int] | Tensor | None,
        deadline_ms: float | None,
        priority: str,
        now: float | None,
    ) -> tuple[ServingVariant, Selection, _Load]:
        """:meth:`select`'s decision (nothing pinned), with the load view it read (which
        deadline admission reads again, measured at most once)."""
        gen = self._gen
        # the table read here, _table (and its refusals) only when there is none: a frame less
        table = gen.tables.get(dataset) or self._table(dataset)
        now = self.clock.now() if now is None else now
        if slo_ms is None and deadline_ms is None:
            request = table.request(num_nodes, tolerance)
        else:
            at = None if deadline_ms is None else now + deadline_ms / 1e3
            request = RequestSpec(num_nodes, tolerance, slo_ms, at)
        cap = self.settings.max_batch_nodes  # the load view, as _view builds it
        load = _Load((self, dataset, num_nodes, priority, now, not self._busy, cap))
        selection = table.decide(request, load, now)
        variant = dataset.variants[selection.variant_id]
        answers = variant.answers
        if (
            answers is not None
            and nodes is not None
            and selection.variant_id not in dataset.covered
            and not answers.covers(dataset.num_nodes)
        ):
            ids = nodes.numpy() if isinstance(nodes, Tensor) else np.asarray(nodes, np.int64)
            if answers.any_stale(ids):
                selection = table.decide(request, load, now, computed_only=True)
                variant = dataset.variants[selection.variant_id]
        gen.current[dataset.name] = (selection.variant_id, now)
        return variant, selection, load

    # -- serving ---------------------------------------------------------------------------------

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
        ``arrived``, on the router's clock, when it reached the app, less the event loop's lag
        met and to come: :meth:`_expires`) the variant is chosen as for an SLO, the request is
        refused at once when no admissible variant is predicted to answer in time, it is never
        computed when its batch is predicted to end after the deadline less the lag met and to
        come, and its answer is discarded when ready after the deadline less the lag met.
        ``priority`` orders it in its variant's queue and decides who is shed first under
        overload (:class:`~gnnaas.serving.core.batcher.Batcher`).

        Raises:
            NotFoundError: unknown pinned variant.
            OverloadedError: the chosen variant's queue is full (for this priority), the request
                was shed for higher-priority traffic, no admissible variant is predicted to meet
                its deadline under the current load, or the router is stopping.
            UnmeetableDeadline: its deadline is shorter than the fastest admissible variant's
                profiled time for it alone: no load would let it be met.
            DeadlineExceeded: its deadline passed (or would have in its batch) before it ran,
                or its answer was ready only after it (discarded).
        """
        num_nodes, now = len(nodes), self.clock.now()
        arrival = now if arrived is None else arrived
        expires = answer_by = left_ms = None
        if deadline_ms is not None:
            expires, answer_by = self._expires(deadline_ms, arrival, priority)
            left_ms = (expires - now) * 1e3
        selection: Selection | None
        load: _Load | None
        if pinned is not None:
            variant, selection, load = _pinned(dataset, pinned), None, None
        else:
            variant, selection, load = self._decide(
                dataset, num_nodes, tolerance, slo_ms, nodes, left_ms, priority, now
            )
        if expires is not None and left_ms is not None and deadline_ms is not None:
            if load is None:  # pinned: no decision built one, only the admission reads it
                load = self._view(dataset, num_nodes, priority, now)
            scope = effective_tolerance(tolerance, slo_ms, deadline_ms)
            lag_ms = (arrival + deadline_ms / 1e3 - expires) * 1e3
            self._admit(load, variant, selection, deadline_ms, left_ms, scope, lag_ms)
        lane = self._served_lane(dataset, variant)
        try:
            out = await lane.batcher.submit(
                ExecRequest(nodes, output), num_nodes, priority=priority, expires=expires
            )
        except DeadlineExceeded:
            self.metrics.admitted(dataset.name, priority, "expired")
            self._high_missed(dataset.name, priority, deadline_ms)
            raise
        except OverloadedError as exc:
            self.metrics.admitted(dataset.name, priority, shed_outcome(exc))
            if exc.cause in ("queue_full", "evicted"):  # until a batch makes room
                scope = effective_tolerance(tolerance, slo_ms, deadline_ms)
                self._shed_until_room(lane, exc, priority, scope, pinned)
            raise
        return self._answered(
            out, variant, selection, dataset.name, priority, deadline_ms, answer_by, arrival
        )

    def _served_lane(self, dataset: ServedDataset, variant: ServingVariant) -> Lane:
        """``variant``'s lane, serving ``dataset``.

        Raises:
            OverloadedError: ``dataset`` is from a registry a reload has replaced: its caller
                awaited something between looking it up and routing (the predict route never
                does).
        """
        lane = self._gen.lanes.get((dataset.name, variant.variant_id))
        if lane is None or lane.dataset is not dataset:
            raise self._reloaded(dataset)
        return lane

    def _answered(
        self,
        out: Batched[Any],
        variant: ServingVariant,
        selection: Selection | None,
        dataset: str,
        priority: str,
        deadline_ms: float | None,
        answer_by: float | None,
        arrival: float,
    ) -> Prediction:
        """The prediction a computed batch's ``out`` answers, counted as admitted; an answer
        ready after the request's deadline (``answer_by``: nothing is left to wait for but its
        writing) is discarded instead (a late answer is worth nothing). ``arrival``: when the
        request reached the app, its deadline counted from there less the lag it met."""
        if answer_by is not None and deadline_ms is not None:  # set together
            over_ms = (self.clock.now() - answer_by) * 1e3
            if over_ms > 0:
                self.metrics.admitted(dataset, priority, "late")
                self._high_missed(dataset, priority, deadline_ms)
                met_ms = (arrival + deadline_ms / 1e3 - answer_by) * 1e3
                raise late_answer(
                    deadline_ms,
                    over_ms,
                    out.queue_s * 1e3,
                    out.batch_size,
                    variant.variant_id,
                    met_ms=met_ms,
                )
        self.metrics.admitted(dataset, priority, "admitted")
        times = out.value.times
        return Prediction(
            variant=variant,
            predictions=out.value.predictions,
            queue_ms=out.queue_s * 1e3,
            sample_ms=times.sample_ms,
            comm_ms=times.comm_ms,
            compute_ms=times.compute_ms,
            batch_size=out.batch_size,
            batch_requests=out.batch_requests,
            selection=selection,
            graph_version=out.value.graph_version,
        )

    def _expires(self, deadline_ms: float, arrived: float, priority: str) -> tuple[float, float]:
        """When a request that arrived at the app at ``arrived`` with ``deadline_ms`` must have
        its answer, on the router's clock: ``(expires, answer_by)``. Unseen by the app, the
        request waited about the event loop's lag before the app read it, and once its batch
        is computed it waits the loop's lag beyond the batches the prediction counts before its
        caller resumes (:mod:`.looplag`). ``expires``, what admission and the batch are fitted
        to, counts both; ``answer_by``, what a computed answer is held to, only the lag met (its
        caller has resumed by then, and the answer is written at once). A high request counts
        the lag it met and the typical lag beyond computing, the others the recent worst of
        each, so that they are shed first while the loop falls behind. While the loop is behind
        by a tick's interval or more (not the timer's usual slip), the lag met counts one
        interval more: the request may have come into its socket up to one tick before the
        tick whose lateness is read was due."""
        deadline = arrived + deadline_ms / 1e3
        lag = self.loop_lag
        if lag is None:
            return deadline, deadline
        now = self.clock.now()
        lag.arrived(now)
        met = lag.latest_s(now) if priority == "high" else lag.behind_s(now)
        if met >= lag.interval_s:  # it may have come up to a tick before the tick read was due
            met += lag.interval_s
        answer_by = deadline - met
        if priority == "high":
            return answer_by - lag.typical_s(beyond_computing=True), answer_by
        return answer_by - lag.behind_s(now, beyond_computing=True), answer_by

    def _shed_until_room(
        self,
        lane: Lane,
        exc: OverloadedError,
        priority: str,
        tolerance: float,
        pinned: str | None,
    ) -> None:
        """Writes a refusal for a full queue or an eviction to the shed book, holding until the
        running batch is predicted to end (a batch taken off the queue makes room)."""
        left_ms = lane.running_ms(self.clock.now())
        if left_ms > 0:
            until = self.clock.now() + left_ms / 1e3
            self.shed.record(lane.dataset.name, priority, Shed(until, exc, None, tolerance, pinned))

    def refusal(self, dataset: str, asked: Asked) -> OverloadedError | None:
        """The refusal admission made that still covers the request ``asked`` of ``dataset``
        (a served name), if any: what the edge answers it with before reading its body
        (:mod:`.shedding`)."""
        if not self.shed:
            return None
        return self.shed.refusal(dataset, asked, self.clock.now())

    def _admit(
        self,
        load: _Load,
        variant: ServingVariant,
        selection: Selection | None,
        deadline_ms: float,
        left_ms: float,
        tolerance: float,
        lag_ms: float,
    ) -> None:
        """The deadline admission of a request (:func:`.deadlines.admit`) under its effective
        ``tolerance``, then, for normal and low, their rate kept while high misses
        (:mod:`.protect`); counted when shed. It reads the load its decision read (measured
        then, or now if it was not). ``lag_ms``: the event loop's lag ``left_ms`` already
        counts."""
        dataset, priority, num_nodes = load.dataset, load.priority, load.num_nodes
        size = min(num_nodes, self.settings.max_batch_nodes)
        pinned = variant.variant_id if selection is None else None
        try:
            admit(
                variant,
                selection,
                num_nodes,
                deadline_ms,
                left_ms,
                priority,
                load=load.snapshot,
                slowdown=self.slowdown.at(size, variant.lookup),
                max_batch_nodes=self.settings.max_batch_nodes,
                retry_after_s=self.settings.retry_after_s,
                fastest_alone=lambda: self._fastest_alone(dataset, variant, selection, num_nodes),
                lag_ms=lag_ms,
            )
        except OverloadedError as exc:
            self.metrics.admitted(dataset.name, priority, shed_outcome(exc))
            self._high_missed(dataset.name, priority, deadline_ms)
            hold_s = exc.hold_s
            lag, now = self.loop_lag, self.clock.now()
            if lag is not None and priority != "high" and 0 < hold_s <= lag_ms / 1e3:
                # The loop's recent worst lag, counted against the deadline, decided the
                # refusal, and it reads the same until its window ends.
                hold_s = max(hold_s, lag.settles_in(now))
            if hold_s > 0:
                shed = Shed(now + hold_s, exc, deadline_ms, tolerance, pinned)
                self.shed.record(dataset.name, priority, shed)
            raise
        except UnmeetableDeadline:
            self.metrics.admitted(dataset.name, priority, "unmeetable")
            raise
        now = self.clock.now()
        wait_s = self.lower.wait_s(dataset.name, priority, now)
        if wait_s > 0:
            exc = OverloadedError(
                f"{priority}-priority requests with a deadline are shed while high-priority "
                "ones miss theirs; retry later or raise X-Priority",
                self.settings.retry_after_s,
                cause="evicted",
                hold_s=wait_s,
            )
            self.metrics.admitted(dataset.name, priority, shed_outcome(exc))
            # Every request of the priority with a deadline, until the next may pass.
            self.shed.record(
                dataset.name, priority, Shed(now + wait_s, exc, math.inf, math.inf, pinned)
            )
            raise exc

    def _high_missed(self, dataset: str, priority: str, deadline_ms: float | None) -> None:
        """A request of ``priority`` missed its deadline: when high, normal and low may be cut
        (:mod:`.protect`), by the event loop's recent lag beyond the device's computing (the
        loop's own work, which admission does not predict; a batch's it does)."""
        lag = self.loop_lag
        if priority == "high" and deadline_ms is not None and lag is not None:
            now = self.clock.now()
            beyond_s = lag.behind_s(now, beyond_computing=True)
            self.lower.missed(dataset, now, deadline_ms / 1e3, beyond_s)

    def _fastest_alone(
        self,
        dataset: ServedDataset,
        variant: ServingVariant,
        selection: Selection | None,
        num_nodes: int,
    ) -> tuple[str, float]:
        """The variant with the smallest profiled time for ``num_nodes`` alone (no queue, no
        slowdown) among those the decision considered (``variant`` alone when pinned), and that
        time in ms: a deadline shorter than it is never met."""
        cap = self.settings.max_batch_nodes
        ids = (variant.variant_id,) if selection is None else selection.considered
        times = []
        for variant_id in ids:
            profile = dataset.variants[variant_id].profile
            if profile is not None:  # every considered variant has one, and so has a pinned one
                times.append((profile.service.predict_batched(num_nodes, cap), variant_id))
        alone_ms, fastest = min(times)
        return fastest, alone_ms


_NO_LOADS: dict[str, VariantLoad] = {}  # an idle device's per-variant loads (none), never changed


def _pinned(dataset: ServedDataset, variant_id: str) -> ServingVariant:
    """The variant a request pins with ``X-Variant``.

    Raises:
        NotFoundError: the dataset has no such variant.
    """
    variant = dataset.variants.get(variant_id)
    if variant is None:
        known = ", ".join(dataset.variants)
        raise NotFoundError(
            f"unknown variant {variant_id!r} for dataset {dataset.name!r}; known variants: {known}"
        )
    return variant


def _stream_of(load: _Load) -> str | None:
    """The variant the stream of ``load``'s dataset is on: its last routed request's, while the
    device is busy or that request was routed less than :data:`STREAM_GAP_S` before the load's
    time (else its stream is over: ``None``). ``_Load.current``, without a frame of its own."""
    router, now = load[0], load[4]
    last = router._gen.current.get(load[1].name)
    if last is None or (not router._busy and now - last[1] > STREAM_GAP_S):
        return None
    return last[0]


class _Load(tuple):
    """The load a decision reads (:class:`~gnnaas.policy.LoadView`), measured only when the
    decision needs it, then once: whether the device is idle and the batch cap are taken when
    the decision starts (nothing awaits before it ends), the stream's variant and the room of a
    busy lane are read off the router when asked, the lanes measured on the first
    :meth:`snapshot` (:meth:`Router._measure`).

    Built on every decision and read by few (a tolerance that admits one variant reads none of
    it), so it is a tuple of the request's fields, built in C without a Python frame (as
    :func:`collections.namedtuple` builds its records); the snapshot, when measured, is kept in
    the instance's dictionary.
    """

    router = property(itemgetter(0), doc="The router deciding.")
    dataset = property(itemgetter(1), doc="The request's dataset (a ServedDataset).")
    num_nodes = property(itemgetter(2), doc="The request's node count.")
    priority = property(itemgetter(3), doc="The request's priority.")
    now = property(itemgetter(4), doc="The decision's time on the router's clock.")
    idle = property(itemgetter(5), doc="Nothing ran or waited on the device as it decided.")
    max_batch_nodes = property(itemgetter(6), doc="The largest batch a lane runs.")

    current = property(_stream_of, doc="The variant the dataset's stream is on.")

    def alone(self, lookup: bool) -> float:
        """The device's slowdown for this request's batch alone (a lookup's with ``lookup``)."""
        nodes, cap = self[2], self[6]
        return self[0].slowdown.at(nodes if nodes < cap else cap, lookup)

    def room(self, variant_id: str) -> int | None:
        """The room of ``variant_id``'s lane for this request's priority while it has work."""
        router = self.router
        lane = router._gen.lanes.get((self.dataset.name, variant_id))
        if lane is None or lane not in router._busy:
            return None
        return lane.batcher.room_with_eviction(self.priority)

    def snapshot(self, variants: Container[str] | None = None) -> LoadSnapshot:
        """The load measured (:meth:`Router.decision_load`) at the decision's time, once: the
        first call's ``variants`` hold for every later one, whose per-variant loads are those
        of the variants the decision chose among (deadline admission reads the chosen one's;
        a pinned request's view is its own, measured in full)."""
        memo = self.__dict__
        snapshot = memo.get("_snapshot")
        if snapshot is None:
            snapshot = memo["_snapshot"] = self[0]._measure(self, variants)
        return snapshot
