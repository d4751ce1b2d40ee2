"""Throughput of the samplers: sampled edges per second on synth-flickr and synth-reddit.

Modes: ``random`` and ``consistent`` are :class:`NeighborSampler` (training, and the ``shared``
serving mode); ``depth`` is the serving sampler (:class:`DepthSampler`, compiled kernel when numba
is installed) and ``depth-torch`` the same sampler on its torch path (``GNNAAS_FAST_SAMPLER=0``).
For each graph and mode it samples batches of random seeds (batch 1024,
fanouts (25, 10) by default) after a warm-up and prints sampled edges/s, batches/s and the p50/p95
wall time per batch, plus sampled edges per second of the thread's own CPU time ("cpu Medges/s"),
which stays meaningful when other processes share the cores. Graphs come from
``gnnaas.data.load_dataset("synth-<preset>")`` when the data layer provides it; otherwise (or with
``--synthetic-only``) from a Chung-Lu power-law graph built here with the preset's node and edge
counts.

Usage::

    python benchmarks/bench_sampler.py            # full run
    python benchmarks/bench_sampler.py --quick    # a few seconds per case
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gnnaas.sampling import DepthSampler, NeighborSampler, fastpath  # noqa: E402

MODES = ("random", "consistent", "depth", "depth-torch")

# nodes, (directed) edges of the presets in ARCHITECTURE.md §3
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
        "p50_ms": statistics.median(times_ms),
        "p95_ms": times_ms[min(len(times_ms) - 1, int(0.95 * len(times_ms)))],
        "edges_per_batch": edges / len(times),
        "nodes_per_batch": nodes / len(times),
    }


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
        "--synthetic-only",
        action="store_true",
        help="use the built-in power-law graphs even when gnnaas.data.load_dataset exists",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    iters = args.iters or (10 if args.quick else 50)
    warmup = 2 if args.quick else 5
    print(
        f"# torch {torch.__version__}, threads {torch.get_num_threads()}, batch {args.batch_size}, "
        f"fanouts {tuple(args.fanouts)}, {iters} timed batches after {warmup} warm-up, "
        f"compiled depth kernel {'on' if fastpath.available() else 'unavailable (numba missing)'}"
    )
    header = (
        f"{'dataset':<13} {'mode':<11} {'Medges/s':>9} {'batch/s':>8} {'p50 ms':>8} "
        f"{'p95 ms':>8} {'cpu Medges/s':>12} {'edges/b':>8} {'nodes/b':>8}"
    )
    for preset in args.datasets:
        t0 = time.perf_counter()
        rowptr, col, source = load_graph(preset, args.synthetic_only)
        num_nodes = rowptr.numel() - 1
        print(
            f"\n## synth-{preset}: {num_nodes:,} nodes, {col.numel():,} edges ({source}, "
            f"{time.perf_counter() - t0:.1f} s)"
        )
        print(header)
        for mode in args.modes:
            sampler = build_sampler(mode, rowptr, col, args.fanouts, args.seed)
            r = bench_case(sampler, num_nodes, args.batch_size, warmup, iters, args.seed)
            print(
                f"{'synth-' + preset:<13} {mode:<11} {r['edges_per_s'] / 1e6:>9.2f} "
                f"{r['batches_per_s']:>8.1f} {r['p50_ms']:>8.2f} {r['p95_ms']:>8.2f} "
                f"{r['cpu_edges_per_s'] / 1e6:>12.2f} {r['edges_per_batch']:>8.0f} "
                f"{r['nodes_per_batch']:>8.0f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
