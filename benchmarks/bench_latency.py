"""The latency floor: one node per request, each stage, and the two implementations of each.

Three parts in one run:

1. **Sampling** of 1, 8 and 64 seeds (and 1,024 for the large-batch path) with the serving
   sampler, fanouts (25, 10), median of many calls, one torch thread: its torch path
   (``DepthSampler(..., fast_path=False)``, "before") and its compiled kernel
   (:mod:`gnnaas.sampling.fastpath`, "after", what it samples a CPU graph with).
2. **Forward** of the 8× and 1× variants for 1 and 64 seeds (the sampled blocks built once):
   PyG's convolutions (``model(x, blocks, pyg_convs=True)``, "before") and the fused eval layers
   (:meth:`gnnaas.models.GNN.fused_layer`, "after", what eval mode runs), with the operators each
   dispatches per forward counted by :mod:`torch.profiler`.
3. **Requests**: ``gnnaas serve`` on 127.0.0.1 with the 8× variant pinned (compiled sampler, fused
   forward and the predict fast lane, :mod:`gnnaas.serving.http.fastlane`, as it always runs),
   small batches on the variant's worker thread and on the event loop's thread
   (``GNNAAS_INLINE_MAX_NODES``), sequential single-node requests (closed loop, one client, the
   same driver as ``bench_policy.py``), client p50/p99 and the server's ``Server-Timing`` stages,
   next to ``benchmarks/trivial_app.py`` (the FastAPI + uvicorn ceiling with the same request
   shape) served the same way. Runs saved before the fast lane, the compiled sampler and the
   fused forward lost their switches also hold servers with them turned off; ``--render`` shows
   whatever a run holds.

Uses the variants and profiles of ``bench_policy.py``/``bench_drift.py`` in ``--workdir``. Writes
``latency.json`` and ``latency.md`` rendered from it (``benchmarks/results/`` unless ``--out``);
``--render latency.json`` rewrites the page from a saved run.

Example:
    python benchmarks/bench_latency.py --dataset synth-flickr@0.2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gnnaas.stats import median

from common import (
    RESULTS,
    command_line,
    machine_info,
    make_bodies,
    render_saved,
    save_results,
    serve_cmd,
    test_nodes,
    trivial_cmd,
)
from loadgen import ServerProcess, StepSpec, free_port, run_closed

__all__ = ["main", "render"]

# Sampler path: label -> DepthSampler's fast_path.
PATHS = {"before (torch sampler)": False, "after (compiled sampler)": True}
FORWARDS = {"before (PyG convolutions)": "pyg", "after (fused layers)": "fused"}
# Request path: (label, GNNAAS_INLINE_MAX_NODES).
SERVERS = [
    ("compiled sampler, fast lane, fused forward, worker thread", "0"),
    ("after: compiled sampler, fast lane, fused forward, on the loop thread", "16"),
]


def _median_ms(fn: Any, calls: int) -> float:
    for _ in range(min(5, calls)):
        fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return median(times)


def micro(dataset: str, variants_dir: Path, ids: list[str], calls: int) -> dict[str, Any]:
    """Sampling and forward medians (ms), in a child process per sampler path (each measured
    on a process of its own, as a server would run it)."""
    out: dict[str, Any] = {}
    for label, fast_path in PATHS.items():
        cmd = [sys.executable, __file__, "--micro-child", "--dataset", dataset]
        cmd += ["--workdir", str(variants_dir.parent), "--variants", *ids, "--calls", str(calls)]
        cmd += ["--fast-path", str(int(fast_path))]
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
        out[label] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def _micro_child(
    dataset: str, variants_dir: str, ids: list[str], calls: int, fast_path: bool
) -> dict[str, Any]:
    from gnnaas.data import load_dataset
    from gnnaas.sampling import DepthSampler
    from gnnaas.variants.repository import VariantRepository

    torch.set_num_threads(1)
    store = load_dataset(dataset)
    # The serving sampler on the chosen path (the runtime builds it with fast_path on).
    sampler = DepthSampler(store.rowptr, store.col, (25, 10), fast_path=fast_path)
    g = torch.Generator().manual_seed(0)
    seed_sets = {b: torch.randperm(store.num_nodes, generator=g)[:b] for b in (1, 8, 64, 1024)}
    sampling = {
        str(b): _median_ms(lambda s=s: sampler.sample(s), calls if b < 1024 else calls // 10)
        for b, s in seed_sets.items()
    }
    repo = VariantRepository(variants_dir)
    forward: dict[str, dict[str, float]] = {}
    ops: dict[str, dict[str, int]] = {}
    for vid in ids:
        loaded = repo.load(store.name, vid)
        x_all = store.feature_subset(torch.tensor(loaded.manifest.kept_features))
        for b in (1, 64):
            sub = sampler.sample(seed_sets[b])
            x = x_all[sub.n_id]

            key = f"{vid} {b}"
            forward[key], ops[key] = {}, {}
            for label, kind in FORWARDS.items():

                def run(
                    model: Any = loaded.model,
                    x: Any = x,
                    blocks: Any = sub.blocks,
                    pyg: bool = kind == "pyg",
                ) -> None:
                    with torch.inference_mode():
                        model(x, blocks, pyg_convs=pyg)

                forward[key][label] = _median_ms(run, calls)
                ops[key][label] = _operators(run)
    return {"sampling": sampling, "forward": forward, "operators": ops}


def _operators(fn: Any) -> int:
    """Operators (``aten::``) one call dispatches, counted by :mod:`torch.profiler`."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))


