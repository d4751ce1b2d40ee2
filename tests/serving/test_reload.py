"""Reload without downtime: the admin endpoint, its token, failures, load and SIGHUP."""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from serving_fakes import (
    TINY_VARIANTS,
    TOY_VARIANTS,
    FakeModel,
    held,
    make_toy_registry,
    next_turn,
    tiny_store,
    write_tiny_repository,
)

import gnnaas.data
from gnnaas.errors import ArtifactError, ConfigError
from gnnaas.serving import Settings, VariantRegistry, create_app
from gnnaas.serving.http.routes.admin import DISABLED_DETAIL

TOKEN = "s3cret-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
RELOAD = "/v1/admin/reload"
URL = "/v1/datasets/toy/predict"
SETTINGS = dict(max_request_nodes=64, max_queue_nodes=4096, max_wait_ms=0.0)
# A variant the toy repository gains between reloads: (kept features, accuracy, service curve).
NEW = (2, 88.0, {1: 1.5, 32: 3.0, 256: 9.0, 1024: 27.0})


class ToySource:
    """What the toy server's folders hold: a loader that a test edits between reloads."""

    def __init__(self) -> None:
        self.variants = dict(TOY_VARIANTS)
        self.error: Exception | None = None
        self.failing: str | None = None  # a variant whose forward raises
        self.models: dict[str, FakeModel] = {}
        self.loads = 0

    def __call__(self) -> VariantRegistry:
        self.loads += 1
        if self.error is not None:
            raise self.error
        registry, self.models = make_toy_registry(self.variants)
        if self.failing is not None:
            self.models[self.failing].fail = "boom"
        return registry


def _toy_app(source: ToySource, **settings: Any) -> tuple[FastAPI, dict[str, FakeModel]]:
    registry, models = make_toy_registry()
    merged = {**SETTINGS, "admin_token": TOKEN, **settings}
    return create_app(Settings(**merged), registry=registry, loader=source), models


