"""The predict fast lane and the FastAPI route: one endpoint, two implementations, one contract.

``POST /v1/datasets/{d}/predict`` is answered by the edge's fast lane when it takes the request and
by the FastAPI route otherwise (:mod:`gnnaas.serving.http.fastlane`). The conformance tests here
send every case of the contract (docs/architecture.md §6: answers, and refusals with 400, 404,
413, 422, 503 and 504) once through the lane and once with the lane stepped aside (this test's
spy returns "not taken", so FastAPI's route answers the same bytes), and require the same status,
headers that matter, body (timings aside) and counted metrics.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from serving_fakes import FakeModel, held, make_toy_registry, wait_until
from test_app import SETTINGS

import gnnaas.serving.http.edge as edge_module
from gnnaas.serving import Settings, create_app
from gnnaas.serving.core.clock import FakeClock
from gnnaas.serving.http.requests import REQUEST_ID_KEY

URL = "/v1/datasets/toy/predict"
FULL, FASTEST = "sage-full-1x", "sage-lasso-8x"
# Headers whose value must be the same whichever implementation answers.
SAME_HEADERS = ("content-type", "x-variant", "x-graph-version", "retry-after")
# The counters a predict request moves (served, refused, admitted by priority).
COUNTERS = re.compile(r"^(gnnaas_(?:requests|rejections|admission)_total\{[^}]*\}) (\S+)$", re.M)


@pytest.fixture(scope="module")
def toy() -> Iterator[SimpleNamespace]:
    """The toy app, with a spy on the lane: ``taken[request id]`` says whether the lane answered,
    and ``route[0] = True`` steps it aside so that FastAPI's route answers every request."""
    taken: dict[str, bool] = {}
    route = [False]
    real = edge_module.try_predict

    async def spy(core: Any, scope: dict[str, Any], body: bytes, send: Any) -> bool:
        answered = False if route[0] else await real(core, scope, body, send)
        taken[scope[REQUEST_ID_KEY]] = answered
        return answered

    registry, models = make_toy_registry()
    edge_module.try_predict = spy  # type: ignore[assignment]
    try:
        clock = FakeClock()  # deadlines pass when a test advances it
        app = create_app(Settings(**SETTINGS), registry, clock=clock)
        with TestClient(app) as client:
            yield SimpleNamespace(
                client=client,
                core=app.state.router,
                models=models,
                taken=taken,
                route=route,
                clock=clock,
            )
    finally:
        edge_module.try_predict = real  # type: ignore[assignment]


@pytest.fixture(autouse=True)
def _no_refusal_left(toy: SimpleNamespace) -> None:
    """Each test starts with no refusal of admission holding (the fake clock does not move,
    so one would hold for the module)."""
    toy.core.shed.clear()


def _post(
    client: TestClient, body: Any, headers: dict[str, str], content_type: str = "application/json"
) -> httpx.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(URL, content=raw, headers={"Content-Type": content_type, **headers})


def _counters(client: TestClient) -> dict[str, float]:
    return {key: float(value) for key, value in COUNTERS.findall(client.get("/metrics").text)}


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


def _send(toy: SimpleNamespace, body: Any, headers: dict[str, str], *, route: bool) -> Any:
    """One request, through the lane (``route=False``, as the app runs) or the route alone;
    returns the response, whether the lane answered it, and the counters it moved."""
    before = _counters(toy.client)
    toy.route[0] = route
    try:
        response = _post(toy.client, body, headers)
    finally:
        toy.route[0] = False
    taken = toy.taken.get(response.headers["x-request-id"])  # None: refused before the lane
    return response, taken, _delta(before, _counters(toy.client))


def _masked(detail: str) -> str:
    """A detail with its measured numbers (ms waited, late by) hidden."""
    return re.sub(r"\d+(\.\d+)?", "#", detail)


