"""Synthetic datasets: build time, peak memory and the graphs' statistics, and the on-disk cache.

1. **Build**: each preset (``--presets``, default all six) built by ``make_synthetic`` (no cache)
   in a fresh child process; the child reports the build time and the graph (nodes, stored edges
   against the preset's target, features, classes, degrees, edge homophily: the share of edges
   whose ends share a label, single-label graphs), the parent the child's wall time (Python and
   torch start-up included), its CPU time and its peak resident memory (``wait4``'s
   ``ru_maxrss``).
2. **Cache** (``--cache-dataset``, default synth-products; ``none`` skips it):
   ``load_dataset`` twice with a fresh cache folder, each call in a child process: the first builds
   the graph and writes the cache, the second reads it (memory-mapped).

Writes ``datasets.json`` and ``datasets.md`` rendered from it (full run: ``benchmarks/results/``;
``--quick``, synth-small and synth-flickr@0.1 without the cache part: ``<workdir>/results/`` unless
``--out`` says otherwise); ``--render JSON`` rewrites the page from a saved run.

Example:
    python benchmarks/bench_datasets.py
    python benchmarks/bench_datasets.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import RESULTS, command_line, machine_info, render_saved, save_results, say, utc_now

__all__ = ["main", "render"]

PRESETS = ("small", "flickr", "arxiv", "reddit", "yelp", "products")
QUICK_DATASETS = ("synth-small", "synth-flickr@0.1")
# The budgets for the build (the figure's goal, not a measurement).
BUDGETS = {"synth-flickr": "≤ 15 s", "synth-products": "≤ 3 min, ≤ 12 GB"}


def _child_build(dataset: str) -> dict[str, Any]:
    """In the child: ``make_synthetic`` of ``dataset``, timed, and the graph's statistics."""
    import torch

    from gnnaas.data.synthetic import PRESETS as CONFIGS
    from gnnaas.data.synthetic import make_synthetic, parse_synthetic_name
    from gnnaas.stats import median

    preset, scale, name = parse_synthetic_name(dataset)
    cfg = CONFIGS[preset].scaled(scale)
    start = time.perf_counter()
    store = make_synthetic(cfg, name, seed=0)
    build_s = time.perf_counter() - start
    degree = (store.rowptr[1:] - store.rowptr[:-1]).double()
    out: dict[str, Any] = {
        "dataset": name,
        "build_s": build_s,
        "num_nodes": store.num_nodes,
        "num_edges": store.num_edges,
        "target_edges": cfg.num_edges,
        "num_features": store.num_features,
        "num_classes": store.num_classes,
        "multi_label": bool(store.multi_label),
        "degree_mean": float(degree.mean()),
        "degree_median": median(degree.numpy()),
        "degree_max": int(degree.max()),
        "homophily": None,
    }
    if not store.multi_label:
        dst = torch.repeat_interleave(torch.arange(store.num_nodes), degree.long())
        out["homophily"] = float((store.y[store.col] == store.y[dst]).double().mean())
    return out


def _child_load(dataset: str, cache_dir: str) -> dict[str, Any]:
    """In the child: ``load_dataset`` of ``dataset`` with ``cache_dir``, timed."""
    from gnnaas.data import load_dataset

    start = time.perf_counter()
    load_dataset(dataset, cache_dir=cache_dir)
    return {"load_s": time.perf_counter() - start}


