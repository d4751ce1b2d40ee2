"""A Ray replica killed under load: how many answers are not 200, and how long until it is back.

Serves a repository on a local Ray (2 CPUs, no dashboard) with ``--replicas`` replicas per dataset,
runs a bounded closed-loop load (``--threads`` clients, sequential requests of ``--nodes`` nodes),
kills one replica's process with SIGKILL once ``--warmup`` answers came back, waits (polling, with
a deadline) until Ray has replaced it, then runs ``--after`` more answers and stops. Prints the
count of non-200 answers by status (each 503 checked for ``Retry-After`` and a ``{"detail": ...}``
body), the time from the kill until the replacement answers, and the slowest request against the
client's bound.

Example:
    python benchmarks/bench_faults.py --variants variants --profiles profiles --dataset synth-small
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import signal
import socket
import threading
import time
from typing import Any

import httpx


def _poll(cond: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench_faults: {what} not within {timeout_s} s")
        pause.wait(0.05)


def main() -> None:
    """Runs the fault benchmark and prints its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="variants", help="variant repository")
    parser.add_argument("--profiles", default="profiles", help="profiles folder")
    parser.add_argument("--dataset", default="synth-small", help="dataset to load and kill")
    parser.add_argument("--replicas", type=int, default=2, help="replicas of the dataset")
    parser.add_argument("--threads", type=int, default=4, help="concurrent clients")
    parser.add_argument("--nodes", type=int, default=1, help="nodes per request")
    parser.add_argument("--warmup", type=int, default=200, help="answers before the kill")
    parser.add_argument("--after", type=int, default=200, help="answers after recovery")
    parser.add_argument("--timeout", type=float, default=20.0, help="client bound per request, s")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()

    from gnnaas.serving.core.settings import Settings
    from gnnaas.serving.deploy import ray as ray_backend

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    settings = Settings(
        variants_dir=args.variants,
        profiles_dir=args.profiles,
        datasets=[args.dataset],
        device="cpu",
    )
    started = time.monotonic()
    ray_backend.start_ray(num_cpus=2, port=port)
    url = ray_backend.run_ray(
        settings, replicas=args.replicas, port=port, replica_cpus=2 / (args.replicas + 1)
    )
    print(f"up in {time.monotonic() - started:.1f} s at {url}")
    path = f"/v1/datasets/{args.dataset}/predict"
    answers: list[tuple[int, str | None, str, float, float]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def load(seed: int) -> None:
        with httpx.Client(base_url=url, timeout=args.timeout) as client:
            i = seed
            while not stop.is_set() and len(answers) < 100_000:
                sent = time.monotonic()
                nodes = [(i * 7919 + k) % 1000 for k in range(args.nodes)]
                try:
                    r = client.post(path, json={"nodes": nodes})
                    row = (r.status_code, r.headers.get("Retry-After"), r.text[:200], sent)
                except httpx.TimeoutException:
                    row = (-1, None, "client timeout", sent)
                with lock:
                    answers.append((*row, time.monotonic() - sent))
                i += args.threads

    threads: list[threading.Thread] = []
    try:
        before: dict[str, int] = {}

        def both() -> bool:
            before.update(ray_backend.replica_pids(args.dataset))
            return len(before) >= args.replicas

        _poll(both, 60, "every replica answering")
        threads += [threading.Thread(target=load, args=(k,)) for k in range(args.threads)]
        for t in threads:
            t.start()
        _poll(lambda: len(answers) >= args.warmup, 120, "warm-up answers")
        victim_id, victim_pid = sorted(before.items())[0]
        killed_at = time.monotonic()
        os.kill(victim_pid, signal.SIGKILL)
        now: dict[str, int] = {}

        def back() -> bool:
            now.clear()
            now.update(ray_backend.replica_pids(args.dataset, calls=8))
            return len(now) >= args.replicas and victim_id not in now

        _poll(back, 120, "the replacement replica")
        back_at = time.monotonic()
        _poll(lambda: sum(a[3] > back_at for a in answers) >= args.after, 120, "answers after")
    finally:
        stop.set()
        for t in threads:
            t.join(args.timeout + 5)
        ray_backend.shutdown_ray()
    codes = collections.Counter(a[0] for a in answers)
    bad_503 = [a for a in answers if a[0] == 503 and (a[1] is None or '"detail"' not in a[2])]
    figures = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "replicas": args.replicas,
        "threads": args.threads,
        "nodes_per_request": args.nodes,
        "requests": len(answers),
        "status_counts": {str(k): v for k, v in sorted(codes.items())},
        "non_200": sum(v for k, v in codes.items() if k != 200),
        "non_200_during_outage": sum(
            1 for a in answers if a[0] != 200 and killed_at - 1 <= a[3] <= back_at
        ),
        "503_without_retry_after_or_detail": len(bad_503),
        "recovery_s": round(back_at - killed_at, 2),
        "slowest_request_s": round(max(a[4] for a in answers), 3),
        "client_bound_s": args.timeout,
    }
    for key, value in figures.items():
        print(f"{key}: {value}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
