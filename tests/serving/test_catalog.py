"""The catalog of a multi-application deployment, without Ray: merged metrics, the replicas'
polls, readiness and listing, and its HTTP routes."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gnnaas.serving import ServingMetrics, Settings
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


def test_replicas_poll_and_a_scrape_wakes_them() -> None:
    async def scenario() -> None:
        catalog = Catalog(APPS, poll_s=30.0, grace_s=0.3, scrape_wait_s=2.0)
        assert catalog.readiness().reasons == [
            "toy: no replica is up yet (Ray Serve is starting them)",
            "ring: no replica is up yet (Ray Serve is starting them)",
        ]
        replicas = [
            _Replica(catalog, "t1", "gnnaas-toy", 3),
            _Replica(catalog, "t2", "gnnaas-toy", 4),
        ]
        await asyncio.sleep(0.05)
        assert catalog.reporting() == {"gnnaas-toy": 2}
        assert [d["name"] for d in catalog.listing()] == ["toy"]
        assert catalog.readiness().reasons == [
            "ring: no replica is up yet (Ray Serve is starting them)"
        ]
        starting = asyncio.create_task(
            catalog.poll(_report("r1", "gnnaas-ring", reasons=["starting: loading"]))
        )
        await asyncio.sleep(0.01)
        assert catalog.readiness().reasons == ["ring: starting: loading"]
        starting.cancel()
        replicas.append(_Replica(catalog, "r1", "gnnaas-ring", 0))
        await asyncio.sleep(0.05)
        ready = catalog.readiness()
        assert (ready.status, ready.datasets) == ("ready", ["toy", "ring"])
        assert ready.not_routed == {"toy/v0": "no profile", "ring/v0": "no profile"}
        assert [d["name"] for d in catalog.listing()] == ["toy", "ring"]

        loop = asyncio.get_running_loop()
        started = loop.time()
        text = (await catalog.render_metrics()).decode()
        assert loop.time() - started < 1.0  # the replicas answered; no wait for the bound
        assert _value(text, 'gnnaas_requests_total{dataset="toy",variant="v1"}') == [7.0]

        replicas[0].task.cancel()  # t1 dies (its last poll stays open until woken)
        await asyncio.sleep(0)
        replicas[0].requests = 0
        text = (await catalog.render_metrics()).decode()  # t1 does not answer this one
        await asyncio.sleep(0.4)  # past the grace: t1 is forgotten, its counts kept
        assert catalog.replicas("gnnaas-toy") == {"t2": 1}
        text = (await catalog.render_metrics()).decode()
        assert _value(text, 'gnnaas_requests_total{dataset="toy",variant="v1"}') == [7.0]

        replicas[1].task.cancel()  # t2 stops: its final report carries its final counts
        await asyncio.sleep(0)
        assert await catalog.poll(_report("t2", "gnnaas-toy", _metrics(5), stopping=True)) == (
            "stop"
        )
        assert await catalog.poll(_report("t2", "gnnaas-toy", _metrics(4))) == "stop"  # late
        text = (await catalog.render_metrics()).decode()
        assert _value(text, 'gnnaas_requests_total{dataset="toy",variant="v1"}') == [8.0]
        assert catalog.readiness().reasons == [
            "toy: no replica is up yet (Ray Serve is starting them)"
        ]
        for r in replicas:
            r.task.cancel()

    asyncio.run(scenario())


def test_an_idle_poll_returns_after_poll_s() -> None:
    async def scenario() -> None:
        catalog = Catalog(APPS, poll_s=0.05)
        assert await catalog.poll(_report("t1", "gnnaas-toy")) == "idle"

    asyncio.run(scenario())


@pytest.mark.parametrize("apps", [{}, {"a": ["x"], "b": ["x"]}])
def test_catalog_refuses_bad_apps(apps: dict[str, list[str]]) -> None:
    with pytest.raises(ValueError, match="Catalog: "):
        Catalog(apps)


def test_catalog_routes() -> None:
    catalog = Catalog(APPS, poll_s=0.05, scrape_wait_s=0.1)
    settings = Settings(admin_token="secret", retry_after_s=3)
    with TestClient(create_catalog_app(settings, catalog)) as client:
        assert client.portal is not None
        client.portal.call(catalog.poll, _report("t1", "gnnaas-toy"))  # on the app's loop
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
        starting = client.post("/v1/datasets/ring/predict", json={"nodes": [1]})
        assert starting.status_code == 503 and starting.headers["Retry-After"] == "3"
        assert client.post("/v1/admin/reload").status_code == 401
        reload = client.post("/v1/admin/reload", headers={"Authorization": "Bearer secret"})
        assert (reload.status_code, reload.json()) == (409, {"detail": REDEPLOY_DETAIL})
        text = client.get("/metrics").text
        assert _value(text, 'gnnaas_rejections_total{reason="not_found"}') == [2.0]
