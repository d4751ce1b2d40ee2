"""The serving core: policy + one batcher and executor per variant, with measured load.

:class:`Router` is plain Python (no FastAPI types), so that the same object could sit behind another
ingress later (ARCHITECTURE.md §7). For every request it takes a load snapshot of the dataset's
variants from its own batchers, asks the pure :func:`~gnnaas.serving.policy.select_variant` for a
variant (or honours a pinned one), and queues the request on that variant's batcher.

Queue wait of a variant = the remaining time of its running batch + the time to serve the nodes
waiting in its queue (in batches of at most ``max_batch_nodes``), both from its profiled service
curve times a *measured* factor: an EWMA of observed batch time / profiled time, updated after every
batch. So load comes from the router's own queues and recent service times, and a machine slower or
busier than the one that profiled is noticed after a few batches.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gnnaas.errors import ConfigError
from gnnaas.serving.batcher import Batcher, BatchStats
from gnnaas.serving.executor import ExecRequest, ExecResult, Executor
from gnnaas.serving.metrics import QueueDepth, ServingMetrics
from gnnaas.serving.policy import Selection, select_variant
from gnnaas.serving.registry import ServedDataset, ServingVariant, VariantRegistry
from gnnaas.serving.settings import Settings

__all__ = [
    "ExecutorFactory",
    "Lane",
    "NotFoundError",
    "Prediction",
    "Router",
    "default_executor_factory",
]

_log = logging.getLogger(__name__)

ExecutorFactory = Callable[
    [ServedDataset, ServingVariant], Callable[[Sequence[ExecRequest]], list[ExecResult]]
]
"""Builds the blocking batch handler of one variant (default: :class:`Executor`)."""

_SCALE_BOUNDS = (0.1, 20.0)


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
        gather_ms (float): feature gather (and copy) time of its batch.
        compute_ms (float): forward time of its batch.
        batch_size (int): nodes in its batch.
        batch_requests (int): requests in its batch.
        selection (Selection, optional): the policy's decision, ``None`` when pinned.
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


def default_executor_factory(
    device: Any,
) -> ExecutorFactory:
    """Builds an :class:`Executor` per variant on ``device``."""

    def build(
        dataset: ServedDataset, variant: ServingVariant
    ) -> Callable[[Sequence[ExecRequest]], list[ExecResult]]:
        return Executor(
            variant.model,
            dataset.store.feature_subset(variant.kept_features),
            dataset.sampler(variant.fanouts),
            device=device,
            multi_label=bool(dataset.store.multi_label),
            name=f"{dataset.name}/{variant.variant_id}",
        )

    return build


class Lane:
    """One variant's executor, batcher and measured speed."""

    def __init__(
        self,
        dataset: ServedDataset,
        variant: ServingVariant,
        handler: Callable[[Sequence[ExecRequest]], list[ExecResult]],
        settings: Settings,
        metrics: ServingMetrics,
    ) -> None:
        self.dataset = dataset
        self.variant = variant
        self.handler = handler
        self.scale = 1.0  # EWMA of observed / profiled batch time
        self._alpha = settings.load_ewma_alpha
        self._metrics = metrics
        self.batcher: Batcher[ExecRequest, ExecResult] = Batcher(
            handler,
            name=f"{dataset.name}/{variant.variant_id}",
            max_batch_size=settings.max_batch_nodes,
            max_wait_s=settings.max_wait_ms / 1e3,
            max_queue_size=settings.max_queue_nodes,
            on_batch=self._on_batch,
            retry_after_s=settings.retry_after_s,
        )

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
        predicted = profile.service.predict(stats.batch_size)
        if predicted <= 0:
            return
        ratio = min(max(stats.duration_s * 1e3 / predicted, _SCALE_BOUNDS[0]), _SCALE_BOUNDS[1])
        self.scale += self._alpha * (ratio - self.scale)

    def wait_ms(self, now: float) -> float:
        """Predicted wait before a new request's batch starts (0 for unprofiled variants)."""
        profile = self.variant.profile
        if profile is None:
            return 0.0
        curve, b = profile.service, self.batcher
        wait = 0.0
        since = b.in_flight_since
        if since is not None:
            expected = self.scale * curve.predict(b.in_flight_nodes)
            wait += max(expected - (now - since) * 1e3, 0.0)
        queued = b.queued_nodes
        if queued:
            full, rest = divmod(queued, b.max_batch_size)
            queued_ms = full * curve.predict(b.max_batch_size) + (
                curve.predict(rest) if rest else 0
            )
            wait += self.scale * queued_ms
        return wait


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
        for ds in self.registry.datasets.values():
            for v in ds.variants.values():
                handler = await asyncio.to_thread(self._factory, ds, v)
                self._lanes[(ds.name, v.variant_id)] = Lane(
                    ds, v, handler, self.settings, self.metrics
                )
        if self.settings.warmup:
            for lane in self._lanes.values():
                warm = [ExecRequest(torch.zeros(1, dtype=torch.long), proba=True)]
                await asyncio.to_thread(lane.handler, warm)
        for lane in self._lanes.values():
            lane.batcher.start()
        self.started = True
        _log.info("router started: %d variants", len(self._lanes))

    async def stop(self) -> None:
        """Refuses new requests and drains the accepted ones (bounded by the shutdown timeout)."""
        self.stopping = True
        await asyncio.gather(
            *(lane.batcher.stop(self.settings.shutdown_timeout_s) for lane in self._lanes.values())
        )
        _log.info("router stopped")

    # -- load and selection ----------------------------------------------------------------------

    def lane(self, dataset: str, variant_id: str) -> Lane:
        """The lane of one variant (``KeyError`` when unknown)."""
        return self._lanes[(dataset, variant_id)]

    def load_snapshot(self, dataset: ServedDataset) -> dict[str, float]:
        """Predicted queue wait (ms) of each variant of ``dataset``, measured now."""
        now = time.monotonic()
        return {
            v: self._lanes[(dataset.name, v)].wait_ms(now)
            for v in dataset.variants
            if (dataset.name, v) in self._lanes
        }

    def queue_depths(self) -> Iterator[QueueDepth]:
        """Queued and running nodes of every variant (read by ``/metrics``)."""
        for (ds, v), lane in self._lanes.items():
            yield QueueDepth(ds, v, lane.batcher.queued_nodes, lane.batcher.in_flight_nodes)

    def select(
        self,
        dataset: ServedDataset,
        num_nodes: int,
        *,
        tolerance: float = 0.0,
        slo_ms: float | None = None,
        pinned: str | None = None,
    ) -> tuple[ServingVariant, Selection | None]:
        """The variant for a request: ``pinned`` if given, else the policy's choice.

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
        selection = select_variant(
            dataset.candidates,
            num_nodes=num_nodes,
            tolerance=tolerance,
            wait_ms=self.load_snapshot(dataset),
            slo_ms=slo_ms,
        )
        return dataset.variants[selection.variant_id], selection

    async def predict(
        self,
        dataset: ServedDataset,
        nodes: Sequence[int] | Tensor,
        *,
        proba: bool = False,
        tolerance: float = 0.0,
        slo_ms: float | None = None,
        pinned: str | None = None,
    ) -> Prediction:
        """Serves one request of validated node ids.

        Raises:
            NotFoundError: unknown pinned variant.
            OverloadedError: the chosen variant's queue is full, or the router is stopping.
        """
        num_nodes = len(nodes)
        variant, selection = self.select(
            dataset, num_nodes, tolerance=tolerance, slo_ms=slo_ms, pinned=pinned
        )
        lane = self._lanes[(dataset.name, variant.variant_id)]
        out = await lane.batcher.submit(ExecRequest(nodes, proba), num_nodes)
        times = out.value.times
        return Prediction(
            variant=variant,
            predictions=out.value.predictions,
            queue_ms=out.queue_s * 1e3,
            sample_ms=times.sample_ms,
            gather_ms=times.gather_ms,
            compute_ms=times.compute_ms,
            batch_size=out.batch_size,
            batch_requests=out.batch_requests,
            selection=selection,
        )
