"""One-command GPU check (``make gpu-check``): the CUDA tests and the CUDA end-to-end latency.

On a machine with CUDA, within ``--budget-s`` (default 270 s, under the issue's 5 minutes on one
GPU; every loop is bounded by it):

1. **CUDA tests**: pytest on the test files that hold CUDA-gated tests (found by their
   ``torch.cuda.is_available()`` skip), selected with ``-k cuda``, in a child process with a time
   limit.
2. **Latency grid** through the served path (:class:`gnnaas.inference.InferencePath` on
   ``cuda``, serving sampler, fanouts (25, 10)): ``--datasets`` (default synth-flickr and
   synth-reddit, full size: generating them takes seconds) × pruning 1× and 8× (the first ⌊f/k⌋
   columns) × cache off, a budget holding 10% of the 1× features, and every node resident
   (:class:`~gnnaas.inference.FeatureCache`) × 1 and 1,024 seeds. The model is a 2-layer
   GraphSAGE, 256 hidden, weights initialized and not trained (latency does not depend on their
   values). The cache's nodes are ranked by their feature reads over the first 8,192 validation
   nodes (:func:`gnnaas.profiling.cacheplan.count_reads`); timed batches are drawn from the test
   nodes. Per cell: warm-up, then up to ``--runs`` runs or ``--cell-s`` seconds; p50 of
   ``latency_ms`` (comm + comp, CUDA events), of the wall time of the call (``e2e_ms``, sampling
   included) and of each stage, the mean hit ratio and MB copied host→device per batch.

Writes ``gpu.json`` and ``gpu.md`` (generated from it, naming the card with
:func:`torch.cuda.get_device_name`) into ``benchmarks/results/`` unless ``--out``; ``--render
gpu.json`` rewrites the page from a saved run. Without CUDA it prints ``no CUDA device: nothing
to check`` and exits 0 having written nothing: the committed ``gpu.json`` and ``gpu.md`` keep the
last run on a GPU (a machine without one has nothing to replace them with); with ``--out DIR``
it writes both files there saying so (date and machine; no figure). The exit status is 1 only
when a CUDA test failed.

Example:
    python benchmarks/gpu_check.py
    python benchmarks/gpu_check.py --datasets synth-flickr@0.2 --budget-s 120 --out /tmp/gpu
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gnnaas.stats import median

from common import (
    REPO,
    RESULTS,
    command_line,
    machine_info,
    render_saved,
    save_results,
    say,
    shown,
    utc_now,
)

sys.path.insert(0, str(REPO))  # this checkout's gnnaas, also under a Python that lacks it

__all__ = ["main", "render"]

DATASETS = ("synth-flickr", "synth-reddit")
PRUNES = (1, 8)
SEEDS = (1, 1024)
CACHES = ("off", "10% of 1x", "all resident")
FANOUTS = (25, 10)
HIDDEN = 256
PLAN_SEEDS = 8192
_CUDA_GATE = "torch.cuda.is_available()"


def cuda_test_files() -> list[str]:
    """Test files holding CUDA-gated tests."""
    files = sorted(p for p in (REPO / "tests").rglob("test_*.py") if _CUDA_GATE in p.read_text())
    return [str(p.relative_to(REPO)) for p in files]


def run_cuda_tests(timeout_s: float) -> dict[str, Any]:
    """``pytest -k cuda`` over the CUDA test files, in a child process with a time limit."""
    files = cuda_test_files()
    command = [sys.executable, "-m", "pytest", "-k", "cuda", "-p", "no:cacheprovider"]
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [*command, *files],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        returncode, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        returncode = -1
        # TimeoutExpired holds bytes whatever text= said
        partial = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        output = f"{partial}\ntimed out after {timeout_s:.0f} s"
    outcome = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected)")
    last = [line for line in output.splitlines() if outcome.search(line)][-1:] or [""]
    counts = {kind: int(n) for n, kind in outcome.findall(last[0])}
    return {
        "command": shlex.join(["python", "-m", "pytest", *command[3:], *files]),
        "files": files,
        "returncode": returncode,
        "summary": last[0],
        "counts": counts,
        "seconds": time.perf_counter() - start,
        "tail": output[-3000:],
    }


def _p50(values: Sequence[float]) -> float:
    return median(values) if values else float("nan")


def latency_grid(args: argparse.Namespace, deadline: float, device: str = "cuda") -> dict[str, Any]:
    """The cells of the grid that fit before ``deadline`` (``time.monotonic()``); ``device`` is
    ``cuda`` here (``cpu`` only to try the script's code without a GPU)."""
    import torch

    from gnnaas.data import load_dataset
    from gnnaas.models import build_model
    from gnnaas.profiling.cacheplan import count_reads
    from gnnaas.runtime import RuntimeGraph, RuntimeVariant

    datasets: dict[str, Any] = {}
    cells: list[dict[str, Any]] = []
    skipped: list[str] = []
    for name in args.datasets:
        if time.monotonic() > deadline:
            skipped.append(f"{name}: every cell (time budget)")
            continue
        start = time.perf_counter()
        store = load_dataset(name, args.data_root)
        load_s = time.perf_counter() - start
        graph = RuntimeGraph(store)
        sampler = graph.sampler(FANOUTS)
        start = time.perf_counter()
        plan_seeds = store.val_idx[:PLAN_SEEDS]
        reads = count_reads(sampler, plan_seeds, store.num_nodes)
        order = torch.sort(reads, descending=True, stable=True).indices  # most read first
        plan_s = time.perf_counter() - start
        perm = torch.randperm(store.test_idx.numel(), generator=torch.Generator().manual_seed(0))
        test_nodes = store.test_idx[perm]
        full_bytes = store.num_nodes * store.num_features * store.x.element_size()
        datasets[name] = {
            "num_nodes": store.num_nodes,
            "num_edges": store.num_edges,
            "num_features": store.num_features,
            "load_s": load_s,
            "plan_s": plan_s,
            "plan_seeds": int(plan_seeds.numel()),
        }
        say(f"{name}: {store.num_nodes:,} nodes, loaded in {load_s:.1f} s, planned {plan_s:.1f} s")
        for prune in PRUNES:
            kept = store.num_features // prune
            features = store.feature_subset(torch.arange(kept))  # [N, F_kept]
            torch.manual_seed(0)
            model = build_model("sage", kept, HIDDEN, store.num_classes).to(device).eval()
            row_bytes = kept * features.element_size()
            for cache_name in CACHES:
                cached = None
                if cache_name != "off":
                    count = store.num_nodes
                    if cache_name == "10% of 1x":
                        count = min(int(0.1 * full_bytes) // row_bytes, store.num_nodes)
                    cached = order[:count].clone()
                variant = RuntimeVariant(
                    name, f"sage-prefix-{prune}x", "sage", "prefix", prune,
                    torch.arange(kept), FANOUTS, model, cache_nodes=cached,
                )  # fmt: skip
                path = variant.executor(graph, device).path
                cache = path.cache
                for num_seeds in SEEDS:
                    label = f"{name} {prune}x cache {cache_name} {num_seeds} seeds"
                    if time.monotonic() > deadline:
                        skipped.append(f"{label} (time budget)")
                        continue
                    cells.append(
                        _cell(path, test_nodes, num_seeds, args, deadline)
                        | {
                            "dataset": name,
                            "prune": prune,
                            "features_kept": kept,
                            "cache": cache_name,
                            "cache_nodes": 0 if cache is None else cache.num_cached,
                            "cache_mb": 0.0 if cache is None else cache.nbytes / 2**20,
                            "seeds": num_seeds,
                        }
                    )
                    c = cells[-1]
                    say(
                        f"{label}: latency {c['latency_ms']:.3f} ms, e2e {c['e2e_ms']:.3f} ms, "
                        f"hit {c['hit_ratio']:.3f}, {c['copied_mb']:.2f} MB copied ({c['runs']} "
                        "runs)"
                    )
                del path, cache
                if device == "cuda":
                    torch.cuda.empty_cache()
            del model, features
        del store
    return {"datasets": datasets, "cells": cells, "skipped": skipped}


def _cell(
    path: Any, nodes: Any, num_seeds: int, args: argparse.Namespace, deadline: float
) -> dict[str, Any]:
    """Warm-up, then at most ``--runs`` timed batches or ``--cell-s`` seconds."""
    num_nodes = int(nodes.numel())

    def batch(i: int) -> Any:
        return nodes.roll(-((i * num_seeds) % num_nodes))[:num_seeds]

    for i in range(3):
        path.run(batch(i))
    times, walls, moved = [], [], []
    stop = min(time.monotonic() + args.cell_s, deadline)
    i = 3
    while len(times) < args.runs and (len(times) < 3 or time.monotonic() < stop):
        seeds = batch(i)
        start = time.perf_counter()
        out = path.run(seeds)  # returns after the blocking copy of the outputs
        walls.append((time.perf_counter() - start) * 1e3)
        times.append(out.times)
        moved.append(path.last_transfer)
        i += 1
    rows = sum(t.rows for t in moved)
    return {
        "runs": len(times),
        "latency_ms": _p50([t.latency_ms for t in times]),
        "e2e_ms": _p50(walls),
        "sample_ms": _p50([t.sample_ms for t in times]),
        "gather_ms": _p50([t.gather_ms for t in times]),
        "compute_ms": _p50([t.compute_ms for t in times]),
        "copy_ms": _p50([t.copy_ms for t in times]),
        "hit_ratio": sum(t.hits for t in moved) / rows if rows else 0.0,
        "copied_mb": statistics.fmean(t.copied_bytes for t in moved) / 2**20,
        "rows": statistics.fmean(t.rows for t in moved),
    }


def render(results: dict[str, Any]) -> str:
    """``gpu.md`` from the results."""
    m = results["machine"]
    where = (
        f"{m['host']}: {m['cpu']}, {m['cores']} cores, {m['mem_gb']} GB, Python {m['python']}, "
        f"torch {m['torch']}"
    )
    lines = ["# GPU check (`make gpu-check`)", ""]
    if not results["cuda"]:
        build = (
            f"a CUDA {m['cuda']} build of torch"
            if m["cuda"]
            else "a CPU-only build of torch (on a GPU machine: `make gpu-check GPU_PYTHON=...`)"
        )
        lines += [
            f"No CUDA device was available: `torch.cuda.is_available()` was false on {where}, "
            f"{build}, {results['date']}. The CUDA tests were not run and no GPU figure is "
            "claimed; run `make gpu-check` on a machine with a GPU to fill this file.",
            "",
        ]
        return "\n".join(lines)
    tests = results["tests"]
    verdict = "passed" if tests["returncode"] == 0 else f"FAILED (exit {tests['returncode']})"
    lines += [
        f"Card: **{m['gpu']}** ({m.get('gpu_mem_gb')} GB), CUDA {m['cuda']}; host {where}. "
        f"Date: {results['date']}. Written by `{results['command']}` from `gpu.json` in "
        f"{results['wall_s']:.0f} s (budget {results['budget_s']:.0f} s).",
        "",
        "## CUDA tests",
        "",
        f"{verdict}: {tests['summary']} ({tests['seconds']:.0f} s); `{tests['command']}`.",
        "",
        "## End-to-end latency on CUDA",
        "",
        "Served path (`InferencePath` on cuda), serving sampler, fanouts (25, 10), 2-layer SAGE "
        "with 256 hidden (untrained); 1× and 8× keep the first ⌊f/k⌋ feature columns. Cache: "
        "off (every sampled row gathered on the host and copied), a budget holding 10% of the "
        "1× features (the most read nodes over the first validation nodes), or every node "
        "resident. latency = comm + comp (p50, CUDA events); e2e = the wall time of the call, "
        "sampling on the CPU included (p50); hit = rows read from the cache / rows read; MB = "
        "feature rows copied host→device per batch (mean). Batches drawn from the test nodes.",
        "",
    ]
    for name, d in results["grid"]["datasets"].items():
        lines.append(
            f"- {name}: {d['num_nodes']:,} nodes, {d['num_edges']:,} edges, "
            f"{d['num_features']} features; generated/loaded in {d['load_s']:.1f} s, reads "
            f"counted over {d['plan_seeds']:,} validation nodes in {d['plan_s']:.1f} s."
        )
    lines += [
        "",
        "| dataset | prune | cache | cached nodes | seeds | latency ms | e2e ms | sample ms | "
        "gather ms | compute ms | copy ms | hit | MB copied | runs |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in results["grid"]["cells"]:
        lines.append(
            f"| {c['dataset']} | {c['prune']}× | {c['cache']} | {c['cache_nodes']:,} | "
            f"{c['seeds']:,} | {c['latency_ms']:.3f} | {c['e2e_ms']:.3f} | {c['sample_ms']:.3f} | "
            f"{c['gather_ms']:.3f} | {c['compute_ms']:.3f} | {c['copy_ms']:.3f} | "
            f"{c['hit_ratio']:.3f} | {c['copied_mb']:.2f} | {c['runs']} |"
        )
    if results["grid"]["skipped"]:
        lines += ["", "Not measured (time budget): " + "; ".join(results["grid"]["skipped"]) + "."]
    lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the check; 1 when a CUDA test failed, else 0 (also without CUDA)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), help="graphs to time")
    parser.add_argument("--data-root", default=None, help="real datasets (default: $GNNAAS_DATA)")
    parser.add_argument("--runs", type=int, default=30, help="most timed runs per cell")
    parser.add_argument("--cell-s", type=float, default=4.0, help="most seconds per cell")
    parser.add_argument("--budget-s", type=float, default=270.0, help="whole check, seconds")
    parser.add_argument("--tests-s", type=float, default=120.0, help="most seconds for tests")
    parser.add_argument(
        "--out",
        default=None,
        help="folder of gpu.json and gpu.md (default: benchmarks/results; without CUDA nothing "
        "is written unless --out is given)",
    )
    parser.add_argument("--render", metavar="JSON", help="only rewrite gpu.md beside its JSON")
    args = parser.parse_args(argv)
    if args.render:
        render_saved(args.render, render)
        return 0
    out = Path(args.out) if args.out else RESULTS
    start = time.monotonic()
    deadline = start + args.budget_s
    import torch

    results: dict[str, Any] = {
        "date": utc_now(),
        "command": command_line("gpu_check.py", argv),
        "budget_s": args.budget_s,
        "cuda": torch.cuda.is_available(),
        "machine": machine_info(),
    }
    if not results["cuda"]:
        say("no CUDA device: nothing to check")
        if torch.version.cuda is None:
            say(f"(torch {torch.__version__} is a CPU-only build; see GPU_PYTHON in the Makefile)")
        if args.out is None:
            # The committed page holds the last GPU run: a machine without one cannot replace it.
            say(f"nothing written: {shown(RESULTS / 'gpu.md')} keeps the last run on a GPU")
            return 0
    else:
        torch.set_num_threads(min(8, os.cpu_count() or 1))
        say(f"CUDA device: {results['machine']['gpu']}")
        tests_s = min(args.tests_s, max(deadline - time.monotonic() - 60, 10))
        results["tests"] = run_cuda_tests(tests_s)
        say(f"CUDA tests: {results['tests']['summary']}")
        results["grid"] = latency_grid(args, deadline)
    results["wall_s"] = time.monotonic() - start
    save_results("gpu", results, render, out)
    return 1 if results["cuda"] and results["tests"]["returncode"] not in (0, 5) else 0


if __name__ == "__main__":
    from common import exit_status

    raise SystemExit(exit_status(main))
