"""The serving core without HTTP: measured load, draining, settings.

Routers whose tests depend on time run on a :class:`FakeClock`: a batch is made slow by advancing
the clock while its model is held, never by sleeping."""

from __future__ import annotations

import asyncio
import math
from typing import Any, Literal

import pytest
import torch
from pydantic import ValidationError
from serving_fakes import FakeModel, held, make_toy_registry, next_turn

from gnnaas.errors import OverloadedError
from gnnaas.policy import DecisionTable, LoadSnapshot, RequestSpec, Selection, candidates_within
from gnnaas.serving import NotFoundError, Router, Settings, VariantRegistry
from gnnaas.serving.core.clock import FakeClock
from gnnaas.serving.core.router import STREAM_GAP_S


def select_variant(
    request: RequestSpec, cands: Any, snapshot: LoadSnapshot, *, tie_margin: float = 0.0
) -> Selection:
    """The decision of a fresh table on ``snapshot``: nothing memoized, no shortcut kept."""
    return DecisionTable(cands, tie_margin=tie_margin).decide(request, snapshot, now=0.0)


@pytest.fixture
async def router(toy: tuple[VariantRegistry, dict[str, FakeModel]]) -> Router:
    core = Router(toy[0], Settings(warmup=False, max_batch_nodes=4), clock=FakeClock())
    await core.start()
    yield core  # type: ignore[misc]
    await core.stop()


slow_id, other_id = "sage-lasso-8x", "sage-lasso-2x"


async def _entered(model: FakeModel) -> None:
    """Until ``model`` runs a batch (in its lane's worker thread)."""
    assert await asyncio.to_thread(model.entered.wait, 5)


async def _backlog(core: Router, ds: Any, model: FakeModel) -> list[asyncio.Future[Any]]:
    """One batch of the slow variant running (held in ``model``) and 4 × 50 nodes queued
    behind it."""
    running = asyncio.ensure_future(core.predict(ds, torch.tensor([0]), pinned=slow_id))
    await _entered(model)
    queued = [
        asyncio.ensure_future(core.predict(ds, torch.arange(50), pinned=slow_id)) for _ in range(4)
    ]
    await next_turn()  # each predict queues its request in its first step
    assert core.lane("toy", slow_id).batcher.queued_nodes == 200
    return [running, *queued]


async def test_load_snapshot_is_measured_from_the_queues(
    router: Router, toy: tuple[VariantRegistry, dict[str, FakeModel]]
) -> None:
    ds = router.registry.get("TOY")  # names are case-insensitive
    assert ds is not None
    idle = router.load_snapshot(ds)
    assert isinstance(idle, LoadSnapshot) and not idle.busy
    assert {v: load.wait_ms for v, load in idle.variants.items()} == dict.fromkeys(ds.variants, 0.0)
    lane = router.lane("toy", "sage-lasso-8x")
    model = toy[1]["sage-lasso-8x"]
    scales: list[float] = []
    update = lane.batcher._on_batch
    assert update is not None

    def record(stats: object) -> None:
        update(stats)  # type: ignore[arg-type]
        scales.append(lane.slowdown_at(1))

    lane.batcher._on_batch = record
    with held(model) as gate:
        running = asyncio.ensure_future(
            router.predict(ds, torch.tensor([0]), pinned="sage-lasso-8x")
        )
        await _entered(model)
        queued = [
            asyncio.ensure_future(router.predict(ds, torch.arange(3), pinned="sage-lasso-8x"))
            for _ in range(3)
        ]
        await next_turn()
        # 9 queued nodes = 2 full batches of 4 + 1 node, from the profiled curve
        # {1: 1.0, 32: 2.0} ms, plus what is left of the running batch: all of its 1 ms, as the
        # clock has not moved since it started.
        snap = router.load_snapshot(ds)
        assert (snap.waiting_nodes, snap.running_nodes, snap.max_batch_nodes) == (9, 1, 4)
        assert snap.load("sage-lasso-8x").queued_nodes == 9
        assert snap.load("sage-lasso-2x").queued_nodes == 0
        waits = {v: load.wait_ms for v, load in snap.variants.items()}
        per4, per1 = 1.0 + 3 / 31, 1.0
        assert waits["sage-lasso-8x"] == pytest.approx(2 * per4 + per1 + 1.0)
        # The device is shared: on the 2x variant the same 9 nodes would take its own time.
        per4_2x, per1_2x = 2.0 + 2 * 3 / 31, 2.0
        assert waits["sage-lasso-2x"] == pytest.approx(2 * per4_2x + per1_2x + 1.0)
        router.clock.advance(0.0005)  # half of the running batch's predicted 1 ms has passed
        assert router.load_snapshot(ds).load("sage-lasso-8x").wait_ms == pytest.approx(
            2 * per4 + per1 + 0.5
        )
        assert waits["gin-random-8x"] == 0.0  # unprofiled: never routed to
        # A new node joins the 8x backlog (2 x 4 + 2 nodes) rather than a 2x batch behind it.
        sel = router.select(ds, 1, tolerance=50)[1]
        assert sel is not None and sel.variant_id == "sage-lasso-8x"
        assert sel.predicted_ms == pytest.approx(2 * per4 + 1.0 + 1 / 31, abs=1.0)
        router.clock.advance(0.0095)  # the held batch takes 10x its profiled 1 ms
        gate.set()
        await asyncio.gather(running, *queued)
    assert router.load_snapshot(ds).load("sage-lasso-8x").wait_ms == 0.0
    # The held batch was far slower than profiled: the measured factor went up after it
    # (the unheld batches that follow may pull it back down).
    assert len(scales) == 4 and scales[0] > 1.0
    assert lane.slowdown_at(1) == router.slowdown.at(1)  # one measured speed per device


