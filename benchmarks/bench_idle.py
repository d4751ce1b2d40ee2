"""Does a batch take longer after the machine idled? Batch time against the idle gap before it.

A served batch of more than ``GNNAAS_INLINE_MAX_NODES`` nodes runs on the batcher's worker thread,
its parallel regions on torch's OpenMP team. Under sequential (light) traffic the machine idles
between batches; under load it does not. A service curve indexed by batch size alone assumes the
idle time before a batch does not matter. This bench measures whether it does: one variant's
batches run on a worker thread, as the server runs them, each after a fixed idle gap, for
torch on one thread, on two, and on two with the OpenMP threads bound to cores
(``OMP_PROC_BIND=true OMP_PLACES=cores``, the main thread's own binding undone so that the
process's other threads may run anywhere). Each configuration runs in its own process (OpenMP
reads its binding when torch loads), the gaps interleaved in rounds so a slow minute of the
machine hits every gap alike.

The page records the guest kernel's scheduler options (``sched_*`` on its command line), which
decide how threads waking on an idle machine are placed.

Writes ``idle.json`` and ``idle.md`` (``--render idle.json`` rewrites the page from the JSON).

Example:
    python benchmarks/bench_idle.py --dataset synth-flickr@0.2
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from gnnaas.stats import median

from common import (
    QUICK,
    RESULTS,
    command_line,
    load_snapshot,
    machine_info,
    prepare,
    render_saved,
    save_results,
    say,
    shown,
)

__all__ = ["CONFIGS", "main", "render"]

CONFIGS: dict[str, tuple[int, dict[str, str]]] = {
    "1 thread": (1, {}),
    "2 threads": (2, {}),
    "2 threads, OpenMP bound": (2, {"OMP_PROC_BIND": "true", "OMP_PLACES": "cores"}),
}
"""Name: (torch threads, environment added to the measuring process)."""


def kernel_sched_options() -> list[str]:
    """The ``sched_*`` options of the running kernel's command line (empty when none or unread)."""
    try:
        words = Path("/proc/cmdline").read_text().split()
    except OSError:
        return []
    return [w for w in words if w.startswith("sched_")]


def child(args: argparse.Namespace) -> dict[str, Any]:
    """Runs in the measuring process: median batch ms per (size, gap), per round."""
    if os.environ.get("OMP_PROC_BIND"):
        # OpenMP bound this (the initial) thread to the first core when torch loaded; threads
        # started later would inherit that one core. Undo it: only the teams stay bound.
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    import torch

    from gnnaas.inference.executor import ExecRequest
    from gnnaas.serving.core.lane import default_executor_factory
    from gnnaas.serving.core.registry import VariantRegistry
    from gnnaas.serving.core.settings import Settings

    torch.set_num_threads(args.threads)
    settings = Settings(
        variants_dir=args.variants_dir, profiles_dir=args.profiles_dir, datasets=[args.dataset]
    )
    ds = VariantRegistry.load(settings).get(args.dataset)
    if ds is None or args.variant not in ds.variants:
        known = ", ".join(sorted(ds.variants)) if ds is not None else "none"
        raise SystemExit(
            f"bench_idle: no profiled variant {args.variant!r} of {args.dataset} (known: {known}); "
            "the default one is in the default plan (bench_policy.py makes it), or pass --variant"
        )
    handler = default_executor_factory(torch.device("cpu"))(ds, ds.variants[args.variant])
    worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gnnaas-batch")
    gen = torch.Generator().manual_seed(0)

    def batch(seeds: torch.Tensor) -> float:
        t = time.perf_counter()
        handler([ExecRequest(seeds, output="proba")])
        return (time.perf_counter() - t) * 1e3

    def seeds(size: int) -> torch.Tensor:  # drawn before the gap: the worker idles through it
        return torch.randperm(ds.num_nodes, generator=gen)[:size]

    for size in args.sizes:  # warm-up
        for _ in range(10):
            worker.submit(batch, seeds(size)).result()
    cells: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for size in args.sizes:
            for gap_ms in args.gaps_ms:
                times = []
                for _ in range(args.runs):
                    batch_seeds = seeds(size)
                    time.sleep(gap_ms / 1e3)
                    times.append(worker.submit(batch, batch_seeds).result())
                cells.setdefault(f"{size}/{gap_ms:g}", []).append(median(times))
    worker.shutdown()
    return {"threads": torch.get_num_threads(), "cells": cells}


