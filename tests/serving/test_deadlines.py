"""Deadlines and priorities over HTTP: refused at once, expired in the queue, counted.

The apps run on a :class:`FakeClock`: a request outlives its deadline because the test advances
the clock while the model is held, whatever the machine's speed."""

from __future__ import annotations

import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import httpx
import pytest
from fastapi.testclient import TestClient
from serving_fakes import TOY_VARIANTS, FakeModel, held, make_toy_registry, wait_until

from gnnaas.serving import Router, Settings, create_app
from gnnaas.serving.core.clock import MONOTONIC, FakeClock
from gnnaas.serving.core.looplag import LoopLag
from gnnaas.serving.core.shedding import Asked

URL = "/v1/datasets/toy/predict"
SETTINGS = dict(max_wait_ms=0.0, max_concurrent_batches=4, inline_max_nodes=0)


@pytest.fixture
def toy() -> Iterator[tuple[TestClient, Router, dict[str, FakeModel]]]:
    """A client of the toy app on a fake clock (``router.clock``), its router and models."""
    registry, models = make_toy_registry()
    app = create_app(Settings(**SETTINGS), registry=registry, clock=FakeClock())
    with TestClient(app) as client:
        yield client, app.state.router, models


def _fake_clock(router: Router) -> FakeClock:
    """The router's clock, a test's fake one (the ``toy`` app's)."""
    assert isinstance(router.clock, FakeClock)
    return router.clock


def _post(client: TestClient, nodes: list[int], **headers: str) -> httpx.Response:
    return client.post(URL, json={"nodes": nodes}, headers=headers)


def _scaled(factor: float) -> dict[str, tuple[int, float | None, dict[int, float] | None]]:
    """The toy variants with curves ``factor`` times slower: a deadline that separates their
    predictions is then far longer than any request takes, however slow the machine."""
    return {
        v: (kept, accuracy, curve and {n: factor * ms for n, ms in curve.items()})
        for v, (kept, accuracy, curve) in TOY_VARIANTS.items()
    }


def test_a_deadline_no_variant_meets_even_alone_is_422_without_retry_after() -> None:
    registry, models = make_toy_registry(_scaled(100))
    # The curves give 103.2 ms for two nodes on the fastest variant (sage-lasso-8x) alone, and
    # 300 ms for one node on the most accurate (sage-full-1x), the only one tolerance 0 admits.
    app = create_app(Settings(**SETTINGS), registry=registry, clock=FakeClock())
    with TestClient(app) as client:
        calls = sum(m.calls for m in models.values())
        refused = _post(client, [1, 2], **{"X-Deadline-Ms": "50", "X-Accuracy-Tolerance": "50"})
        assert refused.status_code == 422, refused.text
        assert "Retry-After" not in refused.headers  # retrying the same request cannot help
        assert refused.json()["detail"] == (
            "X-Deadline-Ms 50: 2 nodes cannot be answered in time even on an idle server: the "
            "fastest admissible one, sage-lasso-8x, takes 103.2 ms alone as profiled; do not "
            "retry as is: ask with a deadline of at least 104 ms, a larger tolerance or fewer "
            "nodes"
        )
        # The tolerance decides which variants count: sage-lasso-8x would make 250 ms.
        strict = _post(client, [1], **{"X-Deadline-Ms": "250", "X-Accuracy-Tolerance": "0"})
        assert strict.status_code == 422 and "Retry-After" not in strict.headers
        assert "the fastest admissible one, sage-full-1x, takes 300.0 ms" in strict.json()["detail"]
        pinned = _post(client, [1], **{"X-Deadline-Ms": "250", "X-Variant": "sage-full-1x"})
        assert pinned.status_code == 422
        assert "the pinned variant sage-full-1x takes 300.0 ms" in pinned.json()["detail"]
        assert sum(m.calls for m in models.values()) == calls  # nothing computed
        metrics = client.get("/metrics").text
    assert 'gnnaas_rejections_total{reason="deadline_unmeetable"} 3.0' in metrics
    unmeetable = 'gnnaas_admission_total{dataset="toy",outcome="unmeetable",priority="normal"}'
    assert f"{unmeetable} 3.0" in metrics
    assert 'outcome="shed_deadline"' not in metrics


