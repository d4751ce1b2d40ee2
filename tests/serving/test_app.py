"""The HTTP API over a toy registry: selection, batching, errors, health and metrics."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import torch
from fastapi.testclient import TestClient
from serving_fakes import TOY_VARIANTS, FakeModel, held, make_toy_registry, wait_until

from gnnaas.serving import Router, Settings, VariantRegistry, create_app

URL = "/v1/datasets/toy/predict"
PIN_FULL = {"X-Variant": "sage-full-1x"}
# Four batches may run at once so that a held variant does not hold up the others.
SETTINGS = dict(
    max_request_nodes=64,
    max_queue_nodes=128,
    max_body_bytes=2048,
    max_wait_ms=0.0,
    max_concurrent_batches=4,
    inline_max_nodes=0,  # tests hold a model inside a batch: keep batches off the loop thread
)


@pytest.fixture(scope="module")
def toy_app() -> Iterator[tuple[TestClient, Router, dict[str, FakeModel]]]:
    registry, models = make_toy_registry()
    app = create_app(Settings(**SETTINGS), registry=registry)
    with TestClient(app) as client:
        yield client, app.state.router, models


@pytest.fixture
def client(toy_app: tuple[TestClient, Router, dict[str, FakeModel]]) -> TestClient:
    return toy_app[0]


@pytest.fixture
def core(toy_app: tuple[TestClient, Router, dict[str, FakeModel]]) -> Router:
    return toy_app[1]


@pytest.fixture
def models(toy_app: tuple[TestClient, Router, dict[str, FakeModel]]) -> dict[str, FakeModel]:
    return toy_app[2]


def _post(client: TestClient, nodes: list[int], **headers: str) -> httpx.Response:
    return client.post(URL, json={"nodes": nodes}, headers=headers)


def _assert_serving(client: TestClient) -> None:
    response = _post(client, [0, 1])
    assert response.status_code == 200, response.text
    assert len(response.json()["predictions"]) == 2


# -- selection ---------------------------------------------------------------------------------


def test_tolerance_zero_selects_the_most_accurate(client: TestClient) -> None:
    response = _post(client, [3, 1, 3])
    assert response.status_code == 200
    body = response.json()
    assert response.headers["X-Variant"] == "sage-full-1x"
    assert body["variant"] == {
        "id": "sage-full-1x",
        "arch": "sage",
        "ranking": "full",
        "prune": 1,
        "features_kept": 8,
        "accuracy": 90.0,
    }
    preds = body["predictions"]
    assert len(preds) == 3 and preds[0] == preds[2] and all(p in (0, 1, 2) for p in preds)
    assert set(body["timing_ms"]) == {"queue", "sample", "gather", "compute", "total"}
    assert re.fullmatch(
        r"queue;dur=[\d.]+, sample;dur=[\d.]+, gather;dur=[\d.]+, compute;dur=[\d.]+, "
        r"total;dur=[\d.]+",
        response.headers["Server-Timing"],
    )


@pytest.mark.parametrize(
    ("tolerance", "expected"),
    [
        ("0", "sage-full-1x"),
        ("1", "sage-lasso-2x"),
        ("4.5", "sage-lasso-2x"),
        ("50", "sage-lasso-8x"),
    ],
)
def test_large_tolerance_selects_the_fastest(
    client: TestClient, core: Router, tolerance: str, expected: str
) -> None:
    core.slowdown.reset(1.0)
    response = _post(client, [5], **{"X-Accuracy-Tolerance": tolerance})
    assert response.headers["X-Variant"] == expected


def test_slo_header(client: TestClient, core: Router) -> None:
    # Within 10 points, the most accurate variant predicted to answer in 2.5 ms is 2x.
    core.slowdown.reset(1.0)  # as profiled (the fake models run far faster)
    response = _post(client, [5], **{"X-Accuracy-Tolerance": "10", "X-Latency-SLO-Ms": "2.5"})
    assert response.headers["X-Variant"] == "sage-lasso-2x"


def test_proba(client: TestClient) -> None:
    response = client.post(URL, json={"nodes": [4, 9], "return": "proba"})
    probs = response.json()["predictions"]
    assert len(probs) == 2 and all(len(p) == 3 and abs(sum(p) - 1) < 1e-5 for p in probs)
    classes = _post(client, [4, 9]).json()["predictions"]
    assert [max(range(3), key=p.__getitem__) for p in probs] == classes


@pytest.mark.parametrize(
    ("headers", "variant", "width"),
    [({}, "sage-full-1x", 8), ({"X-Accuracy-Tolerance": "50"}, "sage-lasso-8x", 1)],
)
def test_embedding(
    client: TestClient, core: Router, headers: dict[str, str], variant: str, width: int
) -> None:
    core.slowdown.reset(1.0)
    response = client.post(URL, json={"nodes": [4, 9, 4], "return": "embedding"}, headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["X-Variant"] == variant
    rows = response.json()["predictions"]
    assert len(rows) == 3 and all(len(row) == width for row in rows)
    # a toy model embeds like a one-layer GNN: its input, the variant's kept feature columns
    store = core.registry.datasets["toy"].store
    expected = store.x[[4, 9, 4], :width]
    torch.testing.assert_close(torch.tensor(rows), expected, rtol=0, atol=1e-6)
    listed = client.get("/v1/datasets/toy/variants").json()["variants"]
    assert {v["id"]: v["embedding_dim"] for v in listed}[variant] == width


def test_pinned_variant_even_without_profile(client: TestClient) -> None:
    response = _post(client, [1], **{"X-Variant": "gin-random-8x"})
    assert response.status_code == 200
    assert response.headers["X-Variant"] == "gin-random-8x"
    assert response.json()["variant"]["accuracy"] is None


# The consistency promise (README, docs/architecture.md §6): a node's class never depends on its
# batch-mates; its probabilities and embedding may differ only by floating-point summation order,
# at most PROBA_ATOL per entry (a batched matmul sums in another order than a single row's).
PROBA_ATOL = 1e-5


def test_same_node_same_answer_alone_and_batched(client: TestClient) -> None:
    def ask(nodes: list[int]) -> tuple[list[int], list[list[float]], list[list[float]]]:
        classes = client.post(URL, json={"nodes": nodes}).json()["predictions"]
        proba = client.post(URL, json={"nodes": nodes, "return": "proba"}).json()["predictions"]
        body = {"nodes": nodes, "return": "embedding"}
        embedding = client.post(URL, json=body).json()["predictions"]
        return classes, proba, embedding

    node = 7
    (alone_class,), (alone_proba,), (alone_embedding,) = ask([node])
    requests = [[node, 8], [9, node], [node], [10, 11, node], list(range(40))]
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(ask, requests))
    for nodes, (classes, proba, embedding) in zip(requests, answers, strict=True):
        i = nodes.index(node)
        assert classes[i] == alone_class, f"class of node {node} changed in batch {nodes}"
        assert max(abs(a - b) for a, b in zip(proba[i], alone_proba, strict=True)) <= PROBA_ATOL
        assert max(range(len(proba[i])), key=proba[i].__getitem__) == alone_class
        pairs = zip(embedding[i], alone_embedding, strict=True)
        assert max(abs(a - b) for a, b in pairs) <= PROBA_ATOL


# -- load and batching -------------------------------------------------------------------------


def test_backlogged_fastest_variant_makes_the_router_pick_the_next(
    client: TestClient, core: Router, models: dict[str, FakeModel]
) -> None:
    fastest = "sage-lasso-8x"
    lane = core.lane("toy", fastest)
    core.slowdown.reset(1.0)
    pin = {"X-Variant": fastest}
    with held(models[fastest]) as gate, ThreadPoolExecutor(4) as pool:
        running = pool.submit(_post, client, [0], **pin)
        assert models[fastest].entered.wait(5)
        backlog = [pool.submit(_post, client, list(range(64)), **pin) for _ in range(2)]
        wait_until(lambda: lane.batcher.queued_nodes == 128)

        chosen = _post(client, [5], **{"X-Accuracy-Tolerance": "50"})
        assert chosen.headers["X-Variant"] == "sage-lasso-2x"

        variants = client.get("/v1/datasets/toy/variants").json()["variants"]
        busy = next(v for v in variants if v["id"] == fastest)
        assert busy["queued_nodes"] == 128 and busy["predicted_wait_ms"] > 3

        # The queue is full: a request pinned there is refused, others are still served.
        refused = _post(client, [1], **pin)
        assert refused.status_code == 503
        assert refused.headers["Retry-After"] == "1"
        assert refused.json()["detail"] == (
            "queue of variant toy/sage-lasso-8x is full (128 nodes waiting, limit 128); retry later"
        )
        _assert_serving(client)
        gate.set()
        assert all(f.result().status_code == 200 for f in [running, *backlog])
    assert lane.batcher.queued_nodes == 0


def test_concurrent_requests_merge_into_fewer_forward_calls(
    client: TestClient, core: Router, models: dict[str, FakeModel]
) -> None:
    model = models["sage-full-1x"]
    lane = core.lane("toy", "sage-full-1x")
    calls = model.calls
    with held(model) as gate, ThreadPoolExecutor(8) as pool:
        first = pool.submit(_post, client, [0])
        assert model.entered.wait(5)
        rest = [pool.submit(_post, client, [i, i + 1]) for i in range(1, 7)]
        wait_until(lambda: lane.batcher.queued_requests == 6)
        gate.set()
        responses = [f.result() for f in [first, *rest]]
    assert all(r.status_code == 200 for r in responses)
    assert model.calls - calls == 2  # 7 requests, 2 forward passes
    assert [r.json()["predictions"] for r in responses[1:]] == [
        _post(client, [i, i + 1]).json()["predictions"] for i in range(1, 7)
    ]


def test_executor_error_is_a_500_and_the_server_keeps_serving(
    client: TestClient, models: dict[str, FakeModel]
) -> None:
    models["sage-full-1x"].fail = "boom"
    try:
        response = _post(client, [1])
    finally:
        models["sage-full-1x"].fail = None
    assert response.status_code == 500
    request_id = response.headers["X-Request-Id"]
    assert response.json() == {
        "detail": f"internal error, see server log (request id {request_id})"
    }
    assert "boom" not in response.text
    _assert_serving(client)


def test_500_logs_the_traceback_under_the_request_id(
    client: TestClient, models: dict[str, FakeModel], caplog: pytest.LogCaptureFixture
) -> None:
    models["sage-full-1x"].fail = "kaboom"
    try:
        with caplog.at_level("ERROR", logger="gnnaas.serving.http.app"):
            response = _post(client, [1], **{"X-Request-Id": "client-id-7"})
    finally:
        models["sage-full-1x"].fail = None
    assert response.status_code == 500
    assert response.headers["X-Request-Id"] == "client-id-7"
    assert "client-id-7" in response.json()["detail"]
    (record,) = [r for r in caplog.records if "client-id-7" in r.getMessage()]
    assert record.exc_info is not None and "kaboom" in str(record.exc_info[1])


def test_every_response_has_a_request_id(client: TestClient) -> None:
    ids = {_post(client, [1]).headers["X-Request-Id"] for _ in range(3)}
    assert len(ids) == 3
    assert client.get("/healthz").headers["X-Request-Id"]
    unsafe = {"X-Request-Id": "x" * 65}  # too long to echo into the log: replaced
    assert client.get("/healthz", headers=unsafe).headers["X-Request-Id"] != "x" * 65


# -- bad input ---------------------------------------------------------------------------------


BAD_REQUESTS: list[tuple[str, dict[str, str], Any, int, str]] = [
    # (url, headers, json body, status, detail)
    (URL, {"X-Accuracy-Tolerance": "abc"}, {"nodes": [1]}, 400,
     "X-Accuracy-Tolerance must be a finite number >= 0 (got 'abc')"),
    (URL, {"X-Accuracy-Tolerance": "-1"}, {"nodes": [1]}, 400,
     "X-Accuracy-Tolerance must be a finite number >= 0 (got '-1')"),
    (URL, {"X-Accuracy-Tolerance": "nan"}, {"nodes": [1]}, 400,
     "X-Accuracy-Tolerance must be a finite number >= 0 (got 'nan')"),
    (URL, {"X-Accuracy-Tolerance": "inf"}, {"nodes": [1]}, 400,
     "X-Accuracy-Tolerance must be a finite number >= 0 (got 'inf')"),
    (URL, {"X-Latency-SLO-Ms": "0"}, {"nodes": [1]}, 400,
     "X-Latency-SLO-Ms must be a finite number > 0 (got '0')"),
    ("/v1/datasets/nope/predict", {}, {"nodes": [1]}, 404,
     "unknown dataset 'nope'; served datasets: toy"),
    (URL, {"X-Variant": "sage-full-3x"}, {"nodes": [1]}, 404,
     "unknown variant 'sage-full-3x' for dataset 'toy'; known variants: gin-random-8x, "
     "sage-full-1x, sage-lasso-2x, sage-lasso-8x"),
    (URL, {}, {"nodes": [1, -1, 100, 2, 10**30]}, 422,
     "node ids must be in [0, 100) for dataset 'toy'; first offenders: nodes[1]=-1, "
     f"nodes[2]=100, nodes[4]={10**30}"),
    (URL, {}, {"nodes": [1, 1.5, True, "3", 2.0]}, 422,
     'node ids must be integers; first offenders: nodes[1]=1.5, nodes[2]=true, nodes[3]="3", '
     "nodes[4]=2.0"),
    (URL, {}, {"nodes": []}, 422, "'nodes' is empty; send at least one node id"),
    (URL, {}, {"node": [1]}, 422,
     """'nodes' is missing; send {"nodes": [0, 1, 2]}; unknown field 'node'; """
     "the body takes 'nodes' and 'return'"),
    (URL, {}, {"nodes": 3}, 422, "'nodes' must be a list of integer node ids (got 3)"),
    (URL, {}, [1, 2], 422, 'the body must be a JSON object like {"nodes": [0, 1, 2]}'),
    (URL, {}, {"nodes": [1], "return": "logits"}, 422,
     "'return' must be 'class', 'proba' or 'embedding' (got 'logits')"),
    (URL, {}, {"nodes": list(range(65))}, 413,
     "too many nodes: 65 in one request, the limit is 64; split it"),
]  # fmt: skip


@pytest.mark.parametrize(("url", "headers", "body", "status", "detail"), BAD_REQUESTS)
def test_bad_input_gets_its_status_and_detail(
    client: TestClient, url: str, headers: dict[str, str], body: Any, status: int, detail: str
) -> None:
    response = client.post(url, json=body, headers=headers)
    assert (response.status_code, response.json()) == (status, {"detail": detail})
    _assert_serving(client)


@pytest.mark.parametrize(
    ("content", "detail"),
    [
        (b'{"nodes": [1, 2', "malformed JSON body: Expecting ',' delimiter at character 15"),
        (b"", 'the request body is missing; send {"nodes": [0, 1, 2]}'),
    ],
)
def test_malformed_json(client: TestClient, content: bytes, detail: str) -> None:
    response = client.post(URL, content=content, headers={"Content-Type": "application/json"})
    assert (response.status_code, response.json()["detail"]) == (422, detail + _suffix(detail))
    _assert_serving(client)


def test_body_that_is_not_declared_json(client: TestClient) -> None:
    response = client.post(URL, content=b'{"nodes": [1]}', headers={"Content-Type": "text/plain"})
    assert response.status_code == 422
    assert response.json()["detail"] == (
        "the body must be JSON sent with 'Content-Type: application/json' (got 'text/plain'); "
        'e.g. {"nodes": [0, 1, 2]}'
    )


def _suffix(detail: str) -> str:
    return '; send an object like {"nodes": [0, 1, 2]}' if detail.startswith("malformed") else ""


def test_body_over_the_limit_is_refused_before_parsing(client: TestClient) -> None:
    big = json.dumps({"nodes": list(range(1000))}).encode()  # > 2048 bytes
    response = client.post(URL, content=big, headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    detail = "request body is over the limit of 2048 bytes; send fewer node ids per request"
    assert response.json()["detail"] == detail
    # Without Content-Length (chunked upload) the streamed bytes are counted.
    chunked = client.post(
        URL, content=iter([big[:1500], big[1500:]]), headers={"Content-Type": "application/json"}
    )
    assert chunked.status_code == 413
    assert chunked.json()["detail"] == detail
    _assert_serving(client)


# -- other endpoints ---------------------------------------------------------------------------


def test_datasets_and_variants(client: TestClient) -> None:
    assert client.get("/v1/datasets").json() == {
        "datasets": [
            {
                "name": "toy",
                "num_nodes": 100,
                "num_features": 8,
                "num_classes": 3,
                "multi_label": False,
                "variants": 4,
                "routable": 3,
                "frontier": 3,
                "graph_version": 0,
                "live": False,
            }
        ]
    }
    variants = {v["id"]: v for v in client.get("/v1/datasets/toy/variants").json()["variants"]}
    assert set(variants) == set(TOY_VARIANTS)
    assert {(tuple(v["fanouts"]), v["precision"]) for v in variants.values()} == {((2, 2), "fp32")}
    assert {v["dominated_by"] for v in variants.values()} == {None}  # each is faster or better
    assert variants["gin-random-8x"]["routable"] is False
    assert variants["gin-random-8x"]["not_routed"] == "no profile"
    assert variants["sage-lasso-2x"]["accuracy"] == 89.0
    assert variants["sage-lasso-2x"]["test_accuracy"] == 88.0
    # the width of `"return": "embedding"` rows: the toy models embed their kept features
    assert {v: d["embedding_dim"] for v, d in variants.items()} == {
        v: kept for v, (kept, _, _) in TOY_VARIANTS.items()
    }
    missing = client.get("/v1/datasets/nope/variants")
    assert missing.status_code == 404


def test_one_dataset(client: TestClient) -> None:
    (listed,) = client.get("/v1/datasets").json()["datasets"]
    one = client.get("/v1/datasets/toy")
    assert one.status_code == 200 and one.json() == listed
    assert client.get("/v1/datasets/TOY").json()["name"] == "toy"  # names match as predict's do
    missing = client.get("/v1/datasets/nope")
    assert (missing.status_code, missing.json()) == (
        404,
        {"detail": "unknown dataset 'nope'; served datasets: toy"},
    )
    assert client.app.openapi()["paths"]["/v1/datasets/{dataset}"]["get"]["responses"].keys() >= {
        "200",
        "404",
    }


def test_health_and_readiness(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    body = ready.json()
    assert (body["status"], body["reasons"], body["datasets"]) == ("ready", [], ["toy"])
    assert body["not_routed"] == {"toy/gin-random-8x": "no profile"}


def test_metrics(client: TestClient) -> None:
    _post(client, [1, 2])
    text = client.get("/metrics").text
    assert 'gnnaas_requests_total{dataset="toy",variant="sage-full-1x"}' in text
    assert 'gnnaas_nodes_total{dataset="toy",variant="sage-full-1x"}' in text
    for stage in ("queue", "sample", "gather", "compute", "total"):
        assert f'stage="{stage}"' in text
    assert 'gnnaas_queue_depth_nodes{dataset="toy",variant="sage-lasso-8x"} 0.0' in text
    assert 'gnnaas_in_flight_nodes{dataset="toy",variant="sage-lasso-8x"} 0.0' in text
    assert "gnnaas_rejections_total" in text
    assert "gnnaas_batch_nodes_bucket" in text


def test_openapi_documents_the_headers(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    params = {
        p["name"]: p for p in spec["paths"][URL.replace("toy", "{dataset}")]["post"]["parameters"]
    }
    for name in ("X-Accuracy-Tolerance", "X-Latency-SLO-Ms", "X-Variant"):
        assert params[name]["in"] == "header" and params[name]["description"]
    responses = spec["paths"][URL.replace("toy", "{dataset}")]["post"]["responses"]
    for status, names in {
        "200": ("X-Variant", "Server-Timing", "X-Request-Id"),
        "500": ("X-Request-Id",),
        "503": ("Retry-After",),
    }.items():
        headers = responses[status]["headers"]
        for name in names:
            assert headers[name]["description"] and headers[name]["schema"]["type"] == "string"


def test_openapi_documents_the_return_values(client: TestClient) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    returned = schemas["PredictRequest"]["properties"]["return"]
    assert returned["enum"] == ["class", "proba", "embedding"]
    assert "hidden_channels" in returned["description"]
    assert "embedding_dim" in schemas["VariantDetail"]["properties"]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_only_local_assets(client: TestClient, page: str) -> None:
    html = client.get(page)
    assert html.status_code == 200
    assets = re.findall(r"""(?:src|href)\s*[=:]\s*['"]([^'"]+)['"]""", html.text)
    assert any(a.endswith(".js") for a in assets), assets
    assert not [a for a in assets if re.match(r"(https?:)?//", a)], assets
    for asset in assets:
        assert client.get(asset).status_code == 200, asset
    assert client.get("/openapi.json").status_code == 200


def test_large_proba_is_encoded_off_the_loop_as_the_json_module_would(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gnnaas.serving.http.routes import predict

    nodes = list(range(40))
    inline = client.post(URL, json={"nodes": nodes, "return": "proba"}, headers=PIN_FULL)
    threads: list[bool] = []
    encode = predict.encode_payload

    def spy(payload: dict[str, Any]) -> bytes:
        try:
            asyncio.get_running_loop()
            threads.append(False)
        except RuntimeError:  # no running loop: a worker thread
            threads.append(True)
        return encode(payload, chunk_rows=7)

    monkeypatch.setattr(predict, "OFFLOAD_VALUES", 10)
    monkeypatch.setattr(predict, "encode_payload", spy)
    offloaded = client.post(URL, json={"nodes": nodes, "return": "proba"}, headers=PIN_FULL)
    assert threads == [True]
    assert offloaded.status_code == inline.status_code == 200
    assert offloaded.json()["predictions"] == inline.json()["predictions"]
    assert offloaded.json()["variant"] == inline.json()["variant"]


@pytest.mark.parametrize("chunk_rows", [1, 3, 256])
def test_encode_payload_matches_the_json_module(chunk_rows: int) -> None:
    from gnnaas.serving.http.routes.predict import encode_payload

    g = torch.Generator().manual_seed(0)
    proba = torch.softmax(torch.randn(50, 7, generator=g), dim=1).tolist()
    payload = {
        "variant": {"id": "sage-full-1x", "accuracy": None, "prune": 1},
        "predictions": proba,
        "timing_ms": {"queue": 0.001, "total": 12.5},
    }
    encoded = encode_payload(payload, chunk_rows=chunk_rows)
    assert json.loads(encoded) == json.loads(json.dumps(payload)) == payload
    assert list(json.loads(encoded)) == ["variant", "predictions", "timing_ms"]


# -- readiness of other registries ---------------------------------------------------------------


def test_not_ready_until_started_and_without_routable_variants() -> None:
    registry, _ = make_toy_registry({"gin-random-8x": (1, None, None)})
    app = create_app(Settings(warmup=False), registry=registry)
    cold = TestClient(app)  # no lifespan: the router never started
    response = cold.get("/readyz")
    assert response.status_code == 503
    assert response.json()["reasons"][0] == "starting: variants are being loaded and warmed up"
    assert cold.post(URL, json={"nodes": [1]}).status_code == 503
    with TestClient(app) as warm:
        body = warm.get("/readyz").json()
        assert body["status"] == "not ready"
        assert body["reasons"] == [
            "dataset toy: no routable variant (every variant lacks a profile); "
            "run `gnnaas profile --dataset toy`"
        ]
        assert warm.post(
            URL, json={"nodes": [1]}, headers={"X-Variant": "gin-random-8x"}
        ).is_success


def test_empty_registry_is_not_ready() -> None:
    with TestClient(create_app(Settings(), registry=VariantRegistry([]))) as client:
        assert client.get("/readyz").json()["reasons"] == ["no dataset loaded"]


def test_variants_show_the_admitting_tolerance_and_the_drift(client: TestClient) -> None:
    pinned = "sage-lasso-2x"
    before = client.get("/v1/datasets/toy/variants").json()["variants"]
    count = next(v for v in before if v["id"] == pinned)["drift"]["count"]
    assert _post(client, [3, 4], **{"X-Variant": pinned}).status_code == 200

    variants = {v["id"]: v for v in client.get("/v1/datasets/toy/variants").json()["variants"]}
    # The tolerance at which the router starts to admit each variant, from the policy's rule.
    assert variants["sage-full-1x"]["admissible_at"] == 0.0
    assert variants["sage-lasso-2x"]["admissible_at"] == pytest.approx(1.0)
    assert variants["sage-lasso-8x"]["admissible_at"] == pytest.approx(5.0)
    assert variants["gin-random-8x"]["admissible_at"] is None  # not profiled, never routed
    drift = variants[pinned]["drift"]
    assert drift["count"] == count + 1
    assert drift["predicted_ms_median"] > 0 and drift["measured_ms_median"] > 0


def test_every_metric_is_exposed_as_defined() -> None:
    """``/metrics`` serves exactly the metrics of ``METRICS`` (the README's table of metrics is
    written from it), each with its type, its labels and its meaning as help text."""
    import re

    from gnnaas.serving.core.drift import DriftRecord
    from gnnaas.serving.core.metrics import METRICS, QueueDepth, ServingMetrics

    m = ServingMetrics()
    m.bind_queues(lambda: [QueueDepth("d", "v", 3, 2)])
    m.bind_limits(lambda: [("d", "low", 12.5)])
    m.served("d", "v", 2, queue_s=0.0, sample_s=0.0, gather_s=0.0, compute_s=0.0, total_s=0.0)
    m.batch("d", "v", 2, failed=True)
    m.batch_time("d", "v", predicted_s=0.001, measured_s=0.002)
    m.admitted("d", "high", "admitted")
    m.rejected("overloaded")
    m.generation.set(1)
    record = DriftRecord()
    record.add(2, predicted_ms=1.0, measured_ms=2.0)
    m.track_drift("d", "v", record)
    text = m.render().decode()
    kinds = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    helps = dict(re.findall(r"^# HELP (\S+) (.+)$", text, re.M))
    labels: dict[str, set[str]] = {}
    for family, inside in re.findall(r"^([a-z_]+?)(?:_bucket|_count|_sum)?\{([^}]*)\}", text, re.M):
        names = {part.split("=")[0] for part in inside.split(",") if part}
        labels.setdefault(family, set()).update(names - {"le"})
    exposed = {}
    for name, kind in kinds.items():
        if name.endswith("_created"):  # prometheus-client's creation times, not ours
            continue
        exposed[name] = (kind, helps[name], labels.get(name, set()))
    assert set(exposed) == set(METRICS)
    for name, doc in METRICS.items():
        assert exposed[name] == (doc.kind, doc.meaning, set(doc.labels)), name
