"""Open-loop load from ``h2load`` (nghttp2's C load generator): a client that keeps up.

A Python client sends a few thousand requests per second per core and falls behind its schedule
above that (its lag passes a 20 ms deadline), so an overload benchmark of single-node requests
measures the client as much as the server. ``h2load`` (Debian package ``nghttp2-client``) sends at
a fixed rate per connection (``--rps``) over HTTP/1.1 (``--h1``) and logs each request's start
time, status and duration (``--log-file``).

One ``h2load`` process sends one body, so a stream of rate ``R`` is sent by ``bodies_per_stream``
processes, each with its own body (a distinct node draw) at ``R / bodies_per_stream`` on one
connection: requests merged into one batch are then mostly of different nodes, as a Python
client's random bodies are (the server dedupes repeated nodes in a batch, which would make
identical bodies cheaper than real traffic). Every process of every stream starts at once.

The results are :class:`loadgen.StepResult` s like the Python client's: latency is from the
request's actual start (``h2load`` does not log its schedule, so ``lag_ms`` is NaN: its
scheduling is C and keeps up), and ``Server-Timing`` is not read (NaN).

Example:
    >>> available()  # doctest: +SKIP
    True
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import tempfile
import urllib.request
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from loadgen import StepResult, StepSpec

__all__ = ["INSTALL", "available", "drive_h2load", "read_log", "run_closed_h2load", "served_counts"]

INSTALL = "apt-get install nghttp2-client  # Debian, Ubuntu: h2load"
"""How to install the client."""


def available() -> bool:
    """Whether ``h2load`` is on the ``PATH``."""
    return shutil.which("h2load") is not None


def read_log(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(start_us, status, duration_us)`` of every request of an ``h2load --log-file``."""
    rows = [line.split("\t") for line in Path(path).read_text().splitlines() if line.strip()]
    start = np.array([float(r[0]) for r in rows], dtype=np.float64)
    status = np.array([int(r[1]) for r in rows], dtype=np.int64)
    duration = np.array([float(r[2]) for r in rows], dtype=np.float64)
    return start, status, duration


def _command(
    url: str, body: Path, headers: dict[str, str], rate: float, count: int, log: Path
) -> list[str]:
    cmd = ["h2load", "--h1", "-c", "1", "-m", "1", "-t", "1", "-n", str(count)]
    cmd += [f"--rps={rate:.6g}", "-d", str(body), "--log-file", str(log)]
    for name, value in {"Content-Type": "application/json", **headers}.items():
        cmd += ["-H", f"{name}: {value}"]
    return [*cmd, url]


def drive_h2load(
    url: str,
    bodies: Sequence[bytes],
    streams: Sequence[tuple[dict[str, str], StepSpec]],
    *,
    bodies_per_stream: int = 16,
    cpus: set[int] | None = None,
) -> list[StepResult]:
    """Runs ``streams`` (headers, spec: ``rate_rps``, ``duration_s``, ``seed``) at the same time
    from ``h2load`` processes, one result per stream.

    Args:
        url (str): the predict URL (127.0.0.1).
        bodies (Sequence[bytes]): JSON bodies to draw each process's from.
        streams (Sequence[tuple[dict[str, str], StepSpec]]): each stream's headers and step.
        bodies_per_stream (int, optional): processes (and distinct bodies) per stream.
            (default: ``16``)
        cpus (set[int], optional): the cores the processes run on (``taskset``-like: their
            affinity); ``None`` leaves it. (default: ``None``)

    Raises:
        RuntimeError: ``h2load`` is not installed, or a process failed.
    """
    if not available():
        raise RuntimeError(f"h2load is not installed; {INSTALL}")
    with tempfile.TemporaryDirectory(prefix="gnnaas-h2load-") as tmp:
        folder = Path(tmp)
        runs: list[list[tuple[subprocess.Popen[bytes], Path]]] = []
        for i, (headers, spec) in enumerate(streams):
            rng = np.random.default_rng(spec.seed)
            k = max(1, min(bodies_per_stream, len(bodies)))
            picks = rng.choice(len(bodies), size=k, replace=False)
            rate = spec.rate_rps / k
            count = max(1, math.ceil(rate * spec.duration_s))
            procs = []
            for j, b in enumerate(picks):
                body, log = folder / f"body-{i}-{j}.json", folder / f"log-{i}-{j}.tsv"
                body.write_bytes(bodies[int(b)])
                procs.append((_start(_command(url, body, headers, rate, count, log), cpus), log))
            runs.append(procs)
        return [_result(spec, procs) for (_, spec), procs in zip(streams, runs, strict=True)]


