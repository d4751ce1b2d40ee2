"""What one routing decision costs: ``Router.select`` per request, idle and under a backlog.

The router decides every request in the event loop, so its decision time is paid by every
request (docs/architecture.md §5). For each dataset this script loads the variants and profiles of
the default plan (:func:`common.prepare`, reused when present; profiled on one torch thread, the
server's, so no curve is re-timed at start-up and every run decides over the profiles' frontier)
in-process, exactly as ``gnnaas serve`` does (``VariantRegistry.load``, a
:class:`~gnnaas.serving.core.router.Router`), and times ``Router.select`` for requests of 1 and
64 nodes at tolerances 0, 1, 2 and 5:

- **idle**: nothing queued or running (the common case at low load);
- **busy**: a backlog of real requests queued on the slowest routed variant and one batch
  running (the decision then reads the load of the busy lanes). The event loop does not run
  while a timing loop does, so the backlog is the same for every decision timed.

Each figure is the median over ``--rounds`` rounds of ``--decisions`` back-to-back decisions, on
the CPU clock of the deciding thread (``time.thread_time``): the busy lanes' running batch
computes in another thread meanwhile, and on a machine of few cores the wall clock would count
the time that thread takes the core from the decisions. Beside each figure, the function calls
one decision makes (Python functions and builtins, as ``cProfile`` counts them over a twentieth
of ``--decisions`` more): the same on every machine and every run on the same frontier, so a
change to the decision's code shows in it where the timing's noise (on a small, shared VM, a
third or more from run to run) would hide it. The
page also gives how many variants the dataset has, how many are on the frontier (routed) and
how many each tolerance admits. The goal (issue 25): at most ~10 µs per decision, whatever the
number of variants.

Writes ``decision.json`` and ``decision.md`` rendered from it (``benchmarks/results/`` unless
``--out``); ``--render decision.json`` rewrites the page from a saved run.

Example:
    python benchmarks/bench_decision.py --datasets synth-flickr@0.2 Cora
"""

from __future__ import annotations

import argparse
import asyncio
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from gnnaas.stats import median

from common import (
    DECISION_SIZES,
    DECISION_TOLERANCES,
    FULL,
    RESULTS,
    command_line,
    decision_backlog,
    decision_router,
    machine_info,
    prepare,
    render_saved,
    save_results,
    say,
    shown,
    time_decisions,
    utc_now,
)

__all__ = ["main", "render"]

CLOCKS = {
    "thread": "on the CPU clock of the deciding thread, which the running batch's own thread "
    "does not take",
    "wall": "on the wall clock",
}
GOAL_US = 10.0


async def _measure(variants: Path, profiles: Path, dataset: str, args: Any) -> dict[str, Any]:
    router = await decision_router(variants, profiles, dataset, args.device)
    try:
        ds = next(iter(router.registry.datasets.values()))
        routed = [c.variant_id for c in ds.candidates]
        out: dict[str, Any] = {
            "variants": len(ds.variants),
            "routed": len(routed),
            "dominated": len(ds.dominated_by),
            "retimed": sum(
                v.profile is not None and v.profile.retimed for v in ds.variants.values()
            ),
            "admitted": {str(t): len(router.admissible(ds, t)) for t in DECISION_TOLERANCES},
            "idle": {},
            "busy": {},
            "calls": {"idle": {}, "busy": {}},
        }

        def time_cells(state: str) -> None:
            for tol in DECISION_TOLERANCES:
                for size in DECISION_SIZES:
                    timings, calls, _ = time_decisions(
                        router, ds, size, tol, args.decisions, args.rounds
                    )
                    out[state][f"{tol:g}/{size}"] = round(median(timings), 2)
                    out["calls"][state][f"{tol:g}/{size}"] = calls

        time_cells("idle")
        # A backlog on the slowest routed variant: one batch running, the rest queued.
        backlog, lane = await decision_backlog(router, ds)
        busy_state = {
            "variant": lane.variant.variant_id,
            "queued_nodes": lane.batcher.queued_nodes,
            "running_nodes": lane.batcher.in_flight_nodes,
        }
        time_cells("busy")
        busy_state["still_queued_nodes"] = lane.batcher.queued_nodes
        out["backlog"] = busy_state
        await asyncio.gather(*backlog)
        return out
    finally:
        await router.stop()


def render(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        "# Routing decision cost",
        "",
        f"Machine: {m['cpu']} ({m['cores']} cores), torch {m['torch']}, run {results['run_at']}.",
        "",
        "`Router.select` per request, in-process on the default plan's variants and profiles, "
        "the median over rounds of back-to-back decisions (µs, "
        + CLOCKS[results.get("clock", "wall")]
        + "). **idle**: nothing queued or "
        "running; **busy**: a backlog queued on the slowest routed variant with one batch "
        f"running. Goal: ≤ ~{GOAL_US:g} µs whatever the number of variants."
        + (
            " In parentheses: the function calls one decision makes (Python functions and "
            "builtins, as `cProfile` counts them), the same on any machine: a change to the "
            "decision's code shows in them through the timing's noise."
            if any("calls" in d for d in results["datasets"].values())
            else ""
        ),
        "",
        f"Reproduce: `{results['command']}`",
        "",
    ]
    for name, d in results["datasets"].items():
        b = d["backlog"]
        lines += [
            f"## {name}",
            "",
            f"{d['variants']} variants, {d['routed']} on the frontier (routed), "
            f"{d['dominated']} dominated"
            + (f", {d['retimed']} curves re-timed at start-up" if "retimed" in d else "")
            + f". Backlog: `{b['variant']}` with {b['queued_nodes']} "
            f"nodes queued and {b['running_nodes']} running ({b['still_queued_nodes']} still "
            "queued when the timing ended).",
            "",
            "| tolerance | admitted | idle, 1 node | idle, 64 nodes | busy, 1 node "
            "| busy, 64 nodes |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        calls = d.get("calls", {})  # pages before the counts have none
        for tol in DECISION_TOLERANCES:
            cells = [
                f"{d[state][f'{tol:g}/{size}']:.1f}"
                + (f" ({calls[state][f'{tol:g}/{size}']})" if calls else "")
                for state in ("idle", "busy")
                for size in DECISION_SIZES
            ]
            lines.append(f"| {tol:g} | {d['admitted'][str(tol)]} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=["synth-flickr@0.2", "Cora"])
    parser.add_argument("--workdir", type=Path, default=Path(".cache/bench"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--decisions", type=int, default=20000, help="decisions per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the median is reported")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--render", type=Path, help="rewrite the page from a saved JSON")
    args = parser.parse_args(argv)
    if args.render:
        render_saved(args.render, render)
        return 0
    os.environ.setdefault("GNNAAS_LOG_LEVEL", "WARNING")
    results: dict[str, Any] = {
        "machine": machine_info(),
        "run_at": utc_now(),
        "clock": "thread",
        "command": command_line("bench_decision.py", argv),
        "datasets": {},
    }
    for dataset in args.datasets:
        # profiled on the server's one thread: no curve is re-timed at start-up, so every run
        # (and every checkout timed on the same profiles) decides over the same frontier
        plan = replace(FULL, dataset=dataset, threads=1)
        variants, profiles = prepare(plan, args.workdir, args.device)
        say(f"{dataset}: timing decisions on {shown(variants)}")
        results["datasets"][dataset] = asyncio.run(_measure(variants, profiles, dataset, args))
        say(f"{dataset}: {results['datasets'][dataset]}")
    save_results("decision", results, render, args.out)
    return 0


if __name__ == "__main__":
    from common import exit_status

    raise SystemExit(exit_status(main))
