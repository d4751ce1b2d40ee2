"""Do the profiles predict what the server measures? Predicted vs measured batch time per variant.

For each dataset: ``gnnaas prepare``-style variants and profiles (reused when present), then
``gnnaas serve`` on a free 127.0.0.1 port on each of ``--threads`` torch thread counts (the
profiles are taken on one; a server on others re-times the curves at start-up), and for every
variant the router routes to (on the frontier; ``--all``: every routable one), pinned with
``X-Variant``, sequential requests (one in flight, so each request is one batch) of 1, 4, 16, 64
and 256 distinct test nodes. The server records each batch's time predicted by the variant's
profiled service curve, alone and times the one device-wide speed factor the router predicted
with, and the time it measured (rounds of 5 requests per variant and size, so a transient
slowdown hits every variant alike); this bench reads that record from
``GET /v1/datasets/{d}/variants`` (``drift``) and prints, per variant and batch size, the median
predicted and measured times and the median absolute relative error, overall and per size.

The target (issue: calibrated service curves; one device-wide factor for machine load may
remain): median absolute error of the router's prediction ≤ 15 % per variant over the batch
sizes served; the curve-alone error is printed beside it. Writes ``drift.md`` and
``drift.json`` (full run: ``benchmarks/results/``; ``--quick``: ``<workdir>/results/``), the page
rendered from the JSON; ``--render drift.json`` rewrites it from a saved run. ``--profile-threads 2
--name drift-p2`` takes the profiles on two threads (a plain ``gnnaas profile`` on 2 cores) and
writes ``drift-p2.md``: then the one-thread server is the one that re-times.

Example:
    python benchmarks/bench_drift.py --datasets Cora synth-flickr@0.2
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
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
    machine_info,
    make_bodies,
    prepare,
    render_saved,
    save_results,
    say,
    serve_cmd,
    shown,
    test_nodes,
)
from loadgen import ServerProcess, StepSpec, free_port, run_closed

__all__ = ["main", "render"]

TARGET = 0.15


def measure(args: argparse.Namespace, dataset: str, threads: int) -> dict[str, Any]:
    """Variants, profiles (taken on ``--profile-threads``) and the drift record of a server of
    ``dataset`` on ``threads`` torch threads (on others than the profiles' it re-times their
    curves at start-up)."""
    plan = replace(
        QUICK,
        dataset=dataset,
        epochs=args.epochs,
        profile_runs=args.profile_runs,
        threads=args.profile_threads,
    )
    workdir = Path(args.workdir)
    folder = "profiles" if args.profile_threads == 1 else f"profiles-{args.profile_threads}t"
    variants_dir, profiles_dir = prepare(plan, workdir, args.device, folder)
    nodes = test_nodes(dataset, workdir)
    sizes = [s for s in args.sizes if s <= len(nodes)]
    port = free_port()
    env = {"GNNAAS_TORCH_THREADS": str(threads), "GNNAAS_MAX_WAIT_MS": "0"}
    cmd = serve_cmd(dataset, variants_dir, profiles_dir, port, args.device)
    log = workdir / f"drift-{dataset}-{threads}t.log"
    with ServerProcess(cmd, port, log, env=env) as server:
        url = f"{server.base_url}/v1/datasets/{dataset}/predict"
        listing = server.get_json(f"/v1/datasets/{dataset}/variants")["variants"]
        # The variants the router routes to (on the frontier), or every routable one (--all).
        routable = [
            v["id"] for v in listing if v["routable"] and (args.all or not v.get("dominated_by"))
        ]
        bodies = {size: make_bodies(nodes, size, 64, seed=size) for size in sizes}
        # Rounds over all variants and sizes, a few requests each: a transient slowdown of the
        # machine then hits every variant alike instead of one variant's whole series.
        per_round = 5
        for r in range((args.requests + per_round - 1) // per_round):
            for vid in routable:
                for size in sizes:
                    spec = StepSpec(
                        rate_rps=0.0,
                        duration_s=args.max_s_per_size,
                        max_requests=per_round,
                        concurrency=1,
                        seed=r * 1000 + size,
                    )
                    asyncio.run(run_closed(url, bodies[size], {"X-Variant": vid}, spec))
            say(f"  {dataset}: round {r + 1}, {len(routable)} variants x {len(sizes)} sizes")
        listing = server.get_json(f"/v1/datasets/{dataset}/variants")["variants"]
    rows = []
    for v in listing:
        drift = v.get("drift") or {}
        if not v["routable"] or not drift.get("count"):
            continue
        rows.append(
            {
                "variant": v["id"],
                "count": drift["count"],
                "median_abs_rel_error": drift["median_abs_rel_error"],
                "median_rel_error": drift["median_rel_error"],
                "median_abs_rel_error_scaled": drift["median_abs_rel_error_scaled"],
                "factor_median": drift["factor_median"],
                "jitter": drift.get("jitter"),
                "by_batch_nodes": drift["by_batch_nodes"],
                "profile_threads": (v.get("profile") or {}).get("threads"),
                "retimed": bool(v.get("retimed")),
            }
        )
    return {
        "dataset": dataset,
        "server_threads": threads,
        "profile_threads": args.profile_threads,
        "retimed": sum(r["retimed"] for r in rows),
        "sizes": sizes,
        "rows": rows,
    }


def _worst_bias(row: dict[str, Any], factor: float = 1.0) -> float:
    """The median error of the batch size whose median is farthest off (signed), with the
    measured times divided by ``factor``."""
    medians = [(1 + b["median_rel_error"]) / factor - 1 for b in row["by_batch_nodes"].values()]
    return max(medians, key=abs) if medians else math.nan


def _device_factor(rows: list[dict[str, Any]]) -> float:
    """Median of measured / predicted over every variant and batch size of one dataset."""
    ratios = [1 + b["median_rel_error"] for r in rows for b in r["by_batch_nodes"].values()]
    return median(ratios) if ratios else 1.0


def render(results: dict[str, Any]) -> str:
    """``drift.md`` from a run's results."""
    m = results["machine"]
    lines = [
        "# Service curves: predicted vs measured batch time",
        "",
        f"Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, torch {m.get('torch', '?')}, "
        f"GPU {m.get('gpu') or 'none'}; profiles taken on "
        f"{results['args'].get('profile_threads', 1)} torch thread(s) on the same machine "
        "by the same command; servers on the threads each section names (on others than the "
        "profiles', the server re-times the curves at start-up). Load average before: "
        + ", ".join(f"{x:.2f}" for x in results["load_before"])
        + ".",
        f"Command: `python benchmarks/bench_drift.py {results['args_line']}`",
        "",
        "Each variant the router routes to (on the frontier; `--all`: every routable one) pinned, "
        "sequential requests (one batch each) of "
        f"{results['args']['requests']} per size. Error = measured / predicted − 1 per batch; "
        f"the server's `/v1/datasets/{{d}}/variants` `drift` record. Target: median |error| ≤ "
        f"{TARGET:.0%} per variant. *As routed*: the time the router predicted when it chose, "
        "the profiled curve times the server's one device-wide speed factor at that moment (its "
        "median over the batches in the next column); *curve alone*: the profiled curve "
        "unscaled. The verdict (ok) is on the prediction as routed.",
        "",
        "*Jitter* is the median deviation of a batch from the median of the batches of the same "
        "size and variant (the same server, the same minute): no curve indexed by batch size can "
        "have a smaller median |error| than that. *Worst size bias* is the largest |median "
        "error| over the batch sizes: how far the curve itself is off (the figure a curve "
        "controls, and what the policy's choices depend on). *After the device factor*: the "
        "same per-size medians divided by one factor for the whole machine (the median of "
        "measured / predicted over every variant and size; the server's own `Slowdown` factor "
        "plays this role): a VM whose speed moved between the profiling minute and this one "
        "moves every curve alike, which this factor removes; what remains is the curves' error "
        "relative to each other.",
        "",
    ]
    for block in results["datasets"]:
        sizes = block["sizes"]
        lines += [
            f"## {block['dataset']}, server on {block.get('server_threads', 1)} torch thread(s)",
            "",
            f"Curves re-timed at start-up: {block.get('retimed', 0)} of {len(block['rows'])}.",
            "",
            f"Device factor (measured / predicted, median over variants and sizes): "
            f"{_device_factor(block['rows']):.3f}.",
            "",
            "| variant | batches | median abs error as routed | server factor | "
            "median abs error, curve alone | jitter | worst size bias | "
            "worst size bias after the device factor | "
            + " | ".join(f"{s} nodes: pred / meas ms" for s in sizes)
            + " | ok |",
            "|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(sizes) + "---|",
        ]
        for r in block["rows"]:
            cells = []
            for s in sizes:
                b = r["by_batch_nodes"].get(f"<={s}")
                cells.append(
                    "–"
                    if b is None
                    else f"{b['predicted_ms_median']:.2f} / {b['measured_ms_median']:.2f}"
                )
            ok = r["median_abs_rel_error_scaled"] <= TARGET
            jitter = r.get("jitter")
            bias = _worst_bias(r)
            factor = _device_factor(block["rows"])
            lines.append(
                f"| {r['variant']} | {r['count']} | {r['median_abs_rel_error_scaled']:.1%} | "
                f"{r['factor_median']:.2f} | {r['median_abs_rel_error']:.1%} | "
                + ("–" if jitter is None else f"{jitter:.1%}")
                + f" | {bias:+.1%} | {_worst_bias(r, factor):+.1%} | "
                + " | ".join(cells)
                + f" | {'yes' if ok else '**no**'} |"
            )
        errs = sorted(r["median_abs_rel_error_scaled"] for r in block["rows"])
        alone = sorted(r["median_abs_rel_error"] for r in block["rows"])
        if errs:
            biases = sorted(abs(_worst_bias(r)) for r in block["rows"])
            factor = _device_factor(block["rows"])
            relative = sorted(abs(_worst_bias(r, factor)) for r in block["rows"])
            jitters = sorted(r["jitter"] for r in block["rows"] if r.get("jitter") is not None)
            lines += [
                "",
                f"As routed: {sum(e <= TARGET for e in errs)} of {len(errs)} variants within "
                f"{TARGET:.0%}; worst {errs[-1]:.1%}, median {median(errs):.1%}. Curve "
                f"alone: {sum(e <= TARGET for e in alone)} of {len(alone)}; worst "
                f"{alone[-1]:.1%}, median {median(alone):.1%}. Jitter floor: median "
                + (f"{median(jitters):.1%}" if jitters else "–")
                + f". Worst size bias within {TARGET:.0%}: {sum(b <= TARGET for b in biases)} "
                f"of {len(biases)} (median {median(biases):.1%}); after the device "
                f"factor {sum(b <= TARGET for b in relative)} of {len(relative)} (median "
                f"{median(relative):.1%}).",
            ]
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--datasets", nargs="+", default=["Cora", "synth-flickr@0.2"], help="datasets to measure"
    )
    parser.add_argument("--quick", action="store_true", help="fewer requests, results in workdir")
    parser.add_argument("--workdir", default=".cache/bench", help="(default: .cache/bench)")
    parser.add_argument("--out", help="results folder (default: benchmarks/results)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    parser.add_argument("--requests", type=int, default=None, help="per variant and size")
    parser.add_argument("--max-s-per-size", type=float, default=10.0)
    parser.add_argument("--epochs", type=int, default=4, help="max training epochs (default: 4)")
    parser.add_argument("--profile-runs", type=int, default=10, help="(default: 10)")
    parser.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=[1, 2],
        help="torch threads of the server, one run each (default: 1 2)",
    )
    parser.add_argument(
        "--profile-threads",
        type=int,
        default=1,
        help="torch threads the profiles are taken on (default: 1; others than 1 are kept in "
        "<workdir>/profiles-<n>t)",
    )
    parser.add_argument(
        "--name", default="drift", help="results file stem: <name>.md and <name>.json"
    )
    parser.add_argument(
        "--all", action="store_true", help="every routable variant, also the dominated ones"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a variant misses")
    parser.add_argument("--render", metavar="JSON", help="only rewrite drift.md beside its JSON")
    args = parser.parse_args(argv)
    if args.render:
        render_saved(args.render, render)
        return 0
    if args.requests is None:
        args.requests = 10 if args.quick else 30
    out = (
        Path(args.out) if args.out else (Path(args.workdir) / "results" if args.quick else RESULTS)
    )
    t0 = time.monotonic()
    results: dict[str, Any] = {
        "machine": machine_info(),
        "load_before": list(os.getloadavg()),
        "args": {k: v for k, v in vars(args).items() if k not in ("out", "name")},
        "args_line": " ".join(sys.argv[1:] if argv is None else argv),
        "command": command_line("bench_drift.py", argv),
        "datasets": [measure(args, d, t) for d in args.datasets for t in args.threads],
    }
    save_results(args.name, results, render, out)
    misses = [
        (b["dataset"], r["variant"], r["median_abs_rel_error_scaled"])
        for b in results["datasets"]
        for r in b["rows"]
        if r["median_abs_rel_error_scaled"] > TARGET
    ]
    for d, v, e in misses:
        say(f"bench_drift: {d} {v}: median |error| as routed {e:.1%} > {TARGET:.0%}")
    total = sum(len(b["rows"]) for b in results["datasets"])
    say(
        f"bench_drift: {total - len(misses)}/{total} variants within {TARGET:.0%}; "
        f"{shown(out / f'{args.name}.md')} in {time.monotonic() - t0:.0f} s"
    )
    return 1 if args.check and misses else 0


if __name__ == "__main__":
    from common import exit_status

    raise SystemExit(exit_status(main))
