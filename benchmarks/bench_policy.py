"""Is the router ever worse than a fixed choice? Router at tolerance N against pinned variants.

The question of docs/architecture.md §6's promise, measured so that a 10 % difference shows: one
``gnnaas serve`` on a free 127.0.0.1 port, requests of 1 and of 64 random test nodes, and for
every request size a set of *policies*:

- ``router-tolN``: the router at ``X-Accuracy-Tolerance: N`` for each N of ``--tolerances``;
- ``pin:<id>``: one variant pinned with ``X-Variant``: the full-feature 1× model that is most
  accurate (what a user without variants runs), and for each tolerance the ``--top-fixed``
  variants it admits that were fastest in a short closed-loop pre-run of every variant (the
  candidates for "best single variant", chosen by measurement, not by the profiles under test);
- the precomputed variant (``--precompute``, default the most accurate 1× model): its exact
  answers stored by ``gnnaas precompute`` and profiled (``gnnaas profile --only <id>@exact``)
  before the server starts, so the router may choose it and it is pinned like the others when it
  is among the fastest admissible; the tables give the router's traffic by variant;
- ``trivial-endpoint`` (single-node requests): ``benchmarks/trivial_app.py``, the FastAPI +
  uvicorn ceiling with the same request shape, on its own port, measured like the others.

Each policy is measured by closed-loop steps at rising concurrency (``--concurrency``), sent by
``h2load`` when it is installed (``--client``: a C client that keeps up with the server on a core
of its own, ``--server-cpus 0 --client-cpus 1`` on a 2-core machine), else by the Python client;
its *sustained rate* is the throughput at which p99 reaches the request size's bound
(``--bound-ms``): the best step within it, interpolated towards the first step over it; a series
stops after two steps in a row over the bound. Closed loop,
not open loop: a step's throughput is a mean over thousands of answers, so one noisy step moves it
by a few percent instead of ending a series. Policies are interleaved at every concurrency level
(all policies run their step at one level before any moves on, each step cut into ``--slices``
slices run round-robin over the policies in a rotating order), so the compared measurements are
spread over the same seconds and a drift of the machine hits all of them alike; the whole set is
repeated ``--repeats`` times, and the tables give the median and the spread (min–max).

The rule checked (``--check``, as ``make bench`` does): for every request size, tolerance and
repeat, the router's sustained rate is at least ``--ratio`` (0.9) times that of the best fixed
variant admissible under the same tolerance in the same repeat. The exit status is 1 when it fails.
Its noise is measured in the same run by a control (``--no-twin`` leaves it out): one pinned
variant measured twice, as ``pin:X`` and ``twin:X``; the page says, beside each verdict, whether
the ratio lies within what those two like policies reached against each other.

Writes ``policy.md`` and ``policy.json`` (full run: ``benchmarks/results/``; ``--quick``:
``<workdir>/results/`` unless ``--out`` says otherwise), the page rendered from the JSON;
``--render policy.json`` rewrites it from a saved run.

Example:
    python benchmarks/bench_policy.py --quick --check
    python benchmarks/bench_policy.py --dataset synth-flickr --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
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
    FULL,
    QUICK,
    RESULTS,
    Plan,
    add_precomputed,
    check_cores,
    command_line,
    gpu_words,
    machine_info,
    make_bodies,
    prepare,
    render_saved,
    save_results,
    say,
    serve_cmd,
    shown,
    test_nodes,
    trivial_cmd,
    wait_idle,
)
from h2load import INSTALL
from h2load import available as h2load_available
from loadgen import ServerProcess, free_port
from measure import Policy, overhead, run_slice, sustained_interleaved

__all__ = ["main", "render"]


def admissible_ids(variants: list[dict[str, Any]], tolerance: float) -> list[str]:
    """Variants the router may serve at ``tolerance``: the server's own rule when it publishes one.

    ``/variants`` lists, per variant, ``admissible_at`` (the smallest tolerance that admits it) when
    the profiles carry accuracy intervals; otherwise the point rule (within N points of the best).
    """
    routable = [v for v in variants if v.get("routable") and v.get("accuracy") is not None]
    if routable and all(v.get("admissible_at") is not None for v in routable):
        return [v["id"] for v in routable if float(v["admissible_at"]) <= tolerance + 1e-9]
    best = max(v["accuracy"] for v in routable)
    return [v["id"] for v in routable if best - v["accuracy"] <= tolerance + 1e-9]


def make_policies(
    variants: list[dict[str, Any]],
    size: int,
    tolerances: Sequence[float],
    prerun: dict[str, float],
    top: int,
    twin: bool = True,
) -> list[Policy]:
    """The router at each tolerance, the 1× model, the candidate best fixed variants and, with
    ``twin``, the rule's control.

    The candidates are, per tolerance, the ``top`` admissible variants by their *measured* rate
    in a short pre-run (``prerun``), not by their profiles: a wrong profile must not hide the
    fixed variant that actually wins. The control, ``twin:<id>``, pins the pre-run's fastest
    variant admissible at the smallest tolerance a second time, under its own key: two policies
    that serve alike, so the ratio of their rates is the noise of the rule's comparison
    (:func:`twins`).
    """
    full = full_model(variants)
    pinned = {full} if full else set()
    control = None
    for tol in sorted(tolerances):
        ids = sorted(admissible_ids(variants, tol), key=lambda i: -prerun.get(i, 0.0))
        pinned |= set(ids[:top])
        control = control or (ids[0] if twin and ids else None)
    if control is not None:
        pinned.add(control)
    out = [
        Policy(f"router-tol{tol:g}", {"X-Accuracy-Tolerance": f"{tol:g}"}, tol)
        for tol in tolerances
    ]
    out += [Policy(f"pin:{i}", {"X-Variant": i}, None) for i in sorted(pinned)]
    if control is not None:
        out.append(Policy(f"{TWIN}{control}", {"X-Variant": control}, None))
    return out


TWIN = "twin:"
"""The key prefix of the control: a pinned variant measured a second time."""


def twins(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per size and repeat, the control's rate over its own variant's pin (``twin:X`` over
    ``pin:X``, interleaved alike): the ratio two policies that serve the same variant the same
    way reach in this run, the noise against which the rule's ratios are read."""
    rows = []
    for size, block in results["sizes"].items():
        for pol in block["policies"]:
            if not pol["key"].startswith(TWIN):
                continue
            pin = "pin:" + pol["key"][len(TWIN) :]
            for r, rep in enumerate(block["repeats"]):
                a, b = rep[pol["key"]]["rate_rps"], rep[pin]["rate_rps"]
                rows.append(
                    {
                        "size": int(size),
                        "variant": pin[4:],
                        "repeat": r + 1,
                        "pin_rps": b,
                        "twin_rps": a,
                        "ratio": a / b if b > 0 else math.nan,
                    }
                )
    return rows