def requests(dataset: str, workdir: Path, variant: str, count: int) -> dict[str, dict[str, float]]:
    """Sequential single-node requests: gnnaas (batches on the worker thread and on the loop
    thread) and the trivial endpoint."""
    nodes = test_nodes(dataset, workdir)
    bodies = make_bodies(nodes, 1, 512, seed=1)
    spec = StepSpec(rate_rps=0.0, duration_s=60.0, max_requests=count, concurrency=1)
    out: dict[str, dict[str, float]] = {}
    servers = [("trivial FastAPI endpoint", "trivial", {}, {})]
    for label, inline in SERVERS:
        env = {"GNNAAS_INLINE_MAX_NODES": inline, "GNNAAS_TORCH_THREADS": "1"}
        servers.append((f"gnnaas, {label}", "gnnaas", env, {"X-Variant": variant}))
    for label, kind, env, headers in servers:
        port = free_port()
        if kind == "trivial":
            argv = trivial_cmd(port)
        else:
            argv = serve_cmd(dataset, workdir / "variants", workdir / "profiles", port, "cpu")
        log = workdir / f"latency-{port}.log"
        with ServerProcess(argv, port, log, env=env) as server:
            url = f"{server.base_url}/v1/datasets/{dataset}/predict"
            asyncio.run(
                run_closed(
                    url,
                    bodies,
                    headers,
                    StepSpec(rate_rps=0.0, duration_s=2.0, max_requests=200, concurrency=1),
                )
            )
            result = asyncio.run(run_closed(url, bodies, headers, spec))
        stages: dict[str, list[float]] = {}
        for t in result.timings():
            for k, v in t.items():
                stages.setdefault(k, []).append(v)
        out[label] = {
            "requests": float(result.ok.sum()),
            "client_p50_ms": result.percentile(50),
            "client_p99_ms": result.percentile(99),
            **{f"server_{k}_p50_ms": median(v) for k, v in stages.items()},
        }
    return out


def gpu_end_to_end(dataset: str, calls: int) -> dict[str, float] | None:
    """End-to-end p50 (ms) of a sampled 2-layer GraphSAGE on CUDA with the graph, the features
    and the sampler resident on the GPU, for 1 and 1,024 seeds of ``dataset`` (the issue's
    flickr-size figure): sample, gather, forward and the copy of the outputs back, synchronized
    by that copy. ``None`` without a GPU."""
    if not torch.cuda.is_available():
        return None
    from gnnaas.data import load_dataset
    from gnnaas.models import build_model
    from gnnaas.runtime import sampled_path

    device = torch.device("cuda")
    store = load_dataset(dataset)
    rowptr, col = store.rowptr.to(device), store.col.to(device)
    model = build_model("sage", store.num_features, 256, store.num_classes).to(device).eval()
    path = sampled_path(model, store.x.to(device), rowptr, col, (25, 10), device=device)
    g = torch.Generator().manual_seed(0)
    out = {"gpu": torch.cuda.get_device_name(device)}
    for b in (1, 1024):
        batches = [torch.randperm(store.num_nodes, generator=g)[:b] for _ in range(calls + 10)]
        times = []
        for i, seeds in enumerate(batches):
            t0 = time.perf_counter()
            path.run(seeds.to(device))  # returns after the blocking copy of the outputs
            if i >= 10:
                times.append((time.perf_counter() - t0) * 1e3)
        out[str(b)] = median(times)
    return out