def test_a_deadline_the_load_makes_unmeetable_is_503_with_retry_after() -> None:
    registry, models = make_toy_registry(_scaled(100))
    app = create_app(Settings(**SETTINGS), registry=registry, clock=FakeClock())
    with TestClient(app) as client:
        router: Router = app.state.router
        # The device measured three times slower than profiled: 309.7 ms predicted for two
        # nodes on sage-lasso-8x, whose 103.2 ms alone would fit a 150 ms deadline when it
        # recovers.
        router.slowdown.reset(3.0)
        calls = sum(m.calls for m in models.values())
        refused = _post(client, [1, 2], **{"X-Deadline-Ms": "150", "X-Accuracy-Tolerance": "50"})
        assert refused.status_code == 503
        assert refused.headers["Retry-After"] == "1"
        detail = refused.json()["detail"]
        assert detail.startswith("X-Deadline-Ms 150: no admissible variant is predicted to answer")
        assert "best prediction: 309.7 ms (sage-lasso-8x)" in detail
        assert sum(m.calls for m in models.values()) == calls  # nothing computed
        router.slowdown.reset(1.0)
        # A deadline the fastest admissible variant meets: served by the most accurate that does.
        ok = _post(client, [1], **{"X-Deadline-Ms": "250", "X-Accuracy-Tolerance": "50"})
        assert ok.status_code == 200 and ok.headers["X-Variant"] == "sage-lasso-2x"
        # A deadline alone admits every variant, as an SLO alone does.
        alone = _post(client, [1], **{"X-Deadline-Ms": "150"})
        assert alone.status_code == 200 and alone.headers["X-Variant"] == "sage-lasso-8x"
        metrics = client.get("/metrics").text
    shed = 'gnnaas_admission_total{dataset="toy",outcome="shed_deadline",priority="normal"} 1.0'
    assert shed in metrics


def test_with_work_ahead_low_and_normal_are_refused_past_their_share_high_is_not() -> None:
    # Curves 1,000 times the toy's: one node 3 s, 32 nodes 6 s on sage-full-1x; the deadlines
    # below are seconds (the running batch's predicted 3 s all count: the clock stands still).
    registry, models = make_toy_registry(_scaled(1000))
    pin = "sage-full-1x"
    app = create_app(Settings(**SETTINGS), registry=registry, clock=FakeClock())
    with TestClient(app) as client, held(models[pin]) as gate, ThreadPoolExecutor(3) as pool:
        lane = app.state.router.lane("toy", pin)
        running = pool.submit(_post, client, [0], **{"X-Variant": pin})
        assert models[pin].entered.wait(5)
        queued = pool.submit(_post, client, list(range(1, 32)), **{"X-Variant": pin})
        wait_until(lambda: lane.batcher.queued_requests == 1)
        # Behind the running batch and 31 queued nodes, a one-node request is predicted to end
        # in under 12 s, but its wait is more than a third (normal) or a quarter (low) of its
        # slack (12 s minus its own 3 s): refused. A high one waits behind no queued node.
        deadline = {"X-Variant": pin, "X-Deadline-Ms": "12000"}
        for priority, share in (("low", "25%"), ("normal", "33%")):
            refused = _post(client, [40], **deadline, **{"X-Priority": priority})
            assert refused.status_code == 503
            detail = refused.json()["detail"]
            assert f"a {priority}-priority request may wait {share} of its slack" in detail
            assert "the rest is kept for higher priorities" in detail
        high = pool.submit(_post, client, [41], **deadline, **{"X-Priority": "high"})
        wait_until(lambda: lane.batcher.queued_requests == 2)
        gate.set()
        assert [f.result().status_code for f in (running, queued, high)] == [200, 200, 200]
        metrics = client.get("/metrics").text
    for priority in ("low", "normal"):
        assert f'outcome="shed_deadline",priority="{priority}"}} 1.0' in metrics
    assert 'outcome="admitted",priority="high"} 1.0' in metrics


