"""The benchmarks' load generator split over client processes (``loadgen.drive``): every share
runs, the shares add up to the step asked for, and the answers are counted once each."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the load generator's clients expect

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = b'{"predictions": [0]}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Variant", self.headers.get("X-Priority", "none"))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/predict"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def loadgen() -> Iterator[Any]:
    sys.path.insert(0, str(BENCH))
    import loadgen

    yield loadgen
    sys.path.remove(str(BENCH))


def test_shares_of_a_step_add_up_to_it(loadgen: Any) -> None:
    spec = loadgen.StepSpec(rate_rps=300.0, duration_s=2.0, max_requests=401, seed=7)
    shares = [loadgen._share(spec, 3, k) for k in range(3)]
    assert sum(s.rate_rps for s in shares) == pytest.approx(300.0)
    assert all(s.max_requests == 134 for s in shares)
    assert len({s.seed for s in shares}) == 3  # independent Poisson processes
    closed = loadgen.StepSpec(rate_rps=0.0, duration_s=1.0, max_requests=100, concurrency=5)
    clients = [loadgen._share(closed, 3, k) for k in range(3)]
    assert [c.concurrency for c in clients] == [2, 2, 1]
    assert loadgen._share(closed, 8, 6) is None  # 5 clients over 8 processes: none left for it


@pytest.mark.parametrize("processes", [1, 2])
def test_drive_runs_every_stream_from_its_client_processes(
    loadgen: Any, url: str, processes: int
) -> None:
    open_high = ({"X-Priority": "high"}, loadgen.StepSpec(60.0, 1.0, 40, seed=1, drain_s=5.0))
    open_low = ({"X-Priority": "low"}, loadgen.StepSpec(60.0, 1.0, 40, seed=2, drain_s=5.0))
    closed = ({}, loadgen.StepSpec(0.0, 0.5, 30, concurrency=2))
    high, low, loop = loadgen.drive(
        url, [b'{"nodes": [1]}'], [open_high, open_low, closed], processes=processes,
        start_delay_s=2.0, client="raw",
    )  # fmt: skip
    for result, (_, spec) in ((high, open_high), (low, open_low)):
        assert result.spec == spec  # the whole step, not one share
        assert 0 < result.sent <= 40 + processes  # each share bounded by its part of 40
        assert (result.status == 200).all() and len(result.latency_ms) == result.sent
    assert set(high.variant) == {"high"} and set(low.variant) == {"low"}
    assert 0 < loop.sent <= 30 + processes and (loop.status == 200).all()
    with pytest.raises(ValueError, match="drive needs processes >= 1"):
        loadgen.drive(url, [b"{}"], [open_high], processes=0)


def test_a_server_process_runs_on_the_cores_it_is_given(loadgen: Any, tmp_path: Path) -> None:
    core = min(os.sched_getaffinity(0))
    port = loadgen.free_port()
    cmd = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    with loadgen.ServerProcess(
        cmd, port, tmp_path / "server.log", ready_path="/", ready_timeout_s=30, cpus=[core]
    ) as server:
        assert os.sched_getaffinity(server.pid) == {core}
