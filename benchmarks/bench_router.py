"""The router under real HTTP load, side by side with static serving and the driver's own ceiling.

Steps (each bounded in requests and seconds; the bench stops by itself):

1. ``gnnaas prepare`` for the dataset (SAGE and GIN, every ranking and prune factor) into
   ``<workdir>/variants`` and ``<workdir>/profiles``; reruns reuse them.
2. The ceiling: ``benchmarks/trivial_app.py`` (the router's request shape, no work) under uvicorn,
   driven by the same open-loop Poisson driver at rising rates.
3. ``gnnaas serve`` on a free 127.0.0.1 port; for requests of 1 and of 64 random test nodes and for
   each policy (static most-accurate, static fastest 8x pinned with ``X-Variant``, router at
   tolerance 1, 2 and 5 points, router with an SLO) a rising series of Poisson rates, stopping a
   policy's series once it saturates. Then the router overhead (low rate, single nodes) and a
   closed-loop saturation step.
4. The same saturation step against a server with dynamic batching off
   (``GNNAAS_MAX_BATCH_NODES=1``).
5. With ``--layers``: where time goes, from ``Server-Timing`` and a py-spy (or no) profile of the
   server under load, written to ``router-layers.md``.

Writes ``router.md`` and ``router.png`` (full run: ``benchmarks/results/``; ``--quick``:
``<workdir>/results/`` unless ``--out`` says otherwise) and the raw figures as JSON in the workdir.

Example:
    python benchmarks/bench_router.py --quick
    python benchmarks/bench_router.py --layers
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadgen import (  # noqa: E402
    CLIENTS,
    ServerProcess,
    StepResult,
    StepSpec,
    free_port,
    run_closed,
    run_step,
)

__all__ = ["main"]

REPO = Path(__file__).resolve().parents[1]


def _shown(path: Path) -> str:
    """``path`` relative to the repository when inside it (results never name a machine's paths)."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return path.name


DATE = "2026-11-23"
SIZES = (1, 64)


def say(*parts: object) -> None:
    """Progress on stdout (the bench's only output besides its files)."""
    print(*parts, flush=True)  # noqa: T201


# ----------------------------------------------------------------------------------------------
# configuration


@dataclass(frozen=True)
class Config:
    """What one run measures; ``--quick`` shrinks it."""

    dataset: str
    step_s: float
    step_max_requests: int
    warmup_s: float
    rate_ratio: float
    max_steps: int
    slo_ms: dict[int, float]
    tolerances: tuple[float, ...] = (1.0, 2.0, 5.0)
    slo_tolerance: float = 5.0
    saturation_s: float = 8.0
    saturation_concurrency: int = 64
    overhead_requests: int = 400
    # The default plan of `gnnaas generate` (rankings, axes, epochs) unless --quick says less.
    rankings: tuple[str, ...] = ("greedy", "lasso")
    epochs: int = 200
    axes: tuple[str, ...] = ("features", "width", "fanouts", "precision")
    profile_runs: int = 30
    client: str = "aiohttp"
    server_env: tuple[tuple[str, str], ...] = ()


FULL = Config(
    dataset="synth-flickr",
    step_s=6.0,
    step_max_requests=24_000,
    warmup_s=2.0,
    rate_ratio=1.4,
    max_steps=18,
    slo_ms={1: 20.0, 64: 50.0},
)
QUICK = Config(
    dataset="synth-flickr@0.2",
    step_s=3.0,
    step_max_requests=8_000,
    warmup_s=1.0,
    rate_ratio=1.8,
    max_steps=10,
    slo_ms={1: 20.0, 64: 50.0},
    saturation_s=4.0,
    overhead_requests=200,
    rankings=("greedy",),
    epochs=2,
    axes=("features",),
    profile_runs=5,
)


@dataclass(frozen=True)
class Policy:
    """A way of sending requests: the headers a client would set."""

    name: str
    label: str
    headers: dict[str, str]
    tolerance: float  # what the client accepts to lose (for the accuracy check)


@dataclass
class Step:
    """Figures of one (policy, size, rate) step."""

    policy: str
    size: int
    offered_rps: float
    throughput_rps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    slo_attainment: float
    rejected: float
    errors: float
    mean_accuracy: float
    lag_p99_ms: float
    sent: int
    realized_rps: float = math.nan  # arrivals actually drawn / step length
    client_cpu_ms: float = math.nan  # per request
    server_cpu_ms: float = math.nan  # per request
    variants: dict[str, int] = field(default_factory=dict)

    def sustained(self, bound_ms: float) -> bool:
        """Whether this step held ``p99 <= bound_ms`` with (almost) nothing refused or lost."""
        return (
            self.p99_ms <= bound_ms
            and self.rejected + self.errors <= 0.01
            and self.throughput_rps >= 0.9 * self._arrival_rps
        )

    @property
    def _arrival_rps(self) -> float:
        return self.offered_rps if math.isnan(self.realized_rps) else self.realized_rps

    def saturated(self, bound_ms: float) -> bool:
        """Whether rising further is pointless."""
        return (
            self.throughput_rps < 0.85 * self._arrival_rps
            or self.rejected > 0.05
            or self.errors > 0.05
            or self.p99_ms > 20 * bound_ms
        )


def _step(
    result: StepResult,
    policy: str,
    size: int,
    slo_ms: float,
    accuracy: dict[str, float],
    server_cpu_s: float = math.nan,
) -> Step:
    s = result.summary()
    served = result.variants_served()
    total = sum(served.values())
    mean_acc = (
        sum(accuracy.get(v, math.nan) * n for v, n in served.items()) / total if total else math.nan
    )
    return Step(
        policy=policy,
        size=size,
        offered_rps=s["offered_rps"],
        throughput_rps=s["throughput_rps"],
        p50_ms=s["p50_ms"],
        p95_ms=s["p95_ms"],
        p99_ms=s["p99_ms"],
        slo_attainment=result.slo_attainment(slo_ms),
        rejected=s["rejected"],
        errors=s["errors"],
        mean_accuracy=mean_acc,
        lag_p99_ms=s["lag_p99_ms"],
        sent=result.sent,
        realized_rps=result.sent / result.spec.duration_s,
        client_cpu_ms=s["client_cpu_ms_per_request"],
        server_cpu_ms=1e3 * server_cpu_s / max(result.sent, 1),
        variants=dict(served.most_common()),
    )


def _nice(rate: float) -> float:
    """Two significant digits."""
    if rate <= 0:
        return rate
    digits = 1 - int(math.floor(math.log10(rate)))
    return float(round(rate, digits))


def rate_grid(start: float, ratio: float, stop: float, max_steps: int) -> list[float]:
    """Geometric rates from ``start`` while ``<= stop``, at most ``max_steps``."""
    out: list[float] = []
    r = start
    while r <= stop * 1.0001 and len(out) < max_steps:
        nice = _nice(r)
        if not out or nice > out[-1]:
            out.append(nice)
        r *= ratio
    return out


# ----------------------------------------------------------------------------------------------
# machine


def _sh(cmd: Sequence[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_info() -> dict[str, Any]:
    """CPU, memory, versions."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = math.nan
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gb = int(line.split()[1]) / 2**20
    except OSError:
        pass
    import aiohttp
    import torch
    import uvicorn

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "mem_gb": round(mem_gb, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "uvicorn": uvicorn.__version__,
        "aiohttp": aiohttp.__version__,
        "uvicorn_loop": _uvicorn_impls(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def _uvicorn_impls() -> str:
    import importlib.util

    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return f"{loop} + {http}"


def load_snapshot() -> dict[str, Any]:
    """Load average and the busiest processes right now."""
    top = _sh(["top", "-bn1", "-o", "%CPU"]).splitlines()
    procs = [line for line in top[7:12] if line.strip()]
    return {"uptime": _sh(["uptime"]), "load": os.getloadavg(), "top": procs}


# ----------------------------------------------------------------------------------------------
# preparation


def prepare(cfg: Config, workdir: Path, device: str) -> tuple[Path, Path]:
    """Variants and profiles for ``cfg.dataset`` under ``workdir`` (reused when present).

    The library calls of ``gnnaas prepare`` with the bench's own choice of rankings and epochs
    (training every ranking of the full preset takes hours on 2 cores).
    """
    from gnnaas.data import load_dataset
    from gnnaas.profiling.profiler import profile_dataset
    from gnnaas.profiling.table import has_profiles
    from gnnaas.variants.pipeline import generate_variants
    from gnnaas.variants.repository import VariantRepository
    from gnnaas.variants.training import TrainConfig

    variants, profiles = workdir / "variants", workdir / "profiles"
    threads = dict(cfg.server_env).get("GNNAAS_TORCH_THREADS")
    if threads:  # profile as the server will run
        import torch

        torch.set_num_threads(int(threads))
    say(
        f"prepare: {cfg.dataset}, archs sage gin, rankings {' '.join(cfg.rankings)}, "
        f"prune 1 2 4 8, axes {' '.join(cfg.axes)}, max {cfg.epochs} epochs, profile runs "
        f"{cfg.profile_runs} -> {workdir}"
    )
    t0 = time.monotonic()
    tty = sys.stderr.isatty()
    store = load_dataset(cfg.dataset)
    repo = VariantRepository(variants)
    generate_variants(
        store,
        repo,
        archs=("sage", "gin"),
        rankings=cfg.rankings,
        prunes=(1, 2, 4, 8),
        config=TrainConfig(seed=0, max_epochs=cfg.epochs),
        device=device,
        force=False,
        progress=tty,
        axes=cfg.axes,
    )
    say(f"prepare: variants ready after {time.monotonic() - t0:.0f} s")
    if not has_profiles(profiles / store.name, repo.list(store.name)):
        profile_dataset(
            store,
            repo,
            profiles,
            batch_size=1024,
            runs=cfg.profile_runs,
            device=device,
            progress=tty,
        )
    say(f"prepare: done in {time.monotonic() - t0:.0f} s")
    return variants, profiles


def test_nodes(dataset: str, workdir: Path) -> np.ndarray:
    """The dataset's test node ids (cached in the workdir)."""
    path = workdir / f"{dataset.replace('@', '_at_')}.test_idx.npy"
    if path.exists():
        return np.load(path)
    from gnnaas.data import load_dataset

    store = load_dataset(dataset)
    idx = store.test_idx.numpy().astype(np.int64)
    np.save(path, idx)
    return idx


def make_bodies(nodes: np.ndarray, size: int, count: int, seed: int) -> list[bytes]:
    """``count`` request bodies of ``size`` random distinct test nodes."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        pick = rng.choice(nodes, size=size, replace=False)
        out.append(json.dumps({"nodes": [int(v) for v in pick]}).encode())
    return out


# ----------------------------------------------------------------------------------------------
# servers


def serve_cmd(dataset: str, variants: Path, profiles: Path, port: int, device: str) -> list[str]:
    """``gnnaas serve`` on 127.0.0.1:port."""
    return [
        sys.executable,
        "-m",
        "gnnaas.cli",
        "serve",
        "--variants",
        str(variants),
        "--profiles",
        str(profiles),
        "--dataset",
        dataset,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        device,
    ]


def trivial_cmd(port: int) -> list[str]:
    """The trivial app on 127.0.0.1:port."""
    return [sys.executable, str(REPO / "benchmarks" / "trivial_app.py"), "--port", str(port)]


def _proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all threads)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return math.nan


def wait_idle(server: ServerProcess, dataset: str, timeout_s: float = 30.0) -> None:
    """Waits (bounded) until no variant has queued nodes, so steps do not overlap."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            listing = server.get_json(f"/v1/datasets/{dataset}/variants")
            if sum(v.get("queued_nodes", 0) for v in listing["variants"]) == 0:
                time.sleep(0.3)
                return
        except OSError:
            pass
        time.sleep(0.5)


def variant_table(server: ServerProcess, dataset: str) -> list[dict[str, Any]]:
    """Variants with profiled accuracy and service curve, from the server's own listing."""
    listing = server.get_json(f"/v1/datasets/{dataset}/variants")["variants"]
    out = []
    for v in listing:
        profile = v.get("profile") or {}
        curve = {int(p["batch_size"]): float(p["e2e_ms"]) for p in profile.get("service_times", [])}
        out.append(
            {
                "id": v["id"],
                "prune": v["prune"],
                "arch": v["arch"],
                "ranking": v["ranking"],
                "features_kept": v["features_kept"],
                "accuracy": v["accuracy"],
                "test_accuracy": v.get("test_accuracy"),
                "routable": v["routable"],
                "service_ms": curve,
            }
        )
    return out


def predict_ms(curve: dict[int, float], size: int) -> float:
    """Profiled service time at ``size`` nodes (linear interpolation, as the policy does)."""
    if not curve:
        return math.nan
    bs = sorted(curve)
    if size <= bs[0]:
        return curve[bs[0]]
    for b0, b1 in zip(bs, bs[1:], strict=False):
        if size <= b1:
            return curve[b0] + (curve[b1] - curve[b0]) * (size - b0) / (b1 - b0)
    if len(bs) == 1:
        return curve[bs[0]] * size / bs[0]
    b0, b1 = bs[-2], bs[-1]
    return curve[b1] + (curve[b1] - curve[b0]) * (size - b1) / (b1 - b0)


def policies(variants: list[dict[str, Any]], size: int, cfg: Config) -> list[Policy]:
    """The compared policies for requests of ``size`` nodes."""
    routable = [v for v in variants if v["routable"] and v["accuracy"] is not None]
    eight = [v for v in routable if v["prune"] == 8] or routable
    fastest = min(eight, key=lambda v: (predict_ms(v["service_ms"], size), -v["accuracy"]))
    slo = cfg.slo_ms[size]
    full = [v for v in routable if v["prune"] == 1] or routable
    most_accurate_1x = max(full, key=lambda v: v["accuracy"])
    out = [
        Policy(
            "static-accurate",
            "static most-accurate (tolerance 0)",
            {"X-Accuracy-Tolerance": "0"},
            0.0,
        ),
        Policy(
            "static-full",
            "static full-feature 1× model (pinned)",
            {"X-Variant": most_accurate_1x["id"]},
            math.inf,
        ),
        Policy(
            "static-fastest",
            "static fastest 8× (pinned)",
            {"X-Variant": fastest["id"]},
            math.inf,
        ),
    ]
    for tol in cfg.tolerances:
        out.append(
            Policy(
                f"router-tol{tol:g}",
                f"router, tolerance {tol:g}",
                {"X-Accuracy-Tolerance": f"{tol:g}"},
                tol,
            )
        )
    out.append(
        Policy(
            "router-slo",
            f"router, tolerance {cfg.slo_tolerance:g} + SLO {slo:g} ms",
            {"X-Accuracy-Tolerance": f"{cfg.slo_tolerance:g}", "X-Latency-SLO-Ms": f"{slo:g}"},
            cfg.slo_tolerance,
        )
    )
    return out


# ----------------------------------------------------------------------------------------------
# measurements


def sweep(
    url: str,
    bodies: list[bytes],
    headers: dict[str, str],
    rates: list[float],
    cfg: Config,
    *,
    policy: str,
    size: int,
    accuracy: dict[str, float],
    server_pid: int,
    between: Any = None,
) -> list[Step]:
    """Rising rates until saturation; one warm-up step first (not recorded)."""
    slo = cfg.slo_ms[size]
    warm = StepSpec(max(rates[0], 20.0), cfg.warmup_s, 2000, seed=99)
    asyncio.run(run_step(url, bodies, headers, warm, client=cfg.client))
    if between is not None:
        between()
    steps: list[Step] = []
    for i, rate in enumerate(rates):
        spec = StepSpec(
            rate, cfg.step_s, min(cfg.step_max_requests, int(rate * cfg.step_s) + 100), seed=i
        )
        cpu0 = _proc_cpu_s(server_pid)
        result = asyncio.run(run_step(url, bodies, headers, spec, client=cfg.client))
        cpu = _proc_cpu_s(server_pid) - cpu0
        step = _step(result, policy, size, slo, accuracy, cpu)
        steps.append(step)
        say(
            f"  {policy:16s} size {size:3d} rate {rate:7.1f}: "
            f"{step.throughput_rps:7.1f} rps  p50 {step.p50_ms:8.2f}  p99 {step.p99_ms:8.2f} ms  "
            f"rej {100 * step.rejected:4.1f}%  slo {100 * step.slo_attainment:5.1f}%  "
            f"acc {step.mean_accuracy:6.2f}  lag99 {step.lag_p99_ms:6.1f}  "
            f"cpu/req client {step.client_cpu_ms:.2f} server {step.server_cpu_ms:.2f} ms"
        )
        if between is not None:
            between()
        if step.saturated(slo):
            break
    return steps


def saturation(url: str, bodies: list[bytes], headers: dict[str, str], cfg: Config) -> dict:
    """Closed-loop throughput with ``cfg.saturation_concurrency`` requests in flight."""
    spec = StepSpec(0.0, cfg.saturation_s, 200_000, concurrency=cfg.saturation_concurrency)
    warm = StepSpec(0.0, 1.0, 5000, concurrency=8)
    asyncio.run(run_closed(url, bodies, headers, warm, client=cfg.client))
    res = asyncio.run(run_closed(url, bodies, headers, spec, client=cfg.client))
    s = res.summary()
    timings = res.timings()
    return {
        "throughput_rps": s["throughput_rps"],
        "p50_ms": s["p50_ms"],
        "p99_ms": s["p99_ms"],
        "rejected": s["rejected"],
        "errors": s["errors"],
        "sent": res.sent,
        "compute_p50_ms": _p([t.get("compute", math.nan) for t in timings], 50),
    }


def _p(values: Sequence[float], q: float) -> float:
    arr = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    return float(np.percentile(arr, q)) if arr.size else math.nan


def overhead(
    url: str, bodies: list[bytes], headers: dict[str, str], cfg: Config
) -> dict[str, float]:
    """Server time minus executor time for single-node requests at a low rate (no merging)."""
    rate = 40.0
    spec = StepSpec(rate, cfg.overhead_requests / rate, cfg.overhead_requests, keep_bodies=True)
    res = asyncio.run(run_step(url, bodies, headers, spec, client=cfg.client))
    total, execu, queue, diff = [], [], [], []
    for b in res.bodies:
        t = b["timing_ms"]
        e = t["sample"] + t["gather"] + t["compute"]
        total.append(t["total"])
        execu.append(e)
        queue.append(t["queue"])
        diff.append(t["total"] - e)
    return {
        "requests": float(len(total)),
        "server_total_p50_ms": _p(total, 50),
        "executor_p50_ms": _p(execu, 50),
        "queue_p50_ms": _p(queue, 50),
        "overhead_p50_ms": _p(total, 50) - _p(execu, 50),
        "overhead_per_request_p50_ms": _p(diff, 50),
        "client_p50_ms": res.percentile(50),
    }


# ----------------------------------------------------------------------------------------------
# summary figures


def sustained_rate(steps: list[Step], bound_ms: float) -> float:
    """Highest offered rate of a step that met ``bound_ms`` at p99 (0 if none)."""
    rates = [s.offered_rps for s in steps if s.sustained(bound_ms)]
    return max(rates) if rates else 0.0


def by_policy(steps: list[Step], size: int) -> dict[str, list[Step]]:
    """Steps of one request size grouped by policy, in run order."""
    out: dict[str, list[Step]] = {}
    for s in steps:
        if s.size == size:
            out.setdefault(s.policy, []).append(s)
    return out


# ----------------------------------------------------------------------------------------------
# outputs


def _f(v: float, fmt: str = ".1f") -> str:
    if v is None or (isinstance(v, float) and (math.isnan(v))):
        return "–"
    if isinstance(v, float) and math.isinf(v):
        return "∞"
    return format(v, fmt)


def plot(results: dict[str, Any], path: Path) -> None:
    """p99 latency vs offered load, one line per policy, one panel per request size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    steps = [Step(**s) for s in results["steps"]]
    ceiling = [Step(**s) for s in results["ceiling"]]
    fig, axes = plt.subplots(1, len(SIZES), figsize=(13, 5.2))
    styles = {
        "static-accurate": ("tab:red", "o", "-"),
        "static-fastest": ("tab:gray", "s", "-"),
        "static-full": ("tab:brown", "o", "--"),
        "router-tol1": ("tab:blue", "^", "-"),
        "router-tol2": ("tab:green", "v", "-"),
        "router-tol5": ("tab:purple", "D", "-"),
        "router-slo": ("tab:orange", "P", "-"),
        "trivial": ("black", "x", ":"),
    }
    labels = results["policy_labels"]
    cap = 20_000.0
    for ax, size in zip(axes, SIZES, strict=True):
        groups = by_policy(ceiling, size)
        groups.update(by_policy(steps, size))
        for name, group in groups.items():
            color, marker, ls = styles.get(name, ("tab:brown", ".", "-"))
            xs = [s.offered_rps for s in group]
            ys = [min(s.p99_ms, cap) for s in group]
            label = labels.get(name, name) if name != "trivial" else "trivial endpoint (ceiling)"
            ax.plot(xs, ys, ls, marker=marker, color=color, label=label, lw=1.6, ms=5)
        bound = results["slo_ms"][str(size)]
        ax.axhline(bound, color="k", lw=0.8, ls="--")
        ax.text(
            0.99,
            bound * 1.08,
            f"p99 bound {bound:g} ms",
            fontsize=8,
            ha="right",
            transform=ax.get_yaxis_transform(),
        )
        ax.set_yscale("log")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("offered load (requests/s, Poisson arrivals)")
        ax.set_ylabel("p99 latency (ms)")
        ax.set_title(f"{size} node{'s' if size > 1 else ''} per request")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7.5, loc="upper left")
    m = results["machine"]
    fig.suptitle(
        f"gnnaas router on {results['dataset']}: p99 latency vs offered load "
        f"({m['cores']}-core CPU shared by client and server; {DATE})",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def targets(results: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The issue's four targets: (target, measured, goal, met)."""
    steps = [Step(**s) for s in results["steps"]]
    ceiling = [Step(**s) for s in results["ceiling"]]
    baseline_acc = results["baseline_accuracy"]
    rows = []
    baselines = (
        ("static-accurate", "static most-accurate"),
        ("static-full", "static full-feature 1× model (supplementary)"),
    )
    for size, (base_name, base_label) in itertools.product(SIZES, baselines):
        bound = results["slo_ms"][str(size)]
        groups = by_policy(steps, size)
        if base_name not in groups:
            continue
        base = sustained_rate(groups[base_name], bound)
        parts, ok = [], []
        for tol in (1.0, 2.0):
            name = f"router-tol{tol:g}"
            r = sustained_rate(groups.get(name, []), bound)
            at = [s for s in groups.get(name, []) if s.offered_rps == r]
            acc = at[0].mean_accuracy if at else math.nan
            drop = baseline_acc - acc
            ratio = r / base if base > 0 else math.inf if r > 0 else math.nan
            parts.append(
                f"tol {tol:g}: {_f(r, '.0f')} vs {_f(base, '.0f')} req/s = {_f(ratio, '.2f')}×, "
                f"accuracy −{_f(drop, '.2f')} pts"
            )
            ok.append(ratio >= 3 and drop <= tol + 1e-9)
        rows.append(
            (
                f"{size}-node requests: rate at p99 ≤ {bound:g} ms, router (tol ≤ 2) vs "
                f"{base_label}",
                "; ".join(parts),
                "≥ 3×, accuracy within tolerance",
                "yes" if all(ok) else "no",
            )
        )
    bound1 = results["slo_ms"]["1"]
    groups = by_policy(steps, 1)
    best_name, best = "", 0.0
    for name, group in groups.items():
        if name.startswith("router"):
            r = sustained_rate(group, bound1)
            if r > best:
                best_name, best = name, r
    trivial = sustained_rate(by_policy(ceiling, 1).get("trivial", []), bound1)
    share = best / trivial if trivial else math.nan
    rows.append(
        (
            f"single-node: highest rate with p99 ≤ {bound1:g} ms",
            f"{best:.0f} req/s ({best_name}); trivial endpoint {trivial:.0f} req/s → "
            f"{_f(100 * share, '.0f')}% of ceiling",
            "≥ 1,000 req/s and ≥ 40% of ceiling",
            "yes" if best >= 1000 and share >= 0.4 else "no",
        )
    )
    on, off = results["batching"]["on"], results["batching"].get("off")
    if off:
        ratio = on["throughput_rps"] / off["throughput_rps"] if off["throughput_rps"] else math.inf
        rows.append(
            (
                "dynamic batching on vs off at saturation (single nodes)",
                f"{on['throughput_rps']:.0f} vs {off['throughput_rps']:.0f} req/s = {ratio:.2f}×",
                "≥ 3×",
                "yes" if ratio >= 3 else "no",
            )
        )
    ov = results["overhead"]["router-tol2"]
    rows.append(
        (
            "router overhead, single nodes: p50 server time − executor time",
            f"{ov['overhead_p50_ms']:.2f} ms (server p50 {ov['server_total_p50_ms']:.2f}, "
            f"executor p50 {ov['executor_p50_ms']:.2f})",
            "≤ 2 ms",
            "yes" if ov["overhead_p50_ms"] <= 2 else "no",
        )
    )
    return rows


def _step_table(steps: list[Step], labels: dict[str, str]) -> list[str]:
    lines = [
        "| policy | offered req/s | achieved req/s | p50 ms | p95 ms | p99 ms | SLO met | "
        "rejected | mean acc % | variants that served (share) | client lag p99 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for s in steps:
        total = sum(s.variants.values()) or 1
        mix = ", ".join(f"{v} {100 * n / total:.0f}%" for v, n in list(s.variants.items())[:3])
        if len(s.variants) > 3:
            mix += ", …"
        lines.append(
            f"| {s.policy} | {s.offered_rps:g} | {s.throughput_rps:.1f} | {_f(s.p50_ms, '.2f')} | "
            f"{_f(s.p95_ms, '.2f')} | {_f(s.p99_ms, '.2f')} | {100 * s.slo_attainment:.1f}% | "
            f"{100 * s.rejected:.1f}% | {_f(s.mean_accuracy, '.2f')} | {mix} | "
            f"{_f(s.lag_p99_ms, '.1f')} |"
        )
    return lines


def write_markdown(results: dict[str, Any], path: Path, png: Path) -> None:
    """``router.md``."""
    m = results["machine"]
    steps = [Step(**s) for s in results["steps"]]
    ceiling = [Step(**s) for s in results["ceiling"]]
    labels = results["policy_labels"]
    lines = [
        f"# Router under HTTP load: {results['dataset']}",
        "",
        f"Date: {DATE}. Machine: {m['cores']}-core {m['cpu']}, {m['mem_gb']} GB RAM, "
        f"GPU: {m['gpu'] or 'none'}; Python {m['python']}, torch {m['torch']} "
        f"({m['torch_threads']} intra-op threads), uvicorn {m['uvicorn']} ({m['uvicorn_loop']}), "
        f"aiohttp {m['aiohttp']}. Load generator client: {results['config']['client']}. "
        f"Device: {results['device']}. Server environment: "
        f"{' '.join('='.join(kv) for kv in results['config']['server_env']) or 'default'}.",
        "",
        "**The load generator and the server share the same cores** (one client process with one "
        "event loop; the server is one uvicorn process with one event loop plus one executor "
        "thread per variant). Every figure is therefore a lower bound on what the server does "
        "alone, and the trivial-endpoint ceiling below is measured with the same driver in the "
        "same run so the router's figures can be read against it.",
        "",
        f"Machine load before the run: `{results['load_before']['uptime']}`; after: "
        f"`{results['load_after']['uptime']}`. {results['busy_note']}",
        "",
        "Commands:",
        "",
        "```",
        *results["commands"],
        "```",
        "",
        f"Run time {results['wall_s'] / 60:.1f} min. Each open-loop step: Poisson arrivals for "
        f"{results['config']['step_s']:g} s (at most {results['config']['step_max_requests']} "
        "requests), then up to 10 s to drain; a policy's rising series stops after the first "
        "saturated step. Latency is measured from each request's *scheduled* send time "
        "(no coordinated omission); 'client lag' is how late the client itself sent. Requests "
        "carry 1 or 64 distinct random test nodes. p50/p95/p99 cover requests not refused (a "
        "timeout counts as infinite); 'SLO met' is the share of all sent requests answered 200 "
        "within the size's bound; 'mean acc' is the mean profiled validation accuracy of the "
        "variants that served (from `X-Variant` and `/v1/datasets/{d}/variants`).",
        "",
        "## The four targets (issue 7), measured",
        "",
        "| target | measured | goal | met |",
        "|---|---|---|---|",
    ]
    for t in targets(results):
        lines.append("| " + " | ".join(t) + " |")
    lines += [
        "",
        "A rate is *sustained* when its step kept p99 within the bound, refused or lost ≤ 1% and "
        f"achieved ≥ 90% of the offered rate; rates rise by ×{results['config']['rate_ratio']:g} "
        "per step, so ratios are resolved to that factor.",
        "",
        f"![p99 latency vs offered load]({png.name})",
        "",
        "## Sustained rate per policy",
        "",
        "| policy | "
        + " | ".join(
            f"{s} node{'s' if s > 1 else ''}: req/s at p99 ≤ {results['slo_ms'][str(s)]:g} ms"
            for s in SIZES
        )
        + " |",
        "|---|" + "---:|" * len(SIZES),
    ]
    names = ["trivial", *labels]
    for name in names:
        cells = []
        for size in SIZES:
            source = ceiling if name == "trivial" else steps
            group = by_policy(source, size).get(name, [])
            cells.append(f"{sustained_rate(group, results['slo_ms'][str(size)]):.0f}")
        label = "trivial endpoint (ceiling)" if name == "trivial" else labels[name]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Ordering a rerun should reproduce: tiers of policies whose sustained rates lie within "
        f"×{CLEAR_RATIO:g} of the tier's best (closer rates swap between runs on this machine: "
        f"the same step repeated on the same server moves p99 by up to 2×). `make bench` checks "
        f"every pair of policies in different tiers against `router-order.json`.",
        "",
    ]
    for size, tiers in order(results).items():
        shown = " > ".join("{" + ", ".join(t) + "}" for t in tiers)
        lines.append(f"- {size} node{'s' if size > 1 else ''}: {shown}")
    lines += ["", "## Ceiling: the trivial FastAPI endpoint, same driver", ""]
    lines += _step_table(ceiling, labels)
    for size in SIZES:
        lines += ["", f"## {size} node{'s' if size > 1 else ''} per request", ""]
        lines += _step_table([s for s in steps if s.size == size], labels)
    b = results["batching"]
    lines += [
        "",
        "## Dynamic batching on vs off at saturation (single-node requests)",
        "",
        f"Closed loop, {results['config']['saturation_concurrency']} requests in flight, "
        f"{results['config']['saturation_s']:g} s, static most-accurate (every request on one "
        "variant). Off = a second server started with `GNNAAS_MAX_BATCH_NODES=1`.",
        "",
        "| batching | throughput req/s | p50 ms | p99 ms | compute p50 ms (per batch) | rejected |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for key in ("on", "off"):
        if key in b and b[key]:
            r = b[key]
            lines.append(
                f"| {key} | {r['throughput_rps']:.0f} | {_f(r['p50_ms'], '.2f')} | "
                f"{_f(r['p99_ms'], '.2f')} | {_f(r['compute_p50_ms'], '.3f')} | "
                f"{100 * r['rejected']:.1f}% |"
            )
    lines += [
        "",
        "## Router overhead (single-node requests, 40 req/s, nothing merges)",
        "",
        "Server time = `timing_ms.total` (request arrival in the ASGI middleware to the response "
        "body ready, serialization excluded); executor = sample + gather + compute of its batch.",
        "",
        "| policy | server p50 ms | executor p50 ms | queue p50 ms | overhead = difference of "
        "p50s | p50 of per-request difference | client p50 ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, o in results["overhead"].items():
        lines.append(
            f"| {name} | {o['server_total_p50_ms']:.3f} | {o['executor_p50_ms']:.3f} | "
            f"{o['queue_p50_ms']:.3f} | {o['overhead_p50_ms']:.3f} | "
            f"{o['overhead_per_request_p50_ms']:.3f} | {_f(o['client_p50_ms'], '.3f')} |"
        )
    lines += [
        "",
        "## Variants served",
        "",
        "| variant | features | val acc % | test acc % | profiled e2e ms @1 | @64 (interp.) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for v in sorted(results["variants"], key=lambda v: -(v["accuracy"] or 0)):
        curve = {int(k): x for k, x in v["service_ms"].items()}
        lines.append(
            f"| {v['id']} | {v['features_kept']} | {_f(v['accuracy'], '.2f')} | "
            f"{_f(v['test_accuracy'], '.2f')} | {_f(predict_ms(curve, 1), '.2f')} | "
            f"{_f(predict_ms(curve, 64), '.2f')} |"
        )
    if results.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in results["notes"]]
    if results.get("findings"):
        lines += ["", "## Findings", "", results["findings"].strip()]
    path.write_text("\n".join(lines) + "\n")


# ----------------------------------------------------------------------------------------------
# where time goes (--layers)

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
    "policy": "`select_variant` scores every routable variant and the router's backlog walks "
    "every variant's batcher on every request; cache the backlog per event-loop tick "
    "(or per millisecond) and precompute the within-tolerance candidate lists per tolerance.",
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


_POLICY_FUNCS = (
    "select",
    "load_snapshot",
    "wait_ms",
    "select_variant",
    "candidates_within",
    "predict",
    "scaled",
)


def classify(stack: list[str], source: _Source) -> str:
    """The layer of one sampled stack (root first), decided by its innermost known frame."""
    for raw in reversed(stack):
        func, path, line = _frame(raw)
        name = func.rsplit(".", 1)[-1]
        if "gnnaas/sampling/" in path:
            return "sampling"
        if "gnnaas/models/" in path or "torch/nn/" in path or "torch_geometric/" in path:
            return "forward"
        if path.endswith(("gnnaas/inference/executor.py", "gnnaas/inference/path.py")):
            text = source.line(path, line)
            if "sample" in text or "unique" in text or "torch.cat" in text:
                return "sampling"
            if "index_select" in text or ".to(" in text or "_sync" in text:
                return "gather"
            if "tolist" in text or "ExecResult" in text or "append" in text:
                return "serialization"
            return "forward"
        if path.endswith("gnnaas/serving/core/policy.py"):
            return "policy"
        if path.endswith("gnnaas/serving/core/router.py"):
            if name in _POLICY_FUNCS and name != "predict":
                return "policy"
            if name == "_on_batch":
                return "metrics"
            if "select(" in source.line(path, line):
                return "policy"
            return "queue (batcher)"
        if path.endswith("gnnaas/serving/core/batcher.py"):
            return "queue (batcher)"
        if path.endswith("gnnaas/serving/core/metrics.py") or "prometheus_client/" in path:
            return "metrics"
        if path.endswith("routes/predict.py"):
            text = source.line(path, line)
            if "json.dumps" in text or "Response(" in text or "describe()" in text:
                return "serialization"
            if "metrics." in text:
                return "metrics"
            return "HTTP + parsing"
        if "/gnnaas/serving/" in path or path.startswith("gnnaas/serving/"):
            return "HTTP + parsing"
        if any(
            k in path
            for k in (
                "pydantic",
                "fastapi/",
                "starlette/",
                "uvicorn/",
                "h11/",
                "httptools",
                "anyio/",
            )
        ):
            return "HTTP + parsing"
        if "concurrent/futures" in path or path.endswith("threading.py"):
            return "thread hand-off"
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
    cpu0 = _proc_cpu_s(srv.pid)
    spec = StepSpec(rate, duration_s, int(rate * duration_s) + 100, seed=7, keep_bodies=True)
    res = asyncio.run(run_step(url, bodies, headers, spec, client=client))
    cpu1 = _proc_cpu_s(srv.pid)
    ok = int(res.ok.sum())
    timings = [b["timing_ms"] for b in res.bodies]
    wall: dict[str, float] = {}
    for key in ("queue", "sample", "gather", "compute", "total"):
        wall[key] = _p([t[key] for t in timings], 50)
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
        cpu0 = _proc_cpu_s(srv.pid)
        res = asyncio.run(run_step(url, bodies, headers, spec, client=client))
        cpu1 = _proc_cpu_s(srv.pid)
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
        "raw": _shown(raw),
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


def write_layers(
    layers: dict[str, Any], machine: dict[str, Any], dataset: str, path: Path, command: str
) -> None:
    """``router-layers.md``."""
    lines = [
        f"# Where time goes: one request through the router ({dataset})",
        "",
        f"Date: {DATE}. Machine: {machine['cores']}-core {machine['cpu']}, no GPU; uvicorn "
        f"({machine['uvicorn_loop']}), torch {machine['torch']} with {machine['torch_threads']} "
        "intra-op threads. Client and server share the cores. Policy: router at tolerance 2 "
        "points; open-loop Poisson load at about half the rate that policy sustains.",
        "",
        "```",
        command,
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
    path.write_text("\n".join(lines) + "\n")


def run_layers(args: argparse.Namespace, cfg: Config, out: Path) -> None:
    """The where-time-goes pass: one server, router at tolerance 2, both request sizes."""
    workdir = Path(args.workdir).resolve()
    command = "python benchmarks/bench_router.py " + " ".join(sys.argv[1:])
    if args.replot:
        layers = json.loads((workdir / "router-layers.json").read_text())
        write_layers(layers, machine_info(), cfg.dataset, out / "router-layers.md", command)
        return
    variants_dir, profiles_dir = prepare(cfg, workdir, args.device)
    nodes = test_nodes(cfg.dataset, workdir)
    raw = workdir / ("router-quick.json" if args.quick else "router.json")
    previous = json.loads(raw.read_text()) if raw.exists() else None
    duration = 4.0 if args.quick else 8.0
    layers: dict[str, Any] = {}
    port = free_port()
    cmd = serve_cmd(cfg.dataset, variants_dir, profiles_dir, port, args.device)
    env = dict(cfg.server_env)
    with ServerProcess(cmd, port, workdir / "logs" / "serve-layers.log", env=env) as srv:
        url = f"{srv.base_url}/v1/datasets/{cfg.dataset}/predict"
        variants = variant_table(srv, cfg.dataset)
        base = max((v for v in variants if v["accuracy"] is not None), key=lambda v: v["accuracy"])
        for size in SIZES:
            rate = 100.0 if size == 1 else max(5.0, 0.25e3 / predict_ms(base["service_ms"], size))
            if previous:
                group = by_policy([Step(**s) for s in previous["steps"]], size).get(
                    "router-tol2", []
                )
                sustained = sustained_rate(group, previous["slo_ms"][str(size)])
                if sustained > 0:
                    rate = _nice(0.5 * sustained)
            headers = {"X-Accuracy-Tolerance": "2"}
            bodies = make_bodies(nodes, size, 2048, seed=size)
            wait_idle(srv, cfg.dataset)
            layers[str(size)] = layer_pass(
                srv, url, bodies, headers, rate, duration, workdir, f"{size}", cfg.client
            )
            say(f"layers size {size}: {json.dumps(layers[str(size)], default=str)[:600]}")
    (workdir / "router-layers.json").write_text(json.dumps(layers, indent=1))
    write_layers(layers, machine_info(), cfg.dataset, out / "router-layers.md", command)
    say(f"wrote {out / 'router-layers.md'}")


# ----------------------------------------------------------------------------------------------
# main


def _busy_note(before: dict[str, Any]) -> str:
    """Whether the machine was otherwise idle when the run started, from ``before``'s snapshot."""
    b = before["load"][0]
    cpu = []
    for line in before.get("top", [])[:3]:
        fields = line.split(None, 11)
        try:
            cpu.append((float(fields[8]), fields[-1]))
        except (IndexError, ValueError):
            continue
    busiest = max(cpu, default=(0.0, ""))
    if b < 1.0 and busiest[0] < 25.0:
        return (
            f"The machine was otherwise idle when the run started (1-min load {b:.2f}, "
            f"no process above {busiest[0]:.0f}% CPU)."
        )
    top = "; ".join(f"{name} {pct:.0f}%" for pct, name in cpu)
    return (
        f"**The machine was otherwise busy when the run started** (1-min load {b:.2f}; top: "
        f"{top}); figures are lower than on an idle machine."
    )


def make_config(args: argparse.Namespace) -> Config:
    """The preset (full or quick) with the command line's overrides."""
    cfg = QUICK if args.quick else FULL
    # Client and server share the cores: one torch thread keeps the server from stalling itself.
    env = [] if args.server_env else [("GNNAAS_TORCH_THREADS", "1")]
    for item in args.server_env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--server-env takes KEY=VALUE (got {item!r})")
        env.append((key, value))
    return Config(
        **{
            **cfg.__dict__,
            "dataset": args.dataset or cfg.dataset,
            "client": args.client,
            "server_env": tuple(env),
            "epochs": args.epochs or cfg.epochs,
            "rankings": tuple(args.rankings or cfg.rankings),
        }
    )


def run(args: argparse.Namespace, cfg: Config) -> dict[str, Any]:
    """The whole benchmark; returns the raw results."""
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    logs = workdir / "logs"
    t_start = time.monotonic()
    results: dict[str, Any] = {
        "dataset": cfg.dataset,
        "device": args.device,
        "machine": machine_info(),
        "load_before": load_snapshot(),
        "config": {k: v for k, v in cfg.__dict__.items() if k != "slo_ms"},
        "slo_ms": {str(k): v for k, v in cfg.slo_ms.items()},
        "commands": [
            "python benchmarks/bench_router.py " + " ".join(sys.argv[1:]),
        ],
        "notes": [],
    }
    say(f"machine: {results['machine']}")
    say(f"load: {results['load_before']['uptime']}")

    variants_dir, profiles_dir = prepare(cfg, workdir, args.device)
    rel = os.path.relpath(workdir, REPO)
    results["commands"] += [
        f"# prepare (library calls of `gnnaas prepare`): archs sage gin, rankings "
        f"{' '.join(cfg.rankings)}, prune 1 2 4 8, max {cfg.epochs} epochs, "
        f"{cfg.profile_runs} profile runs -> {rel}/variants, {rel}/profiles",
        f"# servers: gnnaas serve --variants {rel}/variants --profiles {rel}/profiles "
        f"--dataset {cfg.dataset} --host 127.0.0.1 --port <free> --device {args.device}",
        "#          (batching off: the same with GNNAAS_MAX_BATCH_NODES=1)",
        "# ceiling: python benchmarks/trivial_app.py --port <free>",
    ]
    nodes = test_nodes(cfg.dataset, workdir)
    bodies = {size: make_bodies(nodes, size, 2048, seed=size) for size in SIZES}
    say(f"test nodes: {nodes.size}")

    # -- 1. ceiling ------------------------------------------------------------------------------
    ceiling: list[Step] = []
    port = free_port()
    with ServerProcess(trivial_cmd(port), port, logs / "trivial.log") as srv:
        url = f"{srv.base_url}/v1/datasets/{cfg.dataset}/predict"
        for size in SIZES:
            rates = rate_grid(100.0, cfg.rate_ratio, 6000.0, cfg.max_steps + 2)
            ceiling += sweep(
                url,
                bodies[size],
                {},
                rates,
                cfg,
                policy="trivial",
                size=size,
                accuracy={},
                server_pid=srv.pid,
            )
        trivial_sat = saturation(url, bodies[1], {}, cfg)
    results["ceiling"] = [s.__dict__ for s in ceiling]
    results["trivial_saturation"] = trivial_sat
    trivial_max = max((s.throughput_rps for s in ceiling if s.size == 1), default=1000.0)
    say(f"ceiling: {trivial_max:.0f} rps open loop, {trivial_sat['throughput_rps']:.0f} closed")

    # -- 2. router -------------------------------------------------------------------------------
    steps: list[Step] = []
    labels: dict[str, str] = {}
    pinned: dict[str, str] = {}
    port = free_port()
    cmd = serve_cmd(cfg.dataset, variants_dir, profiles_dir, port, args.device)
    with ServerProcess(cmd, port, logs / "serve.log", env=dict(cfg.server_env)) as srv:
        url = f"{srv.base_url}/v1/datasets/{cfg.dataset}/predict"
        variants = variant_table(srv, cfg.dataset)
        results["variants"] = variants
        accuracy = {v["id"]: v["accuracy"] for v in variants if v["accuracy"] is not None}
        results["baseline_accuracy"] = max(accuracy.values())
        results["baseline_variant"] = max(accuracy, key=lambda k: accuracy[k])

        def idle() -> None:
            wait_idle(srv, cfg.dataset)

        for size in SIZES:
            # From well below the slowest variant's capacity (one batch at a time, as profiled;
            # the server is slower than the profiler's back-to-back loop) up to past the
            # ceiling; each policy's series stops at its first saturated step.
            times = [predict_ms(v["service_ms"], size) for v in variants if v["service_ms"]]
            slowest_rps = 1e3 / max(max(times), 0.05)
            start = 10.0 if size == 1 else max(2.0, _nice(0.1 * slowest_rps))
            rates = rate_grid(start, cfg.rate_ratio, 1.3 * trivial_max, cfg.max_steps)
            say(f"size {size}: rates {rates}")
            for pol in policies(variants, size, cfg):
                labels.setdefault(pol.name, pol.label)
                if pol.name in ("static-fastest", "static-full"):
                    pinned[f"{pol.name} {size}"] = pol.headers["X-Variant"]
                steps += sweep(
                    url,
                    bodies[size],
                    pol.headers,
                    rates,
                    cfg,
                    policy=pol.name,
                    size=size,
                    accuracy=accuracy,
                    server_pid=srv.pid,
                    between=idle,
                )
        pols = {p.name: p for p in policies(variants, 1, cfg)}
        results["overhead"] = {}
        for name in ("static-accurate", "router-tol2"):
            idle()
            results["overhead"][name] = overhead(url, bodies[1], pols[name].headers, cfg)
            say(f"overhead {name}: {results['overhead'][name]}")
        idle()
        on = saturation(url, bodies[1], pols["static-accurate"].headers, cfg)
        say(f"batching on: {on}")
    results["steps"] = [s.__dict__ for s in steps]
    results["policy_labels"] = labels
    results["pinned"] = pinned
    results["notes"] += [
        "Pinned variants (policy, request size: variant): "
        + ", ".join(f"{k}: `{v}`" for k, v in pinned.items())
        + ". Static fastest pins, per request size, the 8× variant with the smallest profiled "
        "service time at that size; static full pins the most accurate 1× (all features) model, "
        "what a user without variants would run.",
        f"Router with SLO: tolerance {cfg.slo_tolerance:g} points plus `X-Latency-SLO-Ms` equal to "
        "the size's p99 bound (the policy takes the most accurate variant predicted to meet it).",
    ]

    # -- 3. batching off -------------------------------------------------------------------------
    port = free_port()
    cmd = serve_cmd(cfg.dataset, variants_dir, profiles_dir, port, args.device)
    with ServerProcess(
        cmd,
        port,
        logs / "serve-nobatch.log",
        env={**dict(cfg.server_env), "GNNAAS_MAX_BATCH_NODES": "1"},
    ) as srv:
        url = f"{srv.base_url}/v1/datasets/{cfg.dataset}/predict"
        off = saturation(url, bodies[1], pols["static-accurate"].headers, cfg)
        say(f"batching off: {off}")
    results["batching"] = {"on": on, "off": off}

    results["load_after"] = load_snapshot()
    results["busy_note"] = _busy_note(results["load_before"])
    results["wall_s"] = time.monotonic() - t_start
    return results


CLEAR_RATIO = 3.0
"""Sustained rates this far apart order two policies; closer ones are within this machine's noise.

Repeating one step on the same server moves p99 by up to 2x near saturation (shared cores, a
client on the same machine), so one policy's sustained rate can move by two rate steps between runs.
"""


def rates(results: dict[str, Any]) -> dict[int, dict[str, float]]:
    """Sustained rate of every policy, per request size."""
    steps = [Step(**s) for s in results["steps"]]
    out: dict[int, dict[str, float]] = {}
    for size in SIZES:
        bound = results["slo_ms"][str(size)]
        groups = by_policy(steps, size)
        out[size] = {name: sustained_rate(groups[name], bound) for name in groups}
    return out


def order(results: dict[str, Any]) -> dict[int, list[list[str]]]:
    """Policies per request size in tiers, fastest tier first.

    A tier opens when a policy's sustained rate is below 1/CLEAR_RATIO of the current tier's best;
    within a tier the order is not resolved by one run.
    """
    out: dict[int, list[list[str]]] = {}
    for size, by_name in rates(results).items():
        tiers: list[list[str]] = []
        top = math.inf
        for name in sorted(by_name, key=lambda n: -by_name[n]):
            if not tiers or by_name[name] * CLEAR_RATIO < top:
                tiers.append([])
                top = by_name[name]
            tiers[-1].append(name)
        out[size] = tiers
    return out


def clear_pairs(results: dict[str, Any]) -> list[tuple[int, str, str]]:
    """(size, faster, slower) for every two policies whose rates are CLEAR_RATIO apart."""
    out = []
    for size, by_name in rates(results).items():
        for a, ra in by_name.items():
            for b, rb in by_name.items():
                if ra > 0 and ra >= CLEAR_RATIO * rb:
                    out.append((size, a, b))
    return out


def compare_order(reference: dict[str, Any], results: dict[str, Any]) -> list[str]:
    """The reference's clear pairs that ``results`` does not reproduce (faster not above slower)."""
    now = rates(results)
    missing = []
    for size, a, b in (tuple(p) for p in reference["pairs"]):
        ra, rb = now.get(int(size), {}).get(a), now.get(int(size), {}).get(b)
        if ra is None or rb is None or not ra > rb:
            missing.append(f"{size} node(s): {a} ({ra}) should beat {b} ({rb})")
    return missing


def order_record(results: dict[str, Any]) -> dict[str, Any]:
    """What ``router-order.json`` keeps of a run: rates, tiers and clear pairs."""
    return {
        "dataset": results["dataset"],
        "clear_ratio": CLEAR_RATIO,
        "rates": {str(k): v for k, v in rates(results).items()},
        "tiers": {str(k): v for k, v in order(results).items()},
        "pairs": clear_pairs(results),
    }


def say_order(results: dict[str, Any], reference: Path | None) -> None:
    """Print the run's policy tiers and whether they reproduce ``reference``'s clear pairs."""
    for size, tiers in order(results).items():
        say(f"order, {size} node(s): {' > '.join(' = '.join(t) for t in tiers)}")
    if reference is None or not reference.exists():
        return
    expected = json.loads(reference.read_text())
    missing = compare_order(expected, results)
    if missing:
        say(f"ordering of {_shown(reference)}: NOT reproduced")
        for line in missing:
            say(f"  {line}")
    else:
        say(f"ordering of {_shown(reference)}: reproduced ({len(expected['pairs'])} clear pairs)")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(description="Router under HTTP load vs static serving.")
    parser.add_argument("--quick", action="store_true", help="scaled dataset, short steps")
    parser.add_argument("--workdir", default=".cache/bench", help="(default: .cache/bench)")
    parser.add_argument(
        "--dataset", help="override the dataset (default: synth-flickr, quick: synth-flickr@0.2)"
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument(
        "--epochs", type=int, help="max training epochs of each variant (default: 4, quick: 2)"
    )
    parser.add_argument(
        "--rankings", nargs="+", help="feature rankings to generate (default: greedy)"
    )
    parser.add_argument(
        "--prepare-only", action="store_true", help="only generate and profile the variants"
    )
    parser.add_argument(
        "--out", help="results folder (default: benchmarks/results, quick: <workdir>/results)"
    )
    parser.add_argument(
        "--layers", action="store_true", help="also profile the server and write router-layers.md"
    )
    parser.add_argument(
        "--client",
        choices=CLIENTS,
        default="aiohttp",
        help="the load generator's client: aiohttp or a minimal HTTP/1.1 one (default: aiohttp)",
    )
    parser.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment for the gnnaas servers, e.g. GNNAAS_MAX_WAIT_MS=1 (repeatable; "
        "default: GNNAAS_TORCH_THREADS=1)",
    )
    parser.add_argument(
        "--replot",
        action="store_true",
        help="rewrite router.md and router.png from the last run's JSON in the workdir",
    )
    parser.add_argument(
        "--findings",
        metavar="FILE",
        help="with --replot: markdown appended to router.md as 'Findings' (kept in the JSON)",
    )
    parser.add_argument(
        "--layers-only",
        action="store_true",
        help="only the where-time-goes pass (reuses the workdir)",
    )
    args = parser.parse_args(argv)
    os.chdir(REPO)
    workdir = Path(args.workdir).resolve()
    out = (
        Path(args.out)
        if args.out
        else (workdir / "results" if args.quick else REPO / "benchmarks" / "results")
    )
    out.mkdir(parents=True, exist_ok=True)
    cfg = make_config(args)
    if args.prepare_only:
        prepare(cfg, workdir, args.device)
        return 0
    if not args.layers_only:
        raw = workdir / ("router-quick.json" if args.quick else "router.json")
        if args.replot:
            results = json.loads(raw.read_text())
            results["busy_note"] = _busy_note(results["load_before"])
            if args.findings:
                results["findings"] = Path(args.findings).read_text()
                raw.write_text(json.dumps(results, indent=1, default=str))
        else:
            results = run(args, cfg)
            raw.write_text(json.dumps(results, indent=1, default=str))
        png = out / "router.png"
        plot(results, png)
        write_markdown(results, out / "router.md", png)
        say(f"wrote {out / 'router.md'}, {png}, {raw}")
        for t in targets(results):
            say(" | ".join(t))
        record = out / "router-order.json"
        reference = REPO / "benchmarks" / "results" / "router-order.json"
        record.write_text(json.dumps(order_record(results), indent=1) + "\n")
        say_order(results, None if record.resolve() == reference.resolve() else reference)
    if args.layers or args.layers_only:
        run_layers(args, cfg, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
