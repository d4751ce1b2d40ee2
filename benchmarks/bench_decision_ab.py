"""One routing decision against a baseline checkout's: the same profiles, timed alternately.

``bench_decision.py`` gives one checkout's figures; on a small shared VM they move by a third or
more from day to day, so "no slower than before" cannot be read off two of its pages. This script
times the decision of this checkout and of another (``--baseline``: a git worktree of an older
commit) on the same variants and profiles (``bench_decision``'s, profiled on one thread: neither
server re-times a curve, so both decide over one frontier), in subprocesses run alternately
(``--pairs``; each pair swaps the order), every cell (tolerances 0, 1, 2, 5; requests of 1 and 64
nodes; an idle device and a backlog on the slowest routed variant, as ``bench_decision``) timed
in ``--rounds`` rounds of ``--decisions`` decisions on the deciding thread's CPU clock.

Per cell the page gives each checkout's median over its runs (each run's median over its rounds),
their ratio, the ratio within each pair, the function calls of one decision (``cProfile``) and
each checkout's choice. Two rows per cell for this checkout when it has ``Router._decide``: what
``Router.predict`` runs (``select``, what ``bench_decision`` times, wraps it for callers that may
pin a variant); a baseline whose ``predict`` called ``select`` is timed on ``select`` in both.

A baseline may check execution-settings columns that profiles no longer record (``fused_forward``
and ``fast_sampler``, switches of an implementation since made the only one): the profiles are
copied for the run with those columns set to 1, which today's reader ignores.

Writes ``decision-ab.json`` and ``decision-ab.md`` rendered from it (``--render`` rewrites the
page).

Example:
    git worktree add ../gnnaas-baseline d056f9e
    python benchmarks/bench_decision_ab.py --baseline ../gnnaas-baseline
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from common import (
    DECISION_SIZES,
    DECISION_TOLERANCES,
    FULL,
    REPO,
    RESULTS,
    command_line,
    decision_backlog,
    decision_router,
    machine_info,
    prepare,
    render_saved,
    save_results,
    say,
    time_decisions,
    utc_now,
)

__all__ = ["main", "render"]

LIMIT = 1.10  # no slower than the baseline by more than 10 % (issue 37's bound)
RETIRED_COLUMNS = ("fused_forward", "fast_sampler")


# -- the worker: one checkout, in its own process ----------------------------------------------


def _worker(args: argparse.Namespace) -> None:
    if "gnnaas" in sys.modules:  # this checkout's: the other's could no longer be imported
        raise RuntimeError("the worker must import gnnaas from the checkout it times")
    checkout = Path(args.worker).resolve()
    sys.path.insert(0, str(checkout))  # the timed checkout's gnnaas first
    import gnnaas

    if not Path(gnnaas.__file__).resolve().is_relative_to(checkout):
        raise RuntimeError(f"gnnaas came from {gnnaas.__file__}, not the checkout timed")
    out = asyncio.run(_time_checkout(args))
    Path(args.json).write_text(json.dumps(out))


async def _time_checkout(args: argparse.Namespace) -> dict[str, Any]:
    router = await decision_router(Path(args.variants), Path(args.profiles), args.dataset, "cpu")
    path = hasattr(router, "_decide")
    out: dict[str, Any] = {"cells": {}, "path": {}}
    try:
        ds = next(iter(router.registry.datasets.values()))
        out["routed"] = sorted(c.variant_id for c in ds.candidates)
        out["retimed"] = sorted(
            v.variant_id
            for v in ds.variants.values()
            if v.profile is not None and getattr(v.profile, "retimed", False)
        )
        for state in ("idle", "busy"):
            backlog = (await decision_backlog(router, ds))[0] if state == "busy" else []
            for tol in DECISION_TOLERANCES:
                for size in DECISION_SIZES:
                    key, n, rounds = f"{state} {tol:g}/{size}", args.decisions, args.rounds
                    timings, calls, choice = time_decisions(router, ds, size, tol, n, rounds)
                    out["cells"][key] = {"timings": timings, "calls": calls, "choice": choice}
                    if path:  # the timings only: calls and choice are select's, as above
                        out["path"][key] = time_decisions(
                            router, ds, size, tol, n, rounds, path=True
                        )[0]
            await asyncio.gather(*backlog)
    finally:
        await router.stop()
    return out


# -- the driver ------------------------------------------------------------------------------


def _profiles_copy(profiles: Path, dataset: str, into: Path) -> Path:
    """``profiles``' files of ``dataset`` under ``into``, with :data:`RETIRED_COLUMNS` set to 1
    where a row lacks them."""
    src, dst = profiles / dataset, into / dataset
    dst.mkdir(parents=True)
    (dst / "profiles.csv").write_bytes((src / "profiles.csv").read_bytes())
    with open(src / "service_times.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    fields = list(rows[0]) + [c for c in RETIRED_COLUMNS if c not in rows[0]]
    with open(dst / "service_times.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows({c: 1 for c in RETIRED_COLUMNS} | row for row in rows)
    return into


def _commit(checkout: Path) -> str:
    """The short commit of ``checkout``, ``+changes`` when its tracked files differ from it."""

    def git(*args: str) -> str:
        command = ["git", "-C", str(checkout), *args]
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()

    changed = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "--short", "HEAD") + ("+changes" if changed else "")


def _run(checkout: Path, dataset: str, variants: Path, profiles: Path, args: Any) -> Any:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            str(checkout),
            "--dataset",
            dataset,
            "--variants",
            str(variants),
            "--profiles",
            str(profiles),
            "--json",
            out.name,
            "--rounds",
            str(args.rounds),
            "--decisions",
            str(args.decisions),
        ]
        subprocess.run(command, check=True, env=os.environ | {"GNNAAS_LOG_LEVEL": "ERROR"})
        return json.loads(Path(out.name).read_text())


def _dataset(dataset: str, baseline: Path, args: Any) -> dict[str, Any]:
    variants, profiles = prepare(replace(FULL, dataset=dataset, threads=1), args.workdir, "cpu")
    runs: dict[str, list[Any]] = {"baseline": [], "this": []}
    with tempfile.TemporaryDirectory() as tmp:
        copied = _profiles_copy(profiles, dataset, Path(tmp))
        for pair in range(args.pairs):
            order = ("baseline", "this") if pair % 2 == 0 else ("this", "baseline")
            for who in order:
                say(f"{dataset}: pair {pair + 1}/{args.pairs}, {who}")
                checkout = baseline if who == "baseline" else REPO
                runs[who].append(_run(checkout, dataset, variants, copied, args))
    return _summary(runs)


def _summary(runs: dict[str, list[Any]]) -> dict[str, Any]:
    """Per cell, each checkout's median over its runs of each run's median over its rounds."""
    from gnnaas.stats import median  # not at the top: a worker imports the timed checkout's

    base, this = runs["baseline"], runs["this"]
    cells = {}
    for key in base[0]["cells"]:
        b = [median(r["cells"][key]["timings"]) for r in base]
        t = [median(r["cells"][key]["timings"]) for r in this]
        paths = [median(r["path"][key]) for r in this if key in r["path"]]
        cells[key] = {
            "baseline_us": median(b),
            "this_us": median(t),
            "pairs": [round(y / x, 3) for x, y in zip(b, t, strict=True)],
            "path_us": median(paths) if paths else None,
            "calls": [base[0]["cells"][key]["calls"], this[0]["cells"][key]["calls"]],
            "choice": [base[0]["cells"][key]["choice"], this[0]["cells"][key]["choice"]],
        }
    return {
        "routed": len(this[0]["routed"]),
        "same_frontier": all(r["routed"] == this[0]["routed"] for r in base + this),
        "retimed": sorted({v for r in base + this for v in r["retimed"]}),
        "cells": cells,
    }


def render(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        "# Routing decision cost against a baseline",
        "",
        f"Machine: {m['cpu']} ({m['cores']} cores), torch {m['torch']}, run {results['run_at']}.",
        "",
        f"This checkout ({results['this']}) against the baseline {results['baseline']}, on the "
        f"same variants and profiles, {results['pairs']} pairs of runs in alternate order, each "
        f"cell {results['rounds']} rounds of {results['decisions']} decisions (µs per decision, "
        "on the deciding thread's CPU clock; each checkout's median over its runs of each run's "
        "median). **ratio**: this / baseline, overall and within each pair. **request path**: "
        "what `Router.predict` runs in this checkout (`Router._decide`; `select` wraps it), "
        "against the baseline's `select` (what its `predict` ran). Calls: one decision's "
        f"function calls (`cProfile`), baseline / this. Bound: a ratio ≤ {LIMIT:.2f}.",
        "",
        f"Reproduce: `{results['command']}` (`--baseline`: a worktree of {results['baseline']})",
        "",
    ]
    for name, d in results["datasets"].items():
        worst = max(c["this_us"] / c["baseline_us"] for c in d["cells"].values())
        paths = [c["path_us"] / c["baseline_us"] for c in d["cells"].values() if c["path_us"]]
        lines += [
            f"## {name}",
            "",
            f"{d['routed']} variants routed, the same frontier in every run: "
            f"{'yes' if d['same_frontier'] else '**no**'}; curves re-timed: "
            f"{len(d['retimed'])}. Largest ratio: **{worst:.2f}**"
            + (f"; on the request path: **{max(paths):.2f}**." if paths else "."),
            "",
            "| cell | baseline | this | ratio | per pair | request path | ratio | calls "
            "| choice (baseline / this) |",
            "|---|---:|---:|---:|---|---:|---:|---:|---|",
        ]
        for key, c in d["cells"].items():
            path = c["path_us"]
            choice = c["choice"][0] if c["choice"][0] == c["choice"][1] else " / ".join(c["choice"])
            lines.append(
                f"| {key} | {c['baseline_us']:.2f} | {c['this_us']:.2f} "
                f"| {c['this_us'] / c['baseline_us']:.2f} "
                f"| {' '.join(f'{p:.2f}' for p in c['pairs'])} "
                + (f"| {path:.2f} | {path / c['baseline_us']:.2f} " if path else "| | ")
                + f"| {c['calls'][0]} / {c['calls'][1]} | `{choice}` |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="a checkout (git worktree) to time against")
    parser.add_argument("--datasets", nargs="+", default=["synth-flickr@0.2", "Cora"])
    parser.add_argument("--workdir", type=Path, default=Path(".cache/bench"))
    parser.add_argument("--pairs", type=int, default=4, help="runs of each checkout, alternated")
    parser.add_argument("--rounds", type=int, default=12, help="rounds per cell and run")
    parser.add_argument("--decisions", type=int, default=3000, help="decisions per round")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--render", type=Path, help="rewrite the page from a saved JSON")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    for hidden in ("--dataset", "--variants", "--profiles", "--json"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args)
        return 0
    if args.render:
        render_saved(args.render, render)
        return 0
    if args.baseline is None or not (args.baseline / "gnnaas" / "serving").is_dir():
        parser.error("--baseline must name a gnnaas checkout (a git worktree of an older commit)")
    baseline = args.baseline.resolve()
    command = command_line("bench_decision_ab.py", argv)
    results: dict[str, Any] = {
        "machine": machine_info(),
        "run_at": utc_now(),
        "command": command.replace(str(args.baseline), "BASELINE"),
        "this": _commit(REPO),
        "baseline": _commit(baseline),
        "pairs": args.pairs,
        "rounds": args.rounds,
        "decisions": args.decisions,
        "datasets": {},
    }
    for dataset in args.datasets:
        results["datasets"][dataset] = _dataset(dataset, baseline, args)
    save_results("decision-ab", results, render, args.out)
    return 0


if __name__ == "__main__":
    if "--worker" in sys.argv:  # before exit_status, which imports this checkout's gnnaas
        raise SystemExit(main())
    from common import exit_status

    raise SystemExit(exit_status(main))
