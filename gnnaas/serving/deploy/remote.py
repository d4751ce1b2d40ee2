"""The serving core split in two: the policy in an ingress, execution in dataset replicas.

docs/architecture.md §7: on more than one process the router's policy runs where requests come in and
the variants run elsewhere. This module holds both halves as plain Python, free of any
distribution framework (:mod:`gnnaas.serving.deploy.ray` puts them in Ray Serve deployments):

- :class:`DatasetServer`, in every replica of one dataset: a :class:`~gnnaas.serving.core.router.Router`
  over that dataset alone (graph store and every variant resident, one batcher per variant),
  serving requests whose variant the ingress already chose (pinned). Every answer carries the
  replica's :class:`ReplicaLoad`: its load snapshot (queued and running nodes per variant, its
  measured speed factor), measured right after the request was served; at most once per
  ``report_interval_s`` also its batch metrics and drift summaries.
- :class:`RemoteRouter`, in the ingress: the same :class:`Router` interface the HTTP routes use
  (``predict``, ``select``, ``load_snapshot``, ``registry``), whose registry describes the
  replicas' datasets (profiles, no weights or graphs) and whose load is the latest report of each
  replica. A call lost with its replica (``lost_errors``) or not answered within
  ``call_timeout_s`` becomes an :class:`~gnnaas.errors.OverloadedError` (503 with
  ``Retry-After``).

The policy's load signal is therefore measured by the replicas and pushed with their answers; the
ingress keeps the latest one per replica, forgets a replica that has not answered for
``load_ttl_s`` (a dead one), and decides on the least loaded replica's snapshot (Ray Serve sends a
request to the less busy of two replicas), its ``ahead_ms`` reduced by the time since the report.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from torch import Tensor

from gnnaas.errors import ConfigError, OverloadedError
from gnnaas.inference.executor import Output, embedding_dim
from gnnaas.serving.core.drift import DriftRecord
from gnnaas.serving.core.lane import ExecutorFactory
from gnnaas.serving.core.metrics import QueueDepth, ServingMetrics
from gnnaas.serving.core.policy import LoadSnapshot
from gnnaas.serving.core.profiles import VariantProfile
from gnnaas.serving.core.registry import ServedDataset, ServingVariant, VariantRegistry
from gnnaas.serving.core.router import Prediction, Router
from gnnaas.serving.core.settings import Settings

__all__ = [
    "REPLICA_METRICS",
    "DatasetCaller",
    "DatasetDescription",
    "DatasetServer",
    "RemoteRouter",
    "ReplicaAnswer",
    "ReplicaLoad",
    "ReplicaRefusal",
    "StoreShape",
    "VariantDescription",
    "served_from",
]

_log = logging.getLogger(__name__)

#: Metric families measured in the replicas (per batch); the ingress shows them per replica.
REPLICA_METRICS = (
    "gnnaas_batches",
    "gnnaas_batch_nodes",
    "gnnaas_batch_errors",
    "gnnaas_batch_predicted_seconds",
    "gnnaas_batch_measured_seconds",
)


# -- what travels between replica and ingress ----------------------------------------------------


@dataclass(frozen=True)
class ReplicaLoad:
    """One replica's load, measured when it answered.

    Args:
        replica (str): the replica's id (unique per replica start).
        pid (int): its process id.
        snapshot (LoadSnapshot): its router's full load snapshot of the dataset.
        depths (tuple[QueueDepth, ...]): queued and running nodes per variant.
        metrics_text (bytes, optional): its Prometheus text, sent at most once per report
            interval. (default: ``None``)
        drift (dict, optional): ``{variant: DriftRecord.summary()}``, same cadence.
            (default: ``None``)
    """

    replica: str
    pid: int
    snapshot: LoadSnapshot
    depths: tuple[QueueDepth, ...]
    metrics_text: bytes | None = None
    drift: dict[str, dict[str, Any]] | None = None


@dataclass(frozen=True)
class ReplicaAnswer:
    """A served request, as a replica returns it (the fields of
    :class:`~gnnaas.serving.core.router.Prediction` less the variant, plus the replica's load)."""

    predictions: list[Any]
    queue_ms: float
    sample_ms: float
    gather_ms: float
    compute_ms: float
    batch_size: int
    batch_requests: int
    load: ReplicaLoad


@dataclass(frozen=True)
class ReplicaRefusal:
    """A request a replica could not queue (full queue, stopping): the ingress answers 503."""

    detail: str
    retry_after_s: float
    load: ReplicaLoad


@dataclass(frozen=True)
class VariantDescription:
    """What the ingress knows of one variant: everything but its weights."""

    variant_id: str
    arch: str
    ranking: str
    prune: int
    kept_features: tuple[int, ...]
    fanouts: tuple[int, ...]
    profile: VariantProfile | None
    not_routed: str | None
    embedding_dim: int | None = None


@dataclass(frozen=True)
class DatasetDescription:
    """What the ingress knows of one dataset: its shape, its variants and the replica's notes."""

    name: str
    num_nodes: int
    num_features: int
    num_classes: int
    multi_label: bool
    variants: tuple[VariantDescription, ...]
    notes: tuple[str, ...] = ()


@dataclass(eq=False)
class StoreShape:
    """A graph store's shape without its tensors: what the ingress's registry holds.

    The graph lives in the replicas; asking this object for features is a bug and raises.
    """

    name: str
    nodes: int
    features: int
    num_classes: int
    multi_label: bool
    rowptr: Tensor = field(default_factory=lambda: torch.zeros(1, dtype=torch.long))
    col: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))

    @property
    def num_nodes(self) -> int:
        """Number of nodes."""
        return self.nodes

    @property
    def num_features(self) -> int:
        """Number of feature columns."""
        return self.features

    def feature_subset(self, keep: Tensor | Sequence[int]) -> Tensor:
        """Refused: features are read in the dataset's replicas only."""
        raise ConfigError(f"dataset {self.name!r}: features are held by its replicas, not here")


