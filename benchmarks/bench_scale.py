"""Scale: one process, worker processes and Ray Serve against one load, with their floors.

Servers (``--backends``), on free 127.0.0.1 ports:

- ``single``: ``gnnaas serve`` (one process, the default);
- ``workers2``: ``gnnaas serve --workers 2``;
- ``trivial``: ``benchmarks/trivial_app.py`` on plain uvicorn (the floor of that stack);
- ``ray1`` / ``ray2``: gnnaas on Ray Serve with 1 / 2 replicas of the dataset's deployment
  (``gnnaas.serving.deploy.ray.run_ray``, the code of ``gnnaas serve --backend ray``; needs the
  ``[ray]`` extra), on a local Ray with ``num_cpus=2`` started in this process, next to the trivial
  app deployed on the same Serve proxy under ``/trivial`` (``trivial-ray@rayN``, the floor of the
  Ray stack), measured together with ``single`` again (``single@rayN``).

The process servers are measured first, interleaved; then each Ray deployment, interleaved with
its floor and the single process.

For every request size (1 and 64 random test nodes of ``--dataset``, router at
``X-Accuracy-Tolerance: 2``) each server's sustained rate is measured the way
``bench_policy.py`` measures a policy (the same load generator, closed-loop steps at rising
concurrency, the same p99 bounds of 20 and 50 ms, servers interleaved slice by slice at every
level, ``--repeats`` times), plus a sequential p50 (one request in flight). CPU: one more
closed-loop step of single-node requests per server (``--cost-requests``; process servers at 32
clients, Ray at 4) says how many CPU milliseconds each process group (Ray's by role: proxy,
ingress, dataset replicas) and the client spent per answered request, and how many of the
machine's cores were busy, which tells a server-bound rate from a machine-bound one. Memory: the
proportional set size (PSS) of each server's process tree after the run, which counts pages the
processes share (the memory-mapped store of ``--workers``) once.

Writes ``scale.md`` and ``scale.json`` (``benchmarks/results/`` unless ``--out``).

Example:
    python benchmarks/bench_scale.py --backends single workers2 trivial --repeats 1 --step-s 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from common import (
    QUICK,
    machine_info,
    make_bodies,
    prepare,
    say,
    serve_cmd,
    test_nodes,
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


def have_ray() -> bool:
    """Whether the ``[ray]`` extra is installed."""
    return importlib.util.find_spec("ray") is not None


def backend_cmd(
    name: str, dataset: str, variants: Path, profiles: Path, port: int, device: str
) -> list[str]:
    """The command that serves ``name`` (a process backend) on 127.0.0.1:``port``."""
    if name == "trivial":
        return trivial_cmd(port)
    cmd = serve_cmd(dataset, variants, profiles, port, device)
    return [*cmd, "--workers", "2"] if name == "workers2" else cmd


def save_results(
    results: dict[str, Any], out: Path, stem: str, markdown: Callable[[dict[str, Any], Path], None]
) -> None:
    """``<out>/<stem>.json`` (every figure) and ``<out>/<stem>.md`` (the tables)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(results, indent=1, default=str))
    markdown(results, out / f"{stem}.md")
    say(f"wrote {out / f'{stem}.md'}")


def tree_pids(pid: int) -> list[int]:
    """A process and all its descendants (those alive now)."""
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
        pids.append(p)
    return pids


def tree_pss_mb(pid: int) -> float:
    """PSS (MB) of a process and all its descendants; shared pages counted once over them."""
    total_kb = 0
    for p in tree_pids(pid):
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


