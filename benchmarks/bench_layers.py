"""Where time goes: one request through the router, layer by layer, under open-loop load.

One ``gnnaas serve`` of the variants of :data:`common.FULL` (``--quick``: :data:`common.QUICK`) on a
free 127.0.0.1 port, the router at tolerance 2; for requests of 1 and of 64 random test nodes, one
open-loop Poisson step at about half the rate the router sustains at that size (from the
``router-order.json`` of ``bench_router.py`` when there is one, else a rate from the profiled
service curve), without and then with py-spy attached (``--gil``: the thread holding the GIL). Wall
time per request by layer comes from the server's stage clocks (``timing_ms``) and the client;
GIL time by layer from py-spy's stacks, each classified by its innermost gnnaas or library frame.

Writes ``router-layers.json`` and ``router-layers.md`` rendered from it (full run:
``benchmarks/results/``; ``--quick``: ``<workdir>/results/`` unless ``--out`` says otherwise);
``--render router-layers.json`` rewrites the page from a saved run.

Example:
    python benchmarks/bench_layers.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from common import (
    FULL,
    QUICK,
    REPO,
    RESULTS,
    command_line,
    machine_info,
    make_bodies,
    predict_ms,
    prepare,
    proc_cpu_s,
    render_saved,
    save_results,
    say,
    serve_cmd,
    shown,
    test_nodes,
    utc_now,
    variant_table,
    wait_idle,
)
from loadgen import CLIENTS, ServerProcess, StepSpec, free_port, run_step
from measure import percentile

__all__ = ["main", "render"]

SIZES = (1, 64)
HEADERS = {"X-Accuracy-Tolerance": "2"}

LAYERS = (
    "HTTP + parsing",
    "policy",
    "queue (batcher)",
    "sampling",
    "gather",
    "forward",
    "serialization",
    "metrics",
    "event loop",
    "thread hand-off",
    "other",
)

# What would cut each layer, quoted for the top three.
REMEDIES = {
    "HTTP + parsing": "uvicorn's HTTP/1.1 parsing and writing and Starlette/FastAPI dispatch "
    "(with uvloop + httptools when installed, as gnnaas requires; with the pure-Python h11 and "
    "the asyncio loop otherwise). The body is read twice (the body-limit middleware buffers it, "
    "then FastAPI parses it into a pydantic model with `list[StrictInt]`); a route that reads "
    "`await request.body()` and parses with `json.loads` + one `torch.tensor` would skip a "
    "validation pass. Beyond one process: more uvicorn workers (`--workers`) on more cores, "
    "each with its own variants.",
    "policy": "the decision (`DecisionTable.decide`) scores the admissible variants of the "
    "request's tolerance against the load of the lanes with work; its memos (admissible sets, "
    "an idle device's choice, profiled times per stream size) are what keep it cheap.",
    "queue (batcher)": "one asyncio future, one queue put/get and a thread hand-off "
    "(`run_in_executor`) per request and batch; a lower cost needs fewer hops, e.g. collecting "
    "directly into a list guarded by an Event instead of an `asyncio.Queue`.",
    "sampling": "the consistent k-hop sampler hashes (node, hop, seed) per edge candidate; "
    "caching sampled neighborhoods of hot nodes, or a native (C++/pyg-lib) sampler, cuts it.",
    "gather": "`index_select` of the kept columns for every sampled node; pruned variants already "
    "shrink it 2–8×; a float16/bfloat16 feature copy halves it again.",
    "forward": "two SAGE/GIN layers over the sampled blocks; fewer hidden channels, pruned "
    "variants (the router's own lever), or bfloat16/oneDNN fused kernels on CPU.",
    "serialization": "`tolist()` of the predictions and `json.dumps` of the payload; `orjson` "
    "would cut it several-fold.",
    "metrics": "Prometheus counters and histograms per request (five stage histograms); "
    "recording per batch instead of per request, or fewer label lookups (cache the labelled "
    "children), cuts it.",
    "event loop": "the event loop's own work (uvloop when installed).",
    "thread hand-off": "the worker thread waking up for each batch; unavoidable per batch, "
    "amortized by batching.",
    "other": "unattributed.",
}


def _frame(frame: str) -> tuple[str, str, int]:
    """``'func (path/file.py:12)'`` -> (func, path, line)."""
    if frame.endswith(")") and " (" in frame:
        func, rest = frame[:-1].rsplit(" (", 1)
        path, _, line = rest.rpartition(":")
        try:
            return func, path, int(line)
        except ValueError:
            return func, rest, 0
    return frame, "", 0


class _Source:
    """Source lines of gnnaas files, to classify frames by the statement they run."""

    def __init__(self) -> None:
        self._cache: dict[str, list[str]] = {}

    def line(self, path: str, lineno: int) -> str:
        key = path[path.find("gnnaas/") :] if "gnnaas/" in path else path
        if key not in self._cache:
            try:
                self._cache[key] = (REPO / key).read_text().splitlines()
            except OSError:
                self._cache[key] = []
        lines = self._cache[key]
        return lines[lineno - 1] if 0 < lineno <= len(lines) else ""


# The router's functions that run the policy; not its ``predict``, which goes by the line it runs.
_POLICY_FUNCS = (
    "select",
    "_decide",
    "decision_load",
    "_measure",
    "_stream_of",
    "load_snapshot",
    "_admit",
)


@dataclasses.dataclass(frozen=True)
class _Rule:
    """Frames of one part of the code, and the layer their time goes to.

    A frame matches when its path contains one of ``contains`` (the path is read with a leading
    ``/``, so ``/gnnaas/serving/`` matches an absolute path and one relative to the repository
    alike) or ends with one of ``suffixes``. Its layer is that of the first ``by_func`` entry
    naming its function, else of the first ``by_line`` entry with a word in its source line, else
    ``layer``.
    """

    layer: str
    contains: tuple[str, ...] = ()
    suffixes: tuple[str, ...] = ()
    by_func: tuple[tuple[tuple[str, ...], str], ...] = ()
    by_line: tuple[tuple[tuple[str, ...], str], ...] = ()

    def matches(self, path: str) -> bool:
        """Whether a frame of ``path`` belongs to this part of the code."""
        return any(k in f"/{path}" for k in self.contains) or path.endswith(self.suffixes)

    def layer_of(self, func: str, path: str, line: int, source: _Source) -> str:
        """The layer of a matching frame: ``func`` running line ``line`` of ``path``."""
        name = func.rsplit(".", 1)[-1]
        for names, layer in self.by_func:
            if name in names:
                return layer
        text = source.line(path, line) if self.by_line else ""
        for words, layer in self.by_line:
            if any(w in text for w in words):
                return layer
        return self.layer


# First match wins: a frame of gnnaas/serving/core/router.py is the router's, not generic serving.
_RULES = (
    _Rule("sampling", contains=("gnnaas/sampling/",)),
    _Rule("forward", contains=("gnnaas/models/", "torch/nn/", "torch_geometric/")),
    _Rule(
        "forward",
        suffixes=("gnnaas/inference/executor.py", "gnnaas/inference/path.py"),
        by_line=(
            (("sample", "unique", "torch.cat"), "sampling"),
            (("index_select", ".to(", "_sync"), "gather"),
            (("tolist", "ExecResult", "append"), "serialization"),
        ),
    ),
    _Rule("policy", contains=("/gnnaas/policy/",)),
    _Rule(
        "queue (batcher)",
        suffixes=("gnnaas/serving/core/router.py",),
        by_func=(
            (_POLICY_FUNCS, "policy"),
            (("_on_batch",), "metrics"),
        ),
        by_line=((("select(",), "policy"),),
    ),
    _Rule("queue (batcher)", suffixes=("gnnaas/serving/core/batcher.py",)),
    _Rule(
        "metrics", contains=("prometheus_client/",), suffixes=("gnnaas/serving/core/metrics.py",)
    ),
    _Rule(
        "HTTP + parsing",
        suffixes=("routes/predict.py",),
        by_line=(
            (("json.dumps", "Response(", "describe()"), "serialization"),
            (("metrics.",), "metrics"),
        ),
    ),
    _Rule(
        "HTTP + parsing",
        contains=(
            "/gnnaas/serving/",
            "pydantic",
            "fastapi/",
            "starlette/",
            "uvicorn/",
            "h11/",
            "httptools",
            "anyio/",
        ),
    ),
    _Rule("thread hand-off", contains=("concurrent/futures",), suffixes=("threading.py",)),
)


def classify(stack: list[str], source: _Source) -> str:
    """The layer of one sampled stack (root first), decided by its innermost known frame."""
    for raw in reversed(stack):
        func, path, line = _frame(raw)
        for rule in _RULES:
            if rule.matches(path):
                return rule.layer_of(func, path, line, source)
    if any("asyncio/" in f for f in stack):
        return "event loop"
    return "other"


def read_pyspy(path: Path) -> list[tuple[list[str], int]]:
    """Collapsed stacks of py-spy's ``--format raw``: (frames root first, count)."""
    out = []
    for line in path.read_text().splitlines():
        head, _, count = line.rpartition(" ")
        if not head or not count.isdigit():
            continue
        frames = head.split(";")
        if frames and frames[0].startswith(("thread (", "process ")):
            frames = frames[1:]
        out.append((frames, int(count)))
    return out


