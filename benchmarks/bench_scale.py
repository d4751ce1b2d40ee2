"""Scale: one process, worker processes and Ray Serve against one load, with their floors.

Servers (``--backends``), all on free 127.0.0.1 ports and all up for the whole run:

- ``single``: ``gnnaas serve`` (one process, the default);
- ``workers2``: ``gnnaas serve --workers 2``;
- ``ray1`` / ``ray2``: ``gnnaas serve --backend ray --replicas 1`` / ``2`` (needs the ``[ray]``
  extra; a local Ray with ``num_cpus=2``);
- ``trivial``: ``benchmarks/trivial_app.py`` on plain uvicorn, and ``trivial-ray``: the same app as
  a Ray Serve ingress (the floors of the two stacks).

For every request size (1 and 64 random test nodes of ``--dataset``, router at
``X-Accuracy-Tolerance: 2``) each server's sustained rate is measured the way
``bench_policy.py`` measures a policy (the same load generator, closed-loop steps at rising
concurrency, the same p99 bounds of 20 and 50 ms, servers interleaved slice by slice at every
level, ``--repeats`` times), plus a sequential p50 (one request in flight). Memory: the
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
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_policy import Policy, sustained_interleaved  # noqa: E402
from bench_router import (  # noqa: E402
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
from loadgen import ServerProcess, StepSpec, free_port, run_closed  # noqa: E402

__all__ = ["main"]

REPO = Path(__file__).resolve().parents[1]
BACKENDS = ("single", "workers2", "ray1", "ray2", "trivial", "trivial-ray")
ROUTER_HEADERS = {"X-Accuracy-Tolerance": "2"}


def have_ray() -> bool:
    """Whether the ``[ray]`` extra is installed."""
    return importlib.util.find_spec("ray") is not None


def backend_cmd(
    name: str, dataset: str, variants: Path, profiles: Path, port: int, device: str
) -> list[str]:
    """The command that serves ``name`` on 127.0.0.1:``port``."""
    if name == "trivial":
        return trivial_cmd(port)
    if name == "trivial-ray":
        return [sys.executable, "-m", "gnnaas.serving.ray_backend", "trivial", "--port", str(port)]
    cmd = serve_cmd(dataset, variants, profiles, port, device)
    if name == "workers2":
        return [*cmd, "--workers", "2"]
    if name in ("ray1", "ray2"):
        return [*cmd, "--backend", "ray", "--replicas", name[-1]]
    return cmd


def tree_pss_mb(pid: int) -> float:
    """PSS (MB) of a process and all its descendants; shared pages counted once over them."""
    total_kb, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total_kb += int(line.split()[1])
            for task in Path(f"/proc/{p}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return total_kb / 1024


def sequential_p50(url: str, bodies: list[bytes], headers: dict[str, str], n: int) -> float:
    """p50 (ms) of ``n`` requests sent one at a time."""
    spec = StepSpec(rate_rps=0.0, duration_s=60.0, max_requests=n, concurrency=1)
    return asyncio.run(run_closed(url, bodies, headers, spec)).percentile(50)


def run(args: argparse.Namespace) -> dict[str, Any]:
    cfg = QUICK  # synth-flickr@0.2 variants as bench_policy and bench_drift use them
    workdir = Path(args.workdir)
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
    }
    with contextlib.ExitStack() as stack:
        servers: dict[str, ServerProcess] = {}
        ports: set[int] = set()
        for name in args.backends:
            port = free_port()
            while port in ports:
                port = free_port()
            ports.add(port)
            cmd = backend_cmd(name, cfg.dataset, variants_dir, profiles_dir, port, "cpu")
            say(f"starting {name}: {' '.join(cmd[2:])}")
            log = workdir / f"scale-{name}.log"
            servers[name] = stack.enter_context(ServerProcess(cmd, port, log, env=env))
        gnnaas_servers = [n for n in args.backends if not n.startswith("trivial")]

        def policy(name: str, size: int) -> Policy:
            headers = {} if name.startswith("trivial") else ROUTER_HEADERS
            return Policy(name, headers, None, url=f"{servers[name].base_url}{route}")

        for size, bound_ms in ((1, 20.0), (64, 50.0)):
            if size not in args.sizes:
                continue
            bodies = make_bodies(nodes, size, 512, seed=size)
            pols = [
                policy(n, size) for n in args.backends if size == 1 or not n.startswith("trivial")
            ]
            for pol in pols:  # warm-up
                spec = StepSpec(rate_rps=0.0, duration_s=1.0, max_requests=400, concurrency=2)
                asyncio.run(run_closed(pol.url or "", bodies, pol.headers, spec))
            results["sequential_p50_ms"][str(size)] = {
                pol.key: sequential_p50(pol.url or "", bodies, pol.headers, args.sequential)
                for pol in pols
            }
            say(f"size {size}: sequential p50 " + ", ".join(
                f"{k} {v:.2f} ms" for k, v in results["sequential_p50_ms"][str(size)].items()
            ))  # fmt: skip
            repeats = []
            for r in range(args.repeats):
                for name in gnnaas_servers:
                    wait_idle(servers[name], cfg.dataset)
                measured = sustained_interleaved("", bodies, pols, args, bound_ms, rotate=r)
                say(f"size {size} repeat {r + 1}: " + ", ".join(
                    f"{k} {v['rate_rps']:.0f}" for k, v in measured.items()
                ) + f" req/s at p99 <= {bound_ms:g} ms")  # fmt: skip
                repeats.append(measured)
            results["sizes"][str(size)] = {"bound_ms": bound_ms, "repeats": repeats}
        for name, server in servers.items():
            results["memory_pss_mb"][name] = tree_pss_mb(server.pid)
    return results


def _median(values: Sequence[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}–{max(values):,.0f})"


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
        default=[1, 2, 4, 8, 16, 32],
        help="closed-loop levels",
    )
    parser.add_argument("--step-max-requests", type=int, default=40_000)
    parser.add_argument("--sequential", type=int, default=300, help="requests for the p50")
    parser.add_argument("--workdir", default=str(REPO / ".cache" / "bench"))
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    if args.backends is None:
        args.backends = [b for b in BACKENDS if have_ray() or "ray" not in b]
    if any("ray" in b for b in args.backends) and not have_ray():
        parser.error("the ray backends need the [ray] extra: pip install -e '.[ray]'")
    results = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scale.json").write_text(json.dumps(results, indent=1, default=str))
    write_markdown(results, out / "scale.md")
    say(f"wrote {out / 'scale.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