def ray_roles() -> dict[str, list[int]]:
    """This machine's Ray Serve processes by role, from their process titles."""
    roles: dict[str, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
        except OSError:
            continue
        if title.startswith("ray::ProxyActor"):
            role = "proxy"
        elif title.startswith("ray::ServeReplica:gnnaas:ingress"):
            role = "ingress"
        elif title.startswith("ray::ServeReplica:gnnaas:dataset-"):
            role = "dataset replicas"
        elif title.startswith("ray::ServeReplica:trivial"):
            role = "trivial app"
        elif title.startswith("ray::") or "/ray/core/src/ray/" in title:
            role = "rest of Ray"
        else:
            continue
        roles.setdefault(role, []).append(int(entry.name))
    return roles


def cpu_cost(
    url: str,
    bodies: list[bytes],
    headers: dict[str, str],
    groups: dict[str, list[int]],
    *,
    concurrency: int,
    requests: int,
) -> dict[str, Any]:
    """CPU per answered request of each process group, of the client and of the whole machine.

    One closed-loop step of ``requests`` at ``concurrency``; the CPU the groups' processes used
    during it over the requests answered. ``machine_busy_cores`` is how many of the machine's
    cores were busy on average (everything: servers, client, the rest), which says whether the
    machine, not the server, bounded the rate.
    """
    before = {g: {p: process_cpu_s(p) for p in pids} for g, pids in groups.items()}
    busy0, t0 = machine_busy_s(), time.perf_counter()
    spec = StepSpec(rate_rps=0.0, duration_s=60.0, max_requests=requests, concurrency=concurrency)
    step = asyncio.run(run_closed(url, bodies, headers, spec))
    wall, busy = time.perf_counter() - t0, machine_busy_s() - busy0
    ok = max(int(step.ok.sum()), 1)
    per = {}
    for g, start in before.items():
        after = {p: process_cpu_s(p) for p in start}
        # a process gone by the end (a Ray worker replaced) has lost its count: left out
        used = sum(after[p] - t for p, t in start.items() if after[p] > 0)
        per[g] = 1e3 * used / ok
    return {
        "concurrency": concurrency,
        "requests": step.sent,
        "rate_rps": step.throughput_rps,
        "server_ms": per,
        "client_ms": 1e3 * step.client_cpu_s / ok,
        "machine_busy_cores": busy / wall,
    }


def sequential_p50(url: str, bodies: list[bytes], headers: dict[str, str], n: int) -> float:
    """p50 (ms) of ``n`` requests sent one at a time."""
    spec = StepSpec(rate_rps=0.0, duration_s=60.0, max_requests=n, concurrency=1)
    return asyncio.run(run_closed(url, bodies, headers, spec)).percentile(50)


def measure(
    pols: list[Policy],
    nodes: Any,
    args: argparse.Namespace,
    results: dict[str, Any],
    idle: list[ServerProcess],
    dataset: str,
) -> None:
    """Sequential p50 and sustained rate of every policy, per request size, into ``results``."""
    for size, bound_ms in ((1, 20.0), (64, 50.0)):
        if size not in args.sizes:
            continue
        bodies = make_bodies(nodes, size, 512, seed=size)
        group = [p for p in pols if size == 1 or not p.key.startswith("trivial")]
        if not group:  # e.g. only Ray backends asked for: no process servers to measure
            continue
        for pol in group:  # warm-up
            spec = StepSpec(rate_rps=0.0, duration_s=1.0, max_requests=400, concurrency=2)
            asyncio.run(run_closed(pol.url or "", bodies, pol.headers, spec))
        seq = results["sequential_p50_ms"].setdefault(str(size), {})
        for pol in group:
            seq[pol.key] = sequential_p50(pol.url or "", bodies, pol.headers, args.sequential)
        say(f"size {size}: sequential p50 " + ", ".join(
            f"{p.key} {seq[p.key]:.2f} ms" for p in group
        ))  # fmt: skip
        block = results["sizes"].setdefault(str(size), {"bound_ms": bound_ms, "repeats": []})
        for r in range(args.repeats):
            for server in idle:
                wait_idle(server, dataset)
            measured = sustained_interleaved("", bodies, group, args, bound_ms, rotate=r)
            say(f"size {size} repeat {r + 1}: " + ", ".join(
                f"{k} {v['rate_rps']:.0f}" for k, v in measured.items()
            ) + f" req/s at p99 <= {bound_ms:g} ms")  # fmt: skip
            if len(block["repeats"]) <= r:
                block["repeats"].append({})
            block["repeats"][r].update(measured)


def run(args: argparse.Namespace) -> dict[str, Any]:
    cfg = QUICK  # synth-flickr@0.2 variants as bench_policy and bench_drift use them
    workdir = Path(args.workdir).resolve()  # Ray replicas and server processes read it too
    variants_dir, profiles_dir = prepare(cfg, workdir, "cpu")
    nodes = test_nodes(cfg.dataset, workdir)
    route = f"/v1/datasets/{cfg.dataset}/predict"
    env = {"GNNAAS_TORCH_THREADS": "1"}
    results: dict[str, Any] = {
        "dataset": cfg.dataset,
        "machine": machine_info(),
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "sizes": {},
        "sequential_p50_ms": {},
        "memory_pss_mb": {},
        "cpu_1_node": {},
    }
    procs = [b for b in args.backends if b in ("single", "workers2", "trivial")]
    rays = [b for b in args.backends if b in ("ray1", "ray2")]
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

        idle = [s for n, s in servers.items() if n != "trivial"]
        pols = [policy(n, s.base_url) for n, s in servers.items()]
        measure(pols, nodes, args, results, idle, cfg.dataset)
        single_bodies = make_bodies(nodes, 1, 512, seed=1)
        for (name, server), pol in zip(servers.items(), pols, strict=True):
            results["memory_pss_mb"][name] = tree_pss_mb(server.pid)
            results["cpu_1_node"][name] = cpu_cost(
                pol.url or "",
                single_bodies,
                pol.headers,
                {"server": tree_pids(server.pid)},
                concurrency=PROCESS_COST_CLIENTS,
                requests=args.cost_requests,
            )
            say(f"cpu {name}: {results['cpu_1_node'][name]}")
        if rays:
            # Ray in this process (the driver): one local cluster, one Serve proxy; the trivial
            # app under /trivial next to gnnaas; 1 then 2 replicas of the dataset's deployment.
            from gnnaas.serving.core.settings import Settings
            from gnnaas.serving.deploy import ray as ray_backend

            sys.path.insert(0, str(REPO / "benchmarks"))
            import trivial_app

            port = free_port()
            settings = Settings(
                variants_dir=variants_dir,
                profiles_dir=profiles_dir,
                datasets=[cfg.dataset],
                device="cpu",
                torch_threads=1,
            )
            ray_backend.start_ray(num_cpus=2, host="127.0.0.1", port=port)
            stack.callback(ray_backend.shutdown_ray)
            base = f"http://127.0.0.1:{port}"
            for name in rays:
                replicas = int(name[-1])
                say(f"deploying gnnaas on Ray with {replicas} replica(s)")
                # One CPU of Ray's 2 for the dataset's replicas whatever their number, so a
                # redeployment fits beside the replicas it replaces (Serve starts the new ones
                # first; more would wait for CPUs for ever). A reservation, not a limit.
                ray_backend.run_ray(
                    settings, replicas=replicas, port=port, replica_cpus=1.0 / replicas
                )
                if name == rays[0]:
                    ray_backend.run_asgi_app(
                        trivial_app.create_app, name="trivial", route_prefix="/trivial"
                    )
                floor = Policy(f"trivial-ray@{name}", {}, None, url=f"{base}/trivial{route}")
                anchor = (
                    policy(f"single@{name}", servers["single"].base_url)
                    if "single" in servers
                    else None
                )
                group = [policy(name, base), floor] + ([anchor] if anchor else [])
                measure(group, nodes, args, results, idle, cfg.dataset)
                pids = ray_backend.replica_pids(cfg.dataset)
                results["memory_pss_mb"][name] = sum(tree_pss_mb(p) for p in pids.values())
                for pol in group[:2]:  # gnnaas on Ray, then the trivial app on Ray
                    results["cpu_1_node"][pol.key] = cpu_cost(
                        pol.url or "",
                        single_bodies,
                        pol.headers,
                        ray_roles(),
                        concurrency=RAY_COST_CLIENTS,
                        requests=max(args.cost_requests // 10, 100),
                    )
                    say(f"cpu {pol.key}: {results['cpu_1_node'][pol.key]}")
                results.setdefault("ray_replica_pids", {})[name] = pids
    return results


def _median(values: Sequence[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}–{max(values):,.0f})"


def _rates(results: dict[str, Any], size: str, key: str) -> list[float]:
    block = results["sizes"].get(size, {"repeats": []})
    return [rep[key]["rate_rps"] for rep in block["repeats"] if key in rep]


def _verdicts(results: dict[str, Any]) -> list[str]:
    """The issue's goals, computed from the run (only for what was measured)."""
    lines = ["## Goals", ""]
    for size in results["sizes"]:
        single, workers = _rates(results, size, "single"), _rates(results, size, "workers2")
        if single and workers:
            ratio = statistics.median(w / s for w, s in zip(workers, single, strict=True))
            lines.append(
                f"- {size}-node: `--workers 2` / one process = {ratio:.2f} (median of repeats; "
                f"goal for 1 node: > 1)"
            )
        for name in ("ray1", "ray2"):
            mine, floor = _rates(results, size, name), _rates(results, size, f"trivial-ray@{name}")
            if mine and floor:
                ratio = statistics.median(m / f for m, f in zip(mine, floor, strict=True))
                lines.append(
                    f"- {size}-node: gnnaas on Ray ({name}) / trivial app on Ray = {ratio:.2f} of "
                    f"its sustained rate (goal ≥ 0.70)"
                )
            seq = results["sequential_p50_ms"].get(size, {})
            if name in seq and f"trivial-ray@{name}" in seq:
                extra = seq[name] - seq[f"trivial-ray@{name}"]
                lines.append(
                    f"- {size}-node: gnnaas on Ray ({name}) adds {extra:.2f} ms of sequential p50 "
                    f"over the trivial app on Ray (goal ≤ 2 ms)"
                )
    lines.append("")
    return lines


def _cpu_table(results: dict[str, Any]) -> list[str]:
    """Where the CPU of a single-node request goes, per server."""
    costs = results.get("cpu_1_node", {})
    if not costs:
        return []
    cores = results["machine"].get("cores", "?")
    lines = [
        "## CPU per single-node request",
        "",
        f"One closed-loop step per server (process servers at {PROCESS_COST_CLIENTS} clients, Ray "
        f"at {RAY_COST_CLIENTS}): CPU milliseconds its processes used per answered request, the "
        f"client's, and how many of the machine's {cores} cores were busy on average.",
        "",
        "| server | req/s | server CPU ms/request (by process group) | client CPU ms/request "
        "| busy cores |",
        "|---|---:|---|---:|---:|",
    ]
    for key, c in costs.items():
        groups = ", ".join(f"{g} {ms:.2f}" for g, ms in c["server_ms"].items())
        total = sum(c["server_ms"].values())
        lines.append(
            f"| {key} | {c['rate_rps']:,.0f} | {total:.2f} ({groups}) | {c['client_ms']:.2f} "
            f"| {c['machine_busy_cores']:.2f} |"
        )
    lines.append("")
    return lines


def write_markdown(results: dict[str, Any], path: Path) -> None:
    m = results["machine"]
    a = results["args"]
    lines = [
        f"# Scale: one process, worker processes, Ray Serve ({results['dataset']})",
        "",
        f"Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, torch {m.get('torch', '?')}; "
        "client (load generator) and servers on the same machine; every server on one torch "
        "thread per process.",
        "Command: `python benchmarks/bench_scale.py "
        + " ".join(
            [f"--backends {' '.join(a['backends'])}", f"--repeats {a['repeats']}"]
            + [f"--step-s {a['step_s']:g}", f"--concurrency {' '.join(map(str, a['concurrency']))}"]
        )
        + "`.",
        "",
        "Sustained rate: closed-loop throughput where p99 reaches the bound (as in `policy.md`), "
        f"median (min–max) of {a['repeats']} repeats, servers interleaved slice by slice. Router "
        "at `X-Accuracy-Tolerance: 2`.",
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
        for key in block["repeats"][0]:
            rates = [rep[key]["rate_rps"] for rep in block["repeats"]]
            lines.append(f"| {key} | {_median(rates)} | {seq[key]:.2f} |")
        lines.append("")
    lines += _verdicts(results)
    lines += _cpu_table(results)
    lines += ["## Memory (PSS of each server's process tree after the run)", ""]
    lines += ["| server | PSS MB |", "|---|---:|"]
    for name, mb in results["memory_pss_mb"].items():
        lines.append(f"| {name} | {mb:,.0f} |")
    lines.append("")
    path.write_text("\n".join(lines))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--backends",
        nargs="+",
        choices=BACKENDS,
        default=None,
        help="servers to compare (default: all; the Ray ones only when ray is installed)",
    )
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
        help="single-node requests of the CPU-per-request step (Ray's: a tenth) (default: 20000)",
    )
    parser.add_argument("--workdir", default=".cache/bench", help="(default: .cache/bench)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    if args.backends is None:
        args.backends = [b for b in BACKENDS if have_ray() or "ray" not in b]
    if any("ray" in b for b in args.backends) and not have_ray():
        parser.error("the ray backends need the [ray] extra: pip install -e '.[ray]'")
    save_results(run(args), Path(args.out), "scale", write_markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
