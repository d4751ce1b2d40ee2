"""Live graph under load: edge updates per second while reads run, read p99 with and without them,
and memory after a million edge updates before and after compaction.

One ``gnnaas serve --state-dir`` (synth-flickr@0.2 variants of ``bench_policy.py``, a fresh state
folder) on a free 127.0.0.1 port:

1. **read ceiling**: single-node predictions (router at ``X-Accuracy-Tolerance: 2``) in a closed
   loop (``--read-concurrency``); half of that rate is the read load of the next steps;
2. **reads alone**: open-loop Poisson reads at half the ceiling for ``--step-s`` (p50/p99);
3. **reads with writes**: the same reads while ``--writers`` clients post edge batches offered at
   ``--write-rate`` edge updates per second, each ``--batch-edges`` updates: half new edges, half
   removals of edges added earlier, so the graph keeps its size. Edge updates per second counts
   acknowledged (fsynced) updates only;
4. **memory**: more batches until ``--total-updates`` updates, then the server's PSS and the
   overlay's size (``/v1/datasets``); the server is stopped, ``gnnaas compact`` folds the log, and
   the restarted server's PSS and start-up time are measured again. Those bulk batches are not
   paced: their rate is the most the server takes with no reads.

Writes ``live.json`` and ``live.md`` rendered from it (``benchmarks/results/`` unless ``--out``);
``--render live.json`` rewrites the page from a saved run.

Example:
    python benchmarks/bench_live.py --total-updates 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from gnnaas.stats import median, percentile

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
    test_nodes,
    tree_pss_mb,
)
from loadgen import ServerProcess, StepSpec, free_port, run_closed, run_step

__all__ = ["main", "render"]

TOKEN = "bench-live-token"
READ_HEADERS = {"X-Accuracy-Tolerance": "2"}


class EdgeStream:
    """Batches of edge updates: ``k`` new edges (absent from the graph) and ``k`` removals of edges
    this stream added earlier (oldest first), so the graph's size stays about the same."""

    def __init__(self, rowptr: np.ndarray, col: np.ndarray, seed: int = 0) -> None:
        self.n = rowptr.shape[0] - 1
        self.rng = random.Random(seed)
        self.existing = set()
        for t in range(self.n):
            for s in col[rowptr[t] : rowptr[t + 1]].tolist():
                self.existing.add((s, t))
        self.added: list[tuple[int, int]] = []
        self.cursor = 0

    def batch(self, k: int) -> dict[str, list[list[int]]]:
        add = []
        while len(add) < k:
            s, t = self.rng.randrange(self.n), self.rng.randrange(self.n)
            if s != t and (s, t) not in self.existing:
                self.existing.add((s, t))
                add.append((s, t))
        remove = []
        while len(remove) < k and self.cursor < len(self.added):
            edge = self.added[self.cursor]
            self.cursor += 1
            self.existing.discard(edge)
            remove.append(edge)
        self.added.extend(add)
        return {"add": [list(e) for e in add], "remove": [list(e) for e in remove]}


