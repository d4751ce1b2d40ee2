"""The serving core without HTTP: measured load, draining, settings."""

from __future__ import annotations

import asyncio

import pytest
import torch
from pydantic import ValidationError
from serving_fakes import FakeModel, held

from gnnaas.errors import OverloadedError
from gnnaas.serving import NotFoundError, Router, Settings, VariantRegistry


@pytest.fixture
async def router(toy: tuple[VariantRegistry, dict[str, FakeModel]]) -> Router:
    core = Router(toy[0], Settings(warmup=False, max_batch_nodes=4))
    await core.start()
    yield core  # type: ignore[misc]
    await core.stop()


async def _until(cond: object) -> None:
    for _ in range(5000):
        if cond():  # type: ignore[operator]
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition not reached in time")


async def test_load_snapshot_is_measured_from_the_queues(
    router: Router, toy: tuple[VariantRegistry, dict[str, FakeModel]]
) -> None:
    ds = router.registry.get("TOY")  # names are case-insensitive
    assert ds is not None
    assert router.load_snapshot(ds) == dict.fromkeys(ds.variants, 0.0)
    lane = router.lane("toy", "sage-lasso-8x")
    model = toy[1]["sage-lasso-8x"]
    scales: list[float] = []
    update = lane.batcher._on_batch
    assert update is not None

    def record(stats: object) -> None:
        update(stats)  # type: ignore[arg-type]
        scales.append(lane.scale)

    lane.batcher._on_batch = record
    with held(model) as gate:
        running = asyncio.ensure_future(
            router.predict(ds, torch.tensor([0]), pinned="sage-lasso-8x")
        )
        await _until(model.entered.is_set)
        queued = [
            asyncio.ensure_future(router.predict(ds, torch.arange(3), pinned="sage-lasso-8x"))
            for _ in range(3)
        ]
        await _until(lambda: lane.batcher.queued_nodes == 9)
        # 9 queued nodes = 2 full batches of 4 + 1 node, from the profiled curve
        # {1: 1.0, 32: 2.0} ms, plus what is left of the running batch (at most 1 ms).
        wait = router.load_snapshot(ds)["sage-lasso-8x"]
        per4, per1 = 1.0 + 3 / 31, 1.0
        assert 2 * per4 + per1 <= wait <= 2 * per4 + per1 + 1.0
        sel = router.select(ds, 1, tolerance=50)[1]
        assert sel is not None and sel.variant_id == "sage-lasso-2x"
        await asyncio.sleep(0.01)  # the held batch takes >= 10x its profiled 1 ms
        gate.set()
        await asyncio.gather(running, *queued)
    assert router.load_snapshot(ds)["sage-lasso-8x"] == 0.0
    # The held batch was far slower than profiled: the measured factor went up after it
    # (the unheld batches that follow may pull it back down).
    assert len(scales) == 4 and scales[0] > 1.0


async def test_stop_drains_in_flight_requests(
    toy: tuple[VariantRegistry, dict[str, FakeModel]],
) -> None:
    core = Router(toy[0], Settings(warmup=False))
    await core.start()
    ds = core.registry.datasets["toy"]
    model = toy[1]["sage-full-1x"]
    with held(model) as gate:
        pending = [asyncio.ensure_future(core.predict(ds, torch.tensor([0])))]
        await _until(model.entered.is_set)
        pending += [asyncio.ensure_future(core.predict(ds, torch.tensor([i]))) for i in (1, 2)]
        await _until(lambda: core.lane("toy", "sage-full-1x").batcher.queued_requests == 2)
        stopping = asyncio.ensure_future(core.stop())
        await asyncio.sleep(0.01)
        assert not stopping.done()
        with pytest.raises(OverloadedError, match="shutting down"):
            await core.predict(ds, torch.tensor([1]))
        gate.set()
        await stopping
    results = [p.result() for p in pending]
    assert [(len(r.predictions), r.batch_requests) for r in results] == [(1, 1), (1, 2), (1, 2)]


async def test_unknown_pinned_variant(router: Router) -> None:
    ds = router.registry.datasets["toy"]
    with pytest.raises(NotFoundError, match="unknown variant 'x' for dataset 'toy'"):
        await router.predict(ds, torch.tensor([1]), pinned="x")


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GNNAAS_MAX_WAIT_MS", "2.5")
    monkeypatch.setenv("GNNAAS_DATASETS", '["Cora"]')
    monkeypatch.setenv("GNNAAS_DATA", "/data")
    s = Settings(variants_dir="v")
    assert (s.max_wait_ms, s.datasets, str(s.data_root), str(s.variants_dir)) == (
        2.5,
        ["Cora"],
        "/data",
        "v",
    )
    assert str(Settings(data_root="/other").data_root) == "/other"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_request_nodes": 10, "max_queue_nodes": 5}, "must not exceed max_queue_nodes"),
        ({"max_batch_nodes": 0}, "max_batch_nodes"),
        ({"datasets": []}, "at least one dataset"),
        ({"sampling": "random"}, "sampling"),
        ({"max_wiat_ms": 1}, "max_wiat_ms"),
    ],
)
def test_settings_are_checked(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        Settings(**kwargs)  # type: ignore[arg-type]
