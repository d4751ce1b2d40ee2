"""The catalog of a multi-application deployment, without Ray: merged metrics, the replicas'
polls, readiness and listing, and its HTTP routes. Its poll, grace and scrape times run on a
:class:`FakeClock`: the tests advance it, and never sleep."""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gnnaas.serving import ServingMetrics, Settings
from gnnaas.serving.core.clock import FakeClock
from gnnaas.serving.core.drift import DriftRecord
from gnnaas.serving.deploy.catalog import (
    REDEPLOY_DETAIL,
    Catalog,
    ReplicaReport,
    create_catalog_app,
    merge_metrics,
)

APPS = {"gnnaas-toy": ["toy"], "gnnaas-ring": ["ring"]}


def _metrics(requests: int, generation: int = 1, drift: float | None = None) -> bytes:
    m = ServingMetrics()
    for _ in range(requests):
        m.served("toy", "v1", 2, queue_s=0, sample_s=0, gather_s=0, compute_s=0, total_s=0.001)
    m.rejected("bad_header")
    m.generation.set(generation)
    if drift is not None:
        record = DriftRecord()
        record.add(1, predicted_ms=1.0, measured_ms=1.0 + drift)
        m.track_drift("toy", "v1", record)
    return m.render()


def _value(text: str, series: str) -> list[float]:
    return [float(v) for v in re.findall(rf"^{re.escape(series)} (\S+)$", text, re.M)]


def test_merge_sums_counters_and_keeps_each_replicas_drift() -> None:
    text = merge_metrics(
        [("a", _metrics(3, drift=0.5)), ("b", _metrics(4, generation=2, drift=0.25))]
    ).decode()
    assert _value(text, 'gnnaas_requests_total{dataset="toy",variant="v1"}') == [7.0]
    assert _value(text, 'gnnaas_nodes_total{dataset="toy",variant="v1"}') == [14.0]
    assert _value(text, 'gnnaas_rejections_total{reason="bad_header"}') == [2.0]
    total = 'gnnaas_stage_seconds_count{dataset="toy",stage="total",variant="v1"}'
    assert _value(text, total) == [7.0]
    assert _value(text, "gnnaas_registry_generation") == [2.0]  # the largest, not a sum
    drift = re.findall(r"^gnnaas_batch_time_samples\{.*replica=\"(\w)\".*\} 1.0$", text, re.M)
    assert sorted(drift) == ["a", "b"]  # one series per replica
    assert "_created" not in text
    assert text.count("# TYPE gnnaas_requests_total counter") == 1


def test_merge_without_gauges_keeps_what_adds_up() -> None:
    text = merge_metrics([("a", _metrics(2))], gauges=False).decode()
    assert _value(text, 'gnnaas_requests_total{dataset="toy",variant="v1"}') == [2.0]
    assert "gnnaas_registry_generation" not in text and "gauge" not in text


def _report(replica: str, app: str, metrics: bytes | None = None, **kw: Any) -> ReplicaReport:
    dataset = APPS[app][0]
    info = {
        "name": dataset, "num_nodes": 10, "num_features": 2, "num_classes": 3,
        "multi_label": False, "variants": 1, "routable": 1,
    }  # fmt: skip
    readiness = {
        "status": "ready",
        "reasons": kw.pop("reasons", []),
        "datasets": [dataset],
        "not_routed": {f"{dataset}/v0": "no profile"},
        "notes": [],
    }
    return ReplicaReport(replica, 1, app, (info,), readiness, metrics, **kw)


class _Replica:
    """A replica's poll loop, as :class:`gnnaas.serving.deploy.ray_apps.DatasetApp` runs it."""

    def __init__(self, catalog: Catalog, replica: str, app: str, requests: int) -> None:
        self.catalog, self.replica, self.app, self.requests = catalog, replica, app, requests
        self.task = asyncio.create_task(self.run())

    async def run(self) -> None:
        metrics = None
        while True:
            command = await self.catalog.poll(_report(self.replica, self.app, metrics))
            metrics = _metrics(self.requests) if command == "metrics" else None

    async def kill(self) -> None:
        """Ends its poll loop (the call it had open ends with it)."""
        await _cancelled(self.task)