def render(results: dict[str, Any]) -> str:
    """``idle.md`` from a run's results."""
    m, a = results["machine"], results["args"]
    sched = ", ".join(f"`{w}`" for w in results["kernel_sched"]) or "none"
    lines = [
        "# Batch time after the machine idled",
        "",
        f"Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, torch {m.get('torch', '?')}, "
        f"GPU {m.get('gpu') or 'none'}; kernel scheduler options: {sched}. Load average "
        "before: " + ", ".join(f"{x:.2f}" for x in results["load_before"]["load"]) + ".",
        f"Command: `{results['command']}`",
        "",
        f"`{a['variant']}` of {a['dataset']} (the served handler), batches of random distinct "
        "nodes on a worker thread as the batcher runs them, each after an idle gap of the "
        f"column's length; median of {a['runs']} batches per cell and round, {a['rounds']} "
        "rounds (the cell shows each round's median). *Slowdown*: the longest gap's time over "
        "back-to-back batches (gap 0), median of the rounds.",
        "",
    ]
    gaps = a["gaps_ms"]
    for size in a["sizes"]:
        lines += [
            f"## {size}-node batches (ms)",
            "",
            "| torch threads | " + " | ".join(f"gap {g:g} ms" for g in gaps) + " | slowdown |",
            "|---|" + "---:|" * (len(gaps) + 1),
        ]
        for name, run in results["configs"].items():
            cells = [run["cells"][f"{size}/{g:g}"] for g in gaps]
            first, last = median(cells[0]), median(cells[-1])
            lines.append(
                f"| {name} | "
                + " | ".join(" / ".join(f"{x:.2f}" for x in c) for c in cells)
                + f" | {last / first - 1:+.0%} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="synth-flickr@0.2", help="(default: %(default)s)")
    parser.add_argument(
        "--variant", default="gin-full-1x-f10.5-h64", help="variant timed (default: %(default)s)"
    )
    parser.add_argument("--workdir", default=".cache/bench", help="(default: %(default)s)")
    parser.add_argument("--out", help="results folder (default: benchmarks/results)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 256])
    parser.add_argument("--gaps-ms", type=float, nargs="+", default=[0, 1, 3, 10, 30])
    parser.add_argument("--runs", type=int, default=30, help="batches per cell and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--render", metavar="JSON", help="only rewrite idle.md beside its JSON")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--variants-dir", help=argparse.SUPPRESS)
    parser.add_argument("--profiles-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.render:
        render_saved(args.render, render)
        return 0
    if args.child:
        print(json.dumps(child(args)))
        return 0
    variants, profiles = prepare(
        replace(QUICK, dataset=args.dataset, threads=1), Path(args.workdir), "cpu"
    )
    results: dict[str, Any] = {
        "machine": machine_info(),
        "kernel_sched": kernel_sched_options(),
        "load_before": load_snapshot(),
        "args": {k: v for k, v in vars(args).items() if k in _KEPT},
        "command": command_line("bench_idle.py", argv),
        "configs": {},
    }
    for name, (threads, env) in CONFIGS.items():
        say(f"bench_idle: {name}")
        cmd = [sys.executable, __file__, "--child", "--threads", str(threads)]
        cmd += ["--dataset", args.dataset, "--variant", args.variant]
        cmd += ["--variants-dir", str(variants), "--profiles-dir", str(profiles)]
        cmd += ["--runs", str(args.runs), "--rounds", str(args.rounds)]
        cmd += ["--sizes", *map(str, args.sizes), "--gaps-ms", *map(str, args.gaps_ms)]
        done = subprocess.run(
            cmd, env={**os.environ, **env}, capture_output=True, text=True, check=False
        )
        if done.returncode:
            say(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed")
            return 1
        results["configs"][name] = json.loads(done.stdout.strip().splitlines()[-1])
    out = Path(args.out) if args.out else RESULTS
    paths = save_results("idle", results, render, out)
    say(f"bench_idle: {shown(paths[-1])}")
    return 0


_KEPT = ("dataset", "variant", "sizes", "gaps_ms", "runs", "rounds")

if __name__ == "__main__":
    from common import exit_status

    raise SystemExit(exit_status(main))
