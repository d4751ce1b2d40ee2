"""Ray's start and stop: a deployment the cluster cannot place fails in bounded time with the CPUs
needed and available, and ``gnnaas serve --backend ray`` leaves no process behind on SIGTERM or
on a failed start."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from serving_fakes import toy_registry_factory, write_tiny_repository
from test_app import SETTINGS
from test_server import HOST, _free_port

from gnnaas.errors import ConfigError
from gnnaas.serving import Settings

psutil = pytest.importorskip("psutil")
serve = pytest.importorskip("ray.serve")

DATASET = "raytiny"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An imported 200-node graph (under the session's ``GNNAAS_HOME``) and untrained variants
    with profiles: what ``gnnaas serve`` loads."""
    from gnnaas.data import import_graph, load_dataset

    root = tmp_path_factory.mktemp("ray-repo")
    rng = np.random.default_rng(0)
    num_nodes = 200
    edges = rng.integers(0, num_nodes, size=(num_nodes * 4, 2))
    (root / "edges.csv").write_text("src,dst\n" + "".join(f"{a},{b}\n" for a, b in edges.tolist()))
    np.save(root / "x.npy", rng.standard_normal((num_nodes, 16)).astype(np.float32))
    np.save(root / "y.npy", rng.integers(0, 3, size=num_nodes))
    import_graph(
        DATASET,
        edges=root / "edges.csv",
        features=root / "x.npy",
        labels=root / "y.npy",
        undirected=True,
        force=True,
    )
    return write_tiny_repository(root, load_dataset(DATASET))


