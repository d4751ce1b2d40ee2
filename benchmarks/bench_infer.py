"""Exact layer-wise inference of the whole graph vs sampled inference of every node, and the
precomputed variant served.

1. **Throughput and memory** (``--datasets``, default synth-reddit and synth-products): every node
   of the graph through (a) the exact layer-wise pass (:mod:`gnnaas.inference.layerwise`, full
   neighborhoods, chunks of ``--chunk-size``) and (b) the served sampled pipeline
   (:class:`~gnnaas.inference.InferencePath`, serving sampler, fanouts (25, 10)) in batches of
   1,024 seeds. Each pass runs in a child process of its own (``--child``), so its peak resident
   memory is its own: the figure is the growth of the peak RSS over the RSS right before the pass
   (graph, features and model already loaded). The model is a 2-layer GraphSAGE with the
   variants' width (256 hidden) and the dataset's features and classes, weights initialized, not
   trained: neither pass's speed depends on the weights' values. The ratio of the node rates is
   the figure (the reference study's distributed system reports 27.4×).
2. **One process vs Ray** (``--ray-dataset``, default synth-flickr): the same exact pass as Ray
   tasks over 2 node-range partitions on a local Ray with 2 CPUs, against one process; Ray is
   warmed up by one untimed pass first.
3. **Exact vs sampled accuracy per variant** (``--accuracy-datasets``, default Cora and
   synth-flickr@0.2, the variants of ``bench_policy.py`` in ``--workdir``).
4. **The precomputed variant served** (``--serve-dataset``, default synth-flickr@0.2):
   ``bench_policy.py``'s variants plus the most accurate 1× model precomputed and profiled, one
   ``gnnaas serve`` on 127.0.0.1; ``--requests`` sequential single-node requests pinned to it
   (server-side ``timing_ms.total`` and client latency), the same pinned to its base variant, and
   the same at ``X-Accuracy-Tolerance: 1`` through the router (its share of the traffic).

Writes ``infer.json`` and ``infer.md`` rendered from it (``benchmarks/results/`` unless ``--out``);
``--render infer.json`` rewrites the page from a saved run.

Example:
    python benchmarks/bench_infer.py
    python benchmarks/bench_infer.py --datasets synth-flickr --skip-serve
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gnnaas.stats import percentile

from common import (
    QUICK,
    RESULTS,
    add_precomputed,
    command_line,
    machine_info,
    make_bodies,
    prepare,
    render_saved,
    save_results,
    say,
    serve_cmd,
    test_nodes,
)
from loadgen import ServerProcess, StepSpec, free_port, run_closed

__all__ = ["main", "render"]

FANOUTS = (25, 10)
HIDDEN = 256


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def child(mode: str, dataset: str, chunk_size: int, data_root: str | None) -> dict[str, Any]:
    """One pass over every node in this process: seconds, nodes/s and peak RSS growth."""
    import torch

    from gnnaas.data import load_dataset
    from gnnaas.inference.layerwise import layerwise_inference, peak_bytes
    from gnnaas.models import build_model
    from gnnaas.runtime import sampled_path

    store = load_dataset(dataset, data_root)
    torch.manual_seed(0)
    model = build_model("sage", store.num_features, HIDDEN, store.num_classes).eval()
    x = store.x
    n = store.num_nodes
    out: dict[str, Any] = {"mode": mode, "dataset": dataset, "nodes": n, "edges": store.num_edges}
    if mode == "ray":
        import ray

        from gnnaas.inference.ray_layerwise import ray_layerwise_inference

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            kwargs = {"chunk_size": chunk_size, "partitions": 2}
            ray_layerwise_inference(model, x, store.rowptr, store.col, **kwargs)  # warm-up
            start = time.perf_counter()
            ray_layerwise_inference(model, x, store.rowptr, store.col, **kwargs)
            out["seconds"] = time.perf_counter() - start
        finally:
            ray.shutdown()
    else:
        before, peak_before = _rss_mb(), _peak_mb()
        start = time.perf_counter()
        if mode == "exact":
            layerwise_inference(model, x, store.rowptr, store.col, chunk_size=chunk_size)
            out["estimate_mb"] = peak_bytes(model, n, store.num_edges, chunk_size) / 2**20
        else:
            path = sampled_path(model, x, store.rowptr, store.col, FANOUTS)
            order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
            for batch in torch.split(order, 1024):
                path.run(batch)
        out["seconds"] = time.perf_counter() - start
        out["rss_before_mb"] = before
        out["peak_growth_mb"] = max(_peak_mb() - max(before, peak_before), 0.0)
        out["features_mb"] = x.numel() * 4 / 2**20
    out["nodes_per_s"] = n / out["seconds"]
    out["threads"] = torch.get_num_threads()
    return out


def run_child(mode: str, dataset: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", mode, "--datasets", dataset]
    cmd += ["--chunk-size", str(args.chunk_size)]
    if args.data_root:
        cmd += ["--data-root", args.data_root]
    say(f"{dataset}: {mode} pass over every node")
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    say(
        f"  {result['nodes_per_s']:,.0f} nodes/s ({result['seconds']:.1f} s), peak RSS growth "
        f"{result.get('peak_growth_mb', float('nan')):,.0f} MB"
    )
    return result


def accuracy(dataset: str, variants_dir: Path, data_root: str | None) -> list[dict[str, Any]]:
    from gnnaas.data import load_dataset
    from gnnaas.variants.exact import exact_pass
    from gnnaas.variants.repository import VariantRepository

    repo = VariantRepository(variants_dir)
    rows = []
    ids = [m.variant_id for m in repo.list(dataset) if m.precomputed is None]
    store = load_dataset(dataset, data_root, seed=repo.manifest(dataset, ids[0]).seed)
    for vid in ids:
        run = exact_pass(store, repo, vid)
        rows.append({"dataset": dataset, "variant": vid, "seconds": run.seconds, **{
            f"{split}_{kind}": a[kind] for split, a in run.accuracy.items() for kind in a
        }})  # fmt: skip
    say(f"{dataset}: exact vs sampled accuracy of {len(rows)} variants")
    return rows


def served(args: argparse.Namespace) -> dict[str, Any]:
    from dataclasses import replace

    plan = replace(QUICK, dataset=args.serve_dataset)
    workdir = Path(args.workdir)
    variants_dir, profiles_dir = prepare(plan, workdir, "cpu")
    exact = add_precomputed(plan.dataset, variants_dir, profiles_dir, "best")
    assert exact is not None
    base = exact.split("@")[0]
    nodes = test_nodes(plan.dataset, workdir)
    bodies = make_bodies(nodes, 1, 2048, seed=3)
    port = free_port()
    cmd = serve_cmd(plan.dataset, variants_dir, profiles_dir, port, "cpu")
    out: dict[str, Any] = {"dataset": plan.dataset, "precomputed": exact, "base": base}
    env = {"GNNAAS_TORCH_THREADS": "1"}
    with ServerProcess(cmd, port, workdir / "infer-server.log", env=env) as server:
        url = f"{server.base_url}/v1/datasets/{plan.dataset}/predict"
        listing = server.get_json(f"/v1/datasets/{plan.dataset}/variants")["variants"]
        out["variants"] = [
            {k: v.get(k) for k in ("id", "accuracy", "admissible_at", "routable", "precomputed")}
            for v in listing
        ]
        for key, headers in (
            ("pinned_exact", {"X-Variant": exact}),
            ("pinned_base", {"X-Variant": base}),
            ("router_tol1", {"X-Accuracy-Tolerance": "1"}),
        ):
            spec = StepSpec(rate_rps=0.0, duration_s=60.0, max_requests=200, concurrency=1)
            asyncio.run(run_closed(url, bodies, headers, spec))  # warm-up
            spec = replace(spec, max_requests=args.requests)
            step = asyncio.run(run_closed(url, bodies, headers, spec))
            totals = [t["total"] for t in step.timings() if "total" in t]
            served_by = dict(step.variants_served())
            out[key] = {
                "requests": int(step.ok.sum()),
                "server_p50_ms": percentile(totals, 50),
                "server_p99_ms": percentile(totals, 99),
                "client_p50_ms": step.percentile(50),
                "client_p99_ms": step.percentile(99),
                "served_by": served_by,
                "precomputed_share": served_by.get(exact, 0) / max(sum(served_by.values()), 1),
            }
            say(
                f"{key}: server p50 {out[key]['server_p50_ms']:.3f} ms, client p50 "
                f"{out[key]['client_p50_ms']:.3f} ms, served by {served_by}"
            )
    return out


def render(results: dict[str, Any]) -> str:
    """``infer.md`` from a run's results."""
    m = results["machine"]
    lines = [
        "# Exact layer-wise inference, and the precomputed variant served",
        "",
        f"Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, {m.get('mem_gb', '?')} GB, "
        f"torch {m.get('torch', '?')}; no GPU. Command: "
        f"`python benchmarks/bench_infer.py {results['args_line']}`.",
        "",
        "## Every node: exact layer-wise vs sampled in batches of 1,024",
        "",
        "2-layer GraphSAGE, 256 hidden, initialized (speed does not depend on the weights); "
        f"sampled: serving sampler, fanouts {FANOUTS}; exact: full neighborhoods, chunks of "
        f"{results['args']['chunk_size']:,} nodes; torch's default threads; each pass in its "
        "own process. Memory: growth of the peak RSS over the RSS before the pass (graph, "
        "features and model loaded); estimate: `peak_bytes` (two layers' states, embeddings, "
        "one chunk).",
        "",
        "| dataset | nodes | edges | exact nodes/s | sampled nodes/s | **ratio** | exact s | "
        "sampled s | exact peak +MB (estimate) | sampled peak +MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in results["throughput"]:
        e, s = row["exact"], row["sampled"]
        lines.append(
            f"| {row['dataset']} | {e['nodes']:,} | {e['edges']:,} | {e['nodes_per_s']:,.0f} | "
            f"{s['nodes_per_s']:,.0f} | **{e['nodes_per_s'] / s['nodes_per_s']:.1f}×** | "
            f"{e['seconds']:.1f} | {s['seconds']:.1f} | {e['peak_growth_mb']:,.0f} "
            f"({e['estimate_mb']:,.0f}) | {s['peak_growth_mb']:,.0f} |"
        )
    if results.get("ray"):
        r = results["ray"]
        lines += [
            "",
            f"## One process vs Ray (2 partitions, local Ray with 2 CPUs), {r['dataset']}",
            "",
            f"One process: {r['local']['seconds']:.2f} s ({r['local']['nodes_per_s']:,.0f} "
            f"nodes/s); Ray: {r['ray']['seconds']:.2f} s ({r['ray']['nodes_per_s']:,.0f} nodes/s,"
            f" after a warm-up pass): **{r['local']['seconds'] / r['ray']['seconds']:.2f}×** of "
            "one process's speed. On one 2-core machine Ray adds serialization and the object "
            "store and gains no memory or cores; its use is graphs whose layer states exceed "
            "one machine.",
        ]
    lines += [
        "",
        "## Exact vs sampled accuracy per variant (%)",
        "",
        "| dataset | variant | val exact | val sampled | test exact | test sampled | exact s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in results["accuracy"]:
        lines.append(
            f"| {row['dataset']} | {row['variant']} | {row['val_exact']:.2f} | "
            f"{row['val_sampled']:.2f} | {row['test_exact']:.2f} | {row['test_sampled']:.2f} | "
            f"{row['seconds']:.2f} |"
        )
    if results.get("served"):
        s = results["served"]
        lines += [
            "",
            f"## The precomputed variant served ({s['dataset']}, `{s['precomputed']}`)",
            "",
            f"{results['args']['requests']:,} sequential single-node requests per row, one "
            "`gnnaas serve` on 127.0.0.1 (one torch thread), client on the same machine. "
            "Server-side: the response's `timing_ms.total`.",
            "",
            "| requests | server p50 ms | server p99 ms | client p50 ms | client p99 ms | "
            "served by |",
            "|---|---:|---:|---:|---:|---|",
        ]
        for key, label in (
            ("pinned_exact", f"pinned `{s['precomputed']}`"),
            ("pinned_base", f"pinned `{s['base']}` (sampled)"),
            ("router_tol1", "router, tolerance 1"),
        ):
            r = s[key]
            by = ", ".join(
                f"{k} {v}" for k, v in sorted(r["served_by"].items(), key=lambda x: -x[1])
            )
            lines.append(
                f"| {label} | {r['server_p50_ms']:.3f} | {r['server_p99_ms']:.3f} | "
                f"{r['client_p50_ms']:.3f} | {r['client_p99_ms']:.3f} | {by} |"
            )
        lines += [
            "",
            f"Share of the router's traffic at tolerance 1 served by the precomputed variant: "
            f"**{100 * s['router_tol1']['precomputed_share']:.1f}%**.",
        ]
    lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", nargs="+", default=["synth-reddit", "synth-products"])
    parser.add_argument("--ray-dataset", default="synth-flickr", help="'none' skips the Ray pass")
    parser.add_argument("--accuracy-datasets", nargs="*", default=["Cora", "synth-flickr@0.2"])
    parser.add_argument("--serve-dataset", default="synth-flickr@0.2")
    parser.add_argument("--skip-serve", action="store_true", help="no served-latency part")
    parser.add_argument("--requests", type=int, default=2000, help="requests per served row")
    parser.add_argument("--chunk-size", type=int, default=16_384)
    parser.add_argument("--data-root", default=os.environ.get("GNNAAS_DATA"))
    parser.add_argument("--workdir", default=".cache/bench", help="(default: .cache/bench)")
    parser.add_argument("--out", default=None, help="(default: benchmarks/results)")
    parser.add_argument("--child", choices=("exact", "sampled", "ray"), help=argparse.SUPPRESS)
    parser.add_argument("--render", metavar="JSON", help="only rewrite infer.md beside its JSON")
    args = parser.parse_args(argv)
    if args.render:
        render_saved(args.render, render)
        return 0
    if args.child:
        result = child(args.child, args.datasets[0], args.chunk_size, args.data_root)
        print(json.dumps(result))
        return 0
    results: dict[str, Any] = {
        "machine": machine_info(),
        "args": {k: v for k, v in vars(args).items() if k not in ("out", "child")},
        "args_line": " ".join(sys.argv[1:] if argv is None else argv),
        "command": command_line("bench_infer.py", argv),
        "throughput": [],
    }
    for dataset in args.datasets:
        results["throughput"].append(
            {
                "dataset": dataset,
                "exact": run_child("exact", dataset, args),
                "sampled": run_child("sampled", dataset, args),
            }
        )
    if args.ray_dataset != "none":
        results["ray"] = {
            "dataset": args.ray_dataset,
            "local": run_child("exact", args.ray_dataset, args),
            "ray": run_child("ray", args.ray_dataset, args),
        }
    results["accuracy"] = [
        row
        for dataset in args.accuracy_datasets
        for row in accuracy(dataset, Path(args.workdir) / "variants", args.data_root)
    ]
    if not args.skip_serve:
        results["served"] = served(args)
    save_results("infer", results, render, Path(args.out) if args.out else RESULTS)
    return 0


if __name__ == "__main__":
    from common import exit_status

    raise SystemExit(exit_status(main))
