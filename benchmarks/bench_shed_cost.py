"""What does refusing a request cost the server, against serving it? The bound it puts on shedding.

Shedding keeps the important traffic fast only while refusing is much cheaper than serving: at an
offered rate of ``L`` times what the server sustains, with its CPU the bottleneck, a server whose
refusal costs ``s`` of a served answer's CPU can serve at most a share
``f = (1 - L s) / (L (1 - s))`` of what is offered (from ``L (f + (1 - f) s) <= 1``). For issue
29's single-node case (``L = 2``, 20 % high priority, every high request served) that needs
``f >= 0.2``, i.e. ``s <= 0.375``.

One ``gnnaas serve`` (one process, one torch thread, as ``bench_deadlines.py`` runs it) on a free
127.0.0.1 port, single-node requests at the same tolerance, closed loop at ``--clients`` clients,
the cases taken in turn in ``--rounds`` slices of ``--requests`` each:

- **served**: the answer computed (200), without deadline or priority headers;
- **served, with headers**: the same with ``X-Deadline-Ms: 1000`` (never binding) and
  ``X-Priority: normal``;
- **refused at admission**: ``X-Deadline-Ms`` shorter than any variant's profiled time (422,
  nothing computed): the router's refusal, after the edge parsed the body and the policy
  predicted;
- **refused at the edge**: an unknown ``X-Priority`` (400 before the body is read): the
  cheapest answer the app gives;
- **shed under overload** (separate server, ``--shed-nodes`` per batch and per queue): two
  background clients keep a batch of ``--shed-nodes`` high-priority nodes running on
  ``--shed-variant`` and another queued (its queue full), while the closed loop sends single-node
  low-priority requests pinned to it: admission refuses one (queue full) and writes the refusal,
  and the HTTP protocol answers the others with it, before they reach the app, until the running
  batch is predicted to end (:mod:`gnnaas.serving.http.protocol`). Every step of such a refusal
  runs on the server's event-loop thread, so its cost is that thread's CPU over the refusals,
  less what the thread spends on the background alone (measured just before, over as long).

Server CPU per answered request is read from ``/proc`` (user + system of every thread); the
client runs on the same machine and its CPU is shown beside.

Writes ``shed-cost.json`` and ``shed-cost.md`` (``--render JSON`` rewrites the page).

Example:
    python benchmarks/bench_shed_cost.py --dataset synth-flickr@0.2
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gnnaas.stats import median

from common import (
    RESULTS,
    Plan,
    command_line,
    computed_only,
    load_snapshot,
    machine_info,
    make_bodies,
    prepare,
    proc_cpu_s,
    render_saved,
    save_results,
    say,
    serve_cmd,
    test_nodes,
    tree_pids,
    utc_now,
    wait_idle,
)
from loadgen import ServerProcess, StepSpec, free_port, run_closed

__all__ = ["CASES", "main", "render", "served_share"]

CASES: dict[str, tuple[dict[str, str], int]] = {
    "served": ({}, 200),
    "served, with headers": ({"X-Deadline-Ms": "1000", "X-Priority": "normal"}, 200),
    "refused at admission": ({"X-Deadline-Ms": "0.001", "X-Priority": "normal"}, 422),
    "refused at the edge": ({"X-Priority": "urgent"}, 400),
}
"""Name: (headers added to the tolerance's, the status every answer must have)."""

SHED_GOAL = 0.25
"""The most a refusal under overload may cost, as a share of a served answer (issue 40)."""


def served_share(load: float, s: float) -> float:
    """Most of the offered requests a CPU-bound server can serve at ``load`` × its sustained rate
    when a refusal costs ``s`` of a served answer (0 when it cannot even refuse them all)."""
    if load <= 1.0:
        return 1.0
    if s >= 1.0:
        return 0.0
    return max(0.0, (1.0 - load * s) / (load * (1.0 - s)))


def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(args.workdir)
    before = load_snapshot()
    variants, profiles = prepare(Plan(dataset=args.dataset, threads=1), workdir, "cpu")
    variants = computed_only(variants, args.dataset, workdir)
    bodies = make_bodies(test_nodes(args.dataset, workdir), 1, 2048, seed=3)
    port = free_port()
    cmd = serve_cmd(args.dataset, variants, profiles, port, "cpu")
    base = {"X-Accuracy-Tolerance": f"{args.tolerance:g}"}
    slices: dict[str, list[dict[str, float]]] = {name: [] for name in CASES}
    with ServerProcess(
        cmd, port, workdir / "shed-cost-server.log", env={"GNNAAS_TORCH_THREADS": "1"}
    ) as server:
        url = f"{server.base_url}/v1/datasets/{args.dataset}/predict"
        wait_idle(server, args.dataset)
        for r in range(args.rounds + 1):  # the first round warms up and is not kept
            for name, (extra, status) in CASES.items():
                spec = StepSpec(
                    rate_rps=0.0,
                    duration_s=60.0,
                    max_requests=args.requests,
                    concurrency=args.clients,
                    seed=r,
                )
                pids = tree_pids(server.pid)
                cpu0 = sum(proc_cpu_s(p) for p in pids)
                step = asyncio.run(run_closed(url, bodies, base | extra, spec))
                cpu1 = sum(proc_cpu_s(p) for p in pids)
                answered = int((step.status == status).sum())
                if answered != step.sent:
                    raise SystemExit(
                        f"bench_shed_cost: {name}: {step.sent - answered} of {step.sent} "
                        f"answers were not {status}"
                    )
                if r == 0:
                    continue
                slices[name].append(
                    {
                        "server_cpu_ms": 1e3 * (cpu1 - cpu0) / answered,
                        "client_cpu_ms": 1e3 * step.client_cpu_s / answered,
                        "rate_rps": answered / step.wall_s,
                    }
                )
                say(f"round {r} {name}: {slices[name][-1]}")
    cases = {}
    for name, rows in slices.items():
        cases[name] = {
            "slices": rows,
            **{k: median(row[k] for row in rows) for k in rows[0]},
        }
    served = cases["served"]["server_cpu_ms"]
    for c in cases.values():
        c["share_of_served"] = c["server_cpu_ms"] / served
        c["served_share_at_load"] = served_share(args.load, c["share_of_served"])
    shed = _shed_case(args, variants, profiles, workdir)
    shed["share_of_served"] = shed["server_cpu_ms"] / served
    shed["served_share_at_load"] = served_share(args.load, shed["share_of_served"])
    cases["shed under overload"] = shed
    return {
        "dataset": args.dataset,
        "date": utc_now(),
        "machine": machine_info(),
        "load_before": before,
        "command": command_line("bench_shed_cost.py", args.argv),
        "tolerance": args.tolerance,
        "clients": args.clients,
        "requests": args.requests,
        "rounds": args.rounds,
        "load": args.load,
        "high_share": args.high_share,
        "cases": cases,
    }


def _thread_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process's main thread (its event loop)."""
    return proc_cpu_s(pid, task=pid)


def _shed_case(
    args: argparse.Namespace, variants: Path, profiles: Path, workdir: Path
) -> dict[str, Any]:
    """The refusal under overload: the event loop's CPU per request the protocol refuses."""
    nodes = test_nodes(args.dataset, workdir)
    big = make_bodies(nodes, args.shed_nodes, 8, seed=5)
    one = make_bodies(nodes, 1, 2048, seed=6)
    port = free_port()
    cmd = serve_cmd(args.dataset, variants, profiles, port, "cpu")
    limits = {f"GNNAAS_MAX_{k}_NODES": str(args.shed_nodes) for k in ("BATCH", "QUEUE", "REQUEST")}
    env = {"GNNAAS_TORCH_THREADS": "1", **limits}
    pin = {"X-Variant": args.shed_variant}
    rows = []
    with ServerProcess(cmd, port, workdir / "shed-cost-overload.log", env=env) as server:
        url = f"{server.base_url}/v1/datasets/{args.dataset}/predict"
        wait_idle(server, args.dataset)
        for r in range(args.rounds + 1):
            row = asyncio.run(_overloaded(url, big, one, pin, args, seed=r, pid=server.pid))
            say(f"round {r} shed under overload: {row}")
            if r:  # the first round warms up
                rows.append(row)
    return {"slices": rows, **{k: median(row[k] for row in rows) for k in rows[0]}}


async def _overloaded(
    url: str,
    big: list[bytes],
    one: list[bytes],
    pin: dict[str, str],
    args: argparse.Namespace,
    seed: int,
    pid: int,
) -> dict[str, float]:
    """One slice: the background alone for ``--shed-seconds``, then with the refused stream."""
    seconds = args.shed_seconds
    background = StepSpec(
        rate_rps=0.0, duration_s=3 * seconds + 30, max_requests=10_000, concurrency=2, seed=seed
    )
    task = asyncio.ensure_future(run_closed(url, big, pin | {"X-Priority": "high"}, background))
    await asyncio.sleep(seconds)  # the first batch running and the next one queued
    cpu0 = _thread_cpu_s(pid)
    await asyncio.sleep(seconds)
    base_s = _thread_cpu_s(pid) - cpu0
    spec = StepSpec(
        rate_rps=0.0,
        duration_s=seconds,
        max_requests=args.requests * 10,
        concurrency=args.clients,
        seed=seed,
    )
    cpu1 = _thread_cpu_s(pid)
    step = await run_closed(url, one, pin | {"X-Priority": "low"}, spec)
    shed_s = _thread_cpu_s(pid) - cpu1
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    refused = int((step.status == 503).sum())
    if refused < step.sent // 2:
        raise SystemExit(
            f"bench_shed_cost: shed under overload: only {refused} of {step.sent} requests were "
            "refused (is the queue kept full? raise --shed-nodes)"
        )
    return {
        "server_cpu_ms": 1e3 * (shed_s - base_s * step.wall_s / seconds) / refused,
        "client_cpu_ms": 1e3 * step.client_cpu_s / step.sent,
        "rate_rps": step.sent / step.wall_s,
        "refused": refused,
        "served": int((step.status == 200).sum()),
        "loop_cpu_background_s": base_s / seconds,
    }


def render(results: dict[str, Any]) -> str:
    """``shed-cost.md`` from a run's results."""
    m, load, high = results["machine"], results["load"], results["high_share"]
    s_max = (1 - load * high) / (load * (1 - high))  # served_share(load, s_max) == high
    lines = [
        "# Refusing against serving: the CPU a shed request still costs",
        "",
        f"Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, torch {m.get('torch', '?')}; "
        f"client and server on the same machine. Load average before: "
        + ", ".join(f"{x:.2f}" for x in results["load_before"]["load"])
        + ".",
        f"Command: `{results['command']}`",
        "",
        f"{results['dataset']}, single-node requests at tolerance {results['tolerance']:g}, one "
        "server process on one torch thread without the precomputed variants (every answer "
        f"computed), closed loop at {results['clients']} clients; the cases taken in turn, "
        f"{results['rounds']} slices of {results['requests']:,} requests each after a warm-up "
        "round; medians over the slices.",
        "",
        f"*Served share at {load:g}×*: the most of the offered requests a server whose CPU is the "
        f"bottleneck can serve at {load:g}× its sustained rate when every other request is "
        "refused this way: `f = (1 − L·s) / (L·(1 − s))`, `s` the refusal's CPU over a served "
        f"answer's. Serving every high-priority request ({high:.0%} of the traffic) needs "
        f"f ≥ {high:.2f}, i.e. s ≤ {s_max:.3f}.",
        "",
        "| case | server CPU ms/request | of a served answer (s) | served share at "
        f"{load:g}× | client CPU ms/request | req/s | slices (server CPU ms) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, c in results["cases"].items():
        refused = not name.startswith("served")
        share = f"{c['served_share_at_load']:.2f}" if refused else "–"
        lines.append(
            f"| {name} | {c['server_cpu_ms']:.3f} | {c['share_of_served']:.2f} | "
            f"{share} | {c['client_cpu_ms']:.3f} | "
            f"{c['rate_rps']:,.0f} | "
            + ", ".join(f"{row['server_cpu_ms']:.3f}" for row in c["slices"])
            + " |"
        )
    admission, edge = (
        results["cases"]["refused at admission"],
        results["cases"]["refused at the edge"],
    )
    verdict = "enough" if admission["served_share_at_load"] >= high else "not enough"
    lines += [
        "",
        f"So refusing at admission (s = {admission['share_of_served']:.2f}) leaves room to serve "
        f"at most {admission['served_share_at_load']:.0%} of the offered requests at {load:g}×: "
        f"{verdict} for the {high:.0%} that are high priority. A refusal made at the edge, "
        f"before the body is read (s = {edge['share_of_served']:.2f}), would leave "
        f"{edge['served_share_at_load']:.0%}. The client's own CPU per request (column beside) "
        f"at {load:g}× the served rate shows what a load generator on the same cores takes "
        "from the server.",
    ]
    shed = results["cases"].get("shed under overload")
    if shed is not None:
        met = "meets" if shed["share_of_served"] <= SHED_GOAL else "misses"
        lines += [
            "",
            f"**Shed under overload**, the refusal the server uses while a priority is shed "
            f"(the HTTP protocol answers before the app): s = {shed['share_of_served']:.2f}, "
            f"which {met} the goal of s ≤ {SHED_GOAL:g} and leaves "
            f"{shed['served_share_at_load']:.0%} of the offered requests to serve at {load:g}×. "
            f"Its server CPU is the event-loop thread's over the refused requests, less the "
            f"{shed['loop_cpu_background_s']:.3f} CPU-s/s the thread spends on the background "
            f"batches alone; per slice {shed['refused']:,.0f} refused and "
            f"{shed['served']:,.0f} admitted (median) of the single-node low-priority stream "
            "(admission decides again each time a refusal stops holding).",
        ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="synth-flickr@0.2", help="(default: %(default)s)")
    parser.add_argument("--workdir", default=".cache/bench", help="(default: %(default)s)")
    parser.add_argument("--out", default=str(RESULTS), help="results folder")
    parser.add_argument("--tolerance", type=float, default=2.0, help="(default: %(default)s)")
    parser.add_argument(
        "--clients", type=int, default=64, help="closed-loop clients (default: %(default)s)"
    )
    parser.add_argument("--requests", type=int, default=3000, help="per slice")
    parser.add_argument("--rounds", type=int, default=4, help="slices per case")
    parser.add_argument("--load", type=float, default=2.0, help="offered / sustained rate")
    parser.add_argument("--high-share", type=float, default=0.2, help="share of high priority")
    parser.add_argument(
        "--shed-variant", default="gin-full-1x", help="overloaded variant (default: %(default)s)"
    )
    parser.add_argument(
        "--shed-nodes", type=int, default=4096, help="nodes per background batch and queue"
    )
    parser.add_argument(
        "--shed-seconds", type=float, default=5.0, help="background and refused stream, each"
    )
    parser.add_argument("--render", metavar="JSON", help="only rewrite the page from a JSON")
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else None
    if args.render:
        render_saved(args.render, render)
        return 0
    save_results("shed-cost", run(args), render, Path(args.out))
    return 0


if __name__ == "__main__":
    from common import exit_status

    raise SystemExit(exit_status(main))
