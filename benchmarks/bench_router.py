"""The router under open-loop HTTP load, side by side with static serving and the driver's ceiling.

Steps (each bounded in requests and seconds; the bench stops by itself):

1. The variants and profiles of :data:`common.FULL` (``--quick``: :data:`common.QUICK`) for the
   dataset, into ``<workdir>/variants`` and ``<workdir>/profiles``; reruns reuse them.
2. The ceiling: ``benchmarks/trivial_app.py`` (the router's request shape, no work) under uvicorn,
   driven by the same open-loop Poisson driver at rising rates.
3. ``gnnaas serve`` on a free 127.0.0.1 port; for requests of 1 and of 64 random test nodes and for
   each policy (static most-accurate, static fastest 8x pinned with ``X-Variant``, router at
   tolerance 1, 2 and 5 points, router with an SLO) a rising series of Poisson rates, stopping a
   policy's series once it saturates. Then the router overhead (low rate, single nodes) and a
   closed-loop saturation step.
4. The same saturation step against a server with dynamic batching off
   (``GNNAAS_MAX_BATCH_NODES=1``).

Writes ``router.json`` (every figure), ``router.md`` and ``router.png`` rendered from it, and
``router-order.json`` (the policies' tiers a rerun should reproduce): full run into
``benchmarks/results/``, ``--quick`` into ``<workdir>/results/`` unless ``--out`` says otherwise.
``--render router.json`` rewrites the page and the plot from a saved run. Where time goes inside
one request is ``bench_layers.py``'s question.

Example:
    python benchmarks/bench_router.py --quick
    python benchmarks/bench_router.py --render benchmarks/results/router.json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import (
    FULL,
    QUICK,
    REPO,
    RESULTS,
    Plan,
    busy_note,
    command_line,
    load_snapshot,
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
    trivial_cmd,
    utc_now,
    variant_table,
    wait_idle,
)
from loadgen import CLIENTS, ServerProcess, StepResult, StepSpec, free_port, run_closed, run_step
from measure import overhead, percentile

__all__ = ["main", "render"]

SIZES = (1, 64)


# ----------------------------------------------------------------------------------------------
# configuration


@dataclass(frozen=True)
class Config:
    """What one run measures; ``--quick`` shrinks it."""

    plan: Plan
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
    client: str = "aiohttp"
    server_env: tuple[tuple[str, str], ...] = ()

    @property
    def dataset(self) -> str:
        """The plan's dataset."""
        return self.plan.dataset