async def write_stream(
    url: str,
    stream: EdgeStream,
    args: argparse.Namespace,
    stop: asyncio.Event,
    limit: int,
    *,
    paced: bool = True,
) -> dict[str, Any]:
    """``args.writers`` clients posting batches until ``stop`` or ``limit`` updates, released at
    ``args.write_rate`` edge updates per second (``paced``) or as fast as they are answered."""
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    done = {"updates": 0, "batches": 0, "errors": 0, "latency_ms": []}
    queue: asyncio.Queue[tuple[bytes, int]] = asyncio.Queue(maxsize=args.writers * 2)

    async def produce() -> None:  # batches built in order, released at the write rate if paced
        made = 0
        loop = asyncio.get_running_loop()
        start = loop.time()
        while not stop.is_set() and made < limit:
            body = stream.batch(args.batch_edges // 2)
            count = len(body["add"]) + len(body["remove"])
            if paced:
                delay = start + made / args.write_rate - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)  # pacing an open-loop stream, not synchronization
            made += count
            await queue.put((json.dumps(body).encode(), count))
        for _ in range(args.writers):
            await queue.put((b"", 0))

    async def writer(session: aiohttp.ClientSession) -> None:
        while True:
            body, count = await queue.get()
            if not body:
                return
            t0 = time.perf_counter()
            async with session.post(url, data=body, headers=headers) as r:
                await r.read()
                if r.status != 200:
                    done["errors"] += 1
                    say(f"write failed: {r.status} {(await r.text())[:200]}")
                    stop.set()
                    return
            done["latency_ms"].append((time.perf_counter() - t0) * 1e3)
            done["batches"] += 1
            done["updates"] += count

    t0 = time.perf_counter()
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(produce(), *(writer(session) for _ in range(args.writers)))
    wall = time.perf_counter() - t0
    lat = done.pop("latency_ms")
    return {
        **done,
        "wall_s": wall,
        "updates_per_s": done["updates"] / wall if wall else 0.0,
        "write_p50_ms": percentile(lat, 50) if lat else float("nan"),
        "write_p99_ms": percentile(lat, 99) if lat else float("nan"),
    }


def read_spec(rate: float, args: argparse.Namespace, seed: int = 0) -> StepSpec:
    """Open-loop reads at ``rate`` for ``args.step_s``."""
    return StepSpec(
        rate_rps=rate, duration_s=args.step_s, max_requests=int(rate * args.step_s) + 10, seed=seed
    )


async def reads_with_writes(
    urls: tuple[str, str],
    bodies: list[bytes],
    stream: EdgeStream,
    args: argparse.Namespace,
    rate: float,
) -> tuple[Any, dict[str, Any]]:
    read_url, write_url = urls
    stop = asyncio.Event()
    spec = read_spec(rate, args)

    async def reads() -> Any:
        try:
            return await run_step(read_url, bodies, READ_HEADERS, spec)
        finally:
            stop.set()

    result, writes = await asyncio.gather(
        reads(), write_stream(write_url, stream, args, stop, limit=10**12)
    )
    return result, writes


