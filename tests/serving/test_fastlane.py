"""The predict fast lane: well-formed requests answered alike, everything else left to FastAPI."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from serving_fakes import make_toy_registry

import gnnaas.serving.http.edge as edge_module
from gnnaas.serving import Settings, create_app

URL = "/v1/datasets/toy/predict"


@pytest.fixture(scope="module")
def lane() -> Iterator[tuple[TestClient, list[bool]]]:
    """A toy app whose fast lane records, per request, whether it answered."""
    taken: list[bool] = []
    real = edge_module.try_predict

    async def spy(*args: Any) -> bool:
        answered = await real(*args)
        taken.append(answered)
        return answered

    registry, _ = make_toy_registry()
    edge_module.try_predict = spy  # type: ignore[assignment]
    try:
        app = create_app(Settings(warmup=False), registry)
        with TestClient(app) as client:
            yield client, taken
    finally:
        edge_module.try_predict = real  # type: ignore[assignment]


def _post(client: TestClient, body: Any, **headers: str) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(URL, content=raw, headers={"Content-Type": "application/json", **headers})


def _same(a: Any, b: Any) -> None:
    """Same status, body (timings aside) and response headers."""
    assert a.status_code == b.status_code
    ja, jb = a.json(), b.json()
    ja.pop("timing_ms"), jb.pop("timing_ms")
    assert ja == jb
    assert a.headers["x-variant"] == b.headers["x-variant"]
    assert a.headers["content-type"] == b.headers["content-type"]
    stages = [part.split(";")[0] for part in a.headers["server-timing"].split(", ")]
    assert stages == [part.split(";")[0] for part in b.headers["server-timing"].split(", ")]
    assert "x-request-id" in a.headers and "x-request-id" in b.headers


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        ({"nodes": [0, 1, 2]}, {}),
        ({"nodes": [3, 3], "return": "proba"}, {"X-Accuracy-Tolerance": "50"}),
        ({"nodes": [5]}, {"X-Variant": "sage-lasso-8x"}),
        ({"nodes": [7, 1]}, {"X-Latency-SLO-Ms": "100"}),
    ],
)
def test_well_formed_requests_take_the_lane_and_answer_as_the_route(
    lane: tuple[TestClient, list[bool]], body: dict[str, Any], headers: dict[str, str]
) -> None:
    client, taken = lane
    fast = _post(client, body, **headers)
    assert taken[-1] is True and fast.status_code == 200
    # The same request in a form only the route accepts (the field's Python name).
    routed_body = {("return_" if k == "return" else k): v for k, v in body.items()}
    routed_body.setdefault("return_", "class")
    routed = _post(client, routed_body, **headers)
    assert taken[-1] is False
    _same(fast, routed)


@pytest.mark.parametrize(
    ("body", "headers", "status", "detail"),
    [
        ({"nodes": [True, 1]}, {}, 422, "node ids must be integers"),
        ({"nodes": [1.0]}, {}, 422, "node ids must be integers"),
        ({"nodes": []}, {}, 422, "'nodes' is empty"),
        ({"nodes": [1], "extra": 1}, {}, 422, "unknown field 'extra'"),
        ({"nodes": [1], "return": "logits"}, {}, 422, "'return' must be 'class', 'proba' or"),
        (b"{not json", {}, 422, "malformed JSON body"),
    ],
)
def test_malformed_bodies_are_left_to_the_route(
    lane: tuple[TestClient, list[bool]],
    body: Any,
    headers: dict[str, str],
    status: int,
    detail: str,
) -> None:
    client, taken = lane
    response = _post(client, body, **headers)
    assert taken[-1] is False
    assert response.status_code == status and detail in response.json()["detail"]


@pytest.mark.parametrize(
    ("body", "headers", "status", "detail"),
    [
        ({"nodes": [0, 10**6]}, {}, 422, "first offenders: nodes[1]=1000000"),
        ({"nodes": list(range(5000))}, {}, 413, "too many nodes: 5000 in one request"),
        ({"nodes": [1]}, {"X-Accuracy-Tolerance": "-1"}, 400, "X-Accuracy-Tolerance must be"),
        ({"nodes": [1]}, {"X-Latency-SLO-Ms": "0"}, 400, "X-Latency-SLO-Ms must be"),
        ({"nodes": [1]}, {"X-Variant": "nope-1x"}, 404, "unknown variant 'nope-1x'"),
    ],
)
def test_refusals_are_one_mapping_whichever_answers(
    lane: tuple[TestClient, list[bool]],
    body: dict[str, Any],
    headers: dict[str, str],
    status: int,
    detail: str,
) -> None:
    """The lane parses and refuses with the route's own functions: same status and body."""
    client, taken = lane
    fast = _post(client, body, **headers)
    assert taken[-1] is True
    routed = _post(client, {**body, "return_": "class"}, **headers)  # a form only the route takes
    assert taken[-1] is False
    assert fast.status_code == routed.status_code == status
    assert fast.json() == routed.json() and detail in fast.json()["detail"]


def test_embeddings_are_served_by_the_route(lane: tuple[TestClient, list[bool]]) -> None:
    client, taken = lane
    response = _post(
        client, {"nodes": [2, 5], "return": "embedding"}, **{"X-Variant": "sage-full-1x"}
    )
    assert taken[-1] is False
    assert response.status_code == 200, response.text
    rows = response.json()["predictions"]
    assert len(rows) == 2 and all(len(row) == 8 for row in rows)  # sage-full-1x keeps 8 features


def test_other_paths_and_content_types_go_to_fastapi(lane: tuple[TestClient, list[bool]]) -> None:
    client, taken = lane
    r = client.post("/v1/datasets/nope/predict", json={"nodes": [1]})
    assert taken[-1] is False and r.status_code == 404
    r = client.post(URL, content=b'{"nodes": [1]}', headers={"Content-Type": "text/plain"})
    assert taken[-1] is False and r.status_code == 422
    r = client.post(URL, content=b'{"nodes": [1]}', headers={"Content-Type": "application/json"})
    assert taken[-1] is True and r.status_code == 200


def test_batches_on_the_loop_thread_answer_as_in_the_worker() -> None:
    answers = []
    for inline in (0, 16):
        registry, models = make_toy_registry()
        settings = Settings(warmup=False, inline_max_nodes=inline)
        with TestClient(create_app(settings, registry)) as client:
            small = _post(client, {"nodes": [1, 2, 3]}, **{"X-Accuracy-Tolerance": "2"})
            large = _post(client, {"nodes": list(range(40))}, **{"X-Variant": "sage-full-1x"})
            assert small.status_code == large.status_code == 200
            answers.append((small.json()["predictions"], large.json()["predictions"]))
        assert sum(m.calls for m in models.values()) == 2
    assert answers[0] == answers[1]
