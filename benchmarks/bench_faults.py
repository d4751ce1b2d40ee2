"""A Ray replica killed under load: which answers are not 200, and how long until it is back.

Serves a repository on a local Ray (2 CPUs, no dashboard) with ``--replicas`` replicas of the
dataset's application (``gnnaas.serving.deploy.ray.run_ray``, the code of ``gnnaas serve
--backend ray``), runs a bounded closed-loop load (``--threads`` clients, sequential requests of
``--nodes`` nodes), kills one replica's process with SIGKILL once ``--warmup`` answers came back,
waits (polling, with a deadline) until Ray has replaced it, then runs ``--after`` more answers and
stops. Counts the answers by status, which of the non-200 answers were requests in flight at the
kill (sent before it, answered after it), checks every 503 for ``Retry-After`` and a
``{"detail": ...}`` body, and measures the time from the kill until the replacement answers and
the slowest request against the client's bound.

Writes ``faults.json`` and ``faults.md`` (generated from it; ``benchmarks/results/`` unless
``--out``); ``--render faults.json`` rewrites the page from a saved run.

Example:
    python benchmarks/bench_faults.py --variants .cache/bench/variants \\
        --profiles .cache/bench/profiles --dataset synth-flickr@0.2
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from common import RESULTS, machine_info, render_saved, save_results, say

RECOVERY_GOAL_S = 30.0


@dataclass(frozen=True)
class _Answer:
    status: int  # -1: the client's bound passed; -2: a connection error
    retry_after: str | None
    body: str
    sent: float
    took_s: float


def _poll(cond: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench_faults: {what} not within {timeout_s} s")
        pause.wait(0.05)


def _load_average() -> list[float]:
    return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class _Load:
    """The closed-loop clients: ``--threads`` clients, each sending one request after another."""

    args: argparse.Namespace
    answers: list[_Answer] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self, url: str) -> None:
        """Starts every client, sending to the server at ``url``."""
        self.threads = [
            threading.Thread(target=self._client, args=(url, k)) for k in range(self.args.threads)
        ]
        for t in self.threads:
            t.start()

    def close(self) -> None:
        """Stops the clients and waits for them (each at most its bound and a margin)."""
        self.stop.set()
        for t in self.threads:
            t.join(self.args.timeout + 5)

    def _client(self, url: str, seed: int) -> None:
        args = self.args
        path = f"/v1/datasets/{args.dataset}/predict"
        with httpx.Client(base_url=url, timeout=args.timeout) as client:
            i = seed
            while not self.stop.is_set() and len(self.answers) < 100_000:
                sent = time.monotonic()
                nodes = [(i * 7919 + k) % 1000 for k in range(args.nodes)]
                try:
                    r = client.post(path, json={"nodes": nodes})
                    row = (r.status_code, r.headers.get("Retry-After"), r.text[:300])
                except httpx.TimeoutException:
                    row = (-1, None, "client timeout")
                except httpx.TransportError as exc:
                    row = (-2, None, repr(exc)[:300])
                with self.lock:
                    self.answers.append(_Answer(*row, sent, time.monotonic() - sent))
                i += args.threads


def _replicas(args: argparse.Namespace) -> dict[str, int]:
    """The process id of every replica of the dataset, once all of them answer."""
    from gnnaas.serving.deploy import ray as ray_backend

    pids: dict[str, int] = {}

    def every() -> bool:
        pids.update(ray_backend.replica_pids(args.dataset))
        return len(pids) >= args.replicas

    _poll(every, 60, "every replica answering")
    return pids


def _kill_and_recover(
    args: argparse.Namespace, load: _Load, before: dict[str, int]
) -> tuple[float, float]:
    """After the warm-up answers, kills one replica and waits until its replacement answers and
    ``--after`` answers more came back: when it killed and when the replacement was back."""
    from gnnaas.serving.deploy import ray as ray_backend

    answers = load.answers
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
    _poll(lambda: sum(a.sent > back_at for a in answers) >= args.after, 120, "answers after")
    return killed_at, back_at


def _answer_counts(answers: list[_Answer], killed_at: float) -> dict[str, Any]:
    """The answers by status, and which of the non-200 ones were in flight at ``killed_at``."""
    codes = collections.Counter(a.status for a in answers)
    in_flight = [a for a in answers if a.sent <= killed_at <= a.sent + a.took_s]
    not_ok = [a for a in answers if a.status != 200]
    bad_503 = [
        a for a in not_ok if a.status == 503 and (a.retry_after is None or '"detail"' not in a.body)
    ]
    return {
        "requests": len(answers),
        "status_counts": {str(k): v for k, v in sorted(codes.items())},
        "in_flight_at_kill": len(in_flight),
        "non_200": len(not_ok),
        "non_200_not_in_flight": sum(1 for a in not_ok if a not in in_flight),
        "503_without_retry_after_or_detail": len(bad_503),
        "non_200_bodies": sorted({a.body for a in not_ok})[:5],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The fault run: its figures."""
    from gnnaas.serving.core.settings import Settings
    from gnnaas.serving.deploy import ray as ray_backend

    port = _free_port()
    settings = Settings(
        variants_dir=args.variants,
        profiles_dir=args.profiles,
        datasets=[args.dataset],
        device="cpu",
        torch_threads=1,
    )
    load_before = _load_average()
    started = time.monotonic()
    ray_backend.start_ray(num_cpus=2, port=port)
    load = _Load(args)
    try:
        url = ray_backend.run_ray(
            settings, replicas=args.replicas, port=port, replica_cpus=2 / (args.replicas + 1)
        )
        up_s = time.monotonic() - started
        print(f"up in {up_s:.1f} s at {url}")
        before = _replicas(args)
        load.start(url)
        killed_at, back_at = _kill_and_recover(args, load, before)
    finally:
        load.close()
        ray_backend.shutdown_ray()
    machine = machine_info()
    return {
        "machine": f"{machine['cpu']}, {machine['cores']} cores",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load_average_before": load_before,
        "load_average_after": _load_average(),
        "args": {k: v for k, v in vars(args).items() if k not in ("out", "render")},
        "start_s": round(up_s, 1),
        **_answer_counts(load.answers, killed_at),
        "recovery_s": round(back_at - killed_at, 2),
        "slowest_request_s": round(max(a.took_s for a in load.answers), 3),
        "client_bound_s": args.timeout,
    }