async def _cancelled(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _toy_requests(text: bytes) -> list[float]:
    return _value(text.decode(), 'gnnaas_requests_total{dataset="toy",variant="v1"}')


async def test_replicas_poll_and_a_scrape_wakes_them() -> None:
    clock = FakeClock()
    catalog = Catalog(APPS, poll_s=30.0, grace_s=0.5, scrape_wait_s=2.0, clock=clock)
    assert catalog.readiness().reasons == [
        "toy: no replica is up yet (Ray Serve is starting them)",
        "ring: no replica is up yet (Ray Serve is starting them)",
    ]
    replicas = [
        _Replica(catalog, "t1", "gnnaas-toy", 3),
        _Replica(catalog, "t2", "gnnaas-toy", 4),
    ]
    await clock.waiting(2)  # both replicas' polls wait here
    assert catalog.reporting() == {"gnnaas-toy": 2}
    assert [d["name"] for d in catalog.listing()] == ["toy"]
    assert catalog.readiness().reasons == [
        "ring: no replica is up yet (Ray Serve is starting them)"
    ]
    starting = asyncio.create_task(
        catalog.poll(_report("r1", "gnnaas-ring", reasons=["starting: loading"]))
    )
    await clock.waiting(3)
    assert catalog.readiness().reasons == ["ring: starting: loading"]
    await _cancelled(starting)
    replicas.append(_Replica(catalog, "r1", "gnnaas-ring", 0))  # ready now
    await clock.waiting(3)
    ready = catalog.readiness()
    assert (ready.status, ready.datasets) == ("ready", ["toy", "ring"])
    assert ready.not_routed == {"toy/v0": "no profile", "ring/v0": "no profile"}
    assert [d["name"] for d in catalog.listing()] == ["toy", "ring"]

    # Every replica answers the scrape: it needs no time on the clock.
    assert _toy_requests(await catalog.render_metrics()) == [7.0]
    assert clock.now() == 0.0

    await replicas[0].kill()  # t1 dies: forgotten once its grace is over, its counts kept
    clock.advance(0.5)
    assert catalog.replicas("gnnaas-toy") == {"t1": 1, "t2": 1}  # not yet
    clock.advance(0.25)
    assert catalog.replicas("gnnaas-toy") == {"t2": 1}
    assert _toy_requests(await catalog.render_metrics()) == [7.0]

    await replicas[1].kill()  # t2 stops: its final report carries its final counts
    assert await catalog.poll(_report("t2", "gnnaas-toy", _metrics(5), stopping=True)) == "stop"
    assert await catalog.poll(_report("t2", "gnnaas-toy", _metrics(4))) == "stop"  # late
    assert _toy_requests(await catalog.render_metrics()) == [8.0]
    assert catalog.readiness().reasons == ["toy: no replica is up yet (Ray Serve is starting them)"]
    await replicas[2].kill()


async def test_a_scrape_waits_scrape_wait_s_for_a_replica_that_does_not_answer() -> None:
    clock = FakeClock()
    catalog = Catalog(APPS, poll_s=30.0, grace_s=5.0, scrape_wait_s=2.0, clock=clock)
    replica = _Replica(catalog, "t1", "gnnaas-toy", 3)
    await clock.waiting()
    assert _toy_requests(await catalog.render_metrics()) == [3.0]  # it answered
    await replica.kill()  # alive for 5 s more, but it answers no longer
    scrape = asyncio.create_task(catalog.render_metrics())
    await clock.waiting()  # the scrape waits for it
    clock.advance(1.75)
    assert clock.pending == 1 and not scrape.done()  # its timeout has not fired
    clock.advance(0.25)
    assert _toy_requests(await scrape) == [3.0]  # its latest metrics
    assert catalog.replicas() == {"t1": 1}


async def test_an_idle_poll_returns_after_poll_s() -> None:
    clock = FakeClock()
    catalog = Catalog(APPS, poll_s=20.0, clock=clock)
    poll = asyncio.create_task(catalog.poll(_report("t1", "gnnaas-toy")))
    await clock.waiting()
    clock.advance(19.5)
    assert clock.pending == 1 and not poll.done()
    clock.advance(0.5)
    assert await poll == "idle"


@pytest.mark.parametrize("apps", [{}, {"a": ["x"], "b": ["x"]}])
def test_catalog_refuses_bad_apps(apps: dict[str, list[str]]) -> None:
    with pytest.raises(ValueError, match="Catalog: "):
        Catalog(apps)


async def _one_idle_poll(catalog: Catalog, clock: FakeClock, report: ReplicaReport) -> str:
    poll = asyncio.create_task(catalog.poll(report))
    await clock.waiting()
    clock.advance(catalog.poll_s)
    return await poll


def test_catalog_routes() -> None:
    clock = FakeClock()
    catalog = Catalog(APPS, poll_s=20.0, grace_s=5.0, clock=clock)
    settings = Settings(admin_token="secret", retry_after_s=3)
    with TestClient(create_catalog_app(settings, catalog)) as client:
        assert client.portal is not None
        poll = client.portal.call(_one_idle_poll, catalog, clock, _report("t1", "gnnaas-toy"))
        assert poll == "idle"  # on the app's loop; t1 is live for its grace
        assert client.get("/healthz").json() == {"status": "ok"}
        listing = client.get("/v1/datasets").json()["datasets"]
        assert [d["name"] for d in listing] == ["toy"]
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["reasons"][0].startswith("ring: ")
        nope = client.post("/v1/datasets/nope/predict", json={"nodes": [1]})
        assert (nope.status_code, nope.json()) == (
            404,
            {"detail": "unknown dataset 'nope'; served datasets: toy, ring"},
        )
        assert client.get("/v1/datasets/nope/variants").status_code == 404
        other_case = client.post(
            "/v1/datasets/TOY/predict?output=proba", json={"nodes": [1]}, follow_redirects=False
        )
        assert (other_case.status_code, other_case.json()) == (
            308,
            {"detail": "dataset 'TOY' is served as 'toy': the request is repeated there"},
        )
        assert other_case.headers["Location"] == "/v1/datasets/toy/predict?output=proba"
        moved = client.get("/v1/datasets/Ring/nodes/a%20b/v1/datasets/Ring", follow_redirects=False)
        assert moved.headers["Location"] == "/v1/datasets/ring/nodes/a%20b/v1/datasets/Ring"
        starting = client.post("/v1/datasets/ring/predict", json={"nodes": [1]})
        assert starting.status_code == 503 and starting.headers["Retry-After"] == "3"
        assert client.post("/v1/admin/reload").status_code == 401
        reload = client.post("/v1/admin/reload", headers={"Authorization": "Bearer secret"})
        assert (reload.status_code, reload.json()) == (409, {"detail": REDEPLOY_DETAIL})
        clock.advance(catalog.grace_s + 1.0)  # t1 is gone: the scrape waits for no one
        text = client.get("/metrics").text
        assert _value(text, 'gnnaas_rejections_total{reason="not_found"}') == [2.0]


def test_a_dataset_named_in_another_case_is_redirected_to_its_route() -> None:
    apps = {"gnnaas-synth": ["synth-x@0.2"], "gnnaas-upper": ["TOY"], "gnnaas-lower": ["toy"]}
    catalog = Catalog(apps, poll_s=20.0, grace_s=5.0, clock=FakeClock())
    app = create_catalog_app(Settings(retry_after_s=3), catalog)
    with TestClient(app, root_path="/base") as client:
        moved = client.post(
            "/base/v1/datasets/SYNTH-X%400.2/predict?a=1",
            json={"nodes": [1]},
            follow_redirects=False,
        )
        assert moved.status_code == 308
        assert moved.headers["Location"] == "/base/v1/datasets/synth-x@0.2/predict?a=1"
        # a name that is served as such is never sent to another case's application
        starting = client.post("/base/v1/datasets/TOY/predict", json={"nodes": [1]})
        assert starting.status_code == 503 and starting.headers["Retry-After"] == "3"