def test_a_high_request_is_judged_as_leading_its_own_batch_not_as_the_streams_next() -> None:
    # Curves 1,000 times the toy's: one node 3 s, 32 nodes 6 s on sage-full-1x; one batch at a
    # time, so the running batch's predicted 6 s all count (the clock stands still).
    registry, models = make_toy_registry(_scaled(1000))
    pin = "sage-full-1x"
    settings = Settings(**{**SETTINGS, "max_concurrent_batches": 1})
    app = create_app(settings, registry=registry, clock=FakeClock())
    with TestClient(app) as client, held(models[pin]) as gate, ThreadPoolExecutor(3) as pool:
        lane = app.state.router.lane("toy", pin)
        running = pool.submit(_post, client, list(range(32)), **{"X-Variant": pin})
        assert models[pin].entered.wait(5)
        # The stream's next batch is judged about the running one's size: a normal request
        # of one node is predicted to end past 12 s (6 s left + 32 more nodes), beyond a 10 s
        # deadline, pinned or decided among the variants tolerance 0 admits.
        ten = {"X-Deadline-Ms": "10000", "X-Priority": "normal"}
        for how in ({"X-Variant": pin}, {"X-Accuracy-Tolerance": "0"}):
            refused = _post(client, [40], **ten, **how)
            assert refused.status_code == 503, refused.text
            assert "(best prediction: 12" in refused.json()["detail"]
        # A high request leads a batch of its own, taken before what lower priorities queue:
        # 6 s left + 3 s alone (then + one high node queued ahead), within the deadline.
        high = {**ten, "X-Priority": "high"}
        answers = [
            pool.submit(_post, client, [41], **high, **{"X-Variant": pin}),
            pool.submit(_post, client, [42], **high, **{"X-Accuracy-Tolerance": "0"}),
        ]
        wait_until(lambda: lane.batcher.queued_requests == 2)
        gate.set()
        assert [f.result().status_code for f in (running, *answers)] == [200, 200, 200]
        metrics = client.get("/metrics").text
    assert 'outcome="shed_deadline",priority="normal"} 2.0' in metrics
    assert 'outcome="admitted",priority="high"} 2.0' in metrics
    assert 'outcome="shed_deadline",priority="high"' not in metrics


class Lagging(NamedTuple):
    client: TestClient
    router: Router
    models: dict[str, FakeModel]
    lag: LoopLag
    clock: FakeClock


@pytest.fixture
def lagging() -> Iterator[Lagging]:
    """The toy app on a fake clock with curves 1,000 times the toy's (one node 3 s on
    sage-full-1x), its router measuring the loop's lag in windows of 10 s (fed by the test,
    as the watcher reads them on a real clock) beyond the router's computing time."""
    registry, models = make_toy_registry(_scaled(1000))
    clock = FakeClock()
    app = create_app(Settings(**SETTINGS), registry=registry, clock=clock)
    with TestClient(app) as client:
        router: Router = app.state.router
        router.loop_lag = lag = LoopLag(window_s=10.0, computing=router.computing.total)
        yield Lagging(client, router, models, lag, clock)


def test_the_event_loops_lag_counts_against_a_deadline_lower_priorities_first(
    lagging: Lagging,
) -> None:
    client, router, models, lag, clock = lagging
    pin = "sage-full-1x"
    calls = models[pin].calls
    # The loop ran a tick 4 s late, then one on time: its worst lag of the window is 4 s, its
    # latest 0, its typical lag 0.19 s (a moving average).
    lag.ran(due=clock.now() - 4.0, now=clock.now())
    lag.ran(due=clock.now(), now=clock.now())
    deadline = {"X-Variant": pin, "X-Deadline-Ms": "10000"}
    # A normal request counts the worst lag twice (before the app read it, and before its
    # caller resumes with the answer), the first with a tick's interval more (it may have come
    # up to a tick before the late one was due): 1.998 s left, under its own 3 s.
    refused = _post(client, [40], **deadline, **{"X-Priority": "normal"})
    assert refused.status_code == 503, refused.text
    detail = refused.json()["detail"]
    assert "within the 1998.0 ms left after 8002.0 ms of the event loop's lag" in detail
    # A high request counts the lag it met (0) and the typical lag: 9.8 s left, served.
    served = _post(client, [41], **deadline, **{"X-Priority": "high"})
    assert served.status_code == 200, served.text
    assert models[pin].calls == calls + 1  # the high request's
    # The lag decided the refusal: it holds while the lag reads the same (until the window
    # ends, 10 s on), not only the 1 s the prediction exceeded the time left by.
    clock.advance(2.0)
    normal = Asked("normal", 10000.0, 0.0, pin)
    assert router.refusal("toy", normal) is not None
    clock.advance(20.0)
    assert router.refusal("toy", normal) is None
    metrics = client.get("/metrics").text
    assert 'outcome="shed_deadline",priority="normal"} 1.0' in metrics
    assert 'outcome="admitted",priority="high"} 1.0' in metrics


