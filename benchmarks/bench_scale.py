"""Scale: one process, worker processes and Ray Serve against one load, with their floors.

Servers (``--backends``), on free 127.0.0.1 ports:

- ``single``: ``gnnaas serve`` (one process, the default);
- ``workers2``: ``gnnaas serve --workers 2``;
- ``trivial``: ``benchmarks/trivial_app.py`` on plain uvicorn (the floor of that stack);
- ``ray1`` / ``ray2``: gnnaas on Ray Serve (``gnnaas.serving.deploy.ray.run_ray``, the code of
  ``gnnaas serve --backend ray``; needs the ``[ray]`` extra): the dataset's application with 1 / 2
  replicas, each the whole app, and the catalog, on a local Ray with ``num_cpus=2`` started in
  this process, next to the trivial app deployed on the same Serve proxy under ``/trivial``
  with as many replicas (``trivial-ray@rayN``, the floor of the Ray stack), measured together
  with ``single`` again
  (``single@rayN``).

The process servers are measured first, interleaved; then each Ray deployment, interleaved with
its floor and the single process.

For every request size (1 and 64 random test nodes of ``--dataset``, router at
``X-Accuracy-Tolerance: 2``) each server's sustained rate is measured the way ``bench_policy.py``
measures a policy (the same load generator, closed-loop steps at rising concurrency, the same p99
bounds of 20 and 50 ms, servers interleaved slice by slice at every level, ``--repeats`` times),
and its sequential p50 (one request in flight; servers alternated in rounds).

CPU per answered request, from ``/proc`` (user + system of every thread): the process servers in
one closed-loop step of single-node requests at 32 clients (their rate); the Ray group, per size,
in steps at 4 clients with gnnaas and the trivial app alternated slice by slice, by process role
(Serve's proxy, gnnaas's replicas, its catalog, the trivial app's replica, the rest of Ray), next
to one gnnaas process serving the same requests one at a time (``single alone``: each request in
a batch of its own, as on Ray at its rate) and at 4 clients. Memory: the proportional set size
(PSS) of each server's processes after the run, which counts shared pages once.

Writes ``scale.json`` and ``scale.md`` (generated from it; ``benchmarks/results/`` unless
``--out``; ``--stem`` names them), with the machine's load average before and after the run;
``--render scale.json`` rewrites the page from a saved run.

Example:
    python benchmarks/bench_scale.py --backends single workers2 trivial --repeats 1 --step-s 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import importlib.util
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gnnaas.stats import median, percentile

from common import (
    QUICK,
    RESULTS,
    machine_info,
    make_bodies,
    prepare,
    render_saved,
    save_results,
    say,
    serve_cmd,
    test_nodes,
    tree_pids,
    tree_pss_mb,
    trivial_cmd,
    wait_idle,
)
from loadgen import ServerProcess, StepSpec, free_port, run_closed
from measure import Policy, sustained_interleaved

__all__ = ["main"]

REPO = Path(__file__).resolve().parents[1]
BACKENDS = ("single", "workers2", "trivial", "ray1", "ray2")
ROUTER_HEADERS = {"X-Accuracy-Tolerance": "2"}
PROCESS_COST_CLIENTS = 32  # near the process servers' sustained rate (policy.md, scale.md)
RAY_COST_CLIENTS = 4  # near Ray's: its p99 passes 20 ms from a few clients on this machine
CPU_GOAL_FACTOR = 1.2  # the issue's: trivial on Ray + 1.2x one process's CPU for the request
SEQ_GOAL_MS = 1.0
RATE_GOAL = 0.85


def have_ray() -> bool:
    """Whether the ``[ray]`` extra is installed."""
    return importlib.util.find_spec("ray") is not None


def load_average() -> list[float]:
    """The machine's 1, 5 and 15 minute load averages."""
    return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]


def backend_cmd(
    name: str, dataset: str, variants: Path, profiles: Path, port: int, device: str
) -> list[str]:
    """The command that serves ``name`` (a process backend) on 127.0.0.1:``port``."""
    if name == "trivial":
        return trivial_cmd(port)
    cmd = serve_cmd(dataset, variants, profiles, port, device)
    return [*cmd, "--workers", "2"] if name == "workers2" else cmd


def pss_mb(pids: Sequence[int]) -> float:
    """PSS (MB) of these processes together."""
    total_kb = 0
    for p in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total_kb += int(line.split()[1])
    return total_kb / 1024


_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) process ``pid`` has used; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy: user, nice, system, irq and softirq over
    every core (idle, iowait, time stolen by the hypervisor and guest time left out)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = ticks[:7]  # steal and guest left out
    return (user + nice + system + irq + softirq) * _TICK_S