class DatasetCaller(Protocol):
    """How the ingress reaches one dataset's replicas (a Ray Serve handle, or a test double)."""

    async def describe(self) -> DatasetDescription:
        """The dataset as a replica serves it."""
        ...

    async def predict(
        self, variant_id: str, nodes: list[int], output: Output
    ) -> ReplicaAnswer | ReplicaRefusal:
        """Serves ``nodes`` with ``variant_id`` on one replica (``output``: what per node)."""
        ...


# -- replica side --------------------------------------------------------------------------------


class DatasetServer:
    """One dataset's replica: a :class:`Router` over the dataset, serving pinned variants.

    Every variant stays resident (a few MB each; ``docs/scaling.md`` has the measurement), so no
    request waits for a model to load; the router batches concurrent requests per variant.

    Args:
        registry (VariantRegistry): exactly one dataset.
        settings (Settings): batching and queue limits.
        replica (str, optional): the replica's id. (default: the process id)
        report_interval_s (float, optional): the shortest time between two answers that carry
            the replica's metrics and drift. (default: ``1.0``)
        executor_factory (ExecutorFactory, optional): the variants' batch handlers (tests).
            (default: ``None``: :class:`~gnnaas.inference.executor.Executor`)

    Raises:
        ValueError: the registry does not hold exactly one dataset.
    """

    def __init__(
        self,
        registry: VariantRegistry,
        settings: Settings,
        *,
        replica: str | None = None,
        report_interval_s: float = 1.0,
        executor_factory: ExecutorFactory | None = None,
    ) -> None:
        if len(registry.datasets) != 1:
            raise ValueError(
                f"DatasetServer: registry must hold exactly one dataset "
                f"(got {sorted(registry.datasets)})"
            )
        self.dataset: ServedDataset = next(iter(registry.datasets.values()))
        self.router = Router(registry, settings, executor_factory=executor_factory)
        self.pid = os.getpid()
        self.replica = replica or str(self.pid)
        self.report_interval_s = report_interval_s
        self._reported = -float("inf")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dataset.name!r}, replica={self.replica!r})"

    async def start(self) -> None:
        """Builds, warms up and starts every variant's lane."""
        await self.router.start()

    async def stop(self) -> None:
        """Drains the accepted requests (bounded by ``shutdown_timeout_s``)."""
        await self.router.stop()

    def describe(self) -> DatasetDescription:
        """The dataset as this replica serves it, for the ingress's registry."""
        ds, store = self.dataset, self.dataset.store
        return DatasetDescription(
            name=ds.name,
            num_nodes=int(store.num_nodes),
            num_features=int(store.num_features),
            num_classes=int(store.num_classes),
            multi_label=bool(store.multi_label),
            variants=tuple(
                VariantDescription(
                    variant_id=v.variant_id,
                    arch=v.arch,
                    ranking=v.ranking,
                    prune=v.prune,
                    kept_features=tuple(int(i) for i in v.kept_features.tolist()),
                    fanouts=tuple(v.fanouts),
                    profile=v.profile,
                    not_routed=v.not_routed,
                    embedding_dim=embedding_dim(v.model),
                )
                for v in ds.variants.values()
            ),
            notes=tuple(self.router.registry.notes),
        )

    def load(self, *, full: bool = False) -> ReplicaLoad:
        """This replica's load now; with metrics and drift when ``full`` or when due."""
        now = time.monotonic()
        due = full or now - self._reported >= self.report_interval_s
        metrics_text = drift = None
        if due:
            self._reported = now
            metrics_text = self.router.metrics.render()
            drift = {
                v: self.router.lane(self.dataset.name, v).drift_summary()
                for v in self.dataset.variants
            }
        return ReplicaLoad(
            replica=self.replica,
            pid=self.pid,
            snapshot=self.router.load_snapshot(self.dataset),
            depths=tuple(self.router.queue_depths()),
            metrics_text=metrics_text,
            drift=drift,
        )

    async def predict(
        self, variant_id: str, nodes: list[int], output: Output
    ) -> ReplicaAnswer | ReplicaRefusal:
        """Serves validated ``nodes`` with ``variant_id`` (chosen by the ingress); ``output`` is
        ``"class"``, ``"proba"`` or ``"embedding"``.

        Returns:
            ReplicaAnswer | ReplicaRefusal: the answer, or why it could not be queued.

        Raises:
            NotFoundError: ``variant_id`` is not a variant of the dataset.
            Exception: whatever the variant's batch raised (the ingress answers 500).
        """
        try:
            out = await self.router.predict(self.dataset, nodes, output=output, pinned=variant_id)
        except OverloadedError as exc:
            return ReplicaRefusal(str(exc), exc.retry_after_s, self.load())
        return ReplicaAnswer(
            predictions=out.predictions,
            queue_ms=out.queue_ms,
            sample_ms=out.sample_ms,
            gather_ms=out.gather_ms,
            compute_ms=out.compute_ms,
            batch_size=out.batch_size,
            batch_requests=out.batch_requests,
            load=self.load(),
        )