def run(args: argparse.Namespace) -> dict[str, Any]:
    from gnnaas.data import load_dataset

    plan = QUICK
    workdir = Path(args.workdir).resolve()  # the server processes read it too
    variants_dir, profiles_dir = prepare(plan, workdir, "cpu")
    nodes = test_nodes(plan.dataset, workdir)
    state = workdir / "live-state"
    shutil.rmtree(state, ignore_errors=True)
    store = load_dataset(plan.dataset)
    stream = EdgeStream(store.rowptr.numpy(), store.col.numpy())
    # The client's own pauses count as read latency (open loop): its edge bookkeeping (hundreds
    # of thousands of tuples) must not trigger full collections mid-step, which stalled it by
    # ~150 ms once per run; collection is off while it measures.
    gc.collect()
    gc.freeze()
    gc.disable()
    env = {"GNNAAS_TORCH_THREADS": "1", "GNNAAS_WRITE_TOKEN": TOKEN}
    results: dict[str, Any] = {
        "dataset": plan.dataset,
        "machine": machine_info(),
        "args": {k: v for k, v in vars(args).items() if k != "out"},
    }
    port = free_port()
    cmd = [
        *serve_cmd(plan.dataset, variants_dir, profiles_dir, port, "cpu"),
        "--state-dir",
        str(state),
    ]
    bodies = make_bodies(nodes, 1, 512, seed=1)
    route = f"/v1/datasets/{plan.dataset}"
    with ServerProcess(cmd, port, workdir / "live-server.log", env=env) as server:
        read_url, write_url = f"{server.base_url}{route}/predict", f"{server.base_url}{route}/edges"
        spec = StepSpec(rate_rps=0.0, duration_s=1.0, max_requests=2000, concurrency=2)
        asyncio.run(run_closed(read_url, bodies, READ_HEADERS, spec))  # warm-up
        spec = StepSpec(
            rate_rps=0.0, duration_s=args.step_s, max_requests=10**6,
            concurrency=args.read_concurrency,
        )  # fmt: skip
        ceiling = asyncio.run(run_closed(read_url, bodies, READ_HEADERS, spec)).throughput_rps
        rate = ceiling / 2
        say(f"read ceiling {ceiling:,.0f} req/s; reads at {rate:,.0f} req/s from here")
        rounds = []
        for r in range(args.repeats):  # alternate: alone, with writes
            alone = asyncio.run(
                run_step(read_url, bodies, READ_HEADERS, read_spec(rate, args, seed=r))
            ).summary()
            loaded, writes = asyncio.run(
                reads_with_writes((read_url, write_url), bodies, stream, args, rate)
            )
            rounds.append({"alone": alone, "with_writes": loaded.summary(), "writes": writes})
            say(
                f"round {r + 1}: read p99 alone {alone['p99_ms']:.2f} ms, with writes "
                f"{loaded.summary()['p99_ms']:.2f} ms; {writes['updates_per_s']:,.0f} edge "
                f"updates/s acknowledged (write p50 {writes['write_p50_ms']:.1f} ms)"
            )
        results.update({"read_ceiling_rps": ceiling, "read_rate_rps": rate, "rounds": rounds})
        done = sum(x["writes"]["updates"] for x in rounds)
        remaining = max(args.total_updates - done, 0)
        say(f"{done:,} updates so far; {remaining:,} more for the memory figures")
        stop = asyncio.Event()
        bulk = asyncio.run(
            write_stream(write_url, stream, args, stop, limit=remaining, paced=False)
        )
        info = server.get_json("/v1/datasets")["datasets"][0]
        results["memory"] = {
            "updates": done + bulk["updates"],
            "bulk_updates_per_s": bulk["updates_per_s"],
            "graph_version": info["graph_version"],
            "pss_mb_before_compaction": tree_pss_mb(server.pid),
            "log_mb": (state / plan.dataset / "log.wal").stat().st_size / 2**20,
        }
        say(f"after {results['memory']['updates']:,} updates: {results['memory']}")
    t0 = time.perf_counter()
    compact = [sys.executable, "-m", "gnnaas.cli", "compact", "--dataset", plan.dataset]
    out = subprocess.run(
        [*compact, "--state-dir", str(state)], capture_output=True, text=True, check=True
    )
    results["memory"]["compact_s"] = time.perf_counter() - t0
    results["memory"]["compact_output"] = out.stdout.strip()
    port = free_port()
    cmd = [
        *serve_cmd(plan.dataset, variants_dir, profiles_dir, port, "cpu"),
        "--state-dir",
        str(state),
    ]
    t0 = time.perf_counter()
    with ServerProcess(cmd, port, workdir / "live-server-2.log", env=env) as server:
        results["memory"]["restart_ready_s"] = time.perf_counter() - t0
        spec = StepSpec(rate_rps=0.0, duration_s=1.0, max_requests=2000, concurrency=2)
        asyncio.run(run_closed(f"{server.base_url}{route}/predict", bodies, READ_HEADERS, spec))
        results["memory"]["pss_mb_after_compaction"] = tree_pss_mb(server.pid)
    say(f"compaction: {results['memory']}")
    return results


