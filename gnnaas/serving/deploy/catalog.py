"""The catalog of a multi-application deployment: listing, readiness and metrics of every replica.

On Ray Serve (:mod:`gnnaas.serving.deploy.ray`) each dataset (or the whole set) is its own Serve
application, whose replicas each run the full app of :func:`~gnnaas.serving.http.app.create_app`;
a request reaches one replica and never the catalog. The catalog, a small application at the
deployment's root, answers what concerns the deployment as a whole, as one process would:

- ``GET /v1/datasets``: every dataset, as its replicas describe it;
- ``GET /readyz``: 200 once every dataset application has a replica that is ready, else 503 with
  the reasons; ``GET /healthz``: the catalog answers;
- ``GET /metrics``: every replica's metrics merged (:func:`merge_metrics`): counters and
  histograms summed over the replicas (those of replicas gone are kept, so counters never go
  back), the load gauges summed over live replicas, the registry generation their largest, the
  drift gauges one series per replica (a ``replica`` label);
- a path under ``/v1/datasets/<name>`` of a dataset no application serves: 404 with the detail one
  process gives; of a served dataset named in another case (Ray's routes are case-sensitive, the
  names are not): 308 to the same path with the served name; ``POST /v1/admin/reload``: the
  token checks, then 409 (redeploy instead).

**How it hears from the replicas** (:meth:`Catalog.poll`): each replica keeps one call open to the
catalog (a long poll). The call carries the replica's :class:`ReplicaReport` (its datasets, its
readiness, and the metrics it was last asked for) and returns after ``poll_s`` with ``"idle"``, or
at once with ``"metrics"`` when a scrape needs them. A scrape of ``/metrics`` therefore wakes
every replica, waits at most ``scrape_wait_s`` for their texts, and merges them: metrics cost
nothing between scrapes, and each scrape costs one render per replica and one merge here. A
replica that stops calling (killed) is forgotten after ``poll_s + grace_s``; its counters stay in
the totals. Every one of these times is on the catalog's :class:`~gnnaas.serving.core.clock.Clock`
(a :class:`~gnnaas.serving.core.clock.FakeClock` in tests).

This module is free of Ray: the Serve deployments that carry the calls are in
:mod:`gnnaas.serving.deploy.ray`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi_offline import FastAPIOffline
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

import gnnaas
from gnnaas.errors import OverloadedError
from gnnaas.serving.core.clock import MONOTONIC, Clock
from gnnaas.serving.core.metrics import CONTENT_TYPE, ServingMetrics
from gnnaas.serving.core.router import NotFoundError, Router
from gnnaas.serving.core.settings import Settings
from gnnaas.serving.http.requests import error_response
from gnnaas.serving.http.routes.admin import require_admin
from gnnaas.serving.http.routes.health import readiness
from gnnaas.serving.http.schemas import DatasetInfo, DatasetList, ErrorResponse, Health, Readiness

__all__ = [
    "REDEPLOY_DETAIL",
    "Catalog",
    "ReplicaReport",
    "create_catalog_app",
    "merge_metrics",
    "replica_report",
]

_log = logging.getLogger(__name__)

REDEPLOY_DETAIL = (
    "on Ray Serve the variants are reloaded by redeploying the applications (`serve deploy` "
    "with the config of `gnnaas ray-config`, or a restart of `gnnaas serve --backend ray`); "
    "Serve replaces the replicas one by one"
)
"""The 409 of ``POST /v1/admin/reload`` on Ray."""

# Gauges that are not summed over the replicas: the largest, or one series per replica.
_GAUGE_MODES = {
    "gnnaas_registry_generation": "max",
    "gnnaas_batch_time_rel_error": "each",
    "gnnaas_batch_time_samples": "each",
}


@dataclass(frozen=True)
class ReplicaReport:
    """What a replica tells the catalog with each poll.

    Args:
        replica (str): the replica's id (unique per replica start).
        pid (int): its process id.
        app (str): its Serve application.
        datasets (tuple[dict, ...]): its datasets as ``GET /v1/datasets`` lists them.
        readiness (dict): its ``/readyz`` body.
        metrics (bytes, optional): its Prometheus text, when the catalog asked for it.
            (default: ``None``)
        stopping (bool, optional): the replica is shutting down; forget it. (default: ``False``)
    """

    replica: str
    pid: int
    app: str
    datasets: tuple[dict[str, Any], ...] = ()
    readiness: dict[str, Any] = field(default_factory=dict)
    metrics: bytes | None = None
    stopping: bool = False


def replica_report(
    core: Router, *, replica: str, pid: int, app: str, metrics: bool, stopping: bool = False
) -> ReplicaReport:
    """The report of a replica serving ``core`` (its metrics rendered when ``metrics``)."""
    return ReplicaReport(
        replica=replica,
        pid=pid,
        app=app,
        datasets=tuple(
            DatasetInfo(**d.info()).model_dump() for d in core.registry.datasets.values()
        ),
        readiness=readiness(core).model_dump(),
        metrics=core.metrics.render() if metrics else None,
        stopping=stopping,
    )


# -- merging Prometheus texts --------------------------------------------------------------------


_Key = tuple[str, tuple[tuple[str, str], ...]]


@dataclass
class _Family:
    documentation: str
    kind: str
    samples: dict[_Key, tuple[dict[str, str], float]] = field(default_factory=dict)


class _Merged(Collector):
    def __init__(self, families: Mapping[str, _Family]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        for name, family in self._families.items():
            metric = Metric(name, family.documentation, family.kind)
            for (sample, _), (labels, value) in family.samples.items():
                metric.add_sample(sample, labels, value)
            yield metric


def _fold(families: dict[str, _Family], source: str, text: bytes, *, gauges: bool = True) -> None:
    """Adds ``text``'s samples into ``families`` (gauges too when ``gauges``)."""
    for parsed in text_string_to_metric_families(text.decode()):
        kind = parsed.type
        if (kind == "gauge" and not gauges) or parsed.name.endswith("_created"):
            continue  # a counter's creation time is a gauge of its own in the text format
        family = families.get(parsed.name)
        if family is None:
            family = families[parsed.name] = _Family(parsed.documentation, kind)
        mode = _GAUGE_MODES.get(parsed.name, "sum") if kind == "gauge" else "sum"
        for s in parsed.samples:
            if s.name.endswith("_created"):  # a per-process timestamp: no sum of them means a thing
                continue
            labels = dict(s.labels)
            if mode == "each":
                labels["replica"] = source
            key = (s.name, tuple(sorted(labels.items())))
            old = family.samples.get(key)
            if old is None:
                family.samples[key] = (labels, s.value)
            elif mode == "max":
                family.samples[key] = (old[0], max(old[1], s.value))
            else:
                family.samples[key] = (old[0], old[1] + s.value)