def twin_floor(rows: list[dict[str, Any]]) -> float | None:
    """The lowest ratio either of two like policies reached against the other over the run
    (``min(t, 1/t)`` over the controls' ratios ``t``): a rule ratio at or above it is within
    the noise this run measured."""
    values = [min(r["ratio"], 1 / r["ratio"]) for r in rows if r["ratio"] > 0]
    return min(values) if values else None


def full_model(variants: list[dict[str, Any]]) -> str | None:
    """The model a user would serve without gnnaas: a trained 1× model (every feature, the
    training fanouts and width, fp32), of the more accurate architecture."""
    full = [
        v
        for v in variants
        if v["prune"] == 1
        and not v.get("base")
        and not v.get("precomputed")
        and v.get("accuracy") is not None
    ]
    return max(full, key=lambda v: v["accuracy"])["id"] if full else None


def prerun_rates(
    url: str, bodies: list[bytes], ids: Sequence[str], args: argparse.Namespace
) -> dict[str, float]:
    """Closed-loop throughput of each variant pinned, one short step at the top concurrency."""
    top = max(args.concurrency)
    return {
        vid: run_slice(
            url, bodies, Policy(vid, {"X-Variant": vid}, None), top, args.prerun_s, args, 0
        ).throughput_rps
        for vid in ids
    }


def _crossed(steps: list[dict[str, Any]], bound_ms: float) -> str:
    """The first concurrency whose step went over the bound: a rate from a series that never
    did is a floor (more clients would have been served within it), and says so."""
    for st in steps:
        if st["p99_ms"] > bound_ms or st["errors"]:
            return f"c={st['concurrency']}"
    top = steps[-1]["concurrency"] if steps else 0
    return f"not reached (c ≤ {top}: a floor)"