def test_a_high_refusal_holds_as_predicted_not_for_the_lags_window(lagging: Lagging) -> None:
    client, router, _, lag, clock = lagging
    pin = "sage-full-1x"
    # A high request met a lag of 0.1 s (0.102 s with a tick's interval) and counts a typical
    # 5 ms for its answer against a 3.1 s deadline: 2.993 s left, short of the 3 s alone. Its
    # lag is read again with every tick: its refusal holds as predicted, not for the lag's
    # window (10 s).
    lag.ran(due=clock.now() - 0.1, now=clock.now())
    headers = {"X-Variant": pin, "X-Deadline-Ms": "3100", "X-Priority": "high"}
    assert _post(client, [40], **headers).status_code == 503
    high = Asked("high", 3100.0, 0.0, pin)
    assert router.refusal("toy", high) is not None
    clock.advance(0.2)
    assert router.refusal("toy", high) is None


def test_a_lag_the_device_computed_through_counts_once_for_a_normal_request(
    lagging: Lagging,
) -> None:
    client, router, models, lag, _ = lagging
    pin = "sage-full-1x"
    # A tick ran 4 s late while a batch computed for all of it: the request met the 4 s, but
    # its answer waits no lag beyond the batches its prediction counts. 10 s - 4 s leaves 6 s
    # for its own 3 s: served (counting the 4 s twice would leave 2 s and refuse it).
    lag.ran(due=lagging.clock.now() - 4.0, now=lagging.clock.now(), computed_s=4.0)
    headers = {"X-Variant": pin, "X-Deadline-Ms": "10000", "X-Priority": "normal"}
    calls = models[pin].calls
    served = _post(client, [40], **headers)
    assert served.status_code == 200, served.text
    assert models[pin].calls == calls + 1
    # A lag beyond computing counts again: 1 s of the 4 s was not the device's.
    lag.ran(due=lagging.clock.now() - 4.0, now=lagging.clock.now(), computed_s=3.0)
    refused = _post(client, [41], **{**headers, "X-Deadline-Ms": "7500"})
    assert refused.status_code == 503, refused.text
    assert "after 5002.0 ms of the event loop's lag" in refused.json()["detail"]


def test_a_computed_answer_is_held_to_the_deadline_less_the_lag_met_only(
    lagging: Lagging,
) -> None:
    client, _, models, lag, clock = lagging
    pin = "sage-full-1x"
    # Latest lag 0, typical 0.19 s: a high request with 10 s is admitted and its batch fitted to
    # 9.81 s (the loop's turn back to it still to come), but once computed it only has to be
    # ready by 10 s: its caller has resumed, and the answer is written at once.
    lag.ran(due=clock.now() - 4.0, now=clock.now())
    lag.ran(due=clock.now(), now=clock.now())
    headers = {"X-Variant": pin, "X-Deadline-Ms": "10000", "X-Priority": "high"}
    with held(models[pin]) as gate, ThreadPoolExecutor(2) as pool:
        answer = pool.submit(_post, client, [40], **headers)
        assert models[pin].entered.wait(5)
        clock.advance(9.9)  # past 9.81 s, within 10 s
        gate.set()
        assert answer.result().status_code == 200, answer.result().text
        # Past the 10 s: discarded.
        gate.clear()
        models[pin].entered.clear()
        late = pool.submit(_post, client, [41], **headers)
        assert models[pin].entered.wait(5)
        clock.advance(10.1)
        gate.set()
        assert late.result().status_code == 504, late.result().text
    assert "ready 100.0 ms after the deadline" in late.result().json()["detail"]