def render(f: dict[str, Any]) -> str:
    """``faults.md`` from the figures."""
    a = f["args"]
    statuses = ", ".join(f"{k}: {v:,}" for k, v in f["status_counts"].items())
    only_in_flight = f["non_200_not_in_flight"] == 0 and f["503_without_retry_after_or_detail"] == 0
    recovered = "met" if f["recovery_s"] <= RECOVERY_GOAL_S else "**not met**"
    lines = [
        f"# A Ray replica killed under load ({a['dataset']})",
        "",
        f"Machine: {f['machine']}; local Ray 2.60 with 2 CPUs, no dashboard; client on the same "
        f"machine. Run {f['date']}; load average (1, 5, 15 min) before "
        f"{', '.join(f'{v:.2f}' for v in f['load_average_before'])}, after "
        f"{', '.join(f'{v:.2f}' for v in f['load_average_after'])}.",
        f"Command: `python benchmarks/bench_faults.py --variants {a['variants']} --profiles "
        f"{a['profiles']} --dataset {a['dataset']} --replicas {a['replicas']} --threads "
        f"{a['threads']}`.",
        "",
        f"{a['replicas']} replicas of the dataset's application (each the whole app), "
        f"{a['threads']} clients sending {a['nodes']}-node requests one after another (bound "
        f"{a['timeout']:g} s per request); one replica's process killed with SIGKILL after "
        f"{a['warmup']} answers; the run goes on until Ray's replacement answers and "
        f"{a['after']} answers more. A request whose replica dies is answered by gnnaas's "
        "middleware in Serve's proxy (`gnnaas.serving.deploy.proxy`).",
        "",
        "| figure | value | goal |",
        "|---|---:|---|",
        f"| requests | {f['requests']:,} | |",
        f"| answers by status | {statuses} | |",
        f"| requests in flight at the kill (any replica) | {f['in_flight_at_kill']} | |",
        f"| non-200 answers not in flight at the kill | {f['non_200_not_in_flight']} | 0: "
        f"{'met' if only_in_flight else '**not met**'} |",
        f"| 503 without `Retry-After` or a `detail` | {f['503_without_retry_after_or_detail']} "
        "| 0 |",
        f"| time from the kill until the replacement answers | {f['recovery_s']:.1f} s | ≤ "
        f"{RECOVERY_GOAL_S:g} s: {recovered} |",
        f"| slowest request | {1e3 * f['slowest_request_s']:,.0f} ms | under the client's bound "
        f"({f['client_bound_s']:g} s) |",
        f"| time to start (Ray, Serve, the replicas) | {f['start_s']:.1f} s | |",
        "",
    ]
    if f["non_200_bodies"]:
        lines += ["Bodies of the non-200 answers:", ""]
        lines += [f"- `{body}`" for body in f["non_200_bodies"]]
        lines.append("")
    lines += [
        "A request that *is* running inside the replica when it dies gets the 503:",
        "`tests/serving/test_ray_faults.py::test_request_in_flight_on_a_killed_replica_gets_503` "
        "holds one inside a toy model, kills its only replica, and checks the 503 with "
        "`Retry-After` and the detail (answered on Ray's death notice) and the replacement; the "
        "other test of that file kills one of two replicas under load (only 200 or such 503s, no "
        "timeout, 200 after recovery).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Runs the fault benchmark, prints its figures and writes them."""
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
    parser.add_argument("--out", type=Path, default=RESULTS, help="(default: benchmarks/results)")
    parser.add_argument("--render", type=Path, help="rewrite the page from a saved JSON")
    args = parser.parse_args(argv)
    if args.render:
        render_saved(args.render, render)
        return 0
    figures = run(args)
    for key, value in figures.items():
        say(f"{key}: {value}")
    save_results("faults", figures, render, args.out)
    return 0


if __name__ == "__main__":
    from common import exit_status

    raise SystemExit(exit_status(main))