def _closed_command(
    url: str, body: Path, headers: dict[str, str], connections: int, duration_s: float, log: Path
) -> list[str]:
    """``connections`` connections with one request in flight each, for ``duration_s``."""
    cmd = ["h2load", "--h1", "-c", str(connections), "-m", "1", "-t", "1"]
    cmd += ["-D", f"{max(1, round(duration_s * 1000))}ms", "-d", str(body), "--log-file", str(log)]
    for name, value in {"Content-Type": "application/json", **headers}.items():
        cmd += ["-H", f"{name}: {value}"]
    return [*cmd, url]


def served_counts(metrics_url: str) -> Counter[str]:
    """Answers per variant so far (``gnnaas_requests_total`` of the server's ``/metrics``)."""
    with urllib.request.urlopen(metrics_url, timeout=10) as resp:
        return _served_in(resp.read().decode())


def _served_in(text: str) -> Counter[str]:
    """Answers per variant in a ``/metrics`` text: its ``gnnaas_requests_total`` lines only (the
    Prometheus parser would read every histogram of every variant, slow on a loaded server's
    page and twice per slice)."""
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        if line.startswith("gnnaas_requests_total{"):
            labels, value = line.rsplit(" ", 1)
            variant = _VARIANT_LABEL.search(labels)
            if variant is not None:
                counts[variant.group(1)] += int(float(value))
    return counts


_VARIANT_LABEL = re.compile(r'[{,]variant="([^"]*)"')


def run_closed_h2load(
    url: str,
    bodies: Sequence[bytes],
    headers: dict[str, str],
    spec: StepSpec,
    *,
    processes: int = 16,
    cpus: set[int] | None = None,
    metrics_url: str | None = None,
) -> StepResult:
    """A closed-loop step from ``h2load``: ``spec.concurrency`` connections, each with one
    request in flight, for ``spec.duration_s``.

    The connections are spread over up to ``processes`` processes, each sending its own body (a
    distinct draw, as :func:`drive_h2load`'s streams), so a batch merges different nodes. With
    ``metrics_url`` (a gnnaas server's ``/metrics``), the answers per variant are the counters'
    difference across the step (nothing else is sent to that server meanwhile), since ``h2load``
    reads no answer's headers.

    Raises:
        RuntimeError: ``h2load`` is not installed, or a process failed.
    """
    if not available():
        raise RuntimeError(f"h2load is not installed; {INSTALL}")
    k = max(1, min(processes, spec.concurrency, len(bodies)))
    conns = [spec.concurrency // k + (1 if j < spec.concurrency % k else 0) for j in range(k)]
    rng = np.random.default_rng(spec.seed)
    picks = rng.choice(len(bodies), size=k, replace=False)
    before = served_counts(metrics_url) if metrics_url else None
    with tempfile.TemporaryDirectory(prefix="gnnaas-h2load-") as tmp:
        procs = []
        for j, (b, c) in enumerate(zip(picks, conns, strict=True)):
            body, log = Path(tmp) / f"body-{j}.json", Path(tmp) / f"log-{j}.tsv"
            body.write_bytes(bodies[int(b)])
            cmd = _closed_command(url, body, headers, c, spec.duration_s, log)
            procs.append((_start(cmd, cpus), log))
        result = _result(spec, procs)
    if before is not None and metrics_url:
        after = served_counts(metrics_url)
        result.served = Counter({v: n - before[v] for v, n in after.items() if n > before[v]})
    return result


def _start(cmd: list[str], cpus: set[int] | None) -> subprocess.Popen[bytes]:
    """One ``h2load`` process, on ``cpus`` when given; its stderr kept for the error."""
    return subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=None if cpus is None else (lambda: _pin(cpus)),
    )


def _pin(cpus: set[int]) -> None:
    import os

    os.sched_setaffinity(0, cpus)


def _result(spec: StepSpec, procs: list[tuple[subprocess.Popen[bytes], Path]]) -> StepResult:
    """One stream's result from its processes' logs (waits for them)."""
    starts, statuses, durations = [], [], []
    for proc, log in procs:
        _, err = proc.communicate(timeout=spec.duration_s + spec.drain_s + 60)
        if proc.returncode != 0:
            raise RuntimeError(f"h2load exited {proc.returncode}: {err.decode()[-400:]}")
        start, status, duration = read_log(log)
        starts.append(start)
        statuses.append(status)
        durations.append(duration)
    start = np.concatenate(starts)
    status = np.concatenate(statuses)
    duration = np.concatenate(durations)
    n = int(start.size)
    wall_s = float((start + duration).max() - start.min()) / 1e6 if n else 0.0
    latency = np.where(status > 0, duration / 1e3, np.inf)
    status = np.where(status > 0, status, -1)
    return StepResult(
        spec,
        n,
        wall_s,
        latency,
        np.full(n, math.nan),
        status,
        [None] * n,
        [None] * n,
    )