def merge_metrics(sources: Iterable[tuple[str, bytes]], *, gauges: bool = True) -> bytes:
    """One Prometheus text of several processes' texts.

    Counters, histograms and summaries are summed sample by sample (``*_created`` samples left
    out); gauges are summed, except ``gnnaas_registry_generation`` (the largest) and the drift
    gauges (one series per source, labelled ``replica``).

    Args:
        sources (Iterable[tuple[str, bytes]]): ``(source id, Prometheus text)`` pairs.
        gauges (bool, optional): keep the gauges; ``False`` keeps only what adds up over time
            (the totals of replicas gone). (default: ``True``)

    Returns:
        bytes: the merged text exposition.

    Example:
        >>> a = b"# TYPE n_total counter\\nn_total 2.0\\n"
        >>> b"n_total 5.0" in merge_metrics([("a", a), ("b", a.replace(b"2.0", b"3.0"))])
        True
    """
    families: dict[str, _Family] = {}
    for source, text in sources:
        _fold(families, source, text, gauges=gauges)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(families))
    return generate_latest(registry)


# -- the catalog ---------------------------------------------------------------------------------


@dataclass
class _Replica:
    report: ReplicaReport
    pending: int = 0  # polls of it waiting here
    expires: float = float("inf")  # forgotten after this unless it polls again
    asked: int = 0  # the scrape its metrics were last asked for
    answered: int = 0  # the scrape its latest metrics answer
    metrics: bytes | None = None

    def live(self, now: float) -> bool:
        return not self.report.stopping and (self.pending > 0 or now <= self.expires)


