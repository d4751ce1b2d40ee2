"""Which ASGI server: uvicorn (httptools + uvloop, gnnaas' default) against its alternatives.

Every server runs the same two apps, one process each, all up for the whole run on free
127.0.0.1 ports: the gnnaas router (``gnnaas.serving.deploy.workers:worker_app``, synth-flickr@0.2
variants of ``bench_policy.py``, router at ``X-Accuracy-Tolerance: 2``) and the trivial FastAPI app
(``benchmarks/trivial_app.py``). Servers (``--servers``):

- ``uvicorn``: httptools parser, uvloop (what ``gnnaas serve`` runs);
- ``uvicorn-h11``: the pure-Python h11 parser and asyncio's loop;
- ``granian``: the Rust server (``--interface asgi``, one worker, one runtime thread, uvloop);
- ``hypercorn``: with its uvloop worker class.

Servers that are not installed are skipped with a note (``pip install granian hypercorn`` to
include them; they are not dependencies of gnnaas). Single-node requests: sequential p50 and the
sustained rate at p99 ≤ 20 ms, measured as ``bench_scale.py`` does (servers interleaved slice by
slice at every concurrency level, ``--repeats`` times).

Writes ``http-server.json`` and ``http-server.md`` rendered from it (``benchmarks/results/`` unless
``--out``); ``--render http-server.json`` rewrites the page from a saved run.

Example:
    python benchmarks/bench_http_server.py --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gnnaas.stats import median

from common import (
    QUICK,
    REPO,
    RESULTS,
    command_line,
    machine_info,
    make_bodies,
    prepare,
    render_saved,
    save_results,
    say,
    test_nodes,
    tree_pss_mb,
)
from loadgen import ServerProcess, free_port
from measure import Policy, sequential_p50, sustained_interleaved

__all__ = ["main", "render"]

SERVERS = ("uvicorn", "uvicorn-h11", "granian", "hypercorn")
APPS = {"gnnaas": "gnnaas.serving.deploy.workers:worker_app", "trivial": "trivial_app:create_app"}
_MODULE = {"uvicorn": "uvicorn", "uvicorn-h11": "uvicorn", "granian": "granian"}


def installed(server: str) -> bool:
    """Whether ``server``'s package can be imported."""
    return importlib.util.find_spec(_MODULE.get(server, server)) is not None


