"""The real server: ``gnnaas serve`` under uvicorn in a subprocess, on a free loopback port
(its start-up, serving, SIGHUP reload and shutdown)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from serving_fakes import TINY_VARIANTS, write_tiny_repository

HOST = "127.0.0.1"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGINT, then SIGKILL if it does not exit within a bounded wait."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            return proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
            raise AssertionError("server did not stop within 20 s of SIGINT") from None
    return proc.returncode


@pytest.fixture(scope="module")
def server(small_store: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    root = tmp_path_factory.mktemp("serve")
    variants_dir, profiles_dir = write_tiny_repository(root, small_store)
    port = _free_port()
    log = root / "server.log"
    cmd = [
        sys.executable, "-m", "gnnaas.cli", "serve", "--variants", str(variants_dir),
        "--profiles", str(profiles_dir), "--host", HOST, "--port", str(port),
        "--device", "cpu", "--dataset", small_store.name,
    ]  # fmt: skip
    env = {**os.environ, "GNNAAS_MAX_WAIT_MS": "5", "GNNAAS_TORCH_THREADS": "1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    base = f"http://{HOST}:{port}"
    try:
        deadline = time.monotonic() + 90
        with httpx.Client(base_url=base, timeout=5) as client:
            while True:
                if proc.poll() is not None:
                    raise AssertionError(f"server exited early:\n{log.read_text()}")
                try:
                    if client.get("/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError(f"server not ready in 90 s:\n{log.read_text()}")
                time.sleep(0.2)
            yield client, proc, log, small_store
    finally:
        _stop(proc)


def test_real_server_serves_embeddings(server: Any) -> None:
    client, _, _, store = server
    url = f"/v1/datasets/{store.name}/predict"
    variants = client.get(f"/v1/datasets/{store.name}/variants").json()["variants"]
    assert {v["id"]: v["embedding_dim"] for v in variants} == {
        "sage-full-1x": 16,  # hidden_channels of the tiny repository's models
        "sage-random-4x": 16,
    }

    def embed(nodes: list[int]) -> list[list[float]]:
        body = {"nodes": nodes, "return": "embedding"}
        response = client.post(url, json=body, headers={"X-Variant": "sage-full-1x"})
        assert response.status_code == 200, response.text
        return response.json()["predictions"]

    alone = embed([7])[0]
    assert len(alone) == 16 and min(alone) >= 0  # the last hidden layer, after its ReLU
    groups = [[7, 1, 2, 3], [4, 7], list(range(40)), [7]]
    with ThreadPoolExecutor(len(groups)) as pool:
        answers = list(pool.map(embed, groups))
    for nodes, got in zip(groups, answers, strict=True):
        assert all(len(row) == 16 for row in got)
        row = got[nodes.index(7)]
        assert max(abs(a - b) for a, b in zip(row, alone, strict=True)) < 1e-5


def test_real_server_serves_and_stops_cleanly(server: Any) -> None:
    client, proc, log, store = server
    url = f"/v1/datasets/{store.name}/predict"
    exact = client.post(url, json={"nodes": [0, 1, 2]})
    assert exact.status_code == 200, exact.text
    assert exact.headers["X-Variant"] == "sage-full-1x"
    assert exact.headers["Server-Timing"].startswith("queue;dur=")
    assert len(exact.json()["predictions"]) == 3
    fast = client.post(url, json={"nodes": [0, 1, 2]}, headers={"X-Accuracy-Tolerance": "20"})
    assert fast.headers["X-Variant"] == "sage-random-4x"

    # A node's answer is the same alone and merged with concurrent requests.
    def proba(nodes: list[int]) -> list[list[float]]:
        body = {"nodes": nodes, "return": "proba"}
        response = client.post(url, json=body, headers={"X-Variant": "sage-full-1x"})
        assert response.status_code == 200, response.text
        return response.json()["predictions"]

    alone = proba([7])[0]
    groups = [[7, 1, 2, 3], [4, 7], list(range(40)), [7]]
    with ThreadPoolExecutor(len(groups)) as pool:
        answers = list(pool.map(proba, groups))
    for nodes, got in zip(groups, answers, strict=True):
        row = got[nodes.index(7)]
        assert max(abs(a - b) for a, b in zip(row, alone, strict=True)) < 1e-5

    bad = client.post(url, json={"nodes": [store.num_nodes]})
    assert bad.status_code == 422 and "first offenders" in bad.json()["detail"]
    assert client.get("/v1/datasets").json()["datasets"][0]["name"] == store.name
    metrics = client.get("/metrics").text
    assert f'gnnaas_requests_total{{dataset="{store.name}",variant="sage-full-1x"}}' in metrics

    assert _stop(proc) == 0
    text = log.read_text()
    assert "Application shutdown complete" in text and "Traceback" not in text
    assert "HTTP/1.1" not in text  # no access log unless --access-log
    # Between the command's first line and readiness, every start-up phase says so.
    phases = [
        "serve: loading variants from",
        f"dataset {store.name}: loading its graph and 2 variants",
        f"dataset {store.name}: 2 variants loaded",
        "warming up 2 variants",
        "Application startup complete",
        f"serve: listening on http://{HOST}:",
    ]
    found = [text.find(phase) for phase in phases]
    assert -1 not in found and found == sorted(found), (found, text)


def test_real_server_reloads_on_sighup(small_store: Any, tmp_path: Path) -> None:
    token = "s3cret-admin-token"
    variants_dir, profiles_dir = write_tiny_repository(tmp_path, small_store)
    port = _free_port()
    log = tmp_path / "server.log"
    cmd = [
        sys.executable, "-m", "gnnaas.cli", "serve", "--variants", str(variants_dir),
        "--profiles", str(profiles_dir), "--host", HOST, "--port", str(port),
        "--device", "cpu", "--dataset", small_store.name,
    ]  # fmt: skip
    env = {**os.environ, "GNNAAS_TORCH_THREADS": "1", "GNNAAS_ADMIN_TOKEN": token}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)

    def wait_for(cond: Callable[[], bool], what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            if proc.poll() is not None:
                raise AssertionError(f"server exited early:\n{log.read_text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not seen in {timeout_s} s:\n{log.read_text()}")
            time.sleep(0.1)  # polling another process: there is no event to wait on

    def ready() -> bool:
        try:
            return client.get("/readyz").status_code == 200
        except httpx.TransportError:
            return False

    try:
        with httpx.Client(base_url=f"http://{HOST}:{port}", timeout=10) as client:
            wait_for(ready, "readiness", 90)
            extra = {**TINY_VARIANTS, "sage-greedy-2x": (2, 75.0, (3.0, 6.0, 20.0, 70.0))}
            write_tiny_repository(tmp_path, small_store, extra)
            proc.send_signal(signal.SIGHUP)
            wait_for(lambda: "reload (SIGHUP) done: generation 2" in log.read_text(), "reload", 60)
            url = f"/v1/datasets/{small_store.name}/predict"
            pinned = client.post(url, json={"nodes": [0]}, headers={"X-Variant": "sage-greedy-2x"})
            assert pinned.status_code == 200, pinned.text
            auth = {"Authorization": f"Bearer {token}"}
            assert client.post("/v1/admin/reload", headers=auth).json()["generation"] == 3
        assert _stop(proc) == 0  # SIGINT still shuts down gracefully
    finally:
        _stop(proc)
    text = log.read_text()
    assert "variant synth-small/sage-greedy-2x added" in text
    assert "Application shutdown complete" in text and "Traceback" not in text
