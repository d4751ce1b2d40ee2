"""Crash test of the live graph: SIGKILL the server at random moments during a stream of writes.

Every acknowledged write must be there after the replay, and no write may be half there: each
write adds two edges, so after every restart each write's edges are both present or both absent.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from serving_fakes import write_tiny_repository
from test_server import HOST, _free_port

from gnnaas.data.live import open_live

KILLS = 8  # each kill restarts a server process: what the suite's time budget allows
TOKEN = "crash-token"


def _pairs(store: Any, count: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """``count`` writes of two edges each, none of them in the graph or in another write."""
    rng = random.Random(0)
    taken: set[tuple[int, int]] = set()
    n = store.num_nodes
    rowptr, col = store.rowptr.tolist(), store.col.tolist()
    existing = {(col[i], t) for t in range(n) for i in range(rowptr[t], rowptr[t + 1])}
    writes = []
    while len(writes) < count:
        s, t = rng.randrange(n), rng.randrange(n)
        if s == t or (s, t) in existing or (t, s) in existing or (s, t) in taken:
            continue
        taken.update({(s, t), (t, s)})
        writes.append(((s, t), (t, s)))
    return writes


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path, deadline: float) -> None:
    while True:
        assert proc.poll() is None, f"server exited:\n{log.read_text()[-3000:]}"
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "server not ready in time"
        time.sleep(0.1)


def test_sigkill_never_loses_an_acknowledged_write(small_store: Any, tmp_path: Path) -> None:
    variants, profiles = write_tiny_repository(tmp_path, small_store)
    state = tmp_path / "state"
    plan = _pairs(small_store, 4000)
    acked: list[int] = []  # indexes into plan
    attempted: list[int] = []
    rng = random.Random(1)
    env = {
        **os.environ,
        "GNNAAS_TORCH_THREADS": "1",
        "GNNAAS_WRITE_TOKEN": TOKEN,
        "GNNAAS_WARMUP": "false",
    }
    deadline = time.monotonic() + 420  # the whole test, bounded
    next_write = 0
    for kill in range(KILLS):
        port = _free_port()
        url = f"http://{HOST}:{port}"
        log = tmp_path / f"server-{kill}.log"
        cmd = [
            sys.executable, "-m", "gnnaas.cli", "serve", "--variants", str(variants),
            "--profiles", str(profiles), "--host", HOST, "--port", str(port), "--device", "cpu",
            "--dataset", small_store.name, "--state-dir", str(state),
        ]  # fmt: skip
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            _wait_ready(proc, url, log, deadline)

            errors: list[str] = []
            stop = threading.Event()

            def writer(
                start: int, url: str = url, stop: threading.Event = stop, errors: list[str] = errors
            ) -> None:
                i = start
                with httpx.Client(base_url=url, timeout=10) as client:
                    while not stop.is_set() and i < len(plan):
                        attempted.append(i)
                        try:
                            r = client.post(
                                f"/v1/datasets/{small_store.name}/edges",
                                json={"add": [list(e) for e in plan[i]]},
                                headers={"Authorization": f"Bearer {TOKEN}"},
                            )
                        except httpx.TransportError:
                            return  # killed mid-request: unknown outcome, all or nothing
                        if r.status_code != 200:
                            errors.append(f"write {i}: {r.status_code} {r.text}")
                            return
                        acked.append(i)
                        i += 2  # two writers, interleaved indexes

            threads = [threading.Thread(target=writer, args=(next_write + j,)) for j in (0, 1)]
            for t in threads:
                t.start()
            time.sleep(rng.uniform(0.05, 0.6))  # a random moment in the stream, then the kill
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            stop.set()
            for t in threads:
                t.join(timeout=15)
                assert not t.is_alive(), "a writer hung after the kill"
            assert not errors, errors
            next_write = max(attempted) + 200
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    assert len(acked) > KILLS  # the stream really ran between the kills

    graph, log_file, lock = open_live(small_store, state)
    try:
        present = {i: [graph.has_edge(s, t) for s, t in plan[i]] for i in set(attempted)}
        lost = [i for i in acked if not all(present[i])]
        assert not lost, f"acknowledged writes lost after replay: {lost[:5]}"
        half = [i for i, edges in present.items() if any(edges) and not all(edges)]
        assert not half, f"writes half applied: {half[:5]}"
        assert graph.version == sum(all(v) for v in present.values())
    finally:
        log_file.close()
        lock.__exit__(None, None, None)