def _assert_same(a: httpx.Response, b: httpx.Response, *, timed: bool = False) -> None:
    """Same status, headers that matter and body; ``timing_ms`` (and, ``timed``, the numbers
    of a detail that depend on how long the request waited) aside."""
    assert a.status_code == b.status_code, (a.text, b.text)
    ja, jb = a.json(), b.json()
    if a.status_code == 200:
        ta, tb = ja.pop("timing_ms"), jb.pop("timing_ms")
        assert list(ta) == list(tb) == ["queue", "sample", "gather", "compute", "total"]
        stages = [part.split(";")[0] for part in a.headers["server-timing"].split(", ")]
        assert stages == list(ta)
        assert stages == [part.split(";")[0] for part in b.headers["server-timing"].split(", ")]
    elif timed:
        ja["detail"], jb["detail"] = _masked(ja["detail"]), _masked(jb["detail"])
    assert ja == jb
    for name in SAME_HEADERS:
        assert a.headers.get(name) == b.headers.get(name), name
    assert set(a.headers) == set(b.headers)  # no header only one of them sends
    assert a.headers["x-request-id"] and b.headers["x-request-id"]


def _both(toy: SimpleNamespace, body: Any, headers: dict[str, str]) -> httpx.Response:
    """Sends a request through the lane and through the route alone, checks that the lane took
    it and that both answered and counted it alike; returns the lane's answer."""
    lane, taken, lane_counted = _send(toy, body, headers, route=False)
    toy.core.shed.clear()  # a refusal of admission would answer the second at the edge
    routed, routed_taken, routed_counted = _send(toy, body, headers, route=True)
    assert taken is True and routed_taken is False
    _assert_same(lane, routed)
    assert lane_counted == routed_counted and lane_counted
    if "X-Request-Id" in headers:  # a client's own id comes back from both
        assert lane.headers["x-request-id"] == routed.headers["x-request-id"]
        assert lane.headers["x-request-id"] == headers["X-Request-Id"]
    return lane


@pytest.mark.parametrize(
    ("body", "headers", "variant"),
    [
        ({"nodes": [0, 1, 2]}, {}, FULL),
        ({"nodes": [2], "return": "class"}, {"X-Request-Id": "conformance-7"}, FULL),
        ({"nodes": [3, 3], "return": "proba"}, {"X-Accuracy-Tolerance": "50"}, None),
        ({"nodes": [5]}, {"X-Variant": FASTEST}, FASTEST),
        ({"nodes": [7, 1]}, {"X-Latency-SLO-Ms": "100"}, None),
        ({"nodes": [9]}, {"X-Deadline-Ms": "60000", "X-Priority": "high"}, None),
        ({"nodes": [4, 8], "return": "proba"}, {"X-Priority": "LOW", "X-Variant": FULL}, FULL),
    ],
)
def test_answers_are_the_same_through_the_lane_and_the_route(
    toy: SimpleNamespace, body: dict[str, Any], headers: dict[str, str], variant: str | None
) -> None:
    toy.core.slowdown.reset(1.0)
    response = _both(toy, body, headers)
    assert response.status_code == 200, response.text
    assert len(response.json()["predictions"]) == len(body["nodes"])
    if variant is not None:
        assert response.headers["x-variant"] == variant
    assert response.headers["x-graph-version"] == "0"


