"""The HTTP contract (docs/architecture.md §6) on the three ways to run the app: one process
(uvicorn), ``--workers 2``, and Ray Serve (one application per dataset, each at its prefix, two
replicas each, and the catalog at ``/``), each serving the toy dataset and a second one
(``ring``).

The same requests must get the same status codes, headers and ``{"detail": ...}`` bodies.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from serving_fakes import RING_NODES, make_toy_registry, toy_registry_factory
from test_app import BAD_REQUESTS, PIN_FULL, SETTINGS, URL
from test_server import HOST, _free_port, _stop

from gnnaas.serving import Settings, create_app

BACKENDS = ["uvicorn", "workers", "ray"]
DATASETS = ("toy", "ring")
HERE = Path(__file__).resolve().parent

# test_app's cases, with both datasets in the unknown-dataset detail
CASES = [
    (url, headers, body, status, detail.replace("datasets: toy", "datasets: toy, ring"))
    for url, headers, body, status, detail in BAD_REQUESTS
]

_WORKERS = """
import socket, sys
from gnnaas.serving.deploy.workers import run_workers
run_workers({{}}, ("127.0.0.1", {port}), socket.AF_INET, workers=2, log_level="warning",
            app="serving_fakes:toy_worker_app")
"""


def _workers(tmp: Path) -> Iterator[httpx.Client]:
    """Two worker processes of the toy app on a free port (``gnnaas serve --workers 2``'s
    supervisor, with the toy registry instead of a repository's)."""
    port = _free_port()
    env = {
        **os.environ,
        **{f"GNNAAS_{k.upper()}": str(v) for k, v in SETTINGS.items()},
        "GNNAAS_DATASETS": json.dumps(list(DATASETS)),
        "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p),
    }
    log = tmp / "workers.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", _WORKERS.format(port=port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        with httpx.Client(base_url=f"http://{HOST}:{port}", timeout=30) as client:
            deadline = time.monotonic() + 90
            while True:
                assert proc.poll() is None, f"workers exited:\n{log.read_text()}"
                assert time.monotonic() < deadline, f"workers not up in 90 s:\n{log.read_text()}"
                try:
                    if client.get("/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                threading.Event().wait(0.1)
            yield client
    finally:
        assert _stop(proc) == 0, log.read_text()


@pytest.fixture(scope="module", params=BACKENDS)
def http(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    """A client of the toy app (datasets ``toy`` and ``ring``) on one backend."""
    if request.param == "uvicorn":
        registry, _ = make_toy_registry(datasets=DATASETS)
        with TestClient(create_app(Settings(**SETTINGS), registry=registry)) as client:
            yield client
        return
    if request.param == "workers":
        yield from _workers(tmp_path_factory.mktemp("workers"))
        return
    port = request.getfixturevalue("ray_serve")
    from gnnaas.serving.deploy import ray as ray_backend

    url = ray_backend.run_ray(
        Settings(**SETTINGS),
        replicas=2,
        port=port,
        datasets=list(DATASETS),
        registry_factory=toy_registry_factory,
        replica_cpus=0.25,
    )
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            yield client
    finally:
        ray_backend.delete_apps()


def _post(client: httpx.Client, nodes: list[int], **headers: str) -> httpx.Response:
    return client.post(URL, json={"nodes": nodes}, headers=headers)


def _assert_serving(client: httpx.Client) -> None:
    response = _post(client, [0, 1])
    assert response.status_code == 200, response.text
    assert len(response.json()["predictions"]) == 2


def test_predict_body_and_headers(http: httpx.Client) -> None:
    response = _post(http, [3, 1, 3])
    assert response.status_code == 200, response.text
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
    assert response.headers["Content-Type"] == "application/json"
    ids = response.headers.get_list("X-Request-Id")
    assert len(ids) == 1 and ids[0]


@pytest.mark.parametrize(
    ("tolerance", "expected"),
    [("0", "sage-full-1x"), ("1", "sage-lasso-2x"), ("50", "sage-lasso-8x")],
)
def test_tolerance_selects_the_variant(http: httpx.Client, tolerance: str, expected: str) -> None:
    response = _post(http, [5], **{"X-Accuracy-Tolerance": tolerance})
    assert response.status_code == 200, response.text
    assert response.headers["X-Variant"] == expected


def test_slo_alone_admits_every_variant(http: httpx.Client) -> None:
    response = _post(http, [5], **{"X-Latency-SLO-Ms": "1000"})
    assert response.status_code == 200, response.text
    assert response.headers["X-Variant"] in {"sage-full-1x", "sage-lasso-2x", "sage-lasso-8x"}


def test_pinned_variant_and_proba(http: httpx.Client) -> None:
    pinned = _post(http, [1], **{"X-Variant": "gin-random-8x"})
    assert pinned.status_code == 200, pinned.text
    assert pinned.headers["X-Variant"] == "gin-random-8x"
    assert pinned.json()["variant"]["accuracy"] is None
    probs = http.post(URL, json={"nodes": [4, 9], "return": "proba"}, headers=PIN_FULL)
    rows = probs.json()["predictions"]
    assert len(rows) == 2 and all(len(p) == 3 and abs(sum(p) - 1) < 1e-5 for p in rows)
    classes = _post(http, [4, 9], **PIN_FULL).json()["predictions"]
    assert [max(range(3), key=p.__getitem__) for p in rows] == classes


def test_embedding(http: httpx.Client) -> None:
    body = {"nodes": [4, 9, 4], "return": "embedding"}
    response = http.post(URL, json=body, headers=PIN_FULL)
    assert response.status_code == 200, response.text
    rows = response.json()["predictions"]
    variants = {v["id"]: v for v in http.get("/v1/datasets/toy/variants").json()["variants"]}
    width = variants["sage-full-1x"]["embedding_dim"]
    assert width == 8 and len(rows) == 3 and all(len(row) == width for row in rows)
    assert max(abs(a - b) for a, b in zip(rows[0], rows[2], strict=True)) <= 1e-5
    assert variants["sage-lasso-8x"]["embedding_dim"] == 1
    alone = http.post(URL, json={"nodes": [9], "return": "embedding"}, headers=PIN_FULL)
    (row,) = alone.json()["predictions"]
    assert max(abs(a - b) for a, b in zip(row, rows[1], strict=True)) <= 1e-5


def test_concurrent_requests_all_answer(http: httpx.Client) -> None:
    answers: list[httpx.Response] = []
    lock = threading.Lock()

    def ask(i: int) -> None:
        response = _post(http, [i, i + 1], **PIN_FULL)
        with lock:
            answers.append(response)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [r.status_code for r in answers] == [200] * 8
    alone = {i: _post(http, [i], **PIN_FULL).json()["predictions"][0] for i in range(9)}
    for response in answers:
        nodes = json.loads(response.request.content)["nodes"]
        assert response.json()["predictions"] == [alone[n] for n in nodes]


@pytest.mark.parametrize(("url", "headers", "body", "status", "detail"), CASES)
def test_bad_input_gets_its_status_and_detail(
    http: httpx.Client, url: str, headers: dict[str, str], body: Any, status: int, detail: str
) -> None:
    response = http.post(url, json=body, headers=headers)
    assert (response.status_code, response.json()) == (status, {"detail": detail})


def test_malformed_and_oversized_bodies(http: httpx.Client) -> None:
    json_type = {"Content-Type": "application/json"}
    broken = http.post(URL, content=b'{"nodes": [1, 2', headers=json_type)
    assert broken.status_code == 422
    assert broken.json()["detail"].startswith("malformed JSON body: Expecting ',' delimiter")
    text = http.post(URL, content=b'{"nodes": [1]}', headers={"Content-Type": "text/plain"})
    assert text.status_code == 422 and "Content-Type: application/json" in text.json()["detail"]
    big = json.dumps({"nodes": list(range(1000))}).encode()  # > max_body_bytes (2048)
    detail = "request body is over the limit of 2048 bytes; send fewer node ids per request"
    refused = http.post(URL, content=big, headers=json_type)
    assert (refused.status_code, refused.json()) == (413, {"detail": detail})
    _assert_serving(http)


def test_datasets_variants_health_and_readiness(http: httpx.Client) -> None:
    datasets = http.get("/v1/datasets").json()["datasets"]
    assert [(d["name"], d["num_nodes"], d["variants"], d["routable"]) for d in datasets] == [
        ("toy", 100, 4, 3),
        ("ring", RING_NODES, 4, 3),
    ]
    variants = {v["id"]: v for v in http.get("/v1/datasets/toy/variants").json()["variants"]}
    assert variants["gin-random-8x"]["not_routed"] == "no profile"
    assert variants["sage-lasso-2x"]["test_accuracy"] == 88.0
    assert {"count", "median_abs_rel_error"} <= set(variants["sage-full-1x"]["drift"])
    assert http.get("/v1/datasets/nope/variants").status_code == 404
    assert http.get("/healthz").json() == {"status": "ok"}
    ready = http.get("/readyz")
    assert ready.status_code == 200
    body = ready.json()
    assert (body["status"], body["reasons"], body["datasets"]) == ("ready", [], ["toy", "ring"])
    assert body["not_routed"] == {
        "toy/gin-random-8x": "no profile",
        "ring/gin-random-8x": "no profile",
    }


def test_one_dataset(http: httpx.Client) -> None:
    """``GET /v1/datasets/{d}``: the dataset as the listing gives it, wherever it is routed (the
    dataset's own application on Ray), and the listing's 404 for one nobody serves."""
    listing = {d["name"]: d for d in http.get("/v1/datasets").json()["datasets"]}
    for name in DATASETS:
        one = http.get(f"/v1/datasets/{name}")
        assert one.status_code == 200, one.text
        assert one.json() == listing[name]
    assert listing["ring"]["num_nodes"] == RING_NODES
    missing = http.get("/v1/datasets/nope")
    assert (missing.status_code, missing.json()) == (
        404,
        {"detail": "unknown dataset 'nope'; served datasets: toy, ring"},
    )


def test_each_dataset_at_its_own_path(http: httpx.Client) -> None:
    ring = http.post("/v1/datasets/ring/predict", json={"nodes": [0, RING_NODES - 1]})
    assert ring.status_code == 200, ring.text
    assert len(ring.json()["predictions"]) == 2
    beyond = http.post("/v1/datasets/ring/predict", json={"nodes": [RING_NODES]})
    assert beyond.status_code == 422
    assert beyond.json()["detail"].startswith(f"node ids must be in [0, {RING_NODES}) for dataset")
    assert http.get("/v1/datasets/ring/variants").json()["dataset"] == "ring"
    assert http.get("/v1/datasets/nope/variants").json() == {
        "detail": "unknown dataset 'nope'; served datasets: toy, ring"
    }


def test_admin_reload_needs_a_configured_token(http: httpx.Client) -> None:
    response = http.post("/v1/admin/reload")
    assert response.status_code == 403 and "GNNAAS_ADMIN_TOKEN" in response.json()["detail"]


def test_metrics(http: httpx.Client) -> None:
    _post(http, [1, 2], **PIN_FULL)
    http.post(URL, json={"nodes": [1]}, headers={"X-Accuracy-Tolerance": "x"})
    response = http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    text = response.text
    assert 'gnnaas_requests_total{dataset="toy",variant="sage-full-1x"}' in text
    for stage in ("queue", "sample", "gather", "compute", "total"):
        assert f'stage="{stage}"' in text
    assert 'gnnaas_queue_depth_nodes{dataset="toy",variant="sage-lasso-8x"} 0.0' in text
    assert 'gnnaas_rejections_total{reason="bad_header"}' in text
    # Batches are counted where they run: one process, or each worker or replica (summed).
    deadline = 30
    done = threading.Event()
    while not re.search(r'gnnaas_batches_total\{dataset="toy",[^}]*variant="sage-full-1x"', text):
        assert deadline > 0, text
        done.wait(0.2)
        deadline -= 0.2
        _post(http, [1], **PIN_FULL)
        text = http.get("/metrics").text
    assert text.count("# TYPE gnnaas_batches_total counter") == 1  # one family, not one per source


def _requests_of(text: str, dataset: str) -> float:
    found = re.findall(rf'^gnnaas_requests_total{{dataset="{dataset}"[^}}]*}} (\S+)$', text, re.M)
    return sum(float(v) for v in found)


def test_metrics_count_every_request(http: httpx.Client) -> None:
    """Whichever process or replica answered: the counts add up."""
    before = _requests_of(http.get("/metrics").text, "ring")
    for i in range(6):
        assert http.post("/v1/datasets/ring/predict", json={"nodes": [i]}).status_code == 200
    assert _requests_of(http.get("/metrics").text, "ring") - before == 6