FULL_CONFIG = Config(
    plan=FULL,
    step_s=6.0,
    step_max_requests=24_000,
    warmup_s=2.0,
    rate_ratio=1.4,
    max_steps=18,
    slo_ms={1: 20.0, 64: 50.0},
)
QUICK_CONFIG = Config(
    plan=QUICK,
    step_s=3.0,
    step_max_requests=8_000,
    warmup_s=1.0,
    rate_ratio=1.8,
    max_steps=10,
    slo_ms={1: 20.0, 64: 50.0},
    saturation_s=4.0,
    overhead_requests=200,
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
# policies


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
        cpu0 = proc_cpu_s(server_pid)
        result = asyncio.run(run_step(url, bodies, headers, spec, client=cfg.client))
        cpu = proc_cpu_s(server_pid) - cpu0
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
        "compute_p50_ms": percentile([t.get("compute", math.nan) for t in timings], 50),
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
        f"({m['cores']}-core CPU shared by client and server; {results['date'][:10]})",
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


def render(results: dict[str, Any]) -> str:
    """``router.md`` from a run's results (its plot: ``router.png`` beside it)."""
    m = results["machine"]
    steps = [Step(**s) for s in results["steps"]]
    ceiling = [Step(**s) for s in results["ceiling"]]
    labels = results["policy_labels"]
    lines = [
        f"# Router under HTTP load: {results['dataset']}",
        "",
        f"Date: {results['date'][:10]}. Machine: {m['cores']}-core {m['cpu']}, "
        f"{m['mem_gb']} GB RAM, "
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
        f"`{results['load_after']['uptime']}`. {busy_note(results['load_before'])}",
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
        "![p99 latency vs offered load](router.png)",
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
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# run


def make_config(args: argparse.Namespace) -> Config:
    """The preset (full or quick) with the command line's overrides."""
    cfg = QUICK_CONFIG if args.quick else FULL_CONFIG
    # Client and server share the cores: one torch thread keeps the server from stalling itself.
    env = [] if args.server_env else [("GNNAAS_TORCH_THREADS", "1")]
    for item in args.server_env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--server-env takes KEY=VALUE (got {item!r})")
        env.append((key, value))
    threads = dict(env).get("GNNAAS_TORCH_THREADS")
    plan = dataclasses.replace(
        cfg.plan,
        dataset=args.dataset or cfg.plan.dataset,
        epochs=args.epochs or cfg.plan.epochs,
        rankings=tuple(args.rankings or cfg.plan.rankings),
        threads=int(threads) if threads else None,  # profile as the server will run
    )
    return dataclasses.replace(cfg, plan=plan, client=args.client, server_env=tuple(env))


@dataclass(frozen=True)
class _Setup:
    """What the phases of a run share: the config, the prepared variants, the request bodies."""

    cfg: Config
    device: str
    variants_dir: Path
    profiles_dir: Path
    bodies: dict[int, list[bytes]]
    logs: Path

    def serve(self, log: str, **env: str) -> ServerProcess:
        """``gnnaas serve`` of the prepared variants on a free port, ``env`` over the config's."""
        port = free_port()
        cmd = serve_cmd(self.cfg.dataset, self.variants_dir, self.profiles_dir, port, self.device)
        return ServerProcess(cmd, port, self.logs / log, env={**dict(self.cfg.server_env), **env})


def _predict_url(srv: ServerProcess, dataset: str) -> str:
    return f"{srv.base_url}/v1/datasets/{dataset}/predict"


def _opening(args: argparse.Namespace, cfg: Config) -> dict[str, Any]:
    """The results' first figures: the machine, its load, the config and the command."""
    config = dataclasses.asdict(cfg)
    del config["slo_ms"]
    return {
        "dataset": cfg.dataset,
        "date": utc_now(),
        "device": args.device,
        "machine": machine_info(),
        "load_before": load_snapshot(),
        "config": config,
        "slo_ms": {str(k): v for k, v in cfg.slo_ms.items()},
        "commands": [command_line("bench_router.py")],
        "notes": [],
    }


def _commands(cfg: Config, workdir: Path, device: str) -> list[str]:
    """The commands a run stands for, beyond its own: the preparation and the servers."""
    rel = os.path.relpath(workdir, REPO)
    plan = cfg.plan
    return [
        f"# prepare (library calls of `gnnaas prepare`): archs sage gin, rankings "
        f"{' '.join(plan.rankings)}, prune 1 2 4 8, axes {' '.join(plan.axes)}, max "
        f"{plan.epochs} epochs, {plan.profile_runs} profile runs -> {rel}/variants, "
        f"{rel}/profiles",
        f"# servers: gnnaas serve --variants {rel}/variants --profiles {rel}/profiles "
        f"--dataset {cfg.dataset} --host 127.0.0.1 --port <free> --device {device}",
        "#          (batching off: the same with GNNAAS_MAX_BATCH_NODES=1)",
        "# ceiling: python benchmarks/trivial_app.py --port <free>",
    ]


def _ceiling(setup: _Setup) -> tuple[list[Step], dict[str, Any]]:
    """Step 1: the trivial endpoint's rate series per request size, and its saturation step."""
    cfg = setup.cfg
    ceiling: list[Step] = []
    port = free_port()
    with ServerProcess(trivial_cmd(port), port, setup.logs / "trivial.log") as srv:
        url = _predict_url(srv, cfg.dataset)
        for size in SIZES:
            rates = rate_grid(100.0, cfg.rate_ratio, 6000.0, cfg.max_steps + 2)
            ceiling += sweep(
                url,
                setup.bodies[size],
                {},
                rates,
                cfg,
                policy="trivial",
                size=size,
                accuracy={},
                server_pid=srv.pid,
            )
        trivial_sat = saturation(url, setup.bodies[1], {}, cfg)
    return ceiling, trivial_sat


def _policy_series(
    setup: _Setup,
    srv: ServerProcess,
    variants: list[dict[str, Any]],
    accuracy: dict[str, float],
    trivial_max: float,
) -> tuple[list[Step], dict[str, str], dict[str, str]]:
    """Every policy's rate series per request size: the steps, the policies' labels and the
    variant each pinned policy pinned (by ``"<policy> <size>"``)."""
    cfg = setup.cfg
    url = _predict_url(srv, cfg.dataset)
    steps: list[Step] = []
    labels: dict[str, str] = {}
    pinned: dict[str, str] = {}

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
                setup.bodies[size],
                pol.headers,
                rates,
                cfg,
                policy=pol.name,
                size=size,
                accuracy=accuracy,
                server_pid=srv.pid,
                between=idle,
            )
    return steps, labels, pinned


def _router(
    setup: _Setup, trivial_max: float, results: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """Step 2: ``gnnaas serve`` under every policy's rate series, the router overhead, and the
    saturation step with batching on.

    Adds ``variants``, ``baseline_accuracy``, ``baseline_variant``, ``overhead``, ``steps``,
    ``policy_labels`` and ``pinned`` to ``results``, and notes on the pinned policies.

    Returns:
        tuple[dict[str, Any], dict[str, str]]: the saturation step, and the headers of the
        static most-accurate policy it ran.
    """
    cfg = setup.cfg
    with setup.serve("serve.log") as srv:
        url = _predict_url(srv, cfg.dataset)
        variants = variant_table(srv, cfg.dataset)
        results["variants"] = variants
        accuracy = {v["id"]: v["accuracy"] for v in variants if v["accuracy"] is not None}
        results["baseline_accuracy"] = max(accuracy.values())
        results["baseline_variant"] = max(accuracy, key=lambda k: accuracy[k])
        steps, labels, pinned = _policy_series(setup, srv, variants, accuracy, trivial_max)
        pols = {p.name: p for p in policies(variants, 1, cfg)}
        results["overhead"] = {}
        for name in ("static-accurate", "router-tol2"):
            wait_idle(srv, cfg.dataset)
            results["overhead"][name] = overhead(
                url, setup.bodies[1], pols[name].headers, cfg.overhead_requests, cfg.client
            )
            say(f"overhead {name}: {results['overhead'][name]}")
        wait_idle(srv, cfg.dataset)
        on = saturation(url, setup.bodies[1], pols["static-accurate"].headers, cfg)
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
    return on, pols["static-accurate"].headers


def _batching_off(setup: _Setup, headers: dict[str, str]) -> dict[str, Any]:
    """Step 3: the saturation step against a server with dynamic batching off."""
    with setup.serve("serve-nobatch.log", GNNAAS_MAX_BATCH_NODES="1") as srv:
        off = saturation(_predict_url(srv, setup.cfg.dataset), setup.bodies[1], headers, setup.cfg)
        say(f"batching off: {off}")
    return off


def run(args: argparse.Namespace, cfg: Config) -> dict[str, Any]:
    """The whole benchmark; returns the raw results."""
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    results = _opening(args, cfg)
    say(f"machine: {results['machine']}")
    say(f"load: {results['load_before']['uptime']}")
    variants_dir, profiles_dir = prepare(cfg.plan, workdir, args.device)
    results["commands"] += _commands(cfg, workdir, args.device)
    nodes = test_nodes(cfg.dataset, workdir)
    bodies = {size: make_bodies(nodes, size, 2048, seed=size) for size in SIZES}
    say(f"test nodes: {nodes.size}")
    setup = _Setup(cfg, args.device, variants_dir, profiles_dir, bodies, workdir / "logs")

    ceiling, trivial_sat = _ceiling(setup)
    results["ceiling"] = [s.__dict__ for s in ceiling]
    results["trivial_saturation"] = trivial_sat
    trivial_max = max((s.throughput_rps for s in ceiling if s.size == 1), default=1000.0)
    say(f"ceiling: {trivial_max:.0f} rps open loop, {trivial_sat['throughput_rps']:.0f} closed")
    on, accurate_headers = _router(setup, trivial_max, results)
    off = _batching_off(setup, accurate_headers)
    results["batching"] = {"on": on, "off": off}

    results["load_after"] = load_snapshot()
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
        say(f"ordering of {shown(reference)}: NOT reproduced")
        for line in missing:
            say(f"  {line}")
    else:
        say(f"ordering of {shown(reference)}: reproduced ({len(expected['pairs'])} clear pairs)")


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
        "--epochs", type=int, help="max training epochs of each variant (default: 200, quick: 2)"
    )
    parser.add_argument(
        "--rankings",
        nargs="+",
        help="feature rankings to generate (default: greedy lasso, quick: greedy)",
    )
    parser.add_argument(
        "--prepare-only", action="store_true", help="only generate and profile the variants"
    )
    parser.add_argument(
        "--out", help="results folder (default: benchmarks/results, quick: <workdir>/results)"
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
        "--render",
        metavar="JSON",
        help="only rewrite router.md and router.png beside a router.json of a run",
    )
    args = parser.parse_args(argv)
    if args.render:
        render_saved(args.render, render)
        plot(json.loads(Path(args.render).read_text()), Path(args.render).with_suffix(".png"))
        return 0
    os.chdir(REPO)
    workdir = Path(args.workdir).resolve()
    out = Path(args.out) if args.out else (workdir / "results" if args.quick else RESULTS)
    cfg = make_config(args)
    if args.prepare_only:
        prepare(cfg.plan, workdir, args.device)
        return 0
    results = run(args, cfg)
    save_results("router", results, render, out)
    plot(results, out / "router.png")
    for t in targets(results):
        say(" | ".join(t))
    record = out / "router-order.json"
    reference = RESULTS / "router-order.json"
    record.write_text(json.dumps(order_record(results), indent=1) + "\n")
    say_order(results, None if record.resolve() == reference.resolve() else reference)
    return 0


if __name__ == "__main__":
    from common import exit_status

    raise SystemExit(exit_status(main))