async def test_decisions_predict_at_the_device_speed_of_their_batch_size(router: Router) -> None:
    """Batches of 4 nodes measured 3x their curve and single nodes as profiled: an idle
    decision and one under load predict each at its own batch size's speed."""
    ds = router.registry.datasets["toy"]
    for _ in range(60):
        router.slowdown.observe(1.0, 1.0, 1)
        router.slowdown.observe(3.0, 1.0, 4)
    small, large = router.slowdown.at(1), router.slowdown.at(4)
    assert small == pytest.approx(1.0, rel=0.1) and large == pytest.approx(3.0, rel=0.1)
    for nodes, speed in ((1, small), (4, large), (9, large)):  # 9: batches of at most 4
        variant, sel = router.select(ds, nodes, tolerance=50)
        assert sel is not None and variant.profile is not None
        curve = variant.profile.service.predict_batched(nodes, 4)
        assert sel.predicted_ms == pytest.approx(speed * curve)
        snap = router.decision_load(ds, nodes)
        assert snap.slowdown == speed
        assert snap.completion_ms(variant.variant_id, variant.profile.service, nodes) == (
            pytest.approx(speed * curve)
        )


async def test_stop_drains_in_flight_requests(
    toy: tuple[VariantRegistry, dict[str, FakeModel]],
) -> None:
    clock = FakeClock()
    core = Router(toy[0], Settings(warmup=False), clock=clock)
    await core.start()
    ds = core.registry.datasets["toy"]
    model = toy[1]["sage-full-1x"]
    with held(model) as gate:
        pending = [asyncio.ensure_future(core.predict(ds, torch.tensor([0])))]
        await _entered(model)
        pending += [asyncio.ensure_future(core.predict(ds, torch.tensor([i]))) for i in (1, 2)]
        await next_turn()
        assert core.lane("toy", "sage-full-1x").batcher.queued_requests == 2
        stopping = asyncio.ensure_future(core.stop())
        await clock.waiting()  # the batchers are closed and wait (on the clock) for the drain
        assert not stopping.done()
        with pytest.raises(OverloadedError, match="shutting down"):
            await core.predict(ds, torch.tensor([1]))
        gate.set()
        await stopping
    results = [p.result() for p in pending]
    assert [(len(r.predictions), r.batch_requests) for r in results] == [(1, 1), (1, 2), (1, 2)]


