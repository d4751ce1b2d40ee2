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

Example:
    python benchmarks/bench_side_by_side.py --dataset Cora --variants sage-greedy-2x gin-full-1x
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_router import machine_info  # noqa: E402
from loadgen import free_port  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from gnnaas.data import load_dataset
    from gnnaas.inference import Executor
    from gnnaas.profiling.curves import _GAP_S as _SERVICE_GAP_S
    from gnnaas.profiling.curves import _timed_batch
    from gnnaas.sampling import serving_sampler
    from gnnaas.variants.repository import VariantRepository

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="Cora")
    parser.add_argument("--variants", nargs="+", required=True, help="variant ids")
    parser.add_argument("--workdir", default=".cache/bench", help="variants/ and profiles/ here")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    parser.add_argument("--rounds", type=int, default=4, help="(default: 4)")
    parser.add_argument("--per-round", type=int, default=10, help="batches per size and round")
    parser.add_argument("--out", default=None, help="markdown file (default: print only)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    work = Path(args.workdir)
    port = free_port()
    env = {**os.environ, "GNNAAS_TORCH_THREADS": "1", "GNNAAS_MAX_WAIT_MS": "0"}
    cmd = [
        sys.executable, "-m", "gnnaas.cli", "serve", "--variants", str(work / "variants"),
        "--profiles", str(work / "profiles"), "--dataset", args.dataset,
        "--port", str(port), "--device", "cpu",
    ]  # fmt: skip
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        store = load_dataset(args.dataset)
        repo = VariantRepository(work / "variants")
        executors = {}
        for vid in args.variants:
            loaded = repo.load(store.name, vid)
            m = loaded.manifest
            features = store.feature_subset(torch.tensor(m.kept_features))
            sampler = serving_sampler(store.rowptr, store.col, m.fanouts)
            executors[vid] = Executor(loaded.model, features, sampler, device="cpu")
        test = store.test_idx.numpy()
        rng = np.random.default_rng(0)
        deadline = time.monotonic() + 120
        while True:
            try:
                probe = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                probe.request("GET", "/readyz")
                if probe.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the server did not become ready")
            time.sleep(0.2)
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
        conn.request("GET", f"/v1/datasets/{args.dataset}/variants")
        listing = json.loads(conn.getresponse().read())["variants"]
    finally:
        server.terminate()
        server.wait(timeout=30)
    m = machine_info()
    lines = [
        f"# Profiler method vs server, side by side ({args.dataset})",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}; one torch thread. Command: "
        "`python benchmarks/bench_side_by_side.py "
        + " ".join(sys.argv[1:] if argv is None else argv)
        + "`.",
        "",
        f"{args.rounds} rounds x {args.per_round} batches per variant and size, each way; server: "
        "median handler time of its drift record (pinned, sequential HTTP requests); profiler: "
        "median of `_timed_batch` in a worker thread after the profiler's idle gap.",
        "",
        "| variant | " + " | ".join(f"{s} nodes: server / profiler ms" for s in args.sizes) + " |",
        "|---|" + "---:|" * len(args.sizes),
    ]
    diffs = []
    for vid in args.variants:
        drift = next(v for v in listing if v["id"] == vid)["drift"]["by_batch_nodes"]
        cells = []
        for size in args.sizes:
            served = drift[f"<={size}"]["measured_ms_median"]
            mine = statistics.median(ours[(vid, size)])
            diffs.append(mine / served - 1)
            cells.append(f"{served:.2f} / {mine:.2f} ({mine / served - 1:+.0%})")
        lines.append(f"| {vid} | " + " | ".join(cells) + " |")
    absd = sorted(abs(d) for d in diffs)
    lines += [
        "",
        f"Median |difference| {absd[len(absd) // 2]:.1%}, worst {absd[-1]:.1%}, over "
        f"{len(absd)} (variant, size) pairs.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