def report_picks(folder: Path, tolerances: Sequence[float]) -> list[dict[str, Any]]:
    """The idle router's pick per tolerance and request size from the profiles, with its
    validation loss and its loss on the test split (``gnnaas report``'s table)."""
    from gnnaas.profiling.frontier import read_router_view, tolerance_table
    from gnnaas.profiling.table import read_profiles

    profiles = read_profiles(folder)
    table = tolerance_table(
        read_router_view(folder),
        sorted({*tolerances, 0.0, 1.0, 2.0, 5.0}),
        test=profiles[profiles["split"] == "test"],
    )
    keep = ("tolerance", "num_nodes", "variant", "baseline", "val_loss", "val_loss_lo")
    keep += ("val_loss_hi", "test_loss", "test_loss_vs_best", "relative_time")
    return [{k: row.get(k) for k in keep} for row in table.to_dict("records")]


def run(args: argparse.Namespace, plan: Plan) -> dict[str, Any]:
    workdir = Path(args.workdir)
    variants_dir, profiles_dir = prepare(plan, workdir, args.device)
    precomputed = add_precomputed(plan.dataset, variants_dir, profiles_dir, args.precompute)
    nodes = test_nodes(plan.dataset, workdir)
    port = free_port()
    env = {"GNNAAS_TORCH_THREADS": "1"}
    results: dict[str, Any] = {
        "dataset": plan.dataset,
        "machine": machine_info(),
        "args": {k: v for k, v in vars(args).items() if k not in ("out",)},
        "precomputed": precomputed,
        "sizes": {},
    }
    cmd = serve_cmd(plan.dataset, variants_dir, profiles_dir, port, args.device)
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(
            ServerProcess(cmd, port, workdir / "policy-server.log", env=env, cpus=args.server_cpus)
        )
        route = f"/v1/datasets/{plan.dataset}/predict"
        url = f"{server.base_url}{route}"
        # The FastAPI + uvicorn app with the same request shape, measured as one more policy
        # (interleaved with the others) for single-node requests.
        trivial: Policy | None = None
        if 1 in args.sizes and not args.no_trivial:
            tport = free_port()
            while tport == port:  # the ports are not held between the two calls
                tport = free_port()
            log = workdir / "policy-trivial.log"
            ceiling = stack.enter_context(
                ServerProcess(trivial_cmd(tport), tport, log, cpus=args.server_cpus)
            )
            trivial = Policy("trivial-endpoint", {}, None, url=f"{ceiling.base_url}{route}")
        if args.client_cpus is not None:  # this process and the clients it spawns
            os.sched_setaffinity(0, args.client_cpus)
        listing = server.get_json(f"/v1/datasets/{plan.dataset}/variants")["variants"]
        variants = []
        for v in listing:
            profile = v.get("profile") or {}
            curve = {
                int(p["batch_size"]): float(p["e2e_ms"]) for p in profile.get("service_times", [])
            }
            variants.append({**v, "service_ms": curve})
        results["variants"] = [
            {k: v.get(k) for k in ("id", "prune", "accuracy", "admissible_at", "dominated_by")}
            for v in variants
        ]
        results["full_model"] = full_model(variants)
        results["picks"] = report_picks(profiles_dir / plan.dataset, args.tolerances)
        ones = make_bodies(nodes, 1, 512, seed=1)
        wait_idle(server, plan.dataset)
        requests = 200 if args.quick else 400
        results["overhead"] = overhead(url, ones, {"X-Accuracy-Tolerance": "2"}, requests)
        say(
            "overhead (single nodes, 40 req/s, tolerance 2): p50 server "
            f"{results['overhead']['server_total_p50_ms']:.2f} ms - executor "
            f"{results['overhead']['executor_p50_ms']:.2f} ms = "
            f"{results['overhead']['overhead_p50_ms']:.2f} ms; client p50 "
            f"{results['overhead']['client_p50_ms']:.2f} ms"
        )
        for size, bound_ms in zip(args.sizes, args.bound_ms, strict=True):
            bodies = make_bodies(nodes, size, 512, seed=size)
            routable = [v["id"] for v in variants if v.get("routable")]
            prerun = prerun_rates(url, bodies, routable, args)
            say(
                f"size {size}: pre-run (req/s, concurrency {max(args.concurrency)}): "
                + ", ".join(
                    f"{k} {v:.0f}" for k, v in sorted(prerun.items(), key=lambda kv: -kv[1])
                )
            )
            pols = make_policies(
                variants, size, args.tolerances, prerun, args.top_fixed, not args.no_twin
            )
            if size == 1 and trivial is not None:
                pols.append(trivial)
            say(f"size {size}: {len(pols)} policies, p99 bound {bound_ms:g} ms")
            # warm-up: every policy once, short
            for pol in pols:
                run_slice(pol.url or url, bodies, pol, 2, 0.5, args, 0)
            repeats: list[dict[str, Any]] = []
            for r in range(args.repeats):
                wait_idle(server, plan.dataset)
                measured = sustained_interleaved(url, bodies, pols, args, bound_ms, rotate=r)
                for pol in pols:
                    say(
                        f"  repeat {r + 1} {pol.key:<28} "
                        f"{measured[pol.key]['rate_rps']:8.0f} req/s at p99 <= {bound_ms:g} ms"
                    )
                repeats.append(measured)
            results["sizes"][str(size)] = {
                "bound_ms": bound_ms,
                "policies": [
                    {"key": p.key, "headers": p.headers, "tolerance": p.tolerance} for p in pols
                ],
                "repeats": repeats,
            }
    return results


