"""Measurements several benchmarks share, on top of :mod:`loadgen`.

- :func:`sustained_interleaved`: the *sustained rate* of several :class:`Policy` (ways of sending
  requests: headers, and optionally another server), by closed-loop steps at rising concurrency,
  interleaved slice by slice so that a drift of the machine hits every policy alike; the rate is
  the throughput at which p99 reaches a bound (:func:`rate_at_bound`).
- :func:`sequential_p50`: the p50 of requests sent one at a time.
- :func:`overhead`: server time minus executor time of single-node requests at a low open-loop
  rate (nothing merges), from the bodies' ``timing_ms``.

Example:
    >>> pol = Policy("router-tol2", {"X-Accuracy-Tolerance": "2"}, 2.0)
    >>> # sustained_interleaved(url, bodies, [pol], args, bound_ms=20.0, rotate=0)
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gnnaas import stats

from h2load import run_closed_h2load
from loadgen import StepResult, StepSpec, run_closed, run_step

__all__ = [
    "Policy",
    "merge_slices",
    "overhead",
    "percentile",
    "rate_at_bound",
    "run_slice",
    "sequential_p50",
    "sustained_interleaved",
]


@dataclass(frozen=True)
class Policy:
    """A way of sending requests of one size: the headers a client would set."""

    key: str
    headers: dict[str, str]
    tolerance: float | None  # router tolerance; None for a pinned variant
    url: str | None = None  # another server (the trivial endpoint); None: gnnaas


def run_slice(
    url: str,
    bodies: list[bytes],
    policy: Policy,
    concurrency: int,
    duration_s: float,
    args: argparse.Namespace,
    part: int,
) -> StepResult:
    """``duration_s`` of closed loop for ``policy`` at ``concurrency``, from the client
    ``args.client`` names (``h2load``: on the cores of ``args.client_cpus``, the answers per
    variant read from a gnnaas server's ``/metrics``; otherwise this process's asyncio client)."""
    spec = StepSpec(
        rate_rps=0.0,
        duration_s=duration_s,
        max_requests=args.step_max_requests,
        concurrency=concurrency,
        seed=concurrency * 100 + part,
    )
    if getattr(args, "client", "python") == "h2load":
        cpus = getattr(args, "client_cpus", None)
        pinned = policy.headers.get("X-Variant")
        # a pinned variant answers every 200 of its policy; a routed one is read off /metrics
        routed = policy.url is None and pinned is None
        result = run_closed_h2load(
            url,
            bodies,
            policy.headers,
            spec,
            cpus=None if cpus is None else set(cpus),
            metrics_url=url.split("/v1/", 1)[0] + "/metrics" if routed else None,
        )
        if pinned is not None:
            result.served = Counter({pinned: int(result.ok.sum())})
        return result
    return asyncio.run(run_closed(url, bodies, policy.headers, spec))


def merge_slices(slices: Sequence[StepResult]) -> dict[str, Any]:
    """One step's figures from its slices: answers over the slices' summed wall time, and
    percentiles over all their requests together."""
    step = StepResult.merged(slices)
    return {
        "concurrency": step.spec.concurrency,
        "slices": len(slices),
        "throughput_rps": step.throughput_rps,
        "p50_ms": step.percentile(50),
        "p99_ms": step.percentile(99),
        "errors": step.error_share + step.rejected_share,
        "variants": dict(step.variants_served()),
    }


def sustained_interleaved(
    url: str,
    bodies: list[bytes],
    policies: Sequence[Policy],
    args: argparse.Namespace,
    bound_ms: float,
    rotate: int,
) -> dict[str, dict[str, Any]]:
    """Every policy's closed-loop steps, interleaved *per concurrency level*.

    At each level (``args.concurrency``) every policy still in the race runs its step
    (``args.step_s``) before any policy moves to the next level, and each step is cut into
    ``args.slices`` slices run round-robin over the policies (in an order rotated from slice to
    slice, level to level and by ``rotate`` between repeats), so the time a policy is measured is
    spread over the whole level: a slowdown of the machine or of the client for a second or two
    hits every policy alike instead of one policy's step. A policy stops after two steps in a row
    over the bound (more clients would only queue longer). Its sustained rate is
    :func:`rate_at_bound` of its steps.

    Returns:
        dict[str, dict[str, Any]]: per policy key, ``rate_rps`` and its ``steps``.
    """
    steps: dict[str, list[dict[str, Any]]] = {p.key: [] for p in policies}
    live = list(policies)
    started = time.monotonic()
    slice_s = args.step_s / args.slices
    for level, concurrency in enumerate(args.concurrency):
        parts: dict[str, list[StepResult]] = {p.key: [] for p in live}
        for part in range(args.slices):
            k = (level + rotate + part) % len(live)
            for pol in live[k:] + live[:k]:
                parts[pol.key].append(
                    run_slice(pol.url or url, bodies, pol, concurrency, slice_s, args, part)
                )
        for pol in live:
            steps[pol.key].append(merge_slices(parts[pol.key]))
        print(
            f"  concurrency {concurrency}: "
            + ", ".join(f"{p.key} {steps[p.key][-1]['throughput_rps']:.0f}" for p in live)
            + f" req/s ({time.monotonic() - started:.0f} s)",
            flush=True,
        )
        live = [
            p
            for p in live
            if not (
                len(steps[p.key]) >= 2
                and steps[p.key][-1]["p99_ms"] > bound_ms
                and steps[p.key][-2]["p99_ms"] > bound_ms
            )
        ]
        if not live:
            break
    return {
        key: {"rate_rps": rate_at_bound(series, bound_ms), "steps": series}
        for key, series in steps.items()
    }


def rate_at_bound(steps: list[dict[str, Any]], bound_ms: float) -> float:
    """Throughput at which p99 reaches ``bound_ms``, interpolated between closed-loop steps.

    Steps are in rising concurrency. Below the first step over the bound the best throughput of
    the steps within it counts; between the last step within and the first step over, the rate
    is interpolated linearly in p99 (a step that just misses the bound then moves the figure by
    a little instead of dropping a whole concurrency level). Steps with errors count as over.
    """
    best = 0.0
    prev: dict[str, Any] | None = None
    for st in steps:
        within = st["p99_ms"] <= bound_ms and st["errors"] == 0
        if within:
            best = max(best, st["throughput_rps"])
            prev = st
            continue
        if prev is not None and st["errors"] == 0 and st["p99_ms"] > prev["p99_ms"]:
            frac = (bound_ms - prev["p99_ms"]) / (st["p99_ms"] - prev["p99_ms"])
            gain = max(st["throughput_rps"] - prev["throughput_rps"], 0.0)
            best = max(best, prev["throughput_rps"] + frac * gain)
        break
    return best


def sequential_p50(url: str, bodies: list[bytes], headers: dict[str, str], n: int) -> float:
    """p50 (ms) of ``n`` requests sent one at a time."""
    spec = StepSpec(rate_rps=0.0, duration_s=60.0, max_requests=n, concurrency=1)
    return asyncio.run(run_closed(url, bodies, headers, spec)).percentile(50)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (:func:`gnnaas.stats.percentile`) of the values that are not NaN
    (a missing timing), NaN when none is."""
    kept = [v for v in values if not math.isnan(v)]
    return stats.percentile(kept, q) if kept else math.nan


def overhead(
    url: str,
    bodies: list[bytes],
    headers: dict[str, str],
    requests: int,
    client: str = "aiohttp",
    rate: float = 40.0,
) -> dict[str, float]:
    """Server time minus executor time for single-node requests at a low rate (no merging).

    ``requests`` requests at ``rate`` req/s, open loop; server time is the body's
    ``timing_ms.total``, executor time its ``sample + gather + compute``.
    """
    spec = StepSpec(rate, requests / rate, requests, keep_bodies=True)
    res = asyncio.run(run_step(url, bodies, headers, spec, client=client))
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
        "server_total_p50_ms": percentile(total, 50),
        "executor_p50_ms": percentile(execu, 50),
        "queue_p50_ms": percentile(queue, 50),
        "overhead_p50_ms": percentile(total, 50) - percentile(execu, 50),
        "overhead_per_request_p50_ms": percentile(diff, 50),
        "client_p50_ms": res.percentile(50),
    }