# -- ingress side --------------------------------------------------------------------------------


def _no_sampler(store: Any, fanouts: tuple[int, ...]) -> Any:
    raise ConfigError(f"dataset {store.name!r}: sampling runs in its replicas, not in the ingress")


def _no_executor(dataset: ServedDataset, variant: ServingVariant) -> Any:
    raise ConfigError(
        f"variant {dataset.name}/{variant.variant_id}: it runs in the dataset's replicas, "
        "not in the ingress"
    )


class _Weightless(torch.nn.Module):
    """A variant's model as the ingress holds it: no weights, only its embedding width (read by
    :func:`~gnnaas.inference.executor.embedding_dim` for the variant listing)."""

    def __init__(self, embedding_dim: int | None) -> None:
        super().__init__()
        self.embedding_dim = embedding_dim


def served_from(description: DatasetDescription) -> ServedDataset:
    """The ingress's view of a dataset: shape, variants and profiles, no graph or weights."""
    store = StoreShape(
        description.name,
        description.num_nodes,
        description.num_features,
        description.num_classes,
        description.multi_label,
    )
    variants = {
        d.variant_id: ServingVariant(
            dataset=description.name,
            variant_id=d.variant_id,
            arch=d.arch,
            ranking=d.ranking,
            prune=d.prune,
            kept_features=torch.as_tensor(d.kept_features, dtype=torch.long),
            fanouts=d.fanouts,
            model=_Weightless(d.embedding_dim),  # the weights live in the replicas
            profile=d.profile,
            not_routed=d.not_routed,
        )
        for d in description.variants
    }
    return ServedDataset(description.name, store, variants, _no_sampler)