def check(results: dict[str, Any], ratio: float) -> list[dict[str, Any]]:
    """Per size, tolerance and repeat: router rate vs the best admissible fixed variant's, and
    whether a miss lies within the noise the run's control measured (:func:`twin_floor`)."""
    variants = results["variants"]
    floor = twin_floor(twins(results))
    rows = []
    for size, block in results["sizes"].items():
        keys = [p["key"] for p in block["policies"]]
        for pol in block["policies"]:
            tol = pol["tolerance"]
            if tol is None:
                continue
            admitted = {f"pin:{i}" for i in admissible_ids(_as_listing(variants), tol)}
            fixed = [k for k in keys if k in admitted]
            for r, rep in enumerate(block["repeats"]):
                best_key = max(fixed, key=lambda k: rep[k]["rate_rps"]) if fixed else None
                best = rep[best_key]["rate_rps"] if best_key else math.nan
                mine = rep[pol["key"]]["rate_rps"]
                rows.append(
                    {
                        "size": int(size),
                        "tolerance": tol,
                        "repeat": r + 1,
                        "router_rps": mine,
                        "best_fixed": best_key,
                        "best_fixed_rps": best,
                        "ratio": mine / best if best and best > 0 else math.nan,
                        "ok": bool(best_key is None or mine >= ratio * best),
                        "within_noise": None
                        if floor is None or not best
                        else bool(mine >= min(ratio, floor) * best),
                    }
                )
    return rows


def _ceiling_lines(block: dict[str, Any]) -> list[str]:
    """The router's rate against the trivial endpoint's, repeat by repeat (when measured)."""
    keys = [p["key"] for p in block["policies"]]
    if "trivial-endpoint" not in keys:
        return []
    out = []
    for pol in block["policies"]:
        if pol["tolerance"] is None:
            continue
        ratios = [
            rep[pol["key"]]["rate_rps"] / rep["trivial-endpoint"]["rate_rps"]
            for rep in block["repeats"]
            if rep["trivial-endpoint"]["rate_rps"] > 0
        ]
        if ratios:
            out.append(
                f"- {pol['key']} / trivial FastAPI endpoint (the same driver, interleaved): "
                f"median {median(ratios):.0%} ({min(ratios):.0%}–{max(ratios):.0%})"
            )
    return out + [""]


def _as_listing(variants: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**v, "routable": True} for v in variants if v.get("accuracy") is not None]


def _spread(values: list[float]) -> str:
    return f"{median(values):,.0f} ({min(values):,.0f}–{max(values):,.0f})"