def render(results: dict[str, Any]) -> str:
    """``live.md`` from a run's results."""
    m, a, mem = results["machine"], results["args"], results["memory"]
    rounds = results["rounds"]

    alone = [r["alone"]["p99_ms"] for r in rounds]
    loaded = [r["with_writes"]["p99_ms"] for r in rounds]
    rates = [r["writes"]["updates_per_s"] for r in rounds]
    ratio = [b / x for x, b in zip(alone, loaded, strict=True)]
    lines = [
        f"# Live graph under load ({results['dataset']})",
        "",
        f"Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, torch {m.get('torch', '?')}; "
        "client and server on the same machine; server on one torch thread, state folder on the "
        "machine's disk (every acknowledged write fsynced).",
        f"Command: `python benchmarks/bench_live.py --repeats {a['repeats']} --step-s "
        f"{a['step_s']:g} --writers {a['writers']} --write-rate {a['write_rate']:g} "
        f"--batch-edges {a['batch_edges']} "
        f"--total-updates {a['total_updates']}`.",
        "",
        f"Read ceiling (closed loop, {a['read_concurrency']} clients, single nodes, tolerance 2): "
        f"{results['read_ceiling_rps']:,.0f} req/s; reads below run open-loop at half of it, "
        f"{results['read_rate_rps']:,.0f} req/s.",
        "",
        "| round | read p50 alone ms | read p99 alone ms | read p50 with writes ms "
        "| read p99 with writes ms | p99 ratio | edge updates/s acknowledged "
        "| write p50 / p99 ms |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for i, r in enumerate(rounds):
        w = r["writes"]
        lines.append(
            f"| {i + 1} | {r['alone']['p50_ms']:.2f} | {r['alone']['p99_ms']:.2f} | "
            f"{r['with_writes']['p50_ms']:.2f} | {r['with_writes']['p99_ms']:.2f} | "
            f"{r['with_writes']['p99_ms'] / r['alone']['p99_ms']:.2f} | "
            f"{w['updates_per_s']:,.0f} | {w['write_p50_ms']:.1f} / {w['write_p99_ms']:.1f} |"
        )
    lines += [
        "",
        f"- Edge updates: median **{median(rates):,.0f}/s** acknowledged and durable (offered "
        f"{a['write_rate']:,.0f}/s), in batches of {a['batch_edges']} (half additions, half "
        f"removals) from {a['writers']} writers (goal ≥ 5,000/s while the reads run).",
        f"- Read p99 with the write stream / without: median **{median(ratio):.2f}** (goal ≤ 1.2).",
        f"- Memory after {mem['updates']:,} edge updates (graph version {mem['graph_version']:,}; "
        f"{mem['bulk_updates_per_s']:,.0f} updates/s with no reads): server PSS "
        f"**{mem['pss_mb_before_compaction']:,.0f} MB**, log {mem['log_mb']:,.1f} MB; "
        f"`gnnaas compact` took {mem['compact_s']:.1f} s ({mem['compact_output']}); after it the "
        f"restarted server (ready in {mem['restart_ready_s']:.1f} s) holds "
        f"**{mem['pss_mb_after_compaction']:,.0f} MB**.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--repeats", type=int, default=3, help="rounds of reads alone / with writes"
    )
    parser.add_argument("--step-s", type=float, default=8.0, help="seconds per measurement")
    parser.add_argument("--writers", type=int, default=2, help="concurrent write clients")
    parser.add_argument(
        "--write-rate",
        type=float,
        default=5000.0,
        help="edge updates per second offered while reads run (default: 5000, the goal)",
    )
    parser.add_argument("--batch-edges", type=int, default=250, help="edge updates per write")
    parser.add_argument("--read-concurrency", type=int, default=2, help="clients of the ceiling")
    parser.add_argument(
        "--total-updates", type=int, default=1_000_000, help="for the memory figures"
    )
    parser.add_argument("--workdir", default=".cache/bench", help="(default: .cache/bench)")
    parser.add_argument("--out", default=str(RESULTS), help="(default: benchmarks/results)")
    parser.add_argument("--render", metavar="JSON", help="only rewrite live.md beside its JSON")
    args = parser.parse_args(argv)
    if args.render:
        render_saved(args.render, render)
        return 0
    results = run(args)
    results["command"] = command_line("bench_live.py", argv)
    save_results("live", results, render, Path(args.out))
    return 0


if __name__ == "__main__":
    from common import exit_status

    raise SystemExit(exit_status(main))