class Catalog:
    """What the replicas of a deployment's applications report, kept for the catalog's routes.

    Args:
        apps (Mapping[str, Sequence[str]]): each dataset application's name and its datasets,
            in the order ``/v1/datasets`` lists them.
        metrics (ServingMetrics, optional): the catalog's own (its refusals), merged into
            ``/metrics``. (default: ``None``: fresh)
        poll_s (float, optional): how long a replica's poll waits here before ``"idle"``.
            (default: ``20``)
        grace_s (float, optional): how long a replica has to poll again before it is forgotten.
            (default: ``5``)
        scrape_wait_s (float, optional): how long a scrape waits for the replicas' metrics
            (then it uses the latest they sent). (default: ``2``)
        clock (Clock, optional): what these times are on.
            (default: :data:`~gnnaas.serving.core.clock.MONOTONIC`)

    Raises:
        ValueError: no application, or a dataset in two of them.
    """

    def __init__(
        self,
        apps: Mapping[str, Sequence[str]],
        *,
        metrics: ServingMetrics | None = None,
        poll_s: float = 20.0,
        grace_s: float = 5.0,
        scrape_wait_s: float = 2.0,
        clock: Clock = MONOTONIC,
    ) -> None:
        self.apps = {app: list(names) for app, names in apps.items()}
        self.datasets = [name for names in self.apps.values() for name in names]
        if not self.datasets:
            raise ValueError("Catalog: apps must name at least one dataset")
        if len(set(self.datasets)) != len(self.datasets):
            raise ValueError(f"Catalog: a dataset is in two applications ({self.apps})")
        self.metrics = metrics or ServingMetrics()
        self.poll_s, self.grace_s, self.scrape_wait_s = poll_s, grace_s, scrape_wait_s
        self.clock = clock
        self._replicas: dict[str, _Replica] = {}
        self._retired = b""  # counters of replicas gone, summed
        self._stopped: set[str] = set()  # replicas that said they stop (ids are never reused)
        self._wanted = 0  # scrapes asked for so far
        self._scrape = asyncio.Event()  # set (and replaced) by each scrape
        self._arrived = asyncio.Condition()  # notified by each poll

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.datasets}, replicas={len(self._replicas)})"

    # -- the replicas' side ----------------------------------------------------------------------

    async def poll(self, report: ReplicaReport) -> str:
        """Keeps ``report`` and waits: ``"metrics"`` when a scrape needs the replica's metrics,
        ``"idle"`` after ``poll_s``, ``"stop"`` for a replica that says it is stopping."""
        if report.replica in self._stopped:  # a call that left before its final report
            return "stop"
        entry = self._replicas.get(report.replica)
        if entry is None:
            entry = self._replicas[report.replica] = _Replica(report)
            _log.info("replica %s of %s joined (pid %d)", report.replica, report.app, report.pid)
        entry.report = report
        if report.metrics is not None:
            entry.metrics, entry.answered = report.metrics, entry.asked
        async with self._arrived:
            self._arrived.notify_all()
        if report.stopping:
            self._stopped.add(report.replica)
            self._retire(report.replica)
            return "stop"
        if entry.asked < self._wanted:
            entry.asked = self._wanted
            entry.expires = self.clock.now() + self.grace_s
            return "metrics"
        scrape = self._scrape
        entry.pending += 1
        try:
            async with self.clock.timeout(self.poll_s):
                await scrape.wait()
        except TimeoutError:
            return "idle"
        finally:
            entry.pending -= 1
            entry.expires = self.clock.now() + self.grace_s
        entry.asked = self._wanted
        return "metrics"

    def _retire(self, replica: str) -> None:
        entry = self._replicas.pop(replica, None)
        if entry is None:
            return
        _log.info("replica %s of %s left", replica, entry.report.app)
        if entry.metrics is not None:
            self._retired = merge_metrics(
                [("retired", self._retired), (replica, entry.metrics)], gauges=False
            )

    def _live(self) -> list[_Replica]:
        now = self.clock.now()
        for replica in [r for r, e in self._replicas.items() if not e.live(now)]:
            self._retire(replica)
        return list(self._replicas.values())

    def replicas(self, app: str | None = None) -> dict[str, int]:
        """``{replica id: pid}`` of the live replicas (of ``app``, or all)."""
        return {
            e.report.replica: e.report.pid
            for e in self._live()
            if app is None or e.report.app == app
        }

    def reporting(self) -> dict[str, int]:
        """Live replicas per dataset application (those heard from)."""
        counts: dict[str, int] = {}
        for entry in self._live():
            counts[entry.report.app] = counts.get(entry.report.app, 0) + 1
        return counts

    # -- what the routes read --------------------------------------------------------------------

    def listing(self) -> list[dict[str, Any]]:
        """``GET /v1/datasets``: each dataset a live replica describes, in the apps' order."""
        latest: dict[str, dict[str, Any]] = {}
        for entry in self._live():
            for info in entry.report.datasets:
                latest[info["name"]] = info
        return [latest[name] for name in self.datasets if name in latest]

    def readiness(self) -> Readiness:
        """``/readyz``: ready when every application has a live replica that is ready."""
        live = self._live()
        reasons: list[str] = []
        not_routed: dict[str, str] = {}
        notes: list[str] = []
        for app, names in self.apps.items():
            mine = [e for e in live if e.report.app == app]
            for e in mine:
                not_routed.update(e.report.readiness.get("not_routed", {}))
                notes.extend(n for n in e.report.readiness.get("notes", ()) if n not in notes)
            if any(not e.report.readiness.get("reasons", ["?"]) for e in mine):
                continue
            what = ", ".join(names)
            if not mine:
                reasons.append(f"{what}: no replica is up yet (Ray Serve is starting them)")
            else:
                reasons.extend(f"{what}: {r}" for r in mine[0].report.readiness["reasons"])
        return Readiness(
            status="not ready" if reasons else "ready",
            reasons=reasons,
            datasets=list(self.datasets),
            not_routed=not_routed,
            notes=notes,
        )

    async def render_metrics(self) -> bytes:
        """Every replica's metrics merged, as fresh as they answer within ``scrape_wait_s``."""
        self._wanted += 1
        wanted = self._wanted
        self._scrape.set()
        self._scrape = asyncio.Event()
        deadline = self.clock.now() + self.scrape_wait_s
        async with self._arrived:
            while any(e.answered < wanted for e in self._live()):
                if self.clock.now() >= deadline:
                    break
                try:
                    async with self.clock.timeout_at(deadline):
                        await self._arrived.wait()
                except TimeoutError:
                    break
        sources = [("catalog", self.metrics.render()), ("retired", self._retired)]
        sources += [(e.report.replica, e.metrics) for e in self._live() if e.metrics is not None]
        return merge_metrics(sources)