def test_a_late_answer_says_how_much_of_the_loops_lag_its_deadline_counted(
    lagging: Lagging,
) -> None:
    client, _, models, lag, clock = lagging
    pin = "sage-full-1x"
    lag.ran(due=clock.now() - 0.5, now=clock.now())  # met 0.5 s, and a tick's interval more
    headers = {"X-Variant": pin, "X-Deadline-Ms": "10000", "X-Priority": "high"}
    with held(models[pin]) as gate, ThreadPoolExecutor(1) as pool:
        late = pool.submit(_post, client, [40], **headers)
        assert models[pin].entered.wait(5)
        clock.advance(9.6)  # 102 ms past 10 s less the 502 ms met
        gate.set()
        answer = late.result()
    assert answer.status_code == 504, answer.text
    assert answer.json()["detail"].startswith(
        "X-Deadline-Ms 10000: the answer was ready 102.0 ms after the deadline, counted from "
        "502.0 ms before the request reached the app, the event loop's lag it met (queued"
    )


def test_a_lag_under_a_ticks_interval_counts_as_read(lagging: Lagging) -> None:
    client, _, _, lag, clock = lagging
    # The timer's usual slip (0.5 ms), not a loop behind by a tick: no interval is added.
    lag.ran(due=clock.now() - 0.0005, now=clock.now())
    headers = {"X-Variant": "sage-full-1x", "X-Deadline-Ms": "3000.5", "X-Priority": "normal"}
    refused = _post(client, [40], **headers)
    assert refused.status_code == 503, refused.text
    assert (
        "within the 2999.5 ms left after 1.0 ms of the event loop's lag"
        in (refused.json()["detail"])
    )


def test_a_real_clock_router_reads_the_lag_beyond_its_own_computing_time() -> None:
    registry, _ = make_toy_registry(_scaled(1))
    router = Router(registry, Settings(**SETTINGS), clock=MONOTONIC)
    assert router.loop_lag is not None
    router.loop_lag._due = router.loop_lag._computed = 0.0  # a tick due at 0 still pending
    router.computing.started(0.0)  # ... while a batch computes from 0
    assert router.loop_lag.behind_s(0.004) == pytest.approx(0.004)
    assert router.loop_lag.behind_s(0.004, beyond_computing=True) == 0.0


def test_the_routers_computing_time_is_each_batch_on_its_clock(
    toy: tuple[TestClient, Router, dict[str, FakeModel]],
) -> None:
    client, core, models = toy
    clock = _fake_clock(core)
    pin = "sage-full-1x"
    before = core.computing.total(clock.now())
    with held(models[pin]) as gate, ThreadPoolExecutor(1) as pool:
        running = pool.submit(_post, client, [0], **{"X-Variant": pin})
        assert models[pin].entered.wait(5)
        clock.advance(0.25)  # the batch runs for 250 ms on the router's clock
        assert core.computing.total(clock.now()) - before == pytest.approx(0.25)
        gate.set()
        assert running.result().status_code == 200
    clock.advance(1.0)  # nothing runs: the computing time stays
    assert core.computing.total(clock.now()) - before == pytest.approx(0.25)


def test_a_request_held_in_the_queue_past_its_deadline_gets_504_and_its_batch_runs(
    toy: tuple[TestClient, Router, dict[str, FakeModel]],
) -> None:
    client, core, models = toy
    clock = _fake_clock(core)
    pin = "sage-full-1x"
    model = models[pin]
    lane = core.lane("toy", pin)
    with held(model) as gate, ThreadPoolExecutor(3) as pool:
        running = pool.submit(_post, client, [0], **{"X-Variant": pin})
        assert model.entered.wait(5)
        seen = model.calls
        # Admitted (predicted to make 50 ms), then held behind the running batch past it.
        late = pool.submit(_post, client, [7], **{"X-Variant": pin, "X-Deadline-Ms": "50"})
        patient = pool.submit(_post, client, [8], **{"X-Variant": pin})
        wait_until(lambda: lane.batcher.queued_requests == 2)
        clock.advance(0.1)  # the running batch takes 100 ms: past the 50 ms deadline
        gate.set()
        assert running.result().status_code == 200
        expired = late.result()
        assert patient.result().status_code == 200
    assert expired.status_code == 504
    assert "deadline passed after 100.0 ms in the queue" in expired.json()["detail"]
    assert "it was not computed" in expired.json()["detail"]
    assert model.calls == seen + 1  # one more batch: the patient request alone
    metrics = client.get("/metrics").text
    assert (
        'gnnaas_admission_total{dataset="toy",outcome="expired",priority="normal"} 1.0' in metrics
    )


