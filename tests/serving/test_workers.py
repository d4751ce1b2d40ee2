"""``gnnaas serve --workers N``: memory-mapped stores shared by the workers, metrics summed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from serving_fakes import write_tiny_repository
from test_server import HOST, _free_port, _stop

from gnnaas.data.shared import share_store
from gnnaas.data.store import GraphStore


def _store(seed: int = 0) -> GraphStore:
    g = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, 50, (2, 300), generator=g)
    return GraphStore.from_edge_index(
        "toy@0.5", edge_index, torch.randn(50, 6, generator=g), torch.randint(0, 3, (50,)), 3
    )


def test_share_store_maps_the_same_values_once(tmp_path: Path) -> None:
    store, twin, other = _store(), _store(), _store(seed=1)
    x, rowptr, col = store.x.clone(), store.rowptr.clone(), store.col.clone()
    keep = [torch.tensor([4, 0, 2]), torch.tensor([1]), torch.arange(6)]
    subsets = [store.feature_subset(k).clone() for k in keep]

    share_store(store, keep, tmp_path)
    assert torch.equal(store.x, x) and torch.equal(store.rowptr, rowptr)
    assert torch.equal(store.col, col)
    for k, want in zip(keep, subsets, strict=True):
        assert torch.equal(store.feature_subset(k), want)
    assert store.feature_subset(keep[2]) is store.x  # every column: the features themselves
    (home,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    files = {p.name: p.stat().st_mtime_ns for p in home.iterdir()}
    assert len(files) == 5 and "x.npy" in files  # x, rowptr, col and two subsets

    share_store(twin, keep[:1], tmp_path)  # the same graph: the files are mapped, not rewritten
    assert {p.name: p.stat().st_mtime_ns for p in home.iterdir()} == files
    assert torch.equal(twin.feature_subset(keep[0]), subsets[0])

    twin.x[0, 0] = 1e6  # copy-on-write: a process's write never reaches the file or the others
    share_store(other, [], tmp_path)  # other data: its own folder
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 2
    third = _store()
    share_store(third, [], tmp_path)
    assert torch.equal(third.x, x)


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.extend(int(t) for t in text)
    return found


def _children_with_maps(pid: int) -> list[int]:
    return [w for w in _children(pid) if _mapped_store_files(w)]


def _mapped_store_files(pid: int) -> set[str]:
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return set()
    return set(re.findall(r"(/\S*gnnaas-workers-\S*/store/\S+\.npy)", maps))


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_two_workers_share_the_port_the_store_and_the_metrics(
    small_store: Any, tmp_path: Path
) -> None:
    variants_dir, profiles_dir = write_tiny_repository(tmp_path, small_store)
    port = _free_port()
    log = tmp_path / "server.log"
    cmd = [
        sys.executable, "-m", "gnnaas.cli", "serve", "--variants", str(variants_dir),
        "--profiles", str(profiles_dir), "--host", HOST, "--port", str(port),
        "--device", "cpu", "--dataset", small_store.name, "--workers", "2",
    ]  # fmt: skip
    env = {**os.environ, "GNNAAS_TORCH_THREADS": "1", "GNNAAS_ADMIN_TOKEN": "workers-token"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://{HOST}:{port}"
    try:
        deadline = time.monotonic() + 120
        workers: list[int] = []
        while len(workers) < 2 or not all(_mapped_store_files(w) for w in workers):
            assert proc.poll() is None, f"server exited early:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"workers not up in 120 s:\n{log.read_text()}"
            time.sleep(0.2)
            workers = _children_with_maps(proc.pid)
        while True:  # both workers loaded their maps; wait until one answers
            try:
                if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"not ready in 120 s:\n{log.read_text()}"
            time.sleep(0.2)

        files = [_mapped_store_files(w) for w in workers]
        assert files[0] == files[1]  # one copy of the graph and features, mapped by both
        assert any(f.endswith("/x.npy") for f in files[0])
        scratch = Path(next(iter(files[0]))).parents[2]

        sent = 24
        for i in range(sent):  # a fresh connection each: either worker may accept it
            with httpx.Client(base_url=url, timeout=10) as client:
                r = client.post(f"/v1/datasets/{small_store.name}/predict", json={"nodes": [i]})
                assert r.status_code == 200, r.text
        # Any worker's /metrics counts every worker's requests.
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        served = re.findall(r"^gnnaas_requests_total\{[^}]*\} (\S+)$", metrics, re.M)
        assert sum(float(v) for v in served) == sent
        assert (
            "gnnaas_queue_depth_nodes{" in metrics and "gnnaas_registry_generation 1.0" in metrics
        )
        assert _reloads(metrics) == 0

        # SIGHUP replaces both workers with fresh processes; /metrics carries the supervisor's
        # count of reloads, not the fresh processes' own.
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 180
        while set(_children(proc.pid)) & set(workers) or len(_children_with_maps(proc.pid)) < 2:
            assert proc.poll() is None, f"server exited:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"workers not replaced in 180 s:\n{log.read_text()}"
            time.sleep(0.2)
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        assert "gnnaas_registry_generation 2.0" in metrics and _reloads(metrics) == 1
        served = re.findall(r"^gnnaas_requests_total\{[^}]*\} (\S+)$", metrics, re.M)
        assert sum(float(v) for v in served) == sent  # the replaced workers' counts stay

        assert _stop(proc) == 0
        assert not scratch.exists()  # the shared folders go with the server
        assert "Traceback" not in log.read_text()
    finally:
        _stop(proc)


def _reloads(metrics: str) -> float:
    (value,) = re.findall(r'^gnnaas_reloads_total\{outcome="ok"\} (\S+)$', metrics, re.M)
    return float(value)


def test_the_supervisor_side_loads_no_torch() -> None:
    # The --workers supervisor reads the settings and runs uvicorn's supervisor: no torch, so it
    # stays a few dozen MB next to workers that each hold the models.
    code = (
        "import sys, gnnaas.cli, gnnaas.serving.core.settings, gnnaas.serving.deploy.workers; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_settings_default_inline_batches_match_the_executor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gnnaas.inference import INLINE_MAX_NODES
    from gnnaas.serving.core.settings import Settings

    monkeypatch.delenv("GNNAAS_INLINE_MAX_NODES", raising=False)  # the serving tests set it
    assert Settings().inline_max_nodes == INLINE_MAX_NODES