@dataclass
class _Reported:
    """The latest report of one replica and when the ingress received it."""

    dataset: str
    load: ReplicaLoad
    at: float
    metrics_text: bytes | None = None
    drift: dict[str, dict[str, Any]] | None = None


class _ReportedLane:
    """What ``GET /v1/datasets/{d}/variants`` reads of a lane: the replicas' latest drift."""

    def __init__(self, summary: dict[str, Any] | None) -> None:
        self._summary = summary

    def drift_summary(self) -> dict[str, Any]:
        """The latest drift summary a replica reported (empty before any report)."""
        return self._summary if self._summary is not None else DriftRecord().summary()


class _ReplicaMetrics(Collector):
    """The replicas' batch metrics, each series labelled with its ``replica``."""

    def __init__(self, router: RemoteRouter) -> None:
        self._router = router

    def describe(self) -> list[Metric]:
        return []  # names come and go with the replicas; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for entry in self._router.fresh_reports():
            if entry.metrics_text is None:
                continue
            for family in text_string_to_metric_families(entry.metrics_text.decode()):
                if family.name not in REPLICA_METRICS:
                    continue
                out = merged.get(family.name)
                if out is None:
                    out = merged[family.name] = Metric(
                        family.name, family.documentation, family.type
                    )
                for s in family.samples:
                    labels = {**s.labels, "replica": entry.load.replica}
                    out.add_sample(s.name, labels, s.value, s.timestamp, s.exemplar)
        yield from merged.values()