def render(results: dict[str, Any]) -> str:
    """``latency.md`` from a run's results."""
    m, r, mach = results["micro"], results["requests"], results["machine"]
    labels = list(PATHS)
    lines = [
        f"# The latency floor ({results['dataset']})",
        "",
        f"Machine: {mach['cpu']}, {mach['cores']} cores, torch {mach['torch']}, "
        f"{mach.get('gpu') or 'no GPU'}; one torch thread; client and server on the same "
        f"machine. Command: `{results['command']}`.",
    ]
    if results.get("recovered_from"):
        lines += ["", results["recovered_from"]]
    lines += [
        "",
        "## Sampling (serving sampler, fanouts (25, 10)), median ms",
        "",
        "| seeds | " + " | ".join(labels) + " |",
        "|---:|" + "---:|" * len(labels),
    ]
    for b in ("1", "8", "64", "1024"):
        lines.append(f"| {b} | " + " | ".join(f"{m[k]['sampling'][b]:.3f}" for k in labels) + " |")
    fwd = m[labels[-1]]  # the blocks of the compiled sampler (the same trees)
    lines += [
        "",
        "## Forward of a sampled batch, median ms (operators dispatched per forward, "
        "torch.profiler)",
        "",
        "| variant, seeds | " + " | ".join(FORWARDS) + " |",
        "|---|" + "---:|" * len(FORWARDS),
    ]
    for key, row in fwd["forward"].items():
        lines.append(
            f"| {key} | "
            + " | ".join(f"{row[k]:.3f} ({fwd['operators'][key][k]})" for k in FORWARDS)
            + " |"
        )
    lines += [
        "",
        f"## Sequential single-node requests ({results['variants'][0]} pinned), ms",
        "",
        "| server | requests | client p50 | client p99 | sample | gather | compute | queue |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, row in r.items():

        def cell(key: str, row: dict[str, float] = row) -> str:
            v = row.get(key)
            return "–" if v is None or not np.isfinite(v) else f"{v:.3f}"

        lines.append(
            f"| {label} | {row['requests']:.0f} | {cell('client_p50_ms')} | "
            f"{cell('client_p99_ms')} | {cell('server_sample_p50_ms')} | "
            f"{cell('server_gather_p50_ms')} | {cell('server_compute_p50_ms')} | "
            f"{cell('server_queue_p50_ms')} |"
        )
    gpu = results["gpu"]
    lines += ["", f"## GPU: end to end on CUDA, {results['gpu_dataset']}, everything resident", ""]
    if gpu is None:
        lines.append(
            "No GPU was available to this run (`torch.cuda.is_available()` is false), so the "
            "CUDA path was not measured."
        )
    else:
        lines += [
            f"{gpu['gpu']}: sample + gather + forward + copy back, median ms: 1 seed "
            f"{gpu['1']:.3f}, 1,024 seeds {gpu['1024']:.3f} (goal ≤ 1 ms for 1,024).",
        ]
    trivial = r["trivial FastAPI endpoint"]["client_p50_ms"]
    after = [row for label, row in r.items() if label.startswith("gnnaas")][-1]["client_p50_ms"]
    lines += [
        "",
        f"gnnaas after / trivial endpoint, client p50: {after / trivial:.2f}× "
        f"({after:.3f} vs {trivial:.3f} ms). Run took {results['wall_s']:.0f} s.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="synth-flickr@0.2")
    parser.add_argument("--workdir", default=".cache/bench")
    parser.add_argument("--variants", nargs=2, default=["sage-greedy-8x", "sage-full-1x"])
    parser.add_argument("--calls", type=int, default=300, help="micro-benchmark calls")
    parser.add_argument("--requests", type=int, default=2000, help="sequential requests")
    parser.add_argument(
        "--gpu-dataset", default="synth-flickr", help="graph of the CUDA figures (with a GPU)"
    )
    parser.add_argument("--out", default=str(RESULTS), help="(default: benchmarks/results)")
    parser.add_argument("--render", metavar="JSON", help="only rewrite latency.md beside its JSON")
    parser.add_argument("--micro-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fast-path", type=int, choices=(0, 1), default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.render:
        render_saved(args.render, render)
        return 0
    workdir = Path(args.workdir)
    if args.micro_child:  # one sampler path, in a process of its own (see micro)
        variants_dir = str(workdir / "variants")
        child = _micro_child(
            args.dataset, variants_dir, args.variants, args.calls, bool(args.fast_path)
        )
        print(json.dumps(child))
        return 0
    t0 = time.monotonic()
    results: dict[str, Any] = {
        "dataset": args.dataset,
        "machine": machine_info(),
        "command": command_line("bench_latency.py", argv),
        "variants": args.variants,
        "micro": micro(args.dataset, workdir / "variants", args.variants, args.calls),
        "requests": requests(args.dataset, workdir, args.variants[0], args.requests),
        "gpu_dataset": args.gpu_dataset,
        "gpu": gpu_end_to_end(args.gpu_dataset, args.calls),
    }
    results["wall_s"] = time.monotonic() - t0
    save_results("latency", results, render, Path(args.out))
    return 0


if __name__ == "__main__":
    from common import exit_status

    raise SystemExit(exit_status(main))
