"""Shedding before the body: admission's refusals that still hold, and the edge that applies them.

Apps and routers run on a :class:`FakeClock`: a refusal stops holding when the test advances the
clock past it, whatever the machine's speed."""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi.testclient import TestClient
from serving_fakes import TOY_VARIANTS, held, make_toy_registry, wait_until

from gnnaas.errors import OverloadedError
from gnnaas.serving import Settings, create_app
from gnnaas.serving.core.clock import FakeClock
from gnnaas.serving.core.shedding import Asked, Shed, ShedBook, shed_outcome

URL = "/v1/datasets/toy/predict"
SETTINGS = dict(max_wait_ms=0.0, max_concurrent_batches=4, inline_max_nodes=0)


def _error(cause: str = "deadline") -> OverloadedError:
    return OverloadedError("shed for higher priorities; retry later", 2.0, cause=cause)


def _asked(
    priority: str, deadline_ms: float | None, tolerance: float = 2.0, pinned: str | None = None
) -> Asked:
    return Asked(priority, deadline_ms, tolerance, pinned)


def test_a_refusal_holds_until_its_time_for_deadlines_no_longer_than_the_refused_one() -> None:
    book, error = ShedBook(), _error()
    book.record("toy", "low", Shed(until=10.0, error=error, deadline_ms=50.0, tolerance=2.0))
    assert book.refusal("toy", _asked("low", 50.0), now=9.0) is error
    assert book.refusal("toy", _asked("low", 20.0), now=9.0) is error  # tighter: refused too
    assert book.refusal("toy", _asked("low", 80.0), now=9.0) is None  # more slack: admission
    assert book.refusal("toy", _asked("low", None), now=9.0) is None  # no deadline: no share
    assert book.refusal("toy", _asked("normal", 50.0), now=9.0) is None  # another priority
    assert book.refusal("other", _asked("low", 50.0), now=9.0) is None  # another dataset
    assert book.refusal("toy", _asked("low", 50.0, 1.0), now=9.0) is error  # fewer variants
    assert book.refusal("toy", _asked("low", 50.0, 5.0), now=9.0) is None  # more: admission
    assert book.refusal("toy", _asked("low", 50.0, 0.0, "x"), now=9.0) is None  # pinned
    assert book.refusal("toy", _asked("low", 50.0), now=10.0) is None and len(book) == 0  # over
    full = _error("queue_full")
    book.record("toy", "normal", Shed(until=5.0, error=full))  # a full queue: every request
    assert book.refusal("toy", _asked("normal", None), now=4.0) is full
    assert book.refusal("toy", _asked("normal", 1e6), now=4.0) is full
    # A pinned request's refusal covers the requests pinned to that variant only.
    pinned = _error("queue_full")
    book.record("toy", "normal", Shed(until=5.0, error=pinned, pinned="slow"))
    assert book.refusal("toy", _asked("normal", None, 0.0, "slow"), now=4.0) is pinned
    assert book.refusal("toy", _asked("normal", None, 0.0, "fast"), now=4.0) is None
    assert book.refusal("toy", _asked("normal", None), now=4.0) is full  # kept beside it
    book.clear()
    assert book.refusal("toy", _asked("normal", None), now=4.0) is None


def test_shed_outcomes_are_the_admission_counters_labels() -> None:
    assert [shed_outcome(_error(c)) for c in ("deadline", "evicted", "queue_full", "stopping")] == [
        "shed_deadline",
        "shed_evicted",
        "shed_queue_full",
        "shed_queue_full",
    ]


def _scaled(factor: float) -> dict[str, tuple[int, float | None, dict[int, float] | None]]:
    return {
        v: (kept, accuracy, curve and {n: factor * ms for n, ms in curve.items()})
        for v, (kept, accuracy, curve) in TOY_VARIANTS.items()
    }


def _held_and_queued(
    client: Any, pool: Any, model: Any, lane: Any, pin: str, nodes: range
) -> tuple[Any, Any]:
    """A one-node batch of ``pin`` held running (its model gated) and a request of ``nodes``
    queued behind it: the two answers' futures."""
    headers = {"X-Variant": pin}
    running = pool.submit(client.post, URL, json={"nodes": [0]}, headers=headers)
    assert model.entered.wait(5)
    queued = pool.submit(client.post, URL, json={"nodes": list(nodes)}, headers=headers)
    wait_until(lambda: lane.batcher.queued_requests == 1)
    return running, queued


