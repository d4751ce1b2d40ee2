"""Throughput of the samplers: sampled edges per second on synth-flickr and synth-reddit.

Modes: ``random`` and ``consistent`` are :class:`NeighborSampler` (training, and the ``shared``
serving mode); ``depth`` is the serving sampler (:class:`DepthSampler`, its compiled kernel) and
``depth-torch`` the same sampler on its torch path (``DepthSampler(..., fast_path=False)``).
For each graph and mode it samples batches of random seeds (batch 1024,
fanouts (25, 10) by default) after a warm-up and prints sampled edges/s, batches/s and the p50/p95
wall time per batch, plus sampled edges per second of the thread's own CPU time ("cpu Medges/s"),
which stays meaningful when other processes share the cores. Graphs come from
``gnnaas.data.load_dataset("synth-<preset>")`` when the data layer provides it; otherwise (or with
``--synthetic-only``) from a Chung-Lu power-law graph built here with the preset's node and edge
counts.

Every case is measured ``--repeats`` times (the graphs loaded once); the page gives the median and
the range. Writes ``sampler.json`` and ``sampler.md`` rendered from it (full run:
``benchmarks/results/``; ``--quick``: ``<workdir>/results/`` unless ``--out`` says otherwise);
``--render sampler.json`` rewrites the page from a saved run.

Usage::

    python benchmarks/bench_sampler.py            # full run
    python benchmarks/bench_sampler.py --quick    # a few seconds per case
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import torch

from gnnaas.sampling import DepthSampler, NeighborSampler, fastpath
from gnnaas.stats import median, percentile

from common import RESULTS, command_line, machine_info, render_saved, save_results, say, utc_now

__all__ = ["main", "render"]

MODES = ("random", "consistent", "depth", "depth-torch")

# nodes, (directed) edges of the presets in docs/architecture.md §3
PRESETS = {"flickr": (89_250, 899_756), "reddit": (232_965, 11_606_919)}


def power_law_csr(
    num_nodes: int, num_edges: int, seed: int = 0, exponent: float = 2.5
) -> tuple[torch.Tensor, torch.Tensor]:
    """A symmetric Chung-Lu graph with power-law expected degrees, as (rowptr, col).

    Expected degrees follow ``(i + 1) ** (-1 / (exponent - 1))``, capped at ``sqrt(E)``;
    self-loops and duplicate edges are dropped, so the edge count lands near ``num_edges``.
    """
    g = torch.Generator().manual_seed(seed)
    w = torch.arange(1, num_nodes + 1, dtype=torch.float64).pow_(-1.0 / (exponent - 1.0))
    w = w / w.sum() * num_edges
    w = w.clamp_(max=num_edges**0.5)
    cdf = (w / w.sum()).cumsum(0)
    half = int(num_edges * 0.52)  # a little extra to make up for the dropped duplicates
    ends = torch.searchsorted(cdf, torch.rand(2, half, generator=g, dtype=torch.float64))
    ends = ends.clamp_(max=num_nodes - 1)
    perm = torch.randperm(num_nodes, generator=g)  # do not tie degree to node id
    src, dst = perm[ends[0]], perm[ends[1]]
    keep = src != dst
    src, dst = src[keep], dst[keep]
    key = torch.cat([dst * num_nodes + src, src * num_nodes + dst]).unique()  # sorted by target
    dst, src = key // num_nodes, key % num_nodes
    rowptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
    rowptr[1:] = torch.bincount(dst, minlength=num_nodes).cumsum(0)
    return rowptr, src


def load_graph(preset: str, synthetic_only: bool) -> tuple[torch.Tensor, torch.Tensor, str]:
    """(rowptr, col, source description) of ``synth-<preset>``."""
    if not synthetic_only:
        try:
            from gnnaas.data import load_dataset  # type: ignore[attr-defined]
        except ImportError:
            pass
        else:
            store = load_dataset(f"synth-{preset}")
            return store.rowptr, store.col, f"load_dataset('synth-{preset}')"
    rowptr, col = power_law_csr(*PRESETS[preset])
    return rowptr, col, "power-law fallback"


def build_sampler(
    mode: str, rowptr: torch.Tensor, col: torch.Tensor, fanouts: list[int], seed: int
) -> NeighborSampler | DepthSampler:
    """The sampler a mode names (see the module docstring)."""
    if mode in ("random", "consistent"):
        return NeighborSampler(rowptr, col, fanouts, consistent=mode == "consistent", seed=seed)
    return DepthSampler(rowptr, col, fanouts, seed=seed, fast_path=mode == "depth")


def bench_case(
    sampler: NeighborSampler | DepthSampler,
    num_nodes: int,
    batch_size: int,
    warmup: int,
    iters: int,
    seed: int,
) -> dict[str, float]:
    """Times ``iters`` sample() calls on random seed batches; returns the figures."""
    g = torch.Generator().manual_seed(seed)
    batches = [torch.randperm(num_nodes, generator=g)[:batch_size] for _ in range(warmup + iters)]
    sample_gen = torch.Generator().manual_seed(seed + 1)
    times, cpu_times, edges, nodes = [], [], 0, 0
    for i, seeds in enumerate(batches):
        c0, t0 = time.thread_time(), time.perf_counter()
        sub = sampler.sample(seeds, generator=sample_gen)
        dt, dc = time.perf_counter() - t0, time.thread_time() - c0
        if i >= warmup:
            times.append(dt)
            cpu_times.append(dc)
            edges += sub.num_sampled_edges
            nodes += sub.num_nodes
    total = sum(times)
    times_ms = sorted(t * 1e3 for t in times)
    return {
        "edges_per_s": edges / total,
        "cpu_edges_per_s": edges / sum(cpu_times),
        "batches_per_s": len(times) / total,
        "p50_ms": median(times_ms),
        "p95_ms": percentile(times_ms, 95),
        "edges_per_batch": edges / len(times),
        "nodes_per_batch": nodes / len(times),
    }


def _spread(values: list[float], scale: float = 1.0, fmt: str = ".2f") -> str:
    """``median (min–max)`` of ``values / scale``; the value alone for one repeat."""
    vals = [v / scale for v in values]
    if len(vals) == 1:
        return format(vals[0], fmt)
    return f"{format(median(vals), fmt)} ({format(min(vals), fmt)}–{format(max(vals), fmt)})"


def render(results: dict[str, Any]) -> str:
    """``sampler.md`` from a run's results."""
    m, a = results["machine"], results["args"]
    repeats = a["repeats"]
    lines = [
        "# Sampler throughput",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['mem_gb']} GB; torch {m['torch']} "
        f"({results['torch_threads']} thread), Python {m['python']}; compiled depth kernel "
        f"{'on' if results['compiled_kernel'] else 'unavailable (it did not compile)'}. Date: "
        f"{results['date'][:10]}; load average before the run "
        + " / ".join(f"{v:.2f}" for v in results["load_before"])
        + f". Command: `{results['command']}`.",
        "",
        f"Batches of {a['batch_size']:,} random seeds, fanouts {tuple(a['fanouts'])}, "
        f"{results['iters']} timed batches after {results['warmup']} warm-up per case; "
        + (f"median (min–max) of {repeats} repeats. " if repeats > 1 else "one repeat. ")
        + "*Thread CPU* divides by the sampling thread's own CPU time (`time.thread_time()`), "
        "which other processes sharing the cores do not inflate; *wall* by the wall clock. "
        "`depth` is the serving sampler (`DepthSampler`, compiled kernel), `depth-torch` the same "
        "sampler on its torch path (`fast_path=False`), `random` and `consistent` are "
        "`NeighborSampler` (training, and the `shared` serving mode).",
    ]
    for g in results["graphs"]:
        lines += [
            "",
            f"## synth-{g['preset']}: {g['num_nodes']:,} nodes, {g['num_edges']:,} edges",
            "",
            f"From {g['source']} ({g['load_s']:.1f} s).",
            "",
            "| mode | M edges/s, thread CPU | M edges/s, wall | batches/s | p50 ms | p95 ms "
            "| edges / batch | nodes / batch |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for mode, runs in g["modes"].items():

            def col(key: str, runs: list[dict[str, float]] = runs) -> list[float]:
                return [r[key] for r in runs]

            lines.append(
                f"| {mode} | {_spread(col('cpu_edges_per_s'), 1e6)} | "
                f"{_spread(col('edges_per_s'), 1e6)} | "
                f"{_spread(col('batches_per_s'), fmt='.1f')} | "
                f"{_spread(col('p50_ms'))} | {_spread(col('p95_ms'))} | "
                f"{median(col('edges_per_batch')):,.0f} | "
                f"{median(col('nodes_per_batch')):,.0f} |"
            )
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short run (fewer batches)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    parser.add_argument("--batch-size", type=int, default=1024, help="seeds per batch")
    parser.add_argument(
        "--fanouts", type=int, nargs="+", default=[25, 10], help="PyG order (default: 25 10)"
    )
    parser.add_argument(
        "--datasets", nargs="+", default=["flickr", "reddit"], choices=sorted(PRESETS)
    )
    parser.add_argument(
        "--modes", nargs="+", default=list(MODES), choices=MODES, help="default: all"
    )
    parser.add_argument("--iters", type=int, default=None, help="timed batches per case")
    parser.add_argument(
        "--repeats", type=int, default=None, help="measurements of each case (default: 3, quick 1)"
    )
    parser.add_argument(
        "--synthetic-only",
        action="store_true",
        help="use the built-in power-law graphs even when gnnaas.data.load_dataset exists",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default=".cache/bench", help="(default: .cache/bench)")
    parser.add_argument(
        "--out", help="results folder (default: benchmarks/results, quick: <workdir>/results)"
    )
    parser.add_argument("--render", metavar="JSON", help="only rewrite sampler.md beside its JSON")
    args = parser.parse_args(argv)
    if args.render:
        render_saved(args.render, render)
        return 0

    torch.set_num_threads(args.threads)
    iters = args.iters or (10 if args.quick else 50)
    warmup = 2 if args.quick else 5
    args.repeats = args.repeats or (1 if args.quick else 3)
    results: dict[str, Any] = {
        "date": utc_now(),
        "machine": machine_info(),
        "command": command_line("bench_sampler.py", argv),
        "args": {k: v for k, v in vars(args).items() if k not in ("out", "render")},
        "load_before": list(os.getloadavg()),
        "torch_threads": torch.get_num_threads(),
        "compiled_kernel": fastpath.available(),
        "iters": iters,
        "warmup": warmup,
        "graphs": [],
    }
    say(
        f"# torch {torch.__version__}, threads {torch.get_num_threads()}, batch {args.batch_size}, "
        f"fanouts {tuple(args.fanouts)}, {iters} timed batches after {warmup} warm-up, "
        f"{args.repeats} repeats, compiled depth kernel "
        f"{'on' if fastpath.available() else 'unavailable (it did not compile)'}"
    )
    header = (
        f"{'dataset':<13} {'mode':<11} {'Medges/s':>9} {'batch/s':>8} {'p50 ms':>8} "
        f"{'p95 ms':>8} {'cpu Medges/s':>12} {'edges/b':>8} {'nodes/b':>8}"
    )
    for preset in args.datasets:
        t0 = time.perf_counter()
        rowptr, col, source = load_graph(preset, args.synthetic_only)
        num_nodes = rowptr.numel() - 1
        graph: dict[str, Any] = {
            "preset": preset,
            "num_nodes": num_nodes,
            "num_edges": col.numel(),
            "source": source,
            "load_s": time.perf_counter() - t0,
            "modes": {mode: [] for mode in args.modes},
        }
        results["graphs"].append(graph)
        say(
            f"\n## synth-{preset}: {num_nodes:,} nodes, {col.numel():,} edges ({source}, "
            f"{graph['load_s']:.1f} s)"
        )
        say(header)
        for _ in range(args.repeats):
            for mode in args.modes:
                sampler = build_sampler(mode, rowptr, col, args.fanouts, args.seed)
                r = bench_case(sampler, num_nodes, args.batch_size, warmup, iters, args.seed)
                graph["modes"][mode].append(r)
                say(
                    f"{'synth-' + preset:<13} {mode:<11} {r['edges_per_s'] / 1e6:>9.2f} "
                    f"{r['batches_per_s']:>8.1f} {r['p50_ms']:>8.2f} {r['p95_ms']:>8.2f} "
                    f"{r['cpu_edges_per_s'] / 1e6:>12.2f} {r['edges_per_batch']:>8.0f} "
                    f"{r['nodes_per_batch']:>8.0f}"
                )
    quick_out = Path(args.workdir) / "results"
    out = Path(args.out) if args.out else (quick_out if args.quick else RESULTS)
    save_results("sampler", results, render, out)
    return 0


if __name__ == "__main__":
    from common import exit_status

    raise SystemExit(exit_status(main))