class RemoteRouter(Router):
    """The ingress's router: the policy here, execution in the datasets' replicas.

    Args:
        settings (Settings): the server's settings (limits, tie margin, ``retry_after_s``).
        callers (Mapping[str, DatasetCaller]): how to reach each dataset's replicas, by name.
        lost_errors (tuple[type[BaseException], ...], optional): exceptions that mean the
            replica serving a call was lost (Ray's actor errors); they become 503.
            (default: ``()``)
        call_timeout_s (float, optional): the longest wait for a replica's answer before 503.
            (default: ``30.0``)
        load_ttl_s (float, optional): a replica silent for this long is forgotten by the
            policy (it died or is idle with nothing queued). (default: ``10.0``)
        metrics (ServingMetrics, optional): where to record. (default: ``None``: fresh)
    """

    def __init__(
        self,
        settings: Settings,
        callers: Mapping[str, DatasetCaller],
        *,
        lost_errors: tuple[type[BaseException], ...] = (),
        call_timeout_s: float = 30.0,
        load_ttl_s: float = 10.0,
        metrics: ServingMetrics | None = None,
    ) -> None:
        super().__init__(
            VariantRegistry([]), settings, metrics=metrics, executor_factory=_no_executor
        )
        self.callers = dict(callers)
        self.lost_errors = lost_errors
        self.call_timeout_s = call_timeout_s
        self.load_ttl_s = load_ttl_s
        self._reports: dict[str, _Reported] = {}  # by replica id
        self.lost_calls = 0
        # The per-batch families are recorded in the replicas: shown per replica instead.
        for family in (
            self.metrics.batches,
            self.metrics.batch_nodes,
            self.metrics.batch_errors,
            self.metrics.batch_predicted,
            self.metrics.batch_measured,
        ):
            self.metrics.registry.unregister(family)
        self.metrics.registry.register(_ReplicaMetrics(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({sorted(self.callers)}, replicas={len(self._reports)})"

    async def start(self) -> None:
        """Asks one replica of every dataset for its description; serves once all answered."""
        if self.started:
            return
        descriptions = await asyncio.gather(*(c.describe() for c in self.callers.values()))
        datasets = [served_from(d) for d in descriptions]
        notes = [n for d in descriptions for n in d.notes]
        self.registry = VariantRegistry(datasets, notes, device="cpu")
        self.generation = 1
        self.metrics.generation.set(self.generation)
        self.started = True
        _log.info("ingress started: %s", ", ".join(self.registry.datasets))

    async def stop(self) -> None:
        """Refuses new requests; those in flight finish in their replicas."""
        self.stopping = True

    async def reload(self, registry: VariantRegistry) -> int:
        """Refused: the replicas reload by a redeploy (``serve deploy``)."""
        raise ConfigError(
            "on Ray Serve the variants are reloaded by redeploying the application "
            "(`serve deploy` with the config from `gnnaas ray-config`), which replaces "
            "replicas one by one"
        )

    # -- load reported by the replicas -----------------------------------------------------------

    def observe(self, dataset: str, load: ReplicaLoad) -> None:
        """Keeps ``load`` as its replica's latest (its metrics and drift when it has them)."""
        entry = self._reports.get(load.replica)
        now = time.monotonic()
        if entry is None:
            entry = self._reports[load.replica] = _Reported(dataset, load, now)
        entry.load, entry.at = load, now
        if load.metrics_text is not None:
            entry.metrics_text = load.metrics_text
        if load.drift is not None:
            entry.drift = load.drift

    def fresh_reports(self, dataset: str | None = None) -> list[_Reported]:
        """The replicas heard from within ``load_ttl_s`` (of ``dataset``, or all)."""
        now = time.monotonic()
        stale = [r for r, e in self._reports.items() if now - e.at > self.load_ttl_s]
        for replica in stale:
            del self._reports[replica]
        return [e for e in self._reports.values() if dataset is None or e.dataset == dataset]

    def replicas(self, dataset: str) -> dict[str, int]:
        """``{replica id: pid}`` of the replicas of ``dataset`` heard from recently."""
        return {e.load.replica: e.load.pid for e in self.fresh_reports(dataset)}

    def _least_loaded(self, dataset: str) -> tuple[_Reported, float] | None:
        """The fresh report promising the earliest start, and its ``ahead_ms`` aged to now."""
        now = time.monotonic()
        best: tuple[float, int] | None = None
        chosen: tuple[_Reported, float] | None = None
        for entry in self.fresh_reports(dataset):
            snap = entry.load.snapshot
            ahead = max(snap.ahead_ms - (now - entry.at) * 1e3, 0.0)
            key = (ahead, snap.waiting_nodes + snap.running_nodes)
            if best is None or key < best:
                best, chosen = key, (entry, ahead)
        return chosen

    def load_snapshot(
        self, dataset: ServedDataset, variant_ids: Iterable[str] | None = None
    ) -> LoadSnapshot:
        """The least loaded replica's latest snapshot of ``dataset`` (idle when none reported).

        Args:
            dataset (ServedDataset): the dataset.
            variant_ids (Iterable[str], optional): keep only these variants' loads.
                (default: ``None``: all)
        """
        current = self._last.get(dataset.name)
        best = self._least_loaded(dataset.name)
        if best is None:
            return LoadSnapshot(max_batch_nodes=self.settings.max_batch_nodes, current=current)
        entry, ahead = best
        snap = entry.load.snapshot
        loads = dict(snap.variants)
        if variant_ids is not None:
            keep = set(variant_ids)
            loads = {v: load for v, load in loads.items() if v in keep}
        return dataclasses.replace(snap, ahead_ms=ahead, variants=loads, current=current)

    def _busy_with_room(self, dataset: ServedDataset, variant_id: str, num_nodes: int) -> bool:
        best = self._least_loaded(dataset.name)
        if best is None:
            return False
        entry = best[0]
        load = entry.load.snapshot.load(variant_id)
        running = any(d.variant == variant_id and d.in_flight_nodes > 0 for d in entry.load.depths)
        return (running or load.queued_nodes > 0) and load.room_nodes >= num_nodes

    def queue_depths(self) -> Iterator[QueueDepth]:
        """Queued and running nodes per variant, summed over the replicas' latest reports."""
        totals: dict[tuple[str, str], list[int]] = {}
        for entry in self.fresh_reports():
            for d in entry.load.depths:
                t = totals.setdefault((d.dataset, d.variant), [0, 0])
                t[0] += d.queued_nodes
                t[1] += d.in_flight_nodes
        for ds in self.registry.datasets.values():  # every variant shows, reported or not
            for v in ds.variants:
                queued, running = totals.get((ds.name, v), (0, 0))
                yield QueueDepth(ds.name, v, queued, running)

    def lane(self, dataset: str, variant_id: str) -> Any:
        """The variant's latest drift, as the most recent replica report has it.

        Raises:
            KeyError: unknown dataset or variant.
        """
        served = self.registry.datasets[dataset]
        if variant_id not in served.variants:
            raise KeyError((dataset, variant_id))
        summary = None
        latest = -float("inf")
        for entry in self.fresh_reports(dataset):
            if entry.drift is not None and variant_id in entry.drift and entry.at > latest:
                summary, latest = entry.drift[variant_id], entry.at
        return _ReportedLane(summary)

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
    ) -> Prediction:
        """Chooses the variant here and has one of the dataset's replicas serve it.

        Raises:
            NotFoundError: unknown pinned variant.
            OverloadedError: the replica's queue is full, the replica was lost while serving
                the request, or it did not answer within ``call_timeout_s``.
        """
        variant, selection = self.select(
            dataset, len(nodes), tolerance=tolerance, slo_ms=slo_ms, pinned=pinned
        )
        ids = nodes.tolist() if isinstance(nodes, Tensor) else list(nodes)
        caller = self.callers[dataset.name]
        retry = self.settings.retry_after_s
        try:
            async with asyncio.timeout(self.call_timeout_s):
                out = await caller.predict(variant.variant_id, ids, output)
        except TimeoutError:
            self.lost_calls += 1
            raise OverloadedError(
                f"no replica of dataset {dataset.name!r} answered within "
                f"{self.call_timeout_s:g} s; retry",
                retry,
            ) from None
        except self.lost_errors as exc:
            self.lost_calls += 1
            _log.warning("replica of %s lost while serving a request: %r", dataset.name, exc)
            raise OverloadedError(
                f"the replica serving dataset {dataset.name!r} was lost while answering; "
                "it is being restarted, retry",
                retry,
            ) from None
        self.observe(dataset.name, out.load)
        if isinstance(out, ReplicaRefusal):
            raise OverloadedError(out.detail, out.retry_after_s)
        return Prediction(
            variant=variant,
            predictions=out.predictions,
            queue_ms=out.queue_ms,
            sample_ms=out.sample_ms,
            gather_ms=out.gather_ms,
            compute_ms=out.compute_ms,
            batch_size=out.batch_size,
            batch_requests=out.batch_requests,
            selection=selection,
        )