@pytest.fixture
def loaded() -> Any:
    """The toy app on a fake clock with curves 1,000 times the toy's (one node 3 s on
    sage-full-1x), a batch of it held running and 31 nodes queued behind it: a low request
    with a deadline of a few seconds waits more than its quarter of the slack."""
    registry, models = make_toy_registry(_scaled(1000))
    pin = "sage-full-1x"
    clock = FakeClock()
    app = create_app(Settings(**SETTINGS), registry=registry, clock=clock)
    with TestClient(app) as client, held(models[pin]) as gate, ThreadPoolExecutor(2) as pool:
        core = app.state.router
        lane = core.lane("toy", pin)
        running, queued = _held_and_queued(client, pool, models[pin], lane, pin, range(1, 32))
        yield client, app, clock
        gate.set()
        assert running.result().status_code == queued.result().status_code == 200


def test_admission_writes_its_refusal_and_the_edge_answers_alike_without_the_body(
    loaded: Any,
) -> None:
    client, app, clock = loaded
    core = app.state.router
    low = {"X-Variant": "sage-full-1x", "X-Deadline-Ms": "12000", "X-Priority": "low"}
    first = client.post(URL, json={"nodes": [40]}, headers=low)
    assert first.status_code == 503
    assert first.json()["detail"].startswith("X-Deadline-Ms 12000: a low-priority request may wait")
    pin = "sage-full-1x"
    refusal = core.refusal("toy", Asked("low", 12000.0, 0.0, pin))
    assert refusal is not None and str(refusal) == first.json()["detail"]
    assert core.refusal("toy", Asked("low", 90000.0, 0.0, pin)) is None  # more slack
    assert core.refusal("toy", Asked("high", 12000.0, 0.0, pin)) is None  # never refused
    assert core.refusal("toy", Asked("low", 12000.0, math.inf)) is None  # not pinned

    # The next one is refused at the edge: same status, Retry-After and detail, body unread.
    read: list[bool] = []
    answer = _call(client, app, low, read)
    assert read == [] and answer["status"] == 503
    assert answer["headers"][b"retry-after"] == first.headers["retry-after"].encode()
    assert json.loads(answer["body"]) == first.json()
    assert b"x-request-id" in answer["headers"]
    metrics = client.get("/metrics").text
    shed = 'gnnaas_admission_total{dataset="toy",outcome="shed_deadline",priority="low"} 2.0'
    assert shed in metrics and 'gnnaas_rejections_total{reason="overloaded"} 2.0' in metrics

    # Past the time admission predicted for the wait to fit, the refusal no longer holds.
    clock.advance(refusal.hold_s + 1e-3)
    assert core.refusal("toy", Asked("low", 12000.0, 0.0, pin)) is None
    read.clear()
    _call(client, app, low, read)
    assert read == [True]  # admission decides again: the body was read


def _call(
    client: TestClient, app: Any, headers: dict[str, str], read: list[bool]
) -> dict[str, Any]:
    """One predict request through the app's ASGI entry point, on the client's event loop;
    ``read`` records each body read."""
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": URL,
        "raw_path": URL.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), *raw],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    out: dict[str, Any] = {"body": b""}

    async def receive() -> dict[str, Any]:
        read.append(True)
        return {"type": "http.request", "body": b'{"nodes": [41]}', "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
            out["headers"] = dict(message["headers"])
        else:
            out["body"] += message.get("body", b"")

    client.portal.call(app, scope, receive, send)  # type: ignore[union-attr]
    return out


def test_a_full_queue_is_refused_at_the_edge_until_its_running_batch_is_predicted_to_end() -> None:
    registry, models = make_toy_registry()
    pin = "sage-full-1x"  # one node: 3 ms by its curve
    clock = FakeClock()
    settings = Settings(**SETTINGS, max_queue_nodes=64, max_request_nodes=64)
    app = create_app(settings, registry=registry, clock=clock)
    with TestClient(app) as client, held(models[pin]) as gate, ThreadPoolExecutor(2) as pool:
        core = app.state.router
        lane = core.lane("toy", pin)
        running, queued = _held_and_queued(client, pool, models[pin], lane, pin, range(64))
        full = client.post(URL, json={"nodes": [1]}, headers={"X-Variant": pin})
        assert full.status_code == 503 and "is full" in full.json()["detail"]
        refusal = core.refusal("toy", Asked("normal", None, 0.0, pin))
        assert refusal is not None and str(refusal) == full.json()["detail"]
        every = core.refusal("toy", Asked("normal", 5.0, math.inf, pin))
        assert every is refusal  # every deadline: no room at all
        again = client.post(URL, json={"nodes": [1]}, headers={"X-Variant": pin})
        assert again.status_code == 503 and again.json() == full.json()
        clock.advance(0.003)  # the running batch is predicted to have ended: room again
        assert core.refusal("toy", Asked("normal", None, 0.0, pin)) is None
        gate.set()
        assert running.result().status_code == queued.result().status_code == 200
        metrics = client.get("/metrics").text
    shed = 'gnnaas_admission_total{dataset="toy",outcome="shed_queue_full",priority="normal"} 2.0'
    assert shed in metrics