def server_cmd(server: str, factory: str, port: int) -> list[str]:
    """The command serving the app ``factory`` (``module:function``) with ``server``."""
    py = [sys.executable, "-m"]
    host = "127.0.0.1"
    if server.startswith("uvicorn"):
        cmd = [*py, "uvicorn", "--factory", factory, "--host", host, "--port", str(port)]
        cmd += ["--no-access-log", "--log-level", "warning"]
        return [*cmd, "--http", "h11", "--loop", "asyncio"] if server == "uvicorn-h11" else cmd
    if server == "granian":
        return [
            *py, "granian", "--interface", "asgi", "--factory", "--host", host, "--port",
            str(port), "--workers", "1", "--runtime-threads", "1", "--loop", "uvloop",
            "--no-ws", "--log-level", "warning", factory,
        ]  # fmt: skip
    return [
        *py, "hypercorn", "--bind", f"{host}:{port}", "--worker-class", "uvloop",
        "--log-level", "warning", f"{factory}()",
    ]  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    plan = QUICK
    workdir = Path(args.workdir).resolve()  # the server processes read it too
    variants_dir, profiles_dir = prepare(plan, workdir, "cpu")
    nodes = test_nodes(plan.dataset, workdir)
    route = f"/v1/datasets/{plan.dataset}/predict"
    env = {
        "GNNAAS_VARIANTS_DIR": str(variants_dir),
        "GNNAAS_PROFILES_DIR": str(profiles_dir),
        "GNNAAS_DATASETS": json.dumps([plan.dataset]),
        "GNNAAS_DEVICE": "cpu",
        "GNNAAS_TORCH_THREADS": "1",
        # trivial_app.py, and whatever the caller's PYTHONPATH adds (e.g. where granian is)
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(REPO / "benchmarks"), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    results: dict[str, Any] = {
        "dataset": plan.dataset,
        "machine": machine_info(),
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "skipped": [s for s in args.servers if not installed(s)],
        "versions": _versions(),
        "sequential_p50_ms": {},
        "memory_pss_mb": {},
    }
    servers = [s for s in args.servers if installed(s)]
    for s in results["skipped"]:
        say(f"{s}: not installed, skipped")
    bodies = make_bodies(nodes, 1, 512, seed=1)
    with contextlib.ExitStack() as stack:
        pols, procs = [], {}
        for server in servers:
            for app, factory in APPS.items():
                key = f"{app}/{server}"
                port = free_port()
                cmd = server_cmd(server, factory, port)
                log = workdir / f"http-{app}-{server}.log"
                say(f"starting {key}")
                proc = stack.enter_context(ServerProcess(cmd, port, log, env=env))
                procs[key] = proc
                headers = {"X-Accuracy-Tolerance": "2"} if app == "gnnaas" else {}
                pols.append(Policy(key, headers, None, url=f"{proc.base_url}{route}"))
        for pol in pols:
            results["sequential_p50_ms"][pol.key] = sequential_p50(
                pol.url or "", bodies, pol.headers, args.sequential
            )
            say(f"{pol.key}: sequential p50 {results['sequential_p50_ms'][pol.key]:.2f} ms")
        repeats = []
        for r in range(args.repeats):
            measured = sustained_interleaved("", bodies, pols, args, 20.0, rotate=r)
            say(f"repeat {r + 1}: " + ", ".join(
                f"{k} {v['rate_rps']:.0f}" for k, v in measured.items()
            ) + " req/s at p99 <= 20 ms")  # fmt: skip
            repeats.append(measured)
        results["repeats"] = repeats
        for key, proc in procs.items():
            results["memory_pss_mb"][key] = tree_pss_mb(proc.pid)
    return results


def render(results: dict[str, Any]) -> str:
    """``http-server.md`` from a run's results."""
    m, a = results["machine"], results["args"]
    lines = [
        f"# HTTP server choice ({results['dataset']}, single-node requests)",
        "",
        f"Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, torch {m.get('torch', '?')}; "
        "client and servers on the same machine, one process per server.",
        f"Command: `python benchmarks/bench_http_server.py --repeats {a['repeats']} --step-s "
        f"{a['step_s']:g} --concurrency {' '.join(map(str, a['concurrency']))}`.",
        "",
        "Sustained rate at p99 ≤ 20 ms (closed loop, servers interleaved slice by slice), median "
        f"(min–max) of {a['repeats']} repeats; the router at `X-Accuracy-Tolerance: 2`.",
        "",
        "| server | gnnaas req/s | trivial req/s | gnnaas / trivial | gnnaas p50 ms "
        "| trivial p50 ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    servers = sorted({k.split("/", 1)[1] for k in results["sequential_p50_ms"]}, key=SERVERS.index)
    for s in servers:
        g = [rep[f"gnnaas/{s}"]["rate_rps"] for rep in results["repeats"]]
        t = [rep[f"trivial/{s}"]["rate_rps"] for rep in results["repeats"]]
        ratio = [x / y for x, y in zip(g, t, strict=True) if y > 0]
        seq = results["sequential_p50_ms"]
        lines.append(
            f"| {s} | {median(g):,.0f} ({min(g):,.0f}–{max(g):,.0f}) "
            f"| {median(t):,.0f} ({min(t):,.0f}–{max(t):,.0f}) "
            f"| {median(ratio):.0%} | {seq[f'gnnaas/{s}']:.2f} "
            f"| {seq[f'trivial/{s}']:.2f} |"
        )
    medians = {
        s: median(rep[f"gnnaas/{s}"]["rate_rps"] for rep in results["repeats"]) for s in servers
    }
    best = max(medians, key=medians.__getitem__)
    lines += [
        "",
        f"Fastest for gnnaas: **{best}**; the others sustain "
        + ", ".join(f"{s} {medians[s] / medians[best]:.0%}" for s in servers if s != best)
        + " of its rate. (A higher gnnaas / trivial share for a slower server means the server "
        "costs more per request, not that gnnaas does less.)",
    ]
    if results.get("versions"):
        lines += [
            "",
            "Versions: "
            + ", ".join(f"{k} {v}" for k, v in results["versions"].items() if v)
            + " (granian and hypercorn are not dependencies of gnnaas).",
        ]
    if results["skipped"]:
        lines += ["", f"Not installed, skipped: {', '.join(results['skipped'])}."]
    lines.append("")
    return "\n".join(lines)


def _versions() -> dict[str, str | None]:
    """Installed versions of the servers and of uvicorn's parser and loop (None: absent)."""
    out: dict[str, str | None] = {}
    for dist in ("uvicorn", "httptools", "uvloop", "h11", "granian", "hypercorn"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS))
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats (default: 3)")
    parser.add_argument("--step-s", type=float, default=3.0, help="seconds per closed-loop step")
    parser.add_argument("--slices", type=int, default=3, help="slices per step (default: 3)")
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="closed-loop levels"
    )
    parser.add_argument("--step-max-requests", type=int, default=40_000)
    parser.add_argument("--sequential", type=int, default=300, help="requests for the p50")
    parser.add_argument("--workdir", default=".cache/bench", help="(default: .cache/bench)")
    parser.add_argument("--out", default=str(RESULTS), help="(default: benchmarks/results)")
    parser.add_argument("--render", metavar="JSON", help="only rewrite the .md beside its JSON")
    args = parser.parse_args(argv)
    if args.render:
        render_saved(args.render, render)
        return 0
    results = run(args)
    results["command"] = command_line("bench_http_server.py", argv)
    save_results("http-server", results, render, Path(args.out))
    return 0


if __name__ == "__main__":
    from common import exit_status

    raise SystemExit(exit_status(main))