@pytest.mark.parametrize(
    ("body", "headers", "status", "detail"),
    [
        ({"nodes": [1]}, {"X-Accuracy-Tolerance": "abc"}, 400,
         "X-Accuracy-Tolerance must be a finite number >= 0 (got 'abc')"),
        ({"nodes": [1]}, {"X-Accuracy-Tolerance": "-1"}, 400,
         "X-Accuracy-Tolerance must be a finite number >= 0 (got '-1')"),
        ({"nodes": [1]}, {"X-Latency-SLO-Ms": "0"}, 400,
         "X-Latency-SLO-Ms must be a finite number > 0 (got '0')"),
        ({"nodes": [1]}, {"X-Deadline-Ms": "soon"}, 400,
         "X-Deadline-Ms must be a finite number > 0 (got 'soon')"),
        ({"nodes": [1]}, {"X-Priority": "urgent"}, 400,
         "X-Priority must be one of high, normal, low (got 'urgent')"),
        ({"nodes": [1]}, {"X-Variant": "sage-full-3x"}, 404,
         "unknown variant 'sage-full-3x' for dataset 'toy'; known variants: gin-random-8x, "
         "sage-full-1x, sage-lasso-2x, sage-lasso-8x"),
        ({"nodes": list(range(65))}, {}, 413,
         "too many nodes: 65 in one request, the limit is 64; split it"),
        ({"nodes": [1, -1, 100, 2]}, {}, 422,
         "node ids must be in [0, 100) for dataset 'toy'; first offenders: nodes[1]=-1, "
         "nodes[2]=100"),
        ({"nodes": [1], "return": "proba"}, {"X-Deadline-Ms": "0.5", "X-Variant": FASTEST}, 422,
         "X-Deadline-Ms 0.5: 1 node cannot be answered in time even on an idle server: the "
         "pinned variant sage-lasso-8x takes 1.0 ms alone as profiled; do not retry as is"),
        ({"nodes": [1, 2]}, {"X-Deadline-Ms": "0.01"}, 422,
         "X-Deadline-Ms 0.01: 2 nodes cannot be answered in time even on an idle server: the "
         "fastest admissible one, sage-lasso-8x, takes 1.0 ms alone as profiled"),
        ({"nodes": [1]}, {"X-Deadline-Ms": "10", "X-Variant": FASTEST, "X-Slowdown": "50"}, 503,
         "X-Deadline-Ms 10: no admissible variant is predicted to answer within the 10.0 ms "
         "left (best prediction: 50.0 ms (sage-lasso-8x))"),
    ],
)  # fmt: skip
def test_refusals_are_the_same_through_the_lane_and_the_route(
    toy: SimpleNamespace, body: dict[str, Any], headers: dict[str, str], status: int, detail: str
) -> None:
    # This test's own header: the device's measured speed the case runs at (the server ignores
    # unknown headers), so a deadline can be refused for the load rather than for its size.
    headers = dict(headers)
    toy.core.slowdown.reset(float(headers.pop("X-Slowdown", 1.0)))
    try:
        response = _both(toy, body, headers)
    finally:
        toy.core.slowdown.reset(1.0)
    assert response.status_code == status
    assert response.json()["detail"].startswith(detail)
    if status == 503:  # the load refused it: retry later
        assert response.headers["retry-after"] == "1"
    else:  # the request itself is refused: nothing invites a retry of the same one
        assert "retry-after" not in response.headers


@pytest.mark.parametrize(
    ("body", "content_type", "status", "detail"),
    [
        ({"nodes": [True, 1]}, "application/json", 422, "node ids must be integers"),
        ({"nodes": [1.0]}, "application/json", 422, "node ids must be integers"),
        ({"nodes": []}, "application/json", 422, "'nodes' is empty"),
        ({"nodes": [1], "extra": 1}, "application/json", 422, "unknown field 'extra'"),
        ({"nodes": [1], "return": "logits"}, "application/json", 422, "'return' must be"),
        (b"{not json", "application/json", 422, "malformed JSON body"),
        ({"nodes": [1]}, "text/plain", 422, "the body must be JSON sent with 'Content-Type"),
        ({"nodes": [2, 5], "return": "embedding"}, "application/json", 200, None),
    ],
)
def test_what_the_lane_leaves_is_answered_by_the_route(
    toy: SimpleNamespace, body: Any, content_type: str, status: int, detail: str | None
) -> None:
    response = _post(toy.client, body, {"X-Variant": FULL}, content_type)
    assert toy.taken[response.headers["x-request-id"]] is False
    assert response.status_code == status, response.text
    if detail is not None:
        assert detail in response.json()["detail"]
    else:  # an embedding: sage-full-1x keeps 8 features, a one-layer model embeds its input
        assert [len(row) for row in response.json()["predictions"]] == [8, 8]


def test_unknown_datasets_and_oversized_bodies_never_reach_the_lane(toy: SimpleNamespace) -> None:
    response = toy.client.post("/v1/datasets/nope/predict", json={"nodes": [1]})
    assert toy.taken[response.headers["x-request-id"]] is False
    assert response.status_code == 404
    assert response.json()["detail"] == "unknown dataset 'nope'; served datasets: toy"
    big = {"nodes": list(range(1000))}  # over the body limit: refused by the edge
    response, taken, counted = _send(toy, big, {}, route=False)
    assert response.status_code == 413 and taken is None
    assert counted == {'gnnaas_rejections_total{reason="body_too_large"}': 1.0}