@asynccontextmanager
async def _serving(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """The app started (lifespan) and a client calling it in-process."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gnnaas") as client:
            yield client


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


# -- the token ---------------------------------------------------------------------------------


def test_admin_is_off_without_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GNNAAS_ADMIN_TOKEN", raising=False)
    source = ToySource()
    app, _ = _toy_app(source, admin_token=None)
    with TestClient(app) as client:
        for headers in ({}, AUTH):
            response = client.post(RELOAD, headers=headers)
            assert response.status_code == 403
            assert response.json() == {"detail": DISABLED_DETAIL}
    assert source.loads == 0


@pytest.mark.parametrize(
    ("headers", "detail"),
    [
        ({}, "missing admin token"),
        ({"Authorization": "Bearer wrong"}, "wrong admin token"),
        ({"Authorization": f"Bearer {TOKEN}x"}, "wrong admin token"),
        ({"Authorization": f"Basic {TOKEN}"}, "missing admin token"),
        ({"Authorization": "Bearer "}, "missing admin token"),
    ],
)
def test_missing_or_wrong_token_is_401(headers: dict[str, str], detail: str) -> None:
    source = ToySource()
    app, _ = _toy_app(source)
    with TestClient(app) as client:
        response = client.post(RELOAD, headers=headers)
        assert response.status_code == 401
        assert response.headers["WWW-Authenticate"] == "Bearer"
        assert response.json()["detail"].startswith(detail)
        assert source.loads == 0 and app.state.router.generation == 1


def test_token_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GNNAAS_ADMIN_TOKEN", TOKEN)
    registry, _ = make_toy_registry()
    app = create_app(Settings(), registry=registry, loader=ToySource())
    with TestClient(app) as client:
        response = client.post(RELOAD, headers=AUTH)
        assert response.status_code == 200, response.text
        assert response.json()["generation"] == 2
    monkeypatch.setenv("GNNAAS_ADMIN_TOKEN", "")
    assert Settings().admin_token is None  # empty means unset


def test_openapi_documents_the_reload() -> None:
    app, _ = _toy_app(ToySource())
    spec = app.openapi()
    responses = spec["paths"][RELOAD]["post"]["responses"]
    assert {"200", "401", "403", "409", "500", "503"} <= set(responses)
    assert "AdminToken" in spec["components"]["securitySchemes"]
    assert "requestBody" not in spec["paths"][RELOAD]["post"]  # it takes no file or URL


# -- what a reload changes -----------------------------------------------------------------------


async def test_reload_makes_a_new_variant_routable() -> None:
    source = ToySource()
    app, _ = _toy_app(source)
    async with _serving(app) as client:
        pinned = {"X-Variant": "sage-greedy-4x"}
        before = await client.post(URL, json={"nodes": [1, 2]}, headers=pinned)
        assert before.status_code == 404

        source.variants["sage-greedy-4x"] = NEW
        source.variants["sage-lasso-2x"] = (4, 87.5, TOY_VARIANTS["sage-lasso-2x"][2])
        del source.variants["gin-random-8x"]
        response = await client.post(RELOAD, headers=AUTH)
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["generation"] == 2 and body["datasets"] == ["toy"] and body["variants"] == 4
        assert body["datasets_added"] == [] and body["datasets_removed"] == []
        assert (body["variants_added"], body["variants_removed"]) == (1, 1)
        assert body["variants_reprofiled"] == 1
        assert body["changes"] == {
            "added": ["toy/sage-greedy-4x"],
            "removed": ["toy/gin-random-8x"],
            "reprofiled": ["toy/sage-lasso-2x"],
        }
        assert body["duration_ms"] >= 0

        after = await client.post(URL, json={"nodes": [1, 2]}, headers=pinned)
        assert after.status_code == 200, after.text
        assert after.headers["X-Variant"] == "sage-greedy-4x"
        assert source.models["sage-greedy-4x"].calls >= 2  # warm-up + this request
        listed = (await client.get("/v1/datasets/toy/variants")).json()["variants"]
        ids = {v["id"]: v for v in listed}
        assert set(ids) == {"sage-full-1x", "sage-lasso-2x", "sage-lasso-8x", "sage-greedy-4x"}
        assert ids["sage-greedy-4x"]["routable"] and ids["sage-lasso-2x"]["accuracy"] == 87.5
        gone = await client.post(URL, json={"nodes": [1]}, headers={"X-Variant": "gin-random-8x"})
        assert gone.status_code == 404
        # The policy routes to it too: within 3 points it is the fastest variant.
        chosen = await client.post(URL, json={"nodes": [1]}, headers={"X-Accuracy-Tolerance": "3"})
        assert chosen.headers["X-Variant"] == "sage-greedy-4x"

        metrics = (await client.get("/metrics")).text
        assert _metric(metrics, "gnnaas_registry_generation") == 2
        assert _metric(metrics, 'gnnaas_reloads_total{outcome="ok"}') == 1
        assert _metric(metrics, 'gnnaas_reloads_total{outcome="failed"}') == 0
        assert 'variant="gin-random-8x"' not in metrics.split("gnnaas_batch_time_samples")[-1]
        assert (await client.get("/readyz")).status_code == 200


async def test_reload_releases_the_previous_set() -> None:
    source = ToySource()
    app, models = _toy_app(source)
    old = [weakref.ref(m) for m in models.values()]
    del models
    async with _serving(app) as client:  # the lifespan freezes the first generation (gc)
        assert (await client.post(URL, json={"nodes": [0]})).status_code == 200
        assert (await client.post(RELOAD, headers=AUTH)).status_code == 200
        assert [ref() for ref in old] == [None] * len(old)


async def test_failed_reload_keeps_the_previous_set() -> None:
    source = ToySource()
    app, old_models = _toy_app(source)
    async with _serving(app) as client:
        source.variants["sage-greedy-4x"] = NEW
        source.error = ArtifactError("variant toy/sage-greedy-4x: weights are corrupt")
        response = await client.post(RELOAD, headers=AUTH)
        assert response.status_code == 409
        detail = response.json()["detail"]
        assert detail == (
            "reload failed while loading variants, profiles and datasets; still serving "
            "generation 1: variant toy/sage-greedy-4x: weights are corrupt"
        )

        source.error = RuntimeError("secret internals")
        response = await client.post(RELOAD, headers=AUTH)
        assert response.status_code == 500
        detail = response.json()["detail"]
        request_id = response.headers["X-Request-Id"]
        assert detail == (
            "reload failed while loading variants, profiles and datasets (unexpected "
            f"RuntimeError); still serving generation 1; see server log (request id {request_id})"
        )
        assert "secret" not in detail

        served = await client.post(URL, json={"nodes": [0, 1]})
        assert served.status_code == 200 and served.headers["X-Variant"] == "sage-full-1x"
        assert old_models["sage-full-1x"].calls >= 2
        pinned = await client.post(
            URL, json={"nodes": [0]}, headers={"X-Variant": "sage-greedy-4x"}
        )
        assert pinned.status_code == 404
        assert app.state.router.generation == 1
        metrics = (await client.get("/metrics")).text
        assert _metric(metrics, 'gnnaas_reloads_total{outcome="failed"}') == 2
        assert _metric(metrics, "gnnaas_registry_generation") == 1


async def test_a_variant_that_fails_warm_up_fails_the_reload() -> None:
    source = ToySource()
    app, _ = _toy_app(source)
    async with _serving(app) as client:
        source.failing = "sage-lasso-8x"
        response = await client.post(RELOAD, headers=AUTH)
        assert response.status_code == 500
        assert response.json()["detail"].startswith(
            "reload failed while warming up variant toy/sage-lasso-8x (unexpected RuntimeError)"
        )
        ok = await client.post(URL, json={"nodes": [0]}, headers={"X-Variant": "sage-lasso-8x"})
        assert ok.status_code == 200


# -- no request fails ----------------------------------------------------------------------------


async def test_requests_queued_on_the_old_set_finish_on_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = ToySource()
    app, old_models = _toy_app(source, max_concurrent_batches=4)
    router = app.state.router
    swapped = asyncio.Event()
    go_live = router._go_live

    def spy(lanes: Any) -> None:  # the swap calls it, then drains the old lanes
        go_live(lanes)
        swapped.set()

    async with _serving(app) as client:
        monkeypatch.setattr(router, "_go_live", spy)
        pinned = {"X-Variant": "sage-full-1x"}
        old_lane = router.lane("toy", "sage-full-1x")
        with held(old_models["sage-full-1x"]) as gate:
            running = asyncio.ensure_future(client.post(URL, json={"nodes": [1]}, headers=pinned))
            assert await asyncio.to_thread(old_models["sage-full-1x"].entered.wait, 5)
            # Routed and queued in its first step (the router never awaits before queuing).
            queued = asyncio.ensure_future(
                router.predict(router.registry.get("toy"), [2], pinned="sage-full-1x")
            )
            await next_turn()
            assert old_lane.batcher.queued_requests == 1
            source.variants["sage-greedy-4x"] = NEW
            reload = asyncio.ensure_future(client.post(RELOAD, headers=AUTH))
            await swapped.wait()
            assert router.generation == 2 and router.lane("toy", "sage-full-1x") is not old_lane
            assert not (reload.done() or running.done() or queued.done())  # the old lane drains
            # New requests go to the new lanes meanwhile, the held model's variant included.
            fresh = await client.post(URL, json={"nodes": [3]}, headers=pinned)
            assert fresh.status_code == 200
            assert source.models["sage-full-1x"].calls == 2  # warm-up + the fresh request
            assert (await client.get("/readyz")).status_code == 200
            gate.set()
            first, second, done = await asyncio.gather(running, queued, reload)
        assert (first.status_code, done.status_code) == (200, 200)
        assert first.headers["X-Variant"] == "sage-full-1x"
        assert second.variant.variant_id == "sage-full-1x" and len(second.predictions) == 1
        assert old_models["sage-full-1x"].calls == 3  # warm-up + the two accepted before
        assert done.json()["generation"] == 2 and old_lane.batcher.closed


async def test_load_keeps_flowing_through_three_reloads() -> None:
    source = ToySource()
    app, _ = _toy_app(source, max_concurrent_batches=2)
    added = ["sage-greedy-2x", "sage-greedy-4x", "gin-greedy-8x"]
    statuses: list[int] = []
    during: list[int] = []  # requests answered while each reload ran
    progress = asyncio.Condition()
    stop = asyncio.Event()

    async def client_loop(client: httpx.AsyncClient, i: int) -> None:
        tolerance = ("0", "2", "50")[i % 3]
        while not stop.is_set():
            nodes = [(i * 7 + len(statuses)) % 100, i]
            response = await client.post(
                URL, json={"nodes": nodes}, headers={"X-Accuracy-Tolerance": tolerance}
            )
            async with progress:
                statuses.append(response.status_code)
                progress.notify_all()

    async def some_requests_answered(count: int) -> None:
        target = len(statuses) + count
        async with progress:
            await progress.wait_for(lambda: len(statuses) >= target)

    async with _serving(app) as client:
        workers = [asyncio.ensure_future(client_loop(client, i)) for i in range(12)]
        try:
            for step, variant_id in enumerate(added, start=2):
                await some_requests_answered(20)
                source.variants[variant_id] = (NEW[0], NEW[1] - step, NEW[2])
                answered = len(statuses)
                response = await client.post(RELOAD, headers=AUTH)
                during.append(len(statuses) - answered)
                assert response.status_code == 200, response.text
                assert response.json()["generation"] == step
                assert response.json()["changes"]["added"] == [f"toy/{variant_id}"]
            await some_requests_answered(20)
        finally:
            stop.set()
            await asyncio.gather(*workers)
        for variant_id in added:
            pinned = await client.post(URL, json={"nodes": [5]}, headers={"X-Variant": variant_id})
            assert pinned.status_code == 200 and pinned.headers["X-Variant"] == variant_id
    assert len(statuses) >= 80 and sum(during) > 0
    assert set(statuses) == {200}, f"non-200 answers during reloads: {sorted(set(statuses))}"


async def test_concurrent_reloads_run_one_after_the_other() -> None:
    source = ToySource()
    app, _ = _toy_app(source)
    async with _serving(app) as client:
        answers = await asyncio.gather(*(client.post(RELOAD, headers=AUTH) for _ in range(3)))
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert sorted(a.json()["generation"] for a in answers) == [2, 3, 4]
    assert source.loads == 3


async def test_concurrent_router_reloads_number_their_generations_one_by_one() -> None:
    # The router's own reload (not only the admin route's) runs one at a time.
    source = ToySource()
    app, _ = _toy_app(source)
    async with _serving(app):
        router = app.state.router
        numbers = await asyncio.gather(*(router.reload(source()) for _ in range(3)))
        assert sorted(numbers) == [2, 3, 4] and router.generation == 4


# -- SIGHUP --------------------------------------------------------------------------------------


async def test_sighup_handler_reloads_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gnnaas.serving.core.reload")
    source = ToySource()
    app, _ = _toy_app(source, admin_token=None)  # SIGHUP needs no token
    reloader = app.state.reloader
    async with _serving(app) as client:
        source.variants["sage-greedy-4x"] = NEW
        await reloader.on_signal()
        assert app.state.router.generation == 2
        assert "reload (SIGHUP) done: generation 2, 1 datasets, 5 variants (1 added" in caplog.text
        pinned = await client.post(
            URL, json={"nodes": [0]}, headers={"X-Variant": "sage-greedy-4x"}
        )
        assert pinned.status_code == 200

        source.error = ConfigError("nothing to serve (no dataset folders)")
        await reloader.on_signal()  # the failure is logged, not raised
        assert app.state.router.generation == 2
        assert (
            "reload (SIGHUP) failed while loading variants, profiles and datasets; still serving "
            "generation 2: nothing to serve" in caplog.text
        )
        assert (await client.get("/readyz")).status_code == 200


# -- from the folders on disk --------------------------------------------------------------------


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[Settings, Any]:
    """A tiny repository on disk and the settings serving it (``load_dataset`` faked)."""
    store = tiny_store()
    monkeypatch.setattr(
        gnnaas.data, "load_dataset", lambda name, *a, **k: store, raising=False
    )  # the data layer is tested elsewhere
    variants_dir, profiles_dir = write_tiny_repository(tmp_path, store)
    settings = Settings(
        variants_dir=variants_dir,
        profiles_dir=profiles_dir,
        device="cpu",
        admin_token=TOKEN,
        max_wait_ms=0.0,
    )
    return settings, store


def _overwrite(path: Path, corrupt: Callable[[bytes], bytes]) -> Callable[[], None]:
    """Replaces ``path``'s bytes with ``corrupt(bytes)``; returns what puts them back."""
    original = path.read_bytes()
    path.write_bytes(corrupt(original))
    return lambda: path.write_bytes(original)


def test_reload_from_disk_adds_and_refuses_corrupt_files(disk: tuple[Settings, Any]) -> None:
    settings, store = disk
    variants_dir, profiles_dir = settings.variants_dir, settings.profiles_dir
    url = f"/v1/datasets/{store.name}/predict"
    with TestClient(create_app(settings)) as client:
        assert client.post(url, json={"nodes": [0, 1]}).status_code == 200

        write_tiny_repository(
            variants_dir.parent,
            store,
            {**TINY_VARIANTS, "sage-greedy-2x": (2, 75.0, (3, 6, 20, 70))},
        )
        response = client.post(RELOAD, headers=AUTH)
        assert response.status_code == 200, response.text
        assert response.json()["changes"] == {
            "added": ["tiny/sage-greedy-2x"],
            "removed": [],
            "reprofiled": [],
        }
        pinned = {"X-Variant": "sage-greedy-2x"}
        assert client.post(url, json={"nodes": [3]}, headers=pinned).status_code == 200

        variant = variants_dir / store.name / "sage-random-4x"
        cases: list[tuple[Path, Callable[[bytes], bytes], str]] = [
            (  # one flipped bit: the checksum no longer matches
                variant / "weights.safetensors",
                lambda data: data[:-1] + bytes([data[-1] ^ 1]),
                "variant tiny/sage-random-4x: ",
            ),
            (variant / "manifest.json", lambda _: b"{not json", "variant tiny/sage-random-4x: "),
            (
                profiles_dir / store.name / "profiles.csv",
                lambda _: b"variant,split\nsage-full-1x\n",
                f"dataset tiny: {profiles_dir / store.name / 'profiles.csv'}",
            ),
        ]
        for path, corrupt, cause in cases:
            restore = _overwrite(path, corrupt)
            response = client.post(RELOAD, headers=AUTH)
            assert response.status_code == 409, (path, response.text)
            detail = response.json()["detail"]
            assert detail.startswith("reload failed while loading variants, profiles and datasets")
            assert "still serving generation 2" in detail and cause in detail, detail
            # The previous set still serves, the variant with the broken file included.
            for variant_id in ("sage-full-1x", "sage-random-4x", "sage-greedy-2x"):
                answer = client.post(url, json={"nodes": [4]}, headers={"X-Variant": variant_id})
                assert answer.status_code == 200, answer.text
            restore()

        response = client.post(RELOAD, headers=AUTH)
        assert response.status_code == 200 and response.json()["generation"] == 3
        metrics = client.get("/metrics").text
        assert _metric(metrics, 'gnnaas_reloads_total{outcome="failed"}') == 3


def test_start_up_notes_a_variant_whose_manifest_is_unreadable(disk: tuple[Settings, Any]) -> None:
    settings, store = disk
    (settings.variants_dir / store.name / "sage-random-4x" / "manifest.json").write_text("{")
    registry = VariantRegistry.load(settings)  # start-up: skipped with a note, not an error
    assert list(registry.datasets[store.name].variants) == ["sage-full-1x"]
    assert registry.notes[0].startswith("variant tiny/sage-random-4x skipped: ")
    with pytest.raises(ArtifactError, match="variant tiny/sage-random-4x: "):
        VariantRegistry.load(settings, strict=True)