def matched(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Router throughput over the best admissible fixed variant's at the *same* concurrency.

    Closed-loop throughput at a given concurrency is a mean over thousands of answers, so this
    ratio is far steadier than the rate at the p99 bound (a p99 is set by a few slow answers).
    Per size, tolerance and concurrency level: the median over repeats of router / best fixed.
    """
    variants = results["variants"]
    out = []
    for size, block in results["sizes"].items():
        keys = [p["key"] for p in block["policies"]]
        for pol in block["policies"]:
            tol = pol["tolerance"]
            if tol is None:
                continue
            admitted = {f"pin:{i}" for i in admissible_ids(_as_listing(variants), tol)}
            fixed = [k for k in keys if k in admitted]
            by_level: dict[int, list[float]] = {}
            for rep in block["repeats"]:
                mine = {st["concurrency"]: st["throughput_rps"] for st in rep[pol["key"]]["steps"]}
                for c, thr in mine.items():
                    best = max(
                        (
                            st["throughput_rps"]
                            for k in fixed
                            for st in rep[k]["steps"]
                            if st["concurrency"] == c
                        ),
                        default=0.0,
                    )
                    if best > 0:
                        by_level.setdefault(c, []).append(thr / best)
            for c in sorted(by_level):
                ratios = by_level[c]
                out.append(
                    {
                        "size": int(size),
                        "tolerance": tol,
                        "concurrency": c,
                        "median_ratio": median(ratios),
                        "min_ratio": min(ratios),
                        "repeats": len(ratios),
                    }
                )
    return out


def _client_words(args: dict[str, Any]) -> str:
    """Which client sent the steps, and on which cores it and the server ran."""
    server, client = args.get("server_cpus"), args.get("client_cpus")
    if args.get("client", "python") != "h2load" and server is None and client is None:
        return "client and server on the same machine"
    if args.get("client", "python") == "h2load":
        words = "closed-loop steps from `h2load` (up to 16 processes, a body each)"
    else:
        words = "closed-loop steps from the benchmark's Python client"
    server_on, client_on = (
        "all cores" if c is None else "core " + ", ".join(map(str, c)) for c in (server, client)
    )
    return f"{words}, server on {server_on}, client on {client_on}"


def render(results: dict[str, Any]) -> str:
    """``policy.md`` (or ``<name>.md``) from a run's results."""
    m, rows = results["machine"], results["check"]
    lines = [
        f"# Router vs fixed choices ({results['dataset']})",
        "",
        f"Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, torch {m.get('torch', '?')}"
        f"{gpu_words(m, results['args'].get('device', 'cpu'))}; {_client_words(results['args'])}"
        "; server on one torch thread.",
        f"Command: `python benchmarks/bench_policy.py {results['args_line']}`.",
        "",
        "Sustained rate = closed-loop throughput (req/s) at which p99 reaches the bound "
        "(interpolated between steps), over concurrency levels "
        + ", ".join(str(c) for c in results["args"]["concurrency"])
        + "."
        f" Median (min–max) of {results['args']['repeats']} repeats; policies interleaved at"
        " every concurrency level"
        + (
            f", each step cut into {results['args']['slices']} slices run round-robin over the"
            " policies."
            if results["args"].get("slices", 1) > 1
            else "."
        ),
        "",
    ]
    o = results["overhead"]
    lines += [
        "## Router overhead (single nodes, 40 req/s open loop, tolerance 2)",
        "",
        f"p50 server total {o['server_total_p50_ms']:.2f} ms − p50 executor "
        f"{o['executor_p50_ms']:.2f} ms = **{o['overhead_p50_ms']:.2f} ms** (queue p50 "
        f"{o['queue_p50_ms']:.2f} ms); client p50 {o['client_p50_ms']:.2f} ms over "
        f"{o['requests']:.0f} requests.",
        "",
    ]
    for size, block in results["sizes"].items():
        lines += [
            f"## {size}-node requests, p99 ≤ {block['bound_ms']:g} ms",
            "",
            "| policy | sustained req/s | p99 over the bound from (last repeat) "
            "| served by (last repeat, best step) |",
            "|---|---:|---|---|",
        ]
        for pol in block["policies"]:
            rates = [rep[pol["key"]]["rate_rps"] for rep in block["repeats"]]
            last = block["repeats"][-1][pol["key"]]["steps"]
            served = max(last, key=lambda s: s["throughput_rps"])["variants"] if last else {}
            top = ", ".join(f"{k} {v}" for k, v in sorted(served.items(), key=lambda kv: -kv[1]))
            crossed = _crossed(last, block["bound_ms"])
            lines.append(f"| {pol['key']} | {_spread(rates)} | {crossed} | {top[:80]} |")
        lines.append("")
        lines += _ceiling_lines(block)
        lines += _traffic_lines(block, results.get("precomputed"))
    lines += _speedup_lines(results)
    lines += _pick_lines(results)
    lines += [
        "## Throughput at matched concurrency: router / best admissible fixed variant",
        "",
        "Median (min) over repeats of the ratio at each closed-loop concurrency both reached.",
        "",
        "| size | tolerance | "
        + " | ".join(f"c={c}" for c in results["args"]["concurrency"])
        + " |",
        "|---:|---:|" + "---:|" * len(results["args"]["concurrency"]),
    ]
    table: dict[tuple[int, float], dict[int, dict[str, Any]]] = {}
    for m_row in matched(results):
        table.setdefault((m_row["size"], m_row["tolerance"]), {})[m_row["concurrency"]] = m_row
    for (size, tol), levels in table.items():
        cells = [
            f"{levels[c]['median_ratio']:.2f} ({levels[c]['min_ratio']:.2f})"
            if c in levels
            else "–"
            for c in results["args"]["concurrency"]
        ]
        lines.append(f"| {size} | {tol:g} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## The rule: router ≥ 0.9 × best admissible fixed variant, every repeat",
        "",
    ]
    lines += _twin_lines(results)
    noise = any(r.get("within_noise") is not None for r in rows)
    lines += [
        "| size | tolerance | repeat | router req/s | best fixed | its req/s | ratio | ok |"
        + (" within the control's noise |" if noise else ""),
        "|---:|---:|---:|---:|---|---:|---:|---|" + ("---|" if noise else ""),
    ]
    for r in rows:
        within = r.get("within_noise")
        verdict = "–" if within is None else "yes" if within else "**no**"
        lines.append(
            f"| {r['size']} | {r['tolerance']:g} | {r['repeat']} | {r['router_rps']:,.0f} | "
            f"{r['best_fixed']} | {r['best_fixed_rps']:,.0f} | {r['ratio']:.2f} | "
            f"{'yes' if r['ok'] else '**no**'} |" + (f" {verdict} |" if noise else "")
        )
    lines.append("")
    return "\n".join(lines)


def _expected_below(controls: int, cells: int) -> str:
    """How many of ``cells`` rule ratios drawn from the control's own noise would fall below its
    floor: each is as likely as any of the ``controls`` ratios to be the most extreme of them
    all, and low half the time, so ``1 / (2 (controls + 1))`` of them."""
    p = 1 / (2 * (controls + 1))
    return (
        f"Were every rule ratio drawn from that same noise, one would fall below the floor with "
        f"probability about 1/(2({controls}+1)) = {p:.2f} (as likely as each of the {controls} "
        f"control ratios to be the most extreme, and low half the time): about "
        f"{p * cells:.1f} of the {cells} cells with no fault of the rule's, more where the best "
        "fixed variant is the fastest of several noisy pins (the highest of them is biased up)."
    )


def _twin_lines(results: dict[str, Any]) -> list[str]:
    """The control: one variant pinned twice, and what its ratio says about the rule's."""
    rows = twins(results)
    floor = twin_floor(rows)
    if floor is None:
        return []
    lines = [
        "The control: the pre-run's fastest variant at the smallest tolerance pinned twice, "
        "`pin:X` and `twin:X`, measured like every other policy. Their ratio is what two "
        "policies that serve alike reach against each other in this run: the noise of the "
        f"rule's comparison. Lowest over the run, either way: **{floor:.2f}**; a rule ratio "
        "at or above it (or above the rule's factor) is within that noise. "
        + _expected_below(len(rows), sum(1 for r in results["check"] if r["best_fixed"])),
        "",
        "| size | variant | repeat | pin req/s | twin req/s | twin / pin |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['size']} | {r['variant']} | {r['repeat']} | {r['pin_rps']:,.0f} | "
        f"{r['twin_rps']:,.0f} | {r['ratio']:.2f} |"
        for r in rows
    ]
    return [*lines, ""]


def speedups(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per size and tolerance, the router's sustained rate over the full model's, repeat by
    repeat (the speed a tolerance buys against what a user would serve without gnnaas)."""
    full = results.get("full_model")
    out = []
    for size, block in results["sizes"].items():
        for pol in block["policies"]:
            if pol["tolerance"] is None or full is None:
                continue
            ratios = [
                rep[pol["key"]]["rate_rps"] / rep[f"pin:{full}"]["rate_rps"]
                for rep in block["repeats"]
                if rep.get(f"pin:{full}", {}).get("rate_rps", 0) > 0
            ]
            if ratios:
                out.append(
                    {
                        "size": int(size),
                        "tolerance": pol["tolerance"],
                        "median": median(ratios),
                        "min": min(ratios),
                        "max": max(ratios),
                    }
                )
    return out


def _speedup_lines(results: dict[str, Any]) -> list[str]:
    rows = speedups(results)
    if not rows:
        return []
    lines = [
        f"## The speed a tolerance buys: router / full model (`{results['full_model']}` pinned)",
        "",
        "The full model is what a user would serve without gnnaas: every feature, the training "
        "fanouts and width, fp32, the more accurate architecture. Sustained rate of the router "
        "at each tolerance over that model's, in the same run; median (min–max) over repeats.",
        "",
        "| size | tolerance | router / full model |",
        "|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['size']} | {r['tolerance']:g} | **{r['median']:.2f}×** "
            f"({r['min']:.2f}–{r['max']:.2f}) |"
        )
    return [*lines, ""]


def _pick_lines(results: dict[str, Any]) -> list[str]:
    picks = results.get("picks") or []
    if not picks:
        return []
    lines = [
        "## The idle router's pick and its loss on the test split (`gnnaas report`)",
        "",
        "Validation loss with its paired 95% interval, and the loss measured on the test split "
        "against the validation baseline (the promise: at most N + 1) and against the test "
        "split's own best variant.",
        "",
        "| N | nodes | pick | val loss [95%] | test loss | vs test best | time / baseline |",
        "|---:|---:|---|---|---:|---:|---:|",
    ]
    for p in picks:
        lines.append(
            f"| {p['tolerance']:g} | {p['num_nodes']} | {p['variant']} | "
            f"{p['val_loss']:.2f} [{p['val_loss_lo']:.2f}, {p['val_loss_hi']:.2f}] | "
            f"{p['test_loss']:.2f} | {p['test_loss_vs_best']:.2f} | "
            f"{100 * p['relative_time']:.0f} % |"
        )
    return [*lines, ""]


def _traffic_lines(block: dict[str, Any], precomputed: str | None) -> list[str]:
    """The router's answers by variant over every step of every repeat, per tolerance."""
    lines = [
        "Router traffic by variant (answers over all steps and repeats)"
        + (f"; precomputed variant `{precomputed}`:" if precomputed else ":"),
        "",
        "| policy | answers | share by variant |",
        "|---|---:|---|",
    ]
    for pol in block["policies"]:
        if pol["tolerance"] is None:
            continue
        served: dict[str, int] = {}
        for rep in block["repeats"]:
            for step in rep[pol["key"]]["steps"]:
                for k, v in step["variants"].items():
                    served[k] = served.get(k, 0) + v
        total = sum(served.values())
        shares = ", ".join(
            f"{k} {100 * v / total:.1f}%" for k, v in sorted(served.items(), key=lambda kv: -kv[1])
        )
        lines.append(f"| {pol['key']} | {total:,} | {shares} |")
    return [*lines, ""]


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1 (got {text})")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="scaled dataset, short steps")
    parser.add_argument("--dataset", help="dataset (default: synth-flickr, quick synth-flickr@0.2)")
    parser.add_argument("--workdir", default=".cache/bench", help="(default: .cache/bench)")
    parser.add_argument(
        "--out", help="results folder (default: benchmarks/results; quick: workdir)"
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 64], help="(default: 1 64)")
    parser.add_argument(
        "--bound-ms", type=float, nargs="+", default=[20.0, 50.0], help="p99 bound per size"
    )
    parser.add_argument(
        "--tolerances",
        type=float,
        nargs="+",
        default=[0.0, 1.0, 2.0, 5.0],
        help="(default: 0 1 2 5)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="(default: 3)")
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=None,
        help=(
            "closed-loop levels, rising until every policy's p99 passes its bound "
            "(default: 1 2 4 8 16 32 64 96 128; --quick: 1 4 16 64 128)"
        ),
    )
    parser.add_argument("--step-s", type=float, default=None, help="seconds per step")
    parser.add_argument("--step-max-requests", type=int, default=20_000)
    parser.add_argument(
        "--no-trivial",
        action="store_true",
        help="leave out the trivial FastAPI endpoint (the ceiling) for single-node requests",
    )
    parser.add_argument(
        "--slices",
        type=_positive_int,
        default=4,
        help="slices per step, run round-robin over the policies at each level; "
        "--step-max-requests caps each slice (default: 4)",
    )
    parser.add_argument(
        "--top-fixed",
        type=int,
        default=2,
        help="per tolerance, pin the N admissible variants fastest in the pre-run (default: 2)",
    )
    parser.add_argument(
        "--no-twin",
        action="store_true",
        help="leave out the control: the pre-run's fastest variant at the smallest tolerance "
        "pinned a second time, whose ratio to its pin is the noise of the rule's comparison",
    )
    parser.add_argument("--prerun-s", type=float, default=1.5, help="pre-run step seconds")
    parser.add_argument("--ratio", type=float, default=0.9, help="the rule's factor (default 0.9)")
    parser.add_argument(
        "--precompute",
        default="best",
        metavar="ID",
        help="variant whose exact answers are precomputed and served as <ID>@exact: a variant "
        "id, best (the most accurate 1x model) or none (default: best)",
    )
    parser.add_argument(
        "--name",
        default="policy",
        help="results file stem: <name>.md and <name>.json (default: policy)",
    )
    parser.add_argument(
        "--client",
        choices=("auto", "h2load", "python"),
        default="auto",
        help="the closed-loop client: h2load (nghttp2's C client, which keeps up with the server "
        "on a core of its own), the Python asyncio client, or auto: h2load when installed "
        "(default: auto)",
    )
    parser.add_argument(
        "--server-cpus",
        type=int,
        nargs="+",
        help="cores the server (and the trivial endpoint) may use (default: all)",
    )
    parser.add_argument(
        "--client-cpus", type=int, nargs="+", help="cores the client may use (default: all)"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when the rule fails")
    parser.add_argument(
        "--render", metavar="JSON", help="only rewrite the .md beside a policy.json of a run"
    )
    args = parser.parse_args(argv)
    if len(args.bound_ms) != len(args.sizes):
        parser.error("--bound-ms needs one value per --sizes value")
    check_cores(parser, args)
    if args.client == "auto":
        args.client = "h2load" if h2load_available() else "python"
    elif args.client == "h2load" and not h2load_available():
        parser.error(f"--client h2load: h2load is not installed ({INSTALL})")
    if args.render:
        render_saved(args.render, render)
        return 0
    plan = QUICK if args.quick else FULL
    # Profile on the server's one torch thread, so the curves are those of the served pipeline.
    plan = replace(plan, dataset=args.dataset or plan.dataset, threads=1)
    # --quick: fewer levels with longer steps rather than many short ones: a p99 over a 2-s step
    # of 64-node requests rests on its ~10 slowest answers and decides a whole series.
    if args.concurrency is None:
        # A single-node series batches more the more clients wait: it passes 20 ms near 64-128
        # clients on 2 cores, while the trivial endpoint is at its ceiling from 16.
        args.concurrency = [1, 4, 16, 64, 128] if args.quick else [1, 2, 4, 8, 16, 32, 64, 96, 128]
    if args.step_s is None:
        args.step_s = 3.0 if args.quick else 4.0
    quick_out = Path(args.workdir) / "results"
    out = Path(args.out) if args.out else (quick_out if args.quick else RESULTS)
    t0 = time.monotonic()
    results = run(args, plan)
    results["args_line"] = " ".join(sys.argv[1:] if argv is None else argv)
    results["command"] = command_line("bench_policy.py", argv)
    rows = check(results, args.ratio)
    results["check"] = rows
    results["twins"] = twins(results)
    save_results(args.name, results, render, out)
    failed = [r for r in rows if not r["ok"]]
    noise = [r for r in failed if r.get("within_noise")]
    say(
        f"bench_policy: {len(rows) - len(failed)}/{len(rows)} checks hold"
        + (f" ({len(noise)} more within the control's noise)" if noise else "")
        + f"; "
        f"{shown(out / f'{args.name}.md')} in {time.monotonic() - t0:.0f} s"
    )
    return 1 if args.check and failed else 0


if __name__ == "__main__":
    from common import exit_status

    raise SystemExit(exit_status(main))