async def test_one_batch_at_a_time_on_the_device(
    toy: tuple[VariantRegistry, dict[str, FakeModel]], monkeypatch: pytest.MonkeyPatch
) -> None:
    core = Router(toy[0], Settings(warmup=False))  # max_concurrent_batches=1
    await core.start()
    ds = core.registry.datasets["toy"]
    slow, other = toy[1]["sage-lasso-8x"], toy[1]["sage-lasso-2x"]
    device, contended = core._gate, asyncio.Event()
    assert device is not None
    acquire = device.acquire

    async def watched() -> Literal[True]:  # tells when a batch waits for the device
        if device.locked():
            contended.set()
        return await acquire()

    monkeypatch.setattr(device, "acquire", watched)
    try:
        with held(slow) as gate:
            first = asyncio.ensure_future(core.predict(ds, torch.tensor([0]), pinned=slow_id))
            await _entered(slow)
            calls = other.calls
            second = asyncio.ensure_future(core.predict(ds, torch.tensor([1]), pinned=other_id))
            await asyncio.wait_for(contended.wait(), 10)  # its batch waits for the device
            assert other.calls == calls and not second.done()
            # Nodes arriving meanwhile merge into the waiting batch.
            third = asyncio.ensure_future(core.predict(ds, torch.tensor([2]), pinned=other_id))
            await next_turn()
            assert core.lane("toy", other_id).batcher.queued_nodes == 2
            gate.set()
            results = await asyncio.gather(first, second, third)
        assert [r.batch_requests for r in results] == [1, 2, 2]
        assert other.calls == calls + 1
    finally:
        await core.stop()


async def test_backlog_moves_traffic_to_a_faster_variant(
    toy: tuple[VariantRegistry, dict[str, FakeModel]],
) -> None:
    # Within 4.5 points: 1x (90 %, 3 ms for one node) and 2x (89 %, 2 ms). Idle, 3 ms is within
    # the 50 % tie band of 2 ms, so the more accurate 1x wins, unless a stream is on 2x.
    core = Router(toy[0], Settings(warmup=False, tie_margin=0.5))
    await core.start()
    ds = core.registry.datasets["toy"]
    blocker = toy[1][slow_id]
    try:
        assert core.select(ds, 1, tolerance=4.5)[0].variant_id == "sage-full-1x"
        with held(blocker) as gate:
            backlog = await _backlog(core, ds, blocker)
            # 200 waiting nodes: 1x would serve them and the new one in 16.6 ms, 2x in 10.0 ms.
            core.slowdown.reset(1.0)
            assert core.select(ds, 1, tolerance=4.5)[0].variant_id == "sage-lasso-2x"
            gate.set()
            await asyncio.gather(*backlog)
        core.slowdown.reset(1.0)
        # Idle again: while the stream goes on, it stays on 2x (a near-tie for one node); once
        # it is over (nothing routed for STREAM_GAP_S), the more accurate 1x wins again.
        now = core.clock.now()
        assert core.select(ds, 1, tolerance=4.5, now=now)[0].variant_id == "sage-lasso-2x"
        later = now + STREAM_GAP_S + 0.01
        assert core.select(ds, 1, tolerance=4.5, now=later)[0].variant_id == "sage-full-1x"
    finally:
        await core.stop()


async def test_slo_alone_admits_every_variant(router: Router) -> None:
    ds = router.registry.datasets["toy"]
    # No tolerance: the most accurate variant, an SLO changes nothing it already meets.
    assert router.select(ds, 1)[0].variant_id == "sage-full-1x"
    assert router.select(ds, 1, slo_ms=5.0)[0].variant_id == "sage-full-1x"
    # Only 8x (1 ms) meets 1.5 ms: with the SLO alone it is chosen; tolerance 0 forbids it.
    variant, sel = router.select(ds, 1, slo_ms=1.5)
    assert variant.variant_id == "sage-lasso-8x" and sel is not None and sel.meets_slo
    assert router.select(ds, 1, tolerance=0.0, slo_ms=1.5)[0].variant_id == "sage-full-1x"
    out = await router.predict(ds, torch.tensor([1]), slo_ms=1.5)
    assert out.variant.variant_id == "sage-lasso-8x"


async def test_a_busy_stream_stays_on_its_lane(
    toy: tuple[VariantRegistry, dict[str, FakeModel]],
) -> None:
    # 1x (3 ms) and 2x (2 ms) for one node tie within a 60 % margin: idle, the accurate 1x. Once
    # the stream is on 2x and the device is busy, 200 decisions in a row keep it there, so its
    # requests merge into one lane's batches.
    core = Router(toy[0], Settings(warmup=False, tie_margin=0.6))
    await core.start()
    ds = core.registry.datasets["toy"]
    blocker = toy[1][slow_id]
    try:
        assert core.select(ds, 1, tolerance=4.5)[0].variant_id == "sage-full-1x"
        with held(blocker) as gate:
            running = asyncio.ensure_future(core.predict(ds, torch.tensor([0]), pinned=slow_id))
            await _entered(blocker)
            core._gen.current[ds.name] = ("sage-lasso-2x", core.clock.now())
            picks = {core.select(ds, 1, tolerance=4.5)[0].variant_id for _ in range(200)}
            assert picks == {"sage-lasso-2x"}
            gate.set()
            await running
    finally:
        await core.stop()


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