def _in_child(args: list[str]) -> dict[str, Any]:
    """Runs this script with ``args`` in a child; its JSON line plus wall, CPU and peak RSS."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True, env=os.environ
    )
    assert proc.stdout is not None
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"bench_datasets: child {' '.join(args)} exited {proc.returncode}")
    return {
        **json.loads(output.strip().splitlines()[-1]),
        "wall_s": wall,
        "user_s": usage.ru_utime,
        "system_s": usage.ru_stime,
        "peak_rss_gib": usage.ru_maxrss / 2**20,  # KiB on Linux
    }


def render(results: dict[str, Any]) -> str:
    """``datasets.md`` from a run's results."""
    m = results["machine"]
    lines = [
        "# Synthetic dataset build: time and peak memory",
        "",
        f"Date: {results['date'][:10]}. Machine: {m['cpu']}, {m['cores']} cores, "
        f"{m['mem_gb']} GB, {m.get('gpu') or 'no GPU'}; torch {m['torch']} "
        f"({m['torch_threads']} threads); load average before the run "
        + " / ".join(f"{v:.2f}" for v in results["load_before"])
        + f". Command: `{results['command']}`.",
        "",
        "Each graph built by `make_synthetic` (seed 0, no cache) in a fresh process: *build* is "
        "the build alone; *wall*, *CPU* (user + system) and *peak RSS* are the whole process's, "
        "Python and torch start-up included. Homophily: the share of stored edges whose ends "
        "share a label.",
        "",
        "| dataset | nodes | edges (stored, target) | features | classes | build s | wall s | "
        "CPU s | peak RSS GiB | degree mean / median / max | homophily | budget |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for b in results["builds"]:
        classes = f"{b['num_classes']}{' (multi-label)' if b['multi_label'] else ''}"
        homophily = "–" if b["homophily"] is None else f"{b['homophily']:.3f}"
        lines.append(
            f"| {b['dataset']} | {b['num_nodes']:,} | {b['num_edges']:,} "
            f"({b['target_edges']:,}) | {b['num_features']} | {classes} | {b['build_s']:.1f} | "
            f"{b['wall_s']:.1f} | {b['user_s'] + b['system_s']:.1f} | {b['peak_rss_gib']:.2f} | "
            f"{b['degree_mean']:.1f} / {b['degree_median']:.0f} / {b['degree_max']:,} | "
            f"{homophily} | {BUDGETS.get(b['dataset'], '')} |"
        )
    cache = results.get("cache")
    if cache:
        lines += [
            "",
            f"## On-disk cache: {cache['dataset']} through `load_dataset`",
            "",
            "Graphs with more than 50 M feature entries plus edges are saved once in the cache "
            "(`$GNNAAS_CACHE`, default `~/.cache/gnnaas`) and memory-mapped copy-on-write when "
            "read again (pages are read when first touched). Each call in a fresh process, the "
            f"first on an empty cache folder; the cache file: {cache['file_gib']:.2f} GiB.",
            "",
            "| call | load s | wall s | peak RSS GiB |",
            "|---|---:|---:|---:|",
        ]
        for label, key in (
            ("first: build + write the cache", "first"),
            ("second: read it", "second"),
        ):
            c = cache[key]
            lines.append(
                f"| {label} | {c['load_s']:.1f} | {c['wall_s']:.1f} | {c['peak_rss_gib']:.2f} |"
            )
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="two small graphs, no cache part")
    parser.add_argument("--datasets", nargs="+", help="(default: synth-<preset> of every preset)")
    parser.add_argument("--cache-dataset", help="(default: synth-products, quick: none)")
    parser.add_argument("--workdir", default=".cache/bench", help="(default: .cache/bench)")
    parser.add_argument(
        "--out", help="results folder (default: benchmarks/results, quick: <workdir>/results)"
    )
    parser.add_argument("--render", metavar="JSON", help="only rewrite the .md beside its JSON")
    parser.add_argument("--child-build", metavar="DATASET", help=argparse.SUPPRESS)
    parser.add_argument("--child-load", nargs=2, metavar=("DATASET", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.render:
        render_saved(args.render, render)
        return 0
    if args.child_build:
        print(json.dumps(_child_build(args.child_build)))
        return 0
    if args.child_load:
        print(json.dumps(_child_load(*args.child_load)))
        return 0
    datasets = args.datasets or (
        list(QUICK_DATASETS) if args.quick else [f"synth-{p}" for p in PRESETS]
    )
    cache_dataset = args.cache_dataset or ("none" if args.quick else "synth-products")
    results: dict[str, Any] = {
        "date": utc_now(),
        "machine": machine_info(),
        "command": command_line("bench_datasets.py", argv),
        "load_before": list(os.getloadavg()),
        "builds": [],
    }
    for dataset in datasets:
        results["builds"].append(_in_child(["--child-build", dataset]))
        say(f"{dataset}: {results['builds'][-1]}")
    if cache_dataset != "none":
        with tempfile.TemporaryDirectory(prefix="gnnaas-bench-cache-") as tmp:
            first = _in_child(["--child-load", cache_dataset, tmp])
            second = _in_child(["--child-load", cache_dataset, tmp])
            size = sum(f.stat().st_size for f in Path(tmp).rglob("*") if f.is_file())
        results["cache"] = {
            "dataset": cache_dataset,
            "first": first,
            "second": second,
            "file_gib": size / 2**30,
        }
        say(f"cache: {results['cache']}")
    quick_out = Path(args.workdir) / "results"
    out = Path(args.out) if args.out else (quick_out if args.quick else RESULTS)
    save_results("datasets", results, render, out)
    return 0


if __name__ == "__main__":
    from common import exit_status

    raise SystemExit(exit_status(main))