def test_a_full_queue_refuses_alike(toy: SimpleNamespace) -> None:
    model: FakeModel = toy.models[FASTEST]
    lane = toy.core.lane("toy", FASTEST)
    pin = {"X-Variant": FASTEST}
    with held(model) as gate, ThreadPoolExecutor(3) as pool:
        running = pool.submit(_post, toy.client, {"nodes": [0]}, pin)
        assert model.entered.wait(5)
        backlog = [pool.submit(_post, toy.client, {"nodes": list(range(64))}, pin) for _ in "ab"]
        wait_until(lambda: lane.batcher.queued_nodes == 128)
        refused = _both(toy, {"nodes": [1]}, pin)
        gate.set()
        assert [f.result().status_code for f in (running, *backlog)] == [200, 200, 200]
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["detail"] == (
        "queue of variant toy/sage-lasso-8x is full (128 nodes waiting, limit 128); retry later"
    )


def _expired(toy: SimpleNamespace, *, route: bool) -> tuple[httpx.Response, dict[str, float]]:
    """A request held in the queue past its deadline, through the lane or the route alone; its
    response and the counters the block moved."""
    model: FakeModel = toy.models[FULL]
    lane = toy.core.lane("toy", FULL)
    pin = {"X-Variant": FULL}
    before = _counters(toy.client)
    toy.route[0] = route  # for every request of the block
    try:
        with held(model) as gate, ThreadPoolExecutor(2) as pool:
            running = pool.submit(_post, toy.client, {"nodes": [0]}, pin)
            assert model.entered.wait(5)
            late = pool.submit(_post, toy.client, {"nodes": [7]}, {**pin, "X-Deadline-Ms": "50"})
            wait_until(lambda: lane.batcher.queued_requests == 1)
            toy.clock.advance(0.1)  # 50 ms from its arrival: passed while it waits
            gate.set()
            assert running.result().status_code == 200
            expired = late.result()
    finally:
        toy.route[0] = False
    assert toy.taken[expired.headers["x-request-id"]] is not route
    return expired, _delta(before, _counters(toy.client))


def test_a_deadline_passed_in_the_queue_is_504_alike(toy: SimpleNamespace) -> None:
    toy.core.slowdown.reset(1.0)
    lane, lane_counted = _expired(toy, route=False)
    routed, routed_counted = _expired(toy, route=True)
    assert lane.status_code == 504
    detail = lane.json()["detail"]
    assert detail.startswith("the request's deadline passed after ") and "not computed" in detail
    _assert_same(lane, routed, timed=True)
    assert lane_counted == routed_counted
    assert lane_counted['gnnaas_rejections_total{reason="expired"}'] == 1.0


def test_a_router_that_has_not_started_is_left_to_the_route(toy: SimpleNamespace) -> None:
    registry, _ = make_toy_registry()
    cold = TestClient(create_app(Settings(warmup=False), registry))  # no lifespan: not started
    response = cold.post(URL, json={"nodes": [1]})
    assert toy.taken[response.headers["x-request-id"]] is False
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert "start" in response.json()["detail"]


def test_batches_on_the_loop_thread_answer_as_in_the_worker() -> None:
    answers = []
    for inline in (0, 16):
        registry, models = make_toy_registry()
        settings = Settings(warmup=False, inline_max_nodes=inline)
        with TestClient(create_app(settings, registry)) as client:
            small = _post(client, {"nodes": [1, 2, 3]}, {"X-Accuracy-Tolerance": "2"})
            large = _post(client, {"nodes": list(range(40))}, {"X-Variant": FULL})
            assert small.status_code == large.status_code == 200
            answers.append((small.json()["predictions"], large.json()["predictions"]))
        assert sum(m.calls for m in models.values()) == 2
    assert answers[0] == answers[1]