async def test_admissible_sets_are_cached_per_tolerance(
    router: Router,
) -> None:
    ds = router.registry.datasets["toy"]
    for tol in (0.0, 1.0, 5.0, 50.0, math.inf):
        want = [c.variant_id for c in candidates_within(ds.candidates, tol)]
        assert [c.variant_id for c in router.admissible(ds, tol)] == want
        assert router.admissible(ds, tol) is router.admissible(ds, tol)  # computed once
    # The same decision as the uncached policy on a snapshot of every variant.
    for tol in (0.0, 5.0, 50.0):
        sel = router.select(ds, 3, tolerance=tol)[1]
        assert sel is not None
        full = select_variant(
            RequestSpec(3, tol), ds.candidates, router.load_snapshot(ds), tie_margin=0.1
        )
        assert sel.variant_id == full.variant_id and sel.considered == full.considered
    # Client-chosen tolerances do not grow the cache without bound.
    for i in range(1000):
        router.admissible(ds, i / 7)
    assert len(router._gen.tables[ds]._sets) <= 256


async def test_cached_decisions_equal_the_policy_on_a_full_snapshot(
    toy: tuple[VariantRegistry, dict[str, FakeModel]],
) -> None:
    """The router's shortcuts (an idle device's choice kept per request size, service times kept
    per stream size, only busy lanes visited) decide as :func:`select_variant` does on a snapshot
    of every variant, idle and under a backlog, at any device speed."""
    core = Router(toy[0], Settings(warmup=False, tie_margin=0.5))
    await core.start()
    ds = core.registry.datasets["toy"]
    blocker = toy[1][slow_id]

    def agree(speed: float) -> dict[tuple[float, int], str]:
        picks = {}
        for tol in (0.0, 1.5, 4.5, 50.0):
            for nodes in (1, 3, 64, 300):
                core.slowdown.reset(speed)
                sel = core.select(ds, nodes, tolerance=tol)[1]
                assert sel is not None
                core._gen.current.pop(ds.name, None)
                want = select_variant(
                    RequestSpec(nodes, tol), ds.candidates, core.load_snapshot(ds), tie_margin=0.5
                )
                assert sel.variant_id == want.variant_id, (speed, tol, nodes)
                assert sel.considered == want.considered
                if not math.isnan(sel.predicted_ms):  # NaN: one admissible variant, no load read
                    assert sel.predicted_ms == pytest.approx(want.predicted_ms)
                picks[tol, nodes] = sel.variant_id
        return picks

    try:
        for speed in (1.0, 2.5):
            idle = agree(speed)
            agree(speed)  # the second time from the caches
        with held(blocker) as gate:
            backlog = await _backlog(core, ds, blocker)
            busy = agree(1.0)
            assert agree(1.0) == busy
            gate.set()
            await asyncio.gather(*backlog)
        assert busy != idle  # the backlog changed some choices: the load was read
    finally:
        await core.stop()


async def test_a_busy_stream_on_the_fastest_variant_is_routed_without_reading_the_load(
    toy: tuple[VariantRegistry, dict[str, FakeModel]],
) -> None:
    core = Router(toy[0], Settings(warmup=False))
    await core.start()
    ds = core.registry.datasets["toy"]
    fastest = slow_id  # the toy's 8x: the smallest curve at every size, admitted at 50 points
    model = toy[1][fastest]
    try:
        full = core.select(ds, 1, tolerance=50.0)  # idle: the policy reads the load
        assert full[0].variant_id == fastest and not math.isnan(full[1].predicted_ms)
        with held(model) as gate:
            running = asyncio.ensure_future(core.predict(ds, torch.tensor([0]), pinned=fastest))
            await _entered(model)
            expected = core.select(ds, 3, tolerance=50.0)[1]  # busy on the fastest: kept
            variant, selection = core.select(ds, 3, tolerance=50.0)
            assert variant.variant_id == expected.variant_id == fastest
            assert selection is expected and math.isnan(selection.predicted_ms)  # no load read
            # With an SLO the load is read.
            assert core.select(ds, 3, tolerance=50.0, slo_ms=100.0)[1].meets_slo is True
            gate.set()
            await running
    finally:
        await core.stop()