def ray_roles(name: str = "gnnaas") -> dict[str, list[int]]:
    """This machine's processes of the local Ray by role, from their process titles (a replica
    is ``ray::ServeReplica:<application>:<deployment>``)."""
    roles: dict[str, list[int]] = {}
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            title = (entry / "cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
        except OSError:
            continue
        if title.startswith("ray::ProxyActor"):
            role = "proxy"
        elif title.startswith(f"ray::ServeReplica:{name}:CatalogApp"):
            role = "catalog"
        elif title.startswith(f"ray::ServeReplica:{name}-") and ":DatasetApp" in title:
            role = "gnnaas replicas"
        elif title.startswith("ray::ServeReplica:trivial"):
            role = "trivial app"
        elif title.startswith("ray::") or "/ray/" in title:
            role = "rest of Ray"
        else:
            continue
        roles.setdefault(role, []).append(int(entry.name))
    return roles


@dataclasses.dataclass
class CostEntry:
    """A server in a CPU step: its name, URL, headers, the process groups to count, clients."""

    key: str
    url: str
    headers: dict[str, str]
    groups: Callable[[], dict[str, list[int]]]
    concurrency: int


def cpu_costs(
    entries: Sequence[CostEntry], bodies: list[bytes], *, requests: int, slices: int
) -> dict[str, dict[str, Any]]:
    """CPU per answered request of each entry's process groups, of the client and the machine.

    Each entry gets ``requests`` requests, in ``slices`` closed-loop slices taken in turn with
    the other entries' (so a change in the machine's load during the run hits every entry
    alike); the CPU its groups used during its slices is divided by the requests answered
    (``server_ms``, by group), and each slice's total by its own answers (``slices_ms``: slice
    ``i`` of every entry belongs to round ``i``, for paired comparisons).
    ``machine_busy_cores`` is how many of the machine's cores were busy on average during its
    slices (servers, client and anything else).
    """
    acc = {
        e.key: {
            "cpu": {},
            "ok": 0,
            "sent": 0,
            "wall": 0.0,
            "client": 0.0,
            "busy": 0.0,
            "slices": [],
        }
        for e in entries
    }
    for part in range(slices):
        for entry in entries[part % len(entries) :] + entries[: part % len(entries)]:
            groups = entry.groups()
            before = {g: {p: process_cpu_s(p) for p in pids} for g, pids in groups.items()}
            busy0, t0 = machine_busy_s(), time.perf_counter()
            spec = StepSpec(
                rate_rps=0.0,
                duration_s=120.0,
                max_requests=max(requests // slices, 1),
                concurrency=entry.concurrency,
                seed=part,
            )
            step = asyncio.run(run_closed(entry.url, bodies, entry.headers, spec))
            a = acc[entry.key]
            a["wall"] += time.perf_counter() - t0
            a["busy"] += machine_busy_s() - busy0
            a["ok"] += int(step.ok.sum())
            a["sent"] += step.sent
            a["client"] += step.client_cpu_s
            in_slice = 0.0
            for g, start in before.items():
                # a process gone by the end (a Ray worker replaced) has lost its count: left out
                used = sum(after - t for p, t in start.items() if (after := process_cpu_s(p)) > 0)
                a["cpu"][g] = a["cpu"].get(g, 0.0) + used
                in_slice += used
            a["slices"].append(1e3 * in_slice / max(int(step.ok.sum()), 1))
    out = {}
    for entry in entries:
        a = acc[entry.key]
        ok = max(a["ok"], 1)
        out[entry.key] = {
            "concurrency": entry.concurrency,
            "requests": a["sent"],
            "rate_rps": a["ok"] / max(a["wall"], 1e-9),
            "server_ms": {g: 1e3 * v / ok for g, v in sorted(a["cpu"].items())},
            "client_ms": 1e3 * a["client"] / ok,
            "machine_busy_cores": a["busy"] / max(a["wall"], 1e-9),
            "slices_ms": a["slices"],
        }
    return out


def scrape_cost(url: str, scrapes: int = 20) -> dict[str, float]:
    """``/metrics`` of the Ray deployment (the catalog merging every replica's): latency p50,
    CPU of the local Ray's processes per scrape, and the text's size."""
    import httpx

    roles = ray_roles()
    before = {p: process_cpu_s(p) for pids in roles.values() for p in pids}
    took, size = [], 0
    with httpx.Client(timeout=30) as client:
        for _ in range(scrapes):
            t0 = time.perf_counter()
            size = len(client.get(url).content)
            took.append(1e3 * (time.perf_counter() - t0))
    used = sum(after - t for p, t in before.items() if (after := process_cpu_s(p)) > 0)
    return {
        "p50_ms": percentile(took, 50),
        "cpu_ms_per_scrape": 1e3 * used / scrapes,
        "bytes": float(size),
    }


def sequential_p50s(
    pols: Sequence[Policy], bodies: list[bytes], n: int, rounds: int = 5
) -> dict[str, float]:
    """p50 (ms) of ``n`` requests per policy sent one at a time, in ``rounds`` rounds that take
    the policies in turn."""
    latencies: dict[str, list[np.ndarray]] = {p.key: [] for p in pols}
    for r in range(rounds):
        for pol in pols[r % len(pols) :] + pols[: r % len(pols)]:
            spec = StepSpec(
                rate_rps=0.0, duration_s=60.0, max_requests=max(n // rounds, 1), concurrency=1
            )
            step = asyncio.run(run_closed(pol.url or "", bodies, pol.headers, spec))
            latencies[pol.key].append(step.latency_ms[np.isfinite(step.latency_ms)])
    return {k: percentile(np.concatenate(v), 50) for k, v in latencies.items()}


def measure(
    pols: list[Policy],
    nodes: Any,
    args: argparse.Namespace,
    results: dict[str, Any],
    idle: list[ServerProcess],
    dataset: str,
    *,
    floors_at_64: bool = False,
    no_rate: Sequence[str] = (),
) -> None:
    """Sequential p50 of every policy and sustained rate of those not in ``no_rate``, per
    request size, into ``results``."""
    for size, bound_ms in ((1, 20.0), (64, 50.0)):
        if size not in args.sizes:
            continue
        bodies = make_bodies(nodes, size, 512, seed=size)
        group = [p for p in pols if size == 1 or floors_at_64 or not p.key.startswith("trivial")]
        if not group:
            continue
        for pol in group:  # warm-up
            spec = StepSpec(rate_rps=0.0, duration_s=1.0, max_requests=400, concurrency=2)
            asyncio.run(run_closed(pol.url or "", bodies, pol.headers, spec))
        seq = results["sequential_p50_ms"].setdefault(str(size), {})
        seq.update(sequential_p50s(group, bodies, args.sequential))
        say(f"size {size}: sequential p50 " + ", ".join(
            f"{p.key} {seq[p.key]:.2f} ms" for p in group
        ))  # fmt: skip
        block = results["sizes"].setdefault(str(size), {"bound_ms": bound_ms, "repeats": []})
        for r in range(args.repeats):
            for server in idle:
                wait_idle(server, dataset)
            racing = [p for p in group if p.key not in no_rate]
            measured = sustained_interleaved("", bodies, racing, args, bound_ms, rotate=r)
            say(f"size {size} repeat {r + 1}: " + ", ".join(
                f"{k} {v['rate_rps']:.0f}" for k, v in measured.items()
            ) + f" req/s at p99 <= {bound_ms:g} ms")  # fmt: skip
            if len(block["repeats"]) <= r:
                block["repeats"].append({})
            block["repeats"][r].update(measured)


def _ray_phase(
    args: argparse.Namespace,
    results: dict[str, Any],
    stack: contextlib.ExitStack,
    servers: dict[str, ServerProcess],
    nodes: Any,
    dataset: str,
    folders: tuple[Path, Path],
) -> None:
    """gnnaas on a local Ray (1 then 2 replicas) next to the trivial app on the same proxy."""

    from gnnaas.serving.core.settings import Settings
    from gnnaas.serving.deploy import ray as ray_backend

    sys.path.insert(0, str(REPO / "benchmarks"))
    import trivial_app

    route = f"/v1/datasets/{dataset}/predict"
    port = free_port()
    settings = Settings(
        variants_dir=folders[0],
        profiles_dir=folders[1],
        datasets=[dataset],
        device="cpu",
        torch_threads=1,
    )
    ray_backend.start_ray(num_cpus=2, host="127.0.0.1", port=port)
    stack.callback(ray_backend.shutdown_ray)
    base = f"http://127.0.0.1:{port}"
    single = servers.get("single")
    for name in [b for b in args.backends if b.startswith("ray")]:
        replicas = int(name[-1])
        say(f"deploying gnnaas on Ray with {replicas} replica(s)")
        # One CPU of Ray's 2 for the dataset's replicas whatever their number, so a
        # redeployment fits beside the replicas it replaces (Serve starts the new ones first).
        # A reservation, not a limit.
        t0 = time.monotonic()
        ray_backend.run_ray(settings, replicas=replicas, port=port, replica_cpus=1.0 / replicas)
        results.setdefault("ray_start_s", {})[name] = time.monotonic() - t0
        # The floor with as many replicas as gnnaas (Serve updates it in place).
        ray_backend.run_asgi_app(
            trivial_app.create_app, name="trivial", route_prefix="/trivial", replicas=replicas
        )
        gnnaas = Policy(name, ROUTER_HEADERS, None, url=f"{base}{route}")
        floor = Policy(f"trivial-ray@{name}", {}, None, url=f"{base}/trivial{route}")
        group = [gnnaas, floor]
        single_url = f"{single.base_url}{route}" if single is not None else ""
        if single is not None:
            group.append(Policy(f"single@{name}", ROUTER_HEADERS, None, url=single_url))
        idle = [single] if single is not None else []
        # Ray's steps with its own repeats, length and levels: its p99 reaches the bound at one
        # or two clients, where a short step's p99 is a few requests' latency.
        ray_args = argparse.Namespace(**{
            **vars(args),
            "repeats": args.ray_repeats,
            "step_s": args.ray_step_s,
            "concurrency": args.ray_concurrency,
        })  # fmt: skip
        measure(group, nodes, ray_args, results, idle, dataset, floors_at_64=True,
                no_rate=[f"single@{name}"])  # fmt: skip
        for size in args.sizes:
            bodies = make_bodies(nodes, size, 512, seed=size)
            entries = [
                CostEntry(name, gnnaas.url or "", ROUTER_HEADERS, ray_roles, RAY_COST_CLIENTS),
                CostEntry(floor.key, floor.url or "", {}, ray_roles, RAY_COST_CLIENTS),
            ]
            if single is not None:
                tree = {"server": tree_pids(single.pid)}

                def the_single(t: dict[str, list[int]] = tree) -> dict[str, list[int]]:
                    return t

                entries += [
                    CostEntry(f"single alone@{name}", single_url, ROUTER_HEADERS, the_single, 1),
                    CostEntry(
                        f"single@{name}", single_url, ROUTER_HEADERS, the_single, RAY_COST_CLIENTS
                    ),
                ]
            costs = cpu_costs(
                entries, bodies, requests=args.ray_cost_requests, slices=args.ray_cost_rounds
            )
            results["cpu"].setdefault(str(size), {}).update(costs)
            for key, cost in costs.items():
                say(f"cpu {size}-node {key}: {sum(cost['server_ms'].values()):.2f} ms "
                    f"({cost['rate_rps']:.0f} req/s)")  # fmt: skip
        results.setdefault("metrics_scrape", {})[name] = scrape_cost(f"{base}/metrics")
        say(f"/metrics on {name}: {results['metrics_scrape'][name]}")
        roles = ray_roles()
        results["memory_pss_mb"][name] = pss_mb(roles.get("gnnaas replicas", []))
        results["memory_pss_mb"][f"{name} catalog"] = pss_mb(roles.get("catalog", []))
        results.setdefault("ray_replica_pids", {})[name] = ray_backend.replica_pids(dataset)


def run(args: argparse.Namespace) -> dict[str, Any]:
    cfg = dataclasses.replace(QUICK, dataset=args.dataset)
    workdir = Path(args.workdir).resolve()  # Ray replicas and server processes read it too
    variants_dir, profiles_dir = prepare(cfg, workdir, "cpu")
    nodes = test_nodes(cfg.dataset, workdir)
    route = f"/v1/datasets/{cfg.dataset}/predict"
    env = {"GNNAAS_TORCH_THREADS": "1"}
    results: dict[str, Any] = {
        "dataset": cfg.dataset,
        "machine": machine_info(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load_average_before": load_average(),
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "sizes": {},
        "sequential_p50_ms": {},
        "memory_pss_mb": {},
        "cpu_1_node": {},
        "cpu": {},
    }
    procs = [b for b in args.backends if b in ("single", "workers2", "trivial")]
    rays = [b for b in args.backends if b in ("ray1", "ray2")]
    if rays and "single" not in procs:
        procs.insert(0, "single")  # the reference of the Ray goals
    with contextlib.ExitStack() as stack:
        servers: dict[str, ServerProcess] = {}
        for name in procs:
            port = free_port()
            while any(s.port == port for s in servers.values()):
                port = free_port()
            cmd = backend_cmd(name, cfg.dataset, variants_dir, profiles_dir, port, "cpu")
            say(f"starting {name}: {' '.join(cmd[2:])}")
            log = workdir / f"scale-{name}.log"
            servers[name] = stack.enter_context(ServerProcess(cmd, port, log, env=env))

        def policy(name: str, base_url: str) -> Policy:
            headers = {} if name.startswith("trivial") else ROUTER_HEADERS
            return Policy(name, headers, None, url=f"{base_url}{route}")

        measured = [n for n in procs if n in args.backends]
        idle = [s for n, s in servers.items() if n != "trivial"]
        pols = [policy(n, servers[n].base_url) for n in measured]
        measure(pols, nodes, args, results, idle, cfg.dataset)
        single_bodies = make_bodies(nodes, 1, 512, seed=1)
        for name, pol in zip(measured, pols, strict=True):
            server = servers[name]
            results["memory_pss_mb"][name] = tree_pss_mb(server.pid)
            tree = {"server": tree_pids(server.pid)}
            entry = CostEntry(name, pol.url or "", pol.headers, lambda t=tree: t,
                              PROCESS_COST_CLIENTS)  # fmt: skip
            results["cpu_1_node"].update(
                cpu_costs([entry], single_bodies, requests=args.cost_requests, slices=1)
            )
            say(f"cpu {name}: {results['cpu_1_node'][name]}")
        if rays:
            _ray_phase(
                args, results, stack, servers, nodes, cfg.dataset, (variants_dir, profiles_dir)
            )
    results["load_average_after"] = load_average()
    return results


# -- the report ----------------------------------------------------------------------------------


def _median(values: Sequence[float]) -> str:
    return f"{median(values):,.0f} ({min(values):,.0f}–{max(values):,.0f})"


def _rates(results: dict[str, Any], size: str, key: str) -> list[float]:
    block = results["sizes"].get(size, {"repeats": []})
    return [rep[key]["rate_rps"] for rep in block["repeats"] if key in rep]


def _total(cost: dict[str, Any]) -> float:
    return float(sum(cost["server_ms"].values()))


def _ray_goals(results: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The issue's Ray goals for one deployment, each with its figures and whether it is met."""
    goals: list[dict[str, Any]] = []
    floor = f"trivial-ray@{name}"
    seq = results["sequential_p50_ms"].get("1", {})
    if name in seq and floor in seq:
        extra = seq[name] - seq[floor]
        goals.append({
            "goal": f"1-node sequential p50 over the trivial app on Ray ≤ {SEQ_GOAL_MS:g} ms",
            "value": f"{extra:+.2f} ms ({seq[name]:.2f} vs {seq[floor]:.2f})",
            "met": extra <= SEQ_GOAL_MS,
        })  # fmt: skip
    mine, base = _rates(results, "1", name), _rates(results, "1", floor)
    if mine and base and all(b > 0 for b in base):
        ratio = median(m / b for m, b in zip(mine, base, strict=True))
        goals.append({
            "goal": "1-node sustained rate at p99 ≤ 20 ms / the trivial app's on Ray "
            f"≥ {RATE_GOAL}",
            "value": f"{ratio:.2f} (median of repeats)",
            "met": ratio >= RATE_GOAL,
        })  # fmt: skip
    cpu = results["cpu"].get("1", {})
    if name in cpu and floor in cpu:
        ratio = cpu[name]["rate_rps"] / max(cpu[floor]["rate_rps"], 1e-9)
        goals.append({
            "goal": f"1-node closed-loop rate at {RAY_COST_CLIENTS} clients / the trivial app's "
            f"on Ray ≥ {RATE_GOAL}",
            "value": f"{ratio:.2f} ({cpu[name]['rate_rps']:.0f} vs {cpu[floor]['rate_rps']:.0f} "
            "req/s)",
            "met": ratio >= RATE_GOAL,
        })  # fmt: skip
    for size, costs in results["cpu"].items():
        alone = costs.get(f"single alone@{name}")
        if name not in costs or floor not in costs or alone is None:
            continue
        excess = _paired_excess(costs[name], costs[floor], alone)
        if excess is not None:
            low, high = median_interval(excess)
            mid = median(excess)
            goals.append({
                "goal": f"{size}-node CPU per request ≤ the trivial app's on Ray + "
                f"{CPU_GOAL_FACTOR:g} × one process's (request alone), median over rounds",
                "value": f"{mid:+.2f} ms over the bound (95% interval {low:+.2f} to "
                f"{high:+.2f}; met in {sum(e <= 0 for e in excess)} of {len(excess)} rounds)",
                "met": mid <= 0,
            })  # fmt: skip
            continue
        bound = _total(costs[floor]) + CPU_GOAL_FACTOR * _total(alone)
        goals.append({
            "goal": f"{size}-node CPU per request ≤ the trivial app's on Ray + "
            f"{CPU_GOAL_FACTOR:g} × one process's (request alone)",
            "value": f"{_total(costs[name]):.2f} ms vs {_total(costs[floor]):.2f} + "
            f"{CPU_GOAL_FACTOR:g} × {_total(alone):.2f} = {bound:.2f} ms",
            "met": _total(costs[name]) <= bound,
        })  # fmt: skip
    return goals


def median_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval of the median of ``values``: the order statistics
    ``x(k)``, ``x(n+1-k)`` for the largest ``k`` with ``P(Binomial(n, 1/2) < k) <= (1-level)/2``
    (:func:`scipy.stats.quantile_test`'s interval; the whole range when ``n`` is too small for
    ``level``, where scipy gives NaN)."""
    from scipy.stats import quantile_test

    ci = quantile_test(values, p=0.5).confidence_interval(level)
    low, high = float(ci.low), float(ci.high)
    return (
        min(values) if math.isnan(low) else low,
        max(values) if math.isnan(high) else high,
    )


def _paired_excess(
    mine: dict[str, Any], floor: dict[str, Any], alone: dict[str, Any]
) -> list[float] | None:
    """Per round of the CPU steps: gnnaas's CPU per request on Ray over the goal's bound (the
    trivial app's in the same round + 1.2 × one process's alone in the same round); ``None``
    for a run saved before per-round figures."""
    rounds = [c.get("slices_ms") for c in (mine, floor, alone)]
    if any(not r for r in rounds) or len({len(r) for r in rounds}) != 1:
        return None
    return [m - f - CPU_GOAL_FACTOR * a for m, f, a in zip(*rounds, strict=True)]


def _verdicts(results: dict[str, Any]) -> list[str]:
    """The goals, computed from the run (only for what was measured)."""
    lines = ["## Goals", ""]
    for size in results["sizes"]:
        single, workers = _rates(results, size, "single"), _rates(results, size, "workers2")
        if single and workers:
            ratio = median(w / s for w, s in zip(workers, single, strict=True))
            lines.append(
                f"- {size}-node: `--workers 2` / one process = {ratio:.2f} of its sustained rate "
                "(median of repeats)"
            )
    lines.append("")
    for name in ("ray1", "ray2"):
        goals = _ray_goals(results, name)
        if not goals:
            continue
        lines += [f"gnnaas on Ray, `{name}`:", "", "| goal | measured | met |", "|---|---|---|"]
        for g in goals:
            lines.append(f"| {g['goal']} | {g['value']} | {'yes' if g['met'] else '**no**'} |")
        lines.append("")
    return lines


def _cpu_tables(results: dict[str, Any]) -> list[str]:
    """Where the CPU of a request goes, per server."""
    cores = results["machine"].get("cores", "?")
    lines: list[str] = []
    costs = results.get("cpu_1_node", {})
    if costs:
        lines += [
            "## CPU per single-node request, process servers",
            "",
            f"One closed-loop step per server at {PROCESS_COST_CLIENTS} clients: CPU milliseconds "
            f"its processes used per answered request, the client's, and how many of the "
            f"machine's {cores} cores were busy on average.",
            "",
            "| server | req/s | server CPU ms/request | client CPU ms/request | busy cores |",
            "|---|---:|---:|---:|---:|",
        ]
        for key, c in costs.items():
            lines.append(
                f"| {key} | {c['rate_rps']:,.0f} | {_total(c):.2f} | {c['client_ms']:.2f} "
                f"| {c['machine_busy_cores']:.2f} |"
            )
        lines.append("")
    for size, group in results.get("cpu", {}).items():
        lines += [
            f"## CPU per {size}-node request, Ray",
            "",
            f"gnnaas on Ray and the trivial app on Ray at {RAY_COST_CLIENTS} clients, taken in "
            "turn in slices; CPU milliseconds per answered request of every process of the local "
            "Ray by role (each step counts them all: a role idle in a step shows what it costs at "
            "rest). `single alone`: one gnnaas process serving the same requests one at a time; "
            f"`single`: at {RAY_COST_CLIENTS} clients.",
            "",
            "| server | clients | req/s | CPU ms/request | by role | client CPU ms/request "
            "| busy cores |",
            "|---|---:|---:|---:|---|---:|---:|",
        ]
        for key, c in group.items():
            roles = ", ".join(f"{g} {ms:.2f}" for g, ms in c["server_ms"].items())
            lines.append(
                f"| {key} | {c['concurrency']} | {c['rate_rps']:,.0f} | {_total(c):.2f} "
                f"| {roles} | {c['client_ms']:.2f} | {c['machine_busy_cores']:.2f} |"
            )
        lines.append("")
    return lines


def _reading(results: dict[str, Any]) -> list[str]:
    """What the figures say, written from them."""
    lines = ["## Reading", ""]
    for name in ("ray1", "ray2"):
        for size, group in results.get("cpu", {}).items():
            floor = group.get(f"trivial-ray@{name}")
            mine = group.get(name)
            alone = group.get(f"single alone@{name}")
            if floor is None or mine is None:
                continue
            ours, theirs = mine["server_ms"], floor["server_ms"]
            app = ours.get("gnnaas replicas", 0.0) - theirs.get("trivial app", 0.0)
            proxy = ours.get("proxy", 0.0) - theirs.get("proxy", 0.0)
            rest = ours.get("rest of Ray", 0.0) - theirs.get("rest of Ray", 0.0)
            idle_ours = ours.get("catalog", 0.0) + ours.get("trivial app", 0.0)
            idle_theirs = theirs.get("catalog", 0.0) + theirs.get("gnnaas replicas", 0.0)
            text = (
                f"- `{name}`, {size}-node requests: {_total(mine):.2f} ms of CPU per request on "
                f"Ray against {_total(floor):.2f} for the trivial app on the same Serve "
                f"({_total(mine) - _total(floor):+.2f}). The app's replicas: gnnaas "
                f"{ours.get('gnnaas replicas', 0.0):.2f}, the trivial app "
                f"{theirs.get('trivial app', 0.0):.2f} ({app:+.2f}); Serve's proxy {proxy:+.2f}; "
                f"the rest of Ray {rest:+.2f}; the replicas idle in each step (the catalog and "
                f"the other app) {idle_ours:.2f} vs {idle_theirs:.2f}."
            )
            if alone is not None:
                text += (
                    f" One gnnaas process spends {_total(alone):.2f} ms on the same request "
                    f"served alone, HTTP included: the replica's extra is {app / _total(alone):.2f}"
                    "× that."
                )
            lines.append(text)
    lines.append(
        f"- Load average of the machine (1, 5, 15 min) before the run "
        f"{', '.join(f'{v:.2f}' for v in results['load_average_before'])}, after "
        f"{', '.join(f'{v:.2f}' for v in results.get('load_average_after', []))}."
    )
    lines.append("")
    return lines


def _ray_flags(a: dict[str, Any]) -> list[str]:
    """The Ray options of the command, for a run that had them."""
    if "ray_repeats" not in a or not any(b.startswith("ray") for b in a["backends"]):
        return []
    return [
        f"--ray-repeats {a['ray_repeats']}",
        f"--ray-step-s {a['ray_step_s']:g}",
        f"--ray-concurrency {' '.join(map(str, a['ray_concurrency']))}",
        f"--ray-cost-rounds {a['ray_cost_rounds']}",
        f"--ray-cost-requests {a['ray_cost_requests']}",
    ]


def render(results: dict[str, Any]) -> str:
    m = results["machine"]
    a = results["args"]
    lines = [
        f"# Scale: one process, worker processes, Ray Serve ({results['dataset']})",
        "",
        f"Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, torch {m.get('torch', '?')}; "
        "client (load generator) and servers on the same machine; every server on one torch "
        f"thread per process. Run {results.get('date', '?')}.",
        "Command: `python benchmarks/bench_scale.py "
        + " ".join(
            [f"--dataset {a['dataset']}", f"--backends {' '.join(a['backends'])}"]
            + [f"--repeats {a['repeats']}", f"--step-s {a['step_s']:g}"]
            + [f"--concurrency {' '.join(map(str, a['concurrency']))}"]
            + _ray_flags(a)
        )
        + "`.",
        "",
        "Sustained rate: closed-loop throughput where p99 reaches the bound (as in `policy.md`), "
        f"median (min–max) of {a['repeats']} repeats, servers interleaved slice by slice. Router "
        "at `X-Accuracy-Tolerance: 2`. gnnaas on Ray: one application for the dataset (1 or 2 "
        "replicas, each the whole app) and the catalog; the trivial app on the same proxy, with as "
        "many replicas."
        + (
            f" On Ray: {a['ray_repeats']} repeats of {a['ray_step_s']:g}-s steps at "
            f"{', '.join(map(str, a['ray_concurrency']))} clients; the CPU steps in "
            f"{a['ray_cost_rounds']} rounds (every server once a round, in rotated order), the "
            "CPU goal judged on the median over rounds of each round's excess over its bound."
            if "ray_repeats" in a
            else ""
        ),
        "",
    ]
    for size, block in results["sizes"].items():
        seq = results["sequential_p50_ms"][size]
        lines += [
            f"## {size}-node requests, p99 ≤ {block['bound_ms']:g} ms",
            "",
            "| server | sustained req/s | sequential p50 ms |",
            "|---|---:|---:|",
        ]
        keys = [k for rep in block["repeats"] for k in rep]
        for key in dict.fromkeys(keys):
            rates = [rep[key]["rate_rps"] for rep in block["repeats"] if key in rep]
            lines.append(f"| {key} | {_median(rates)} | {seq.get(key, float('nan')):.2f} |")
        lines.append("")
    lines += _verdicts(results)
    lines += _cpu_tables(results)
    scrapes = results.get("metrics_scrape", {})
    if scrapes:
        lines += [
            "## `/metrics` on Ray",
            "",
            "The catalog asks every replica for its metrics and merges them, at each scrape: "
            "latency (p50 of 20 scrapes one after another), CPU of all of Ray's processes per "
            "scrape, size of the text.",
            "",
            "| deployment | p50 ms | CPU ms/scrape | KB |",
            "|---|---:|---:|---:|",
        ]
        for name, c in scrapes.items():
            lines.append(
                f"| {name} | {c['p50_ms']:.1f} | {c['cpu_ms_per_scrape']:.1f} "
                f"| {c['bytes'] / 1024:.0f} |"
            )
        lines.append("")
    lines += ["## Memory (PSS after the run)", ""]
    lines += ["| server | PSS MB |", "|---|---:|"]
    for name, mb in results["memory_pss_mb"].items():
        lines.append(f"| {name} | {mb:,.0f} |")
    lines.append("")
    lines += _reading(results)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--backends",
        nargs="+",
        choices=BACKENDS,
        default=None,
        help="servers to compare (default: all; the Ray ones only when ray is installed)",
    )
    parser.add_argument("--dataset", default=QUICK.dataset, help=f"(default: {QUICK.dataset})")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 64], choices=[1, 64])
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats (default: 3)")
    parser.add_argument("--step-s", type=float, default=3.0, help="seconds per closed-loop step")
    parser.add_argument("--slices", type=int, default=3, help="slices per step (default: 3)")
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=[1, 2, 4, 8, 16, 32, 64, 96, 128],
        help="closed-loop levels, as bench_policy.py climbs (default: 1 2 4 ... 128)",
    )
    parser.add_argument("--step-max-requests", type=int, default=40_000)
    parser.add_argument("--sequential", type=int, default=300, help="requests for the p50")
    parser.add_argument(
        "--cost-requests",
        type=int,
        default=20_000,
        help="single-node requests of a process server's CPU step (default: 20000)",
    )
    parser.add_argument(
        "--ray-cost-requests",
        type=int,
        default=3_600,
        help="requests per server and size of the Ray group's CPU steps (default: 3600)",
    )
    parser.add_argument(
        "--ray-cost-rounds",
        type=int,
        default=12,
        help="rounds the Ray group's CPU steps are cut into, each server once a round; the CPU "
        "goal is the median over rounds (default: 12)",
    )
    parser.add_argument(
        "--ray-repeats", type=int, default=5, help="repeats of Ray's sustained rate (default: 5)"
    )
    parser.add_argument(
        "--ray-step-s", type=float, default=6.0, help="seconds per Ray step (default: 6)"
    )
    parser.add_argument(
        "--ray-concurrency",
        type=int,
        nargs="+",
        default=[1, 2, 3, 4, 6, 8],
        help="Ray's closed-loop levels (default: 1 2 3 4 6 8)",
    )
    parser.add_argument("--workdir", default=".cache/bench", help="(default: .cache/bench)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="(default: benchmarks/results)")
    parser.add_argument(
        "--stem", default="scale", help="names of the results files (default: scale)"
    )
    parser.add_argument("--render", type=Path, help="rewrite the page from a saved JSON")
    args = parser.parse_args(argv)
    if args.render:
        render_saved(args.render, render)
        return 0
    if args.backends is None:
        args.backends = [b for b in BACKENDS if have_ray() or "ray" not in b]
    if any("ray" in b for b in args.backends) and not have_ray():
        parser.error("the ray backends need the [ray] extra: pip install -e '.[ray]'")
    save_results(args.stem, run(args), render, args.out)
    return 0


if __name__ == "__main__":
    from common import exit_status

    raise SystemExit(exit_status(main))