def _pyspy() -> str | None:
    exe = Path(sys.executable).parent / "py-spy"
    return str(exe) if exe.exists() else shutil.which("py-spy")


def layer_pass(
    srv: ServerProcess,
    url: str,
    bodies: list[bytes],
    headers: dict[str, str],
    rate: float,
    duration_s: float,
    workdir: Path,
    tag: str,
    client: str = "aiohttp",
) -> dict[str, Any]:
    """One step without and one with py-spy attached; stage times and CPU by layer."""
    warm = StepSpec(rate, 1.5, 5000, seed=98)
    asyncio.run(run_step(url, bodies, headers, warm, client=client))
    time.sleep(0.5)
    cpu0 = proc_cpu_s(srv.pid)
    spec = StepSpec(rate, duration_s, int(rate * duration_s) + 100, seed=7, keep_bodies=True)
    res = asyncio.run(run_step(url, bodies, headers, spec, client=client))
    cpu1 = proc_cpu_s(srv.pid)
    ok = int(res.ok.sum())
    timings = [b["timing_ms"] for b in res.bodies]
    wall: dict[str, float] = {}
    for key in ("queue", "sample", "gather", "compute", "total"):
        wall[key] = percentile([t[key] for t in timings], 50)
        wall[key + "_mean"] = float(np.mean([t[key] for t in timings])) if timings else math.nan
    wall["client"] = res.percentile(50)
    wall["client_mean"] = float(np.mean(res.latency_ms[res.ok])) if ok else math.nan
    wall["client_p99"] = res.percentile(99)
    out: dict[str, Any] = {
        "rate": rate,
        "requests": ok,
        "throughput_rps": res.throughput_rps,
        "server_cpu_ms_per_request": 1e3 * (cpu1 - cpu0) / max(ok, 1),
        "wall": wall,
        "profiler": None,
    }
    spy = _pyspy()
    if spy is None:
        out["profiler_note"] = "py-spy not installed (pip install py-spy); CPU split skipped"
        return out
    raw = workdir / f"pyspy-{tag}.txt"
    hz = 200
    time.sleep(0.5)
    # --gil: one stack per sample, from the thread holding the GIL, i.e. Python-level CPU time;
    # work that releases the GIL (torch kernels, OpenMP workers) is what /proc shows beyond it.
    cmd = [
        spy, "record", "--pid", str(srv.pid), "--duration", f"{math.ceil(duration_s)}",
        "--rate", str(hz), "--gil", "--nonblocking", "--threads", "--format", "raw",
        "--output", str(raw),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(0.3)
        cpu0 = proc_cpu_s(srv.pid)
        res = asyncio.run(run_step(url, bodies, headers, spec, client=client))
        cpu1 = proc_cpu_s(srv.pid)
        log, _ = proc.communicate(timeout=duration_s + 30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    if not raw.exists():
        out["profiler_note"] = f"py-spy failed: {log[-500:]}"
        return out
    counts = dict.fromkeys(LAYERS, 0)
    source = _Source()
    for frames, n in read_pyspy(raw):
        counts[classify(frames, source)] += n
    samples = errors = 0
    for token in log.replace(":", " ").split("Samples")[-1:]:
        words = token.split()
        try:
            samples, errors = int(words[0]), int(words[words.index("Errors") + 1])
        except (ValueError, IndexError):
            pass
    ok = int(res.ok.sum())
    scale = (1 + errors / samples) if samples else 1.0
    out["profiler"] = {
        "tool": f"py-spy record --gil --nonblocking --rate {hz}",
        "thread_samples": sum(counts.values()),
        "samples": samples,
        "errors": errors,
        "counts": counts,
        "cpu_ms_per_request": {k: 1e3 * n / hz * scale / max(ok, 1) for k, n in counts.items()},
        "server_cpu_ms_per_request": 1e3 * (cpu1 - cpu0) / max(ok, 1),
        "throughput_rps": res.throughput_rps,
        "raw": shown(raw),
    }
    return out


def _decompose(d: dict[str, Any]) -> dict[str, float]:
    """Mean wall ms per request by layer, adding up to the mean client latency.

    Stage clocks give queue/sample/gather/compute; the server's ``total`` runs from the ASGI
    middleware to just before metrics and serialization, so ``total`` minus the stages is parsing
    + policy + hand-offs, and client minus ``total`` is HTTP both ways + metrics + serialization
    + the client. Policy, metrics and serialization are pure Python on the event loop: their GIL
    time stands for their wall time and is taken out of the row that holds them.
    """
    w = d["wall"]
    prof = d.get("profiler") or {}
    gil = prof.get("cpu_ms_per_request", {})
    policy = gil.get("policy", 0.0)
    serialization = gil.get("serialization", 0.0)
    metrics = gil.get("metrics", 0.0)
    stages = sum(w[k + "_mean"] for k in ("queue", "sample", "gather", "compute"))
    return {
        "HTTP + parsing": w["client_mean"]
        - w["total_mean"]
        - serialization
        - metrics
        + max(w["total_mean"] - stages - policy, 0.0),
        "policy": policy,
        "queue (batcher)": w["queue_mean"],
        "sampling": w["sample_mean"],
        "gather": w["gather_mean"],
        "forward": w["compute_mean"],
        "serialization": serialization,
        "metrics": metrics,
    }


def render(results: dict[str, Any]) -> str:
    """``router-layers.md`` from a run's results."""
    machine, layers = results["machine"], results["sizes"]
    gpu = machine.get("gpu") or "no GPU"
    lines = [
        f"# Where time goes: one request through the router ({results['dataset']})",
        "",
        f"Date: {results['date'][:10]}. Machine: {machine['cores']}-core {machine['cpu']}, "
        f"{gpu}; uvicorn "
        f"({machine['uvicorn_loop']}), torch {machine['torch']} with {machine['torch_threads']} "
        "intra-op threads. Client and server share the cores. Policy: router at tolerance 2 "
        "points; open-loop Poisson load at about half the rate that policy sustains.",
        "",
        "```",
        results["command"],
        "```",
        "",
        "Two sources. **Wall time** per request comes from the server's own stage clocks "
        "(`timing_ms` in the body: queue, sample, gather, compute, total) and the client's clock, "
        "as means so that the rows add up to the mean client latency; sample, gather and compute "
        "are those of the *batch* that served the request, shared by every request merged into "
        "it. The server's `total` runs from the ASGI middleware to just before metrics and "
        "serialization, so 'HTTP + parsing' = (client − total) + (total − stages − policy): "
        "uvicorn's h11 parsing and writing, Starlette/FastAPI dispatch, body and header "
        "validation, the event loop's own delays, loopback and the client. **GIL time** per "
        "request comes from py-spy (`--gil`) sampling whichever server thread holds the GIL while "
        "the same load runs, each stack classified by its innermost gnnaas/library frame: the "
        "Python-level CPU of each layer, all of it on one lock shared by the event loop and the "
        "executor threads. Policy, metrics and serialization are pure Python on the event loop, "
        "so their GIL time stands for their wall time. The server's total CPU per request is "
        "read from `/proc`; what is not GIL time ran outside the GIL (torch kernels and their "
        "OpenMP worker, socket system calls).",
        "",
    ]
    for size, d in layers.items():
        w = d["wall"]
        prof = d.get("profiler")
        wall = _decompose(d)
        client = w["client_mean"]
        lines += [
            f"## {size} node{'s' if int(size) > 1 else ''} per request at {d['rate']:g} req/s",
            "",
            f"Achieved {d['throughput_rps']:.0f} req/s over {d['requests']} requests; client "
            f"latency mean {client:.2f} ms, p50 {w['client']:.2f} ms, p99 {w['client_p99']:.2f} "
            f"ms; server CPU {d['server_cpu_ms_per_request']:.3f} ms per request (all threads).",
            "",
            "| layer | wall ms per request, mean (share) | p50 | GIL held, ms per request | "
            "share of GIL time |",
            "|---|---:|---:|---:|---:|",
        ]
        p50 = {
            "queue (batcher)": w["queue"],
            "sampling": w["sample"],
            "gather": w["gather"],
            "forward": w["compute"],
        }
        gil_total = sum(prof["counts"].values()) if prof else 0
        for layer in LAYERS:
            if layer in wall:
                ms = wall[layer]
                wall_cell = f"{ms:.3f} ({100 * ms / client:.0f}%)" if client > 0 else "–"
            else:
                wall_cell = ""
            p50_cell = f"{p50[layer]:.3f}" if layer in p50 else ""
            if prof:
                n = prof["counts"][layer]
                if layer not in wall and n == 0:
                    continue
                gil_cell = f"{prof['cpu_ms_per_request'][layer]:.3f}"
                share_cell = f"{100 * n / max(gil_total, 1):.1f}%"
            else:
                gil_cell = share_cell = "–"
            lines.append(f"| {layer} | {wall_cell} | {p50_cell} | {gil_cell} | {share_cell} |")
        if prof:
            gil_ms = sum(prof["cpu_ms_per_request"].values())
            lines.append(
                "| *outside the GIL (torch kernels, OpenMP worker, syscalls)* | | | "
                f"{prof['server_cpu_ms_per_request'] - gil_ms:.3f} (CPU) | |"
            )
        lines.append(
            f"| **total** | {client:.3f} (client) | {w['client']:.3f} | "
            + (f"{prof['server_cpu_ms_per_request']:.3f} (server CPU)" if prof else "–")
            + " | |"
        )
        top = sorted(wall, key=lambda k: -wall[k])[:3]
        lines += ["", "Top three costs (mean wall time per request) and what would cut them:", ""]
        for i, k in enumerate(top, 1):
            gil_note = ""
            if prof and prof["counts"].get(k):
                gil_note = f"; {prof['cpu_ms_per_request'][k]:.3f} ms of it holds the GIL"
            lines.append(f"{i}. **{k}** — {wall[k]:.3f} ms/request{gil_note}. {REMEDIES[k]}")
        if prof:
            lines += [
                "",
                f"Profiler: {prof['tool']}, {prof['thread_samples']} GIL-holder samples "
                f"({prof['errors']} of {prof['samples'] + prof['errors']} sampling attempts "
                "failed and are scaled back in); under the profiler the step achieved "
                f"{prof['throughput_rps']:.0f} req/s. Raw stacks: `{prof['raw']}`.",
            ]
        elif d.get("profiler_note"):
            lines += ["", d["profiler_note"]]
        lines.append("")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The where-time-goes pass: one server, router at tolerance 2, both request sizes."""
    plan = QUICK if args.quick else FULL
    plan = dataclasses.replace(plan, dataset=args.dataset or plan.dataset, threads=1)
    workdir = Path(args.workdir).resolve()
    variants_dir, profiles_dir = prepare(plan, workdir, args.device)
    nodes = test_nodes(plan.dataset, workdir)
    rates = _router_rates(Path(args.rates)) if args.rates else {}
    duration = 4.0 if args.quick else 8.0
    results: dict[str, Any] = {
        "dataset": plan.dataset,
        "date": utc_now(),
        "machine": machine_info(),
        "command": command_line("bench_layers.py"),
        "rates_from": shown(args.rates) if rates else None,
        "sizes": {},
    }
    port = free_port()
    cmd = serve_cmd(plan.dataset, variants_dir, profiles_dir, port, args.device)
    env = {"GNNAAS_TORCH_THREADS": "1"}
    with ServerProcess(cmd, port, workdir / "logs" / "serve-layers.log", env=env) as srv:
        url = f"{srv.base_url}/v1/datasets/{plan.dataset}/predict"
        variants = variant_table(srv, plan.dataset)
        base = max((v for v in variants if v["accuracy"] is not None), key=lambda v: v["accuracy"])
        for size in SIZES:
            rate = 100.0 if size == 1 else max(5.0, 0.25e3 / predict_ms(base["service_ms"], size))
            if rates.get(size, 0.0) > 0:
                rate = _nice(0.5 * rates[size])
            bodies = make_bodies(nodes, size, 2048, seed=size)
            wait_idle(srv, plan.dataset)
            results["sizes"][str(size)] = layer_pass(
                srv, url, bodies, HEADERS, rate, duration, workdir, f"{size}", args.client
            )
            say(f"layers size {size}: {json.dumps(results['sizes'][str(size)], default=str)[:600]}")
    return results


def _router_rates(path: Path) -> dict[int, float]:
    """The router's sustained rate at tolerance 2 per request size, from ``router-order.json``."""
    if not path.exists():
        return {}
    rates = json.loads(path.read_text())["rates"]
    return {
        int(size): float(by["router-tol2"]) for size, by in rates.items() if "router-tol2" in by
    }


def _nice(rate: float) -> float:
    """Two significant digits."""
    if rate <= 0:
        return rate
    digits = 1 - int(math.floor(math.log10(rate)))
    return float(round(rate, digits))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="scaled dataset, short steps")
    parser.add_argument("--workdir", default=".cache/bench", help="(default: .cache/bench)")
    parser.add_argument(
        "--dataset", help="override the dataset (default: synth-flickr, quick: synth-flickr@0.2)"
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument(
        "--rates",
        help="router-order.json of a bench_router.py run: load at half the router's sustained "
        "rate (default: the one in the results folder, when there)",
    )
    parser.add_argument("--client", choices=CLIENTS, default="aiohttp")
    parser.add_argument(
        "--out", help="results folder (default: benchmarks/results, quick: <workdir>/results)"
    )
    parser.add_argument(
        "--render", metavar="JSON", help="only rewrite router-layers.md beside its JSON"
    )
    args = parser.parse_args(argv)
    if args.render:
        render_saved(args.render, render)
        return 0
    os.chdir(REPO)
    workdir = Path(args.workdir).resolve()
    out = Path(args.out) if args.out else (workdir / "results" if args.quick else RESULTS)
    if args.rates is None and (out / "router-order.json").exists():
        args.rates = str(out / "router-order.json")
    save_results("router-layers", run(args), render, out)
    return 0


if __name__ == "__main__":
    from common import exit_status

    raise SystemExit(exit_status(main))
