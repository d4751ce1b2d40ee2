"""The profiler's timing method against the server's own measurement, side by side.

``bench_drift.py`` compares curves profiled in one minute with batches served in another; on a
shared VM the machine's own speed moves between the two. This benchmark removes that: it starts
``gnnaas serve`` (pinned variants, one request at a time, as ``bench_drift.py``) and, interleaved
with it in the same minutes, times the same variants the way the profiler does (the variant's
:class:`~gnnaas.inference.Executor` in a worker thread with the profiler's idle gap before each
batch: :func:`gnnaas.profiling.curves._timed_batch`). Per variant and batch size it prints the
server's median handler time (its drift record) and the profiler method's median, and their
difference: how far a curve measured by ``gnnaas profile`` is from what the server measures when
the machine is the same.

Writes ``side-by-side-<dataset>.json`` and ``.md`` rendered from it (``benchmarks/results/`` unless
``--out``); ``--render JSON`` rewrites the page from a saved run.

Example:
    python benchmarks/bench_side_by_side.py --dataset Cora --variants sage-greedy-2x gin-full-1x
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import time
from pathlib import Path
from typing import Any

from gnnaas.stats import median

from common import (
    RESULTS,
    command_line,
    machine_info,
    render_saved,
    save_results,
    serve_cmd,
)
from loadgen import ServerProcess, free_port

__all__ = ["main", "render"]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Per variant and size, the server's median handler time and the profiler method's."""
    import numpy as np
    import torch

    from gnnaas.data import load_dataset
    from gnnaas.profiling.curves import _GAP_S as _SERVICE_GAP_S
    from gnnaas.profiling.curves import _timed_batch
    from gnnaas.runtime import RuntimeGraph, open_variant
    from gnnaas.variants.repository import VariantRepository

    torch.set_num_threads(1)
    work = Path(args.workdir)
    port = free_port()
    env = {"GNNAAS_TORCH_THREADS": "1", "GNNAAS_MAX_WAIT_MS": "0"}
    cmd = serve_cmd(args.dataset, work / "variants", work / "profiles", port, "cpu")
    store = load_dataset(args.dataset)
    repo = VariantRepository(work / "variants")
    graph = RuntimeGraph(store)
    executors = {
        vid: open_variant(repo, repo.manifest(store.name, vid), graph).executor(graph)
        for vid in args.variants
    }
    test = store.test_idx.numpy()
    rng = np.random.default_rng(0)
    log = work / f"side-by-side-{args.dataset}.log"
    with ServerProcess(cmd, port, log, env=env, ready_timeout_s=120.0) as server:
        conn = http.client.HTTPConnection("127.0.0.1", port)
        worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gnnaas-curve")
        ours: dict[tuple[str, int], list[float]] = {}
        for _ in range(args.rounds):
            for size in args.sizes:
                for vid in args.variants:
                    for _ in range(args.per_round):  # the server, as bench_drift asks it
                        nodes = [int(v) for v in rng.choice(test, size, replace=False)]
                        headers = {"X-Variant": vid, "Content-Type": "application/json"}
                        body = json.dumps({"nodes": nodes})
                        conn.request("POST", f"/v1/datasets/{args.dataset}/predict", body, headers)
                        conn.getresponse().read()
                    for _ in range(args.per_round):  # the profiler's method, the same minute
                        seeds = torch.from_numpy(rng.choice(test, size, replace=False))
                        time.sleep(_SERVICE_GAP_S)
                        ms, _ = worker.submit(_timed_batch, executors[vid], seeds).result()
                        ours.setdefault((vid, size), []).append(ms)
        worker.shutdown()
        listing = server.get_json(f"/v1/datasets/{args.dataset}/variants")["variants"]
    rows = []
    for vid in args.variants:
        drift = next(v for v in listing if v["id"] == vid)["drift"]["by_batch_nodes"]
        rows.append(
            {
                "variant": vid,
                "server_ms": {str(s): drift[f"<={s}"]["measured_ms_median"] for s in args.sizes},
                "profiler_ms": {str(s): median(ours[(vid, s)]) for s in args.sizes},
            }
        )
    return {
        "dataset": args.dataset,
        "machine": machine_info(),
        "sizes": args.sizes,
        "rounds": args.rounds,
        "per_round": args.per_round,
        "rows": rows,
    }


def render(results: dict[str, Any]) -> str:
    """``side-by-side-<dataset>.md`` from a run's results."""
    m, sizes = results["machine"], results["sizes"]
    lines = [
        f"# Profiler method vs server, side by side ({results['dataset']})",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}; one torch thread. "
        f"Command: `{results['command']}`.",
        "",
        f"{results['rounds']} rounds x {results['per_round']} batches per variant and size, each "
        "way; server: median handler time of its drift record (pinned, sequential HTTP "
        "requests); profiler: median of `_timed_batch` in a worker thread after the profiler's "
        "idle gap.",
        "",
        "| variant | " + " | ".join(f"{s} nodes: server / profiler ms" for s in sizes) + " |",
        "|---|" + "---:|" * len(sizes),
    ]
    diffs = []
    for row in results["rows"]:
        cells = []
        for size in sizes:
            served, mine = row["server_ms"][str(size)], row["profiler_ms"][str(size)]
            diffs.append(mine / served - 1)
            cells.append(f"{served:.2f} / {mine:.2f} ({mine / served - 1:+.0%})")
        lines.append(f"| {row['variant']} | " + " | ".join(cells) + " |")
    absd = sorted(abs(d) for d in diffs)
    lines += [
        "",
        f"Median |difference| {median(absd):.1%}, worst {absd[-1]:.1%}, over "
        f"{len(absd)} (variant, size) pairs.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="Cora")
    parser.add_argument("--variants", nargs="+", help="variant ids (required unless --render)")
    parser.add_argument("--workdir", default=".cache/bench", help="variants/ and profiles/ here")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    parser.add_argument("--rounds", type=int, default=4, help="(default: 4)")
    parser.add_argument("--per-round", type=int, default=10, help="batches per size and round")
    parser.add_argument("--out", default=str(RESULTS), help="(default: benchmarks/results)")
    parser.add_argument("--render", metavar="JSON", help="only rewrite the .md beside its JSON")
    args = parser.parse_args(argv)
    if args.render:
        render_saved(args.render, render)
        return 0
    if not args.variants:
        parser.error("--variants is required")
    results = {"command": command_line("bench_side_by_side.py", argv), **run(args)}
    name = f"side-by-side-{args.dataset.split('@')[0]}"
    save_results(name, results, render, Path(args.out))
    return 0


if __name__ == "__main__":
    from common import exit_status

    raise SystemExit(exit_status(main))