# -- the catalog's HTTP app ----------------------------------------------------------------------


def _refusal(exc: Exception, metrics: ServingMetrics) -> Response:
    status, content, headers, reason = error_response(exc)
    metrics.rejected(reason)
    return Response(content, status_code=status, media_type="application/json", headers=headers)


def _served_as(dataset: str, served: Sequence[str]) -> str | None:
    """The served name ``dataset`` means, itself first: names are case-insensitive (as one
    process reads them), Ray Serve's route prefixes are not."""
    if dataset in served:
        return dataset
    folded = dataset.lower()
    return next((name for name in served if name.lower() == folded), None)


def _moved(request: Request, dataset: str, served: str) -> Response:
    """308 to the same request on the dataset's own route (the method and body kept): a client that
    follows redirects gets the answer one process would give for ``dataset``.

    The ``Location`` is the request's own path as the client sent it (its percent-encoding, any
    prefix before ``/v1/datasets``) with the first ``/v1/datasets/<dataset>`` segment renamed, and
    its query: a reference without scheme or host, which a proxy in front keeps valid."""
    raw = request.scope.get("raw_path") or request.url.path.encode()
    parts = raw.decode("latin-1").split("/")
    for i in range(len(parts) - 2):
        if parts[i : i + 2] == ["v1", "datasets"] and unquote(parts[i + 2]) == dataset:
            parts[i + 2] = quote(served, safe="@-._~")
            break
    query = request.url.query
    location = "/".join(parts) + (f"?{query}" if query else "")
    detail = f"dataset {dataset!r} is served as {served!r}: the request is repeated there"
    return JSONResponse({"detail": detail}, status_code=308, headers={"Location": location})