def test_an_answer_ready_after_its_deadline_is_discarded_with_504() -> None:
    registry, models = make_toy_registry(_scaled(100))
    pin = "sage-full-1x"
    model = models[pin]
    clock = FakeClock()
    with (
        TestClient(create_app(Settings(**SETTINGS), registry=registry, clock=clock)) as client,
        held(model) as gate,
        ThreadPoolExecutor(1) as pool,
    ):
        seen = model.calls
        # Predicted to make 1.5 s (300 ms), so it is computed; the held model takes 1.6 s.
        late = pool.submit(_post, client, [7], **{"X-Variant": pin, "X-Deadline-Ms": "1500"})
        assert model.entered.wait(5)
        clock.advance(1.6)
        gate.set()
        answer = late.result()
        metrics = client.get("/metrics").text
    assert answer.status_code == 504
    detail = answer.json()["detail"]
    assert detail.startswith("X-Deadline-Ms 1500: the answer was ready 100.0 ms after the")
    assert "after the deadline" in detail and "it was discarded, never answered late" in detail
    assert model.calls == seen + 1  # computed, not sent
    assert 'gnnaas_admission_total{dataset="toy",outcome="late",priority="normal"} 1.0' in metrics
    assert 'outcome="admitted"' not in metrics


def test_a_high_miss_the_loop_made_sheds_lower_priorities_with_a_deadline(
    lagging: Lagging,
) -> None:
    """A high request shed at admission while the loop's lag beyond computing is 30 % of its
    deadline cuts normal and low (none admitted before: to a floor's share, briefly): the next
    low request with a deadline, admitted by its own deadline's rule, gets 503 as shed for
    higher priorities, the one after it is refused by the edge (its body never read); a request
    without a deadline is served, and low again once its rate grew back."""
    client, router, _, lag, clock = lagging
    pin = "sage-full-1x"  # one node: 3 s
    lag.ran(due=clock.now() - 6.0, now=clock.now())  # nothing computing: the loop's own work
    high = {"X-Variant": pin, "X-Deadline-Ms": "20000", "X-Priority": "high"}
    missed = _post(client, [7], **{**high, "X-Deadline-Ms": "8000"})  # 6 s of lag + 3 s alone
    low = {"X-Variant": pin, "X-Deadline-Ms": "60000", "X-Priority": "low"}
    first = _post(client, [1], **low)
    second = client.post(URL, content=b"never read", headers=low)  # else 422
    plain = _post(client, [4], **{"X-Variant": pin, "X-Priority": "low"})
    metrics = client.get("/metrics").text
    assert 0.0 < router.lower.limit("toy", "low", clock.now()) < 10.0
    assert 0.0 < _rate_limit(metrics, "low") < 10.0 and _rate_limit(metrics, "normal") < 10.0
    clock.advance(20.0)  # the lag's window passed, the cut rate grew back
    again = _post(client, [5], **low)
    assert _rate_limit(client.get("/metrics").text, "low") == math.inf  # lifted
    statuses = [r.status_code for r in (missed, first, second, plain, again)]
    assert statuses == [503, 503, 503, 200, 200], [r.text for r in (missed, first, again)]
    assert first.json() == second.json()  # the edge's refusal is admission's
    assert first.json()["detail"].startswith(
        "low-priority requests with a deadline are shed while high-priority ones miss theirs"
    )
    assert first.headers["Retry-After"] == second.headers["Retry-After"]
    shed = 'gnnaas_admission_total{dataset="toy",outcome="shed_evicted",priority="low"} 2.0'
    assert shed in metrics