def _serve(repo: tuple[Path, Path], log: Path, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    cmd = [
        sys.executable, "-m", "gnnaas.cli", "serve", "--backend", "ray", "--variants",
        str(repo[0]), "--profiles", str(repo[1]), "--host", HOST, "--port", str(port),
        "--device", "cpu", *extra,
    ]  # fmt: skip
    env = {**os.environ, "GNNAAS_TORCH_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    return proc, f"http://{HOST}:{port}"


def _tree(pid: int) -> list[Any]:
    """The process and its descendants now."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _left(processes: list[Any]) -> list[str]:
    """Those of ``processes`` still running (zombies waiting for their parent aside)."""
    alive = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{p.pid} {' '.join(p.cmdline())[:80]}")
        except psutil.NoSuchProcess:
            continue
    return alive


def _session_dirs(processes: list[Any]) -> set[str]:
    """The Ray session folders named on the processes' command lines."""
    found = set()
    for p in processes:
        try:
            found.update(re.findall(r"/[^\s=,]*/session_[0-9_-]+", " ".join(p.cmdline())))
        except psutil.Error:
            continue
    return found


def _named_session(folders: set[str]) -> list[str]:
    """Processes anywhere on the machine whose command line names one of ``folders``."""
    hits = []
    for p in psutil.process_iter(["cmdline"]):
        line = " ".join(p.info["cmdline"] or ())
        if any(folder in line for folder in folders):
            hits.append(f"{p.pid} {line[:80]}")
    return hits


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pause = 0.2
    while True:
        assert proc.poll() is None, f"server exited ({proc.returncode}):\n{log.read_text()}"
        assert time.monotonic() < deadline, f"not ready in {timeout_s} s:\n{log.read_text()}"
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(pause)


def test_sigterm_stops_every_process_the_server_started(
    repository: tuple[Path, Path], tmp_path: Path
) -> None:
    log = tmp_path / "serve.log"
    proc, url = _serve(repository, log, "--replica-cpus", "0.5")
    try:
        _wait_ready(proc, url, log, 240)
        answer = httpx.post(f"{url}/v1/datasets/{DATASET}/predict", json={"nodes": [0, 5]})
        assert answer.status_code == 200, answer.text
        started = _tree(proc.pid)
        names = " ".join(" ".join(p.cmdline()) for p in started)
        for role in ("raylet", "gcs_server", "ServeController", "ProxyActor", "ServeReplica"):
            assert role in names, names  # the tree holds what Ray started for the server
        sessions = _session_dirs(started)
        assert sessions
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0, log.read_text()
        deadline = time.monotonic() + 10  # reaping of orphans by init is not instant
        while _left(started) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _left(started) == []
        assert _named_session(sessions) == []
    finally:
        if proc.poll() is None:
            for p in reversed(_tree(proc.pid)):
                p.kill()
            proc.wait(timeout=30)


def test_more_than_the_machine_has_fails_at_once(
    repository: tuple[Path, Path], tmp_path: Path
) -> None:
    cpus = os.cpu_count() or 1
    log = tmp_path / "serve.log"
    started_at = time.monotonic()
    proc, _ = _serve(repository, log, "--replicas", str(cpus + 1))
    try:
        seen: list[Any] = []
        while proc.poll() is None and time.monotonic() - started_at < 120:
            seen.extend(p for p in _tree(proc.pid) if p not in seen)
            time.sleep(0.2)
        assert proc.poll() == 1, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert time.monotonic() - started_at < 120
    lines = [line for line in log.read_text().splitlines() if line.startswith("ConfigError")]
    assert len(lines) == 1, log.read_text()
    # Ray counts the CPUs it may use (a cgroup can allow fewer than the machine has)
    assert re.fullmatch(
        rf"ConfigError: serve: Ray needs {cpus + 1} CPUs for 1 dataset application\(s\) × "
        rf"{cpus + 1} replica\(s\) × 1 CPU but the cluster has \d+; ask for fewer "
        r"replicas \(--replicas, --autoscale\) or datasets \(--dataset\), reserve less per "
        r"replica \(--replica-cpus 0.5: a reservation, not a limit\), or add nodes",
        lines[0],
    ), lines[0]
    assert _left(seen) == []


@pytest.fixture
def shared_ray(ray_serve: int) -> Iterator[int]:
    yield ray_serve


def test_a_replica_with_no_room_fails_within_the_bound(shared_ray: int) -> None:
    """The cluster has the CPUs in all but not free (an actor holds one): the wait for a node
    ends at ``place_timeout_s`` with the CPUs needed and free."""
    import ray

    from gnnaas.serving.deploy import ray as ray_backend

    @ray.remote(num_cpus=1)
    class Holder:
        def ready(self) -> bool:
            return True

    holder = Holder.remote()  # type: ignore[attr-defined]
    ray.get(holder.ready.remote(), timeout=60)
    started = time.monotonic()
    try:
        with pytest.raises(ConfigError) as failed:
            ray_backend.run_ray(
                Settings(**SETTINGS),
                port=shared_ray,
                datasets=["ring"],
                registry_factory=toy_registry_factory,
                replica_cpus=1.5,
                name="squeezed",
                route_prefix="/squeezed",
                place_timeout_s=5.0,
            )
        assert time.monotonic() - started < 60
        assert str(failed.value).startswith(
            "Ray could not place 1 replica(s) of application 'squeezed-ring' within 5 s: each "
            "needs 1.5 CPU and the cluster has 1 of its 2 CPUs free"
        ), failed.value
        assert "squeezed" not in serve.status().applications  # nothing left waiting
    finally:
        ray.kill(holder)


def test_a_replica_that_cannot_load_fails_the_start(shared_ray: int) -> None:
    """Serve gives up on a replica whose constructor raises; the start says why."""
    from gnnaas.serving.deploy import ray as ray_backend

    with pytest.raises(ConfigError) as failed:
        ray_backend.run_ray(
            Settings(**SETTINGS),
            port=shared_ray,
            datasets=["missing"],
            registry_factory=toy_registry_factory,
            replica_cpus=0.1,
            name="broken",
            route_prefix="/broken",
        )
    message = str(failed.value)
    assert message.startswith("Ray Serve could not start application 'broken-missing': ")
    assert "make_toy_registry: datasets are 'toy' and 'ring' (got 'missing')" in message
    assert "broken" not in serve.status().applications  # nothing left behind