async def test_lanes_idle_again_leave_the_decision_to_the_idle_choice(
    toy: tuple[VariantRegistry, dict[str, FakeModel]],
) -> None:
    """A lane that answered and holds nothing more (as an inline batch is by the next request)
    has left the device's busy lanes, so the next decision is an idle one; a lane with work is
    among them."""
    core = Router(toy[0], Settings(warmup=False))
    await core.start()
    ds = core.registry.datasets["toy"]
    model = toy[1][slow_id]
    try:
        await core.predict(ds, torch.tensor([0]), tolerance=50.0)
        assert not core._busy and core.decision_load(ds, 3).idle
        idle = core.select(ds, 3, tolerance=4.5)[1]
        core._gen.current.pop(ds.name, None)
        want = select_variant(RequestSpec(3, 4.5), ds.candidates, core.load_snapshot(ds))
        assert idle.variant_id == want.variant_id
        assert idle.predicted_ms == pytest.approx(want.predicted_ms)
        with held(model) as gate:
            running = asyncio.ensure_future(core.predict(ds, torch.tensor([0]), pinned=slow_id))
            await _entered(model)
            assert core._busy == {core.lane("toy", slow_id)}
            assert not core.decision_load(ds, 3).idle  # busy: the load is read
            # a decision among other variants reads the stream, not the busy lane's own load
            among = core.decision_load(ds, 3, variants=(other_id,))
            assert among.running_nodes == 1 and slow_id not in among.variants
            assert slow_id in core.decision_load(ds, 3, variants=(slow_id, other_id)).variants
            gate.set()
            await running
    finally:
        await core.stop()


async def test_decisions_reuse_their_request_and_kept_stream_objects(
    toy: tuple[VariantRegistry, dict[str, FakeModel]],
) -> None:
    """Repeated decisions of one size and tolerance share one checked RequestSpec, a stream kept
    on its variant one Selection; a bad tolerance is refused every time, never kept."""
    core = Router(toy[0], Settings(warmup=False))
    await core.start()
    ds = core.registry.datasets["toy"]
    try:
        table = core._gen.tables[ds]
        assert table.request(3, 4.5) is table.request(3, 4.5)
        assert table.request(3, 4.5) == RequestSpec(3, 4.5)
        for bad in (-1.0, math.nan):
            for _ in range(2):
                with pytest.raises(ValueError, match="tolerance"):
                    core.select(ds, 3, tolerance=bad)
        stream = sorted(table._set(50.0, False).keeps_stream)[0]
        kept = table._kept(table._set(50.0, False), stream)
        assert kept is table._kept(table._set(50.0, False), stream)
        assert (kept.variant_id, kept.considered) == (stream, table._set(50.0, False).ids)
        assert math.isnan(kept.predicted_ms) and kept.meets_slo is None
        with held(toy[1][stream]) as gate:  # the stream runs on that variant: it is kept
            running = asyncio.ensure_future(core.predict(ds, torch.tensor([0]), pinned=stream))
            await _entered(toy[1][stream])
            core._gen.current[ds.name] = (stream, core.clock.now())
            assert core.select(ds, 1, tolerance=50.0)[1] is kept
            gate.set()
            await running
    finally:
        await core.stop()


async def test_a_dataset_of_a_replaced_generation_is_refused_not_decided() -> None:
    """A request that took its dataset before a reload is refused with a retry (the stopping
    cause), not decided on the new generation's table; the dataset the reload brought decides."""
    core = Router(make_toy_registry()[0], Settings(warmup=False))
    await core.start()
    try:
        before = core.registry.datasets["toy"]
        assert core.select(before, 3, tolerance=4.5)[1] is not None
        await core.reload(make_toy_registry()[0])
        with pytest.raises(OverloadedError, match="reloaded while this request was routed") as e:
            core.select(before, 3, tolerance=4.5)
        assert e.value.cause == "stopping"
        after = core.registry.datasets["toy"]
        assert after is not before and core.select(after, 3, tolerance=4.5)[1] is not None
    finally:
        await core.stop()