def _rate_limit(metrics: str, priority: str) -> float:
    """The ``gnnaas_priority_rate_limit`` of ``priority`` on the toy dataset in a scrape."""
    label = f'gnnaas_priority_rate_limit{{dataset="toy",priority="{priority}"}} '
    line = next(x for x in metrics.splitlines() if x.startswith(label))
    return float(line.removeprefix(label))


def test_a_high_miss_the_loop_took_little_of_sheds_nothing_more(lagging: Lagging) -> None:
    """A high request shed at admission while the loop's lag beyond computing is a sixth of its
    deadline (the request's own time made it miss, which admission predicts) cuts nothing: a
    low request with a deadline is served."""
    client, router, _, lag, clock = lagging
    pin = "sage-full-1x"  # one node: 3 s
    lag.ran(due=clock.now() - 0.5, now=clock.now())
    high = {"X-Variant": pin, "X-Deadline-Ms": "3200", "X-Priority": "high"}
    missed = _post(client, [7], **high)  # 0.5 s of lag + 3 s alone
    low = _post(client, [1], **{**high, "X-Deadline-Ms": "60000", "X-Priority": "low"})
    assert (missed.status_code, low.status_code) == (503, 200), (missed.text, low.text)
    assert router.lower.limit("toy", "low", clock.now()) == math.inf


def test_every_priority_is_served_at_light_load_and_counted(
    toy: tuple[TestClient, Router, dict[str, FakeModel]],
) -> None:
    client, core, models = toy
    pin = "sage-lasso-2x"
    lane = core.lane("toy", pin)
    with held(models[pin]) as gate, ThreadPoolExecutor(4) as pool:
        first = pool.submit(_post, client, [0], **{"X-Variant": pin})
        assert models[pin].entered.wait(5)
        jobs = []
        for node, priority in ((1, "low"), (2, "normal"), (3, "HIGH")):
            headers = {"X-Variant": pin, "X-Priority": priority}
            jobs.append(pool.submit(_post, client, [node], **headers))
            queued = len(jobs)
            wait_until(lambda: lane.batcher.queued_requests == queued)  # noqa: B023
        gate.set()
        assert [job.result().status_code for job in [first, *jobs]] == [200] * 4
    metrics = client.get("/metrics").text
    for priority in ("high", "normal", "low"):
        line = f'gnnaas_admission_total{{dataset="toy",outcome="admitted",priority="{priority}"}}'
        assert line in metrics


@pytest.mark.parametrize(
    ("header", "value", "detail"),
    [
        ("X-Deadline-Ms", "-5", "X-Deadline-Ms must be a finite number > 0 (got '-5')"),
        ("X-Deadline-Ms", "0", "X-Deadline-Ms must be a finite number > 0 (got '0')"),
        ("X-Deadline-Ms", "soon", "X-Deadline-Ms must be a finite number > 0 (got 'soon')"),
        ("X-Priority", "urgent", "X-Priority must be one of high, normal, low (got 'urgent')"),
    ],
)
def test_bad_deadline_and_priority_values_are_400(
    toy: tuple[TestClient, Router, dict[str, FakeModel]], header: str, value: str, detail: str
) -> None:
    client = toy[0]
    response = _post(client, [1], **{header: value})
    assert response.status_code == 400 and response.json() == {"detail": detail}


def test_the_variants_listing_and_openapi_document_both_headers(
    toy: tuple[TestClient, Router, dict[str, FakeModel]],
) -> None:
    client = toy[0]
    documented = client.get("/v1/datasets/toy/variants").json()["request_headers"]
    assert {"X-Deadline-Ms", "X-Priority"} <= set(documented)
    assert "504" in documented["X-Deadline-Ms"]
    spec = client.get("/openapi.json").json()
    params = spec["paths"]["/v1/datasets/{dataset}/predict"]["post"]["parameters"]
    names = {p["name"] for p in params}
    assert {"X-Deadline-Ms", "X-Priority"} <= names
    responses = spec["paths"]["/v1/datasets/{dataset}/predict"]["post"]["responses"]
    assert "504" in responses