def _unrouted(catalog: Catalog, settings: Settings) -> APIRouter:
    """The paths under ``/v1/datasets/<name>`` that reach the catalog rather than a dataset's
    application: a dataset no application serves (404), one whose application is starting (503),
    one named in another case than its application's route (308)."""
    router = APIRouter()
    not_served: dict[int | str, dict[str, Any]] = {
        404: {"model": ErrorResponse, "description": "Unknown dataset."}
    }

    @router.api_route(
        "/v1/datasets/{dataset}",
        methods=["GET", "POST", "PUT", "DELETE"],
        include_in_schema=False,
        responses=not_served,
    )
    @router.api_route(
        "/v1/datasets/{dataset}/{rest:path}",
        methods=["GET", "POST", "PUT", "DELETE"],
        include_in_schema=False,
        responses=not_served,
    )
    async def not_routed(dataset: str, request: Request) -> Response:
        """A dataset no application serves (or one whose application is still starting, or one
        named in another case than its application's route)."""
        served = _served_as(dataset, catalog.datasets)
        if served is None:
            known = ", ".join(catalog.datasets)
            exc: Exception = NotFoundError(f"unknown dataset {dataset!r}; served datasets: {known}")
        elif served != dataset:
            return _moved(request, dataset, served)
        else:
            exc = OverloadedError(
                f"dataset {dataset!r} is starting; retry shortly", settings.retry_after_s
            )
        return _refusal(exc, catalog.metrics)

    return router


def create_catalog_app(settings: Settings, catalog: Catalog) -> FastAPI:
    """The catalog's app: the deployment's listing, health, readiness, metrics and admin.

    Args:
        settings (Settings): the server's settings (``GNNAAS_ADMIN_TOKEN`` for the admin route,
            ``retry_after_s``).
        catalog (Catalog): what the replicas report.

    Returns:
        FastAPI: the app.
    """
    app = FastAPIOffline(title="gnnaas", version=gnnaas.__version__)
    app.state.settings = settings
    app.state.metrics = catalog.metrics
    app.state.catalog = catalog

    @app.get("/healthz", response_model=Health, tags=["health"])
    async def healthz() -> Health:
        """Liveness: the catalog answers."""
        return Health()

    @app.get(
        "/readyz",
        response_model=Readiness,
        tags=["health"],
        responses={503: {"model": Readiness, "description": "Not ready; `reasons` says why."}},
    )
    async def readyz() -> JSONResponse:
        """Readiness: 200 once every dataset application has a ready replica, else 503."""
        body = catalog.readiness()
        return JSONResponse(body.model_dump(), status_code=503 if body.reasons else 200)

    @app.get("/metrics", response_class=Response, tags=["health"])
    async def metrics() -> Response:
        """Prometheus metrics of every replica, merged."""
        return Response(await catalog.render_metrics(), media_type=CONTENT_TYPE)

    @app.get("/v1/datasets", response_model=DatasetList, tags=["datasets"])
    async def list_datasets() -> DatasetList:
        """Lists the served datasets."""
        return DatasetList(datasets=[DatasetInfo(**d) for d in catalog.listing()])

    app.include_router(_unrouted(catalog, settings))

    admin = APIRouter(prefix="/v1/admin", tags=["admin"], dependencies=[Depends(require_admin)])

    @admin.post("/reload", responses={409: {"model": ErrorResponse}})
    async def reload(request: Request) -> JSONResponse:
        """Refused on Ray Serve: redeploy instead."""
        return JSONResponse({"detail": REDEPLOY_DETAIL}, status_code=409)

    app.include_router(admin)
    return app
