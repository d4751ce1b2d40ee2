"""Generate, profile and report feature-pruned variants; write ``benchmarks/results/variants-*.md``.

For each dataset: train the variants (``gnnaas.variants.pipeline.generate_variants``; existing
ones with the same settings are reused), profile them (``gnnaas.profiling.profile_dataset``),
write the report with its six plots, profile the SAGE 1x and 8x variants a second time to
measure p50 reproducibility, and write a results page with the machine, the plan that was run,
the headline figure (SAGE 8x latency as a share of 1x; target <= 30 % on synth-flickr) and the
report's tables.

Writes ``variants-<dataset>.json`` and ``variants-<dataset>.md`` rendered from it
(``benchmarks/results/``; ``--quick``: the work folder); ``--render JSON`` rewrites a page from a
saved run.

Plans (``--quick`` shrinks every one of them; flags override):

- Cora: SAGE + GIN, rankings random/greedy/lasso, prune 1/2/4/8, up to 200 epochs.
- synth-flickr (full preset): SAGE + GIN, all rankings, prune 1/2/4/8, up to 5 epochs.
- synth-reddit (full preset): SAGE only, rankings random + lasso, prune 1/2/4/8, up to 2 epochs
  (11.6 M edges, 602 features: an epoch takes minutes on 2 cores).

Usage::

    python benchmarks/bench_variants.py --data-root ../shared/data            # full run
    python benchmarks/bench_variants.py --quick --data-root ../shared/data    # make bench
    python benchmarks/bench_variants.py --datasets synth-flickr --epochs 5
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from common import (
    REPO,
    RESULTS,
    command_line,
    machine_info,
    render_saved,
    save_results,
    shown,
    utc_now,
)

__all__ = ["main", "render"]

_log = logging.getLogger("bench_variants")

TARGET_RATIO = 0.30  # SAGE 8x latency / 1x latency on synth-flickr


@dataclass(frozen=True)
class Plan:
    """What to generate and how to profile it for one dataset."""

    archs: tuple[str, ...] = ("sage", "gin")
    rankings: tuple[str, ...] = ("random", "greedy", "lasso")
    prunes: tuple[int, ...] = (1, 2, 4, 8)
    max_epochs: int = 200
    patience: int = 25
    runs: int = 30


FULL_PLANS = {
    "cora": Plan(),
    "synth-flickr": Plan(max_epochs=5, patience=2),
    "synth-reddit": Plan(archs=("sage",), rankings=("random", "lasso"), max_epochs=2, patience=1),
}
QUICK_PLANS = {
    "cora": Plan(
        archs=("sage",),
        rankings=("random", "lasso"),
        prunes=(1, 8),
        max_epochs=30,
        patience=10,
        runs=10,
    ),
    "synth-flickr@0.25": Plan(
        archs=("sage",), rankings=("random",), prunes=(1, 8), max_epochs=2, patience=1, runs=10
    ),
    "synth-reddit@0.1": Plan(
        archs=("sage",), rankings=("random",), prunes=(1, 8), max_epochs=2, patience=1, runs=10
    ),
}


def _say(text: str = "") -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _load_avg() -> list[float] | None:
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def _plan_for(name: str, quick: bool, args: argparse.Namespace) -> Plan:
    plans = QUICK_PLANS if quick else FULL_PLANS
    plan = plans.get(name.lower(), plans.get(name.lower().split("@")[0], Plan()))
    if args.epochs is not None:
        plan = replace(plan, max_epochs=args.epochs, patience=min(plan.patience, args.epochs))
    if args.runs is not None:
        plan = replace(plan, runs=args.runs)
    if args.archs:
        plan = replace(plan, archs=tuple(args.archs))
    if args.rankings:
        plan = replace(plan, rankings=tuple(args.rankings))
    return plan


def _latency_ratios(val: Any) -> list[tuple[str, float, float, float]]:
    """(variant, 8x latency, 1x latency, ratio) of every SAGE 8x variant."""
    sage = val[val["arch"] == "sage"]
    full = sage[sage["prune"] == 1]
    if full.empty:
        return []
    base = float(full["latency_ms"].iloc[0])
    return [
        (str(r.variant), float(r.latency_ms), base, float(r.latency_ms) / base)
        for r in sage[sage["prune"] == 8].itertuples()
    ]


def _repeat_p50(
    store: Any, repo: Any, runs: int, device: torch.device, first: Any
) -> list[tuple[str, str, float, float]]:
    """Profiles the SAGE 1x and 8x variants again; (variant, split, first p50, second p50)."""
    from gnnaas.profiling import profile_dataset, read_profiles

    wanted = [
        v
        for v in first["variant"].unique()
        if v.startswith("sage-") and (v.endswith("-1x") or v.endswith("-8x"))
    ]
    if not wanted:
        return []
    with tempfile.TemporaryDirectory(prefix="bench-repeat-") as tmp:
        again = profile_dataset(
            store, repo, tmp, batch_size=1024, runs=runs, device=device, variants=wanted
        )
        second = read_profiles(again.path).set_index(["variant", "split"])
    out = []
    for r in first[first["variant"].isin(wanted)].itertuples():
        out.append(
            (
                r.variant,
                r.split,
                float(r.latency_ms),
                float(second.loc[(r.variant, r.split), "latency_ms"]),
            )
        )
    return out


def _demote(report_md: str) -> list[str]:
    """The report's lines with headings one level deeper and image links dropped."""
    lines = []
    for line in report_md.splitlines()[1:]:
        if line.startswith("!["):
            continue
        lines.append("#" + line if line.startswith("#") else line)
    return lines


def run_dataset(name: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Generates, profiles and reports one dataset; returns the figures of its results page."""
    from gnnaas.data import load_dataset
    from gnnaas.profiling import profile_dataset, read_profiles, write_report
    from gnnaas.profiling.report import tolerance_table
    from gnnaas.variants.pipeline import generate_variants
    from gnnaas.variants.repository import VariantRepository
    from gnnaas.variants.training import TrainConfig

    plan = _plan_for(name, args.quick, args)
    progress = sys.stderr.isatty()
    work = Path(args.work)
    load_before = _load_avg()
    t0 = time.perf_counter()
    store = load_dataset(name, args.data_root, seed=0)
    load_s = time.perf_counter() - t0
    _say(
        f"## {store.name}: {store.num_nodes:,} nodes, {store.num_edges:,} edges, "
        f"{store.num_features} features, {store.num_classes} classes (loaded in {load_s:.1f} s)"
    )
    _say(f"plan: {plan}")

    repo = VariantRepository(work / "variants")
    config = TrainConfig(max_epochs=plan.max_epochs, patience=plan.patience, seed=0)
    t0 = time.perf_counter()
    gen_rows = generate_variants(
        store,
        repo,
        archs=plan.archs,
        rankings=plan.rankings,
        prunes=plan.prunes,
        config=config,
        device=device,
        force=False,
        progress=progress,
    )
    gen_s = time.perf_counter() - t0
    trained = sum(r.status == "trained" for r in gen_rows)
    _say(f"generated: {len(gen_rows)} variants ({trained} trained) in {gen_s:.0f} s")

    t0 = time.perf_counter()
    result = profile_dataset(
        store,
        repo,
        work / "profiles",
        batch_size=1024,
        runs=plan.runs,
        device=device,
        progress=progress,
        variants=[r.variant_id for r in gen_rows],
    )
    prof_s = time.perf_counter() - t0
    _say(f"profiled: {result.num_profiled} variants in {prof_s:.0f} s -> {result.path}")
    report = write_report(result.path.parent)
    df = read_profiles(result.path)
    val = df[df["split"] == "val"]
    repeat = [] if args.no_repeat else _repeat_p50(store, repo, plan.runs, device, df)
    tol = {float(r.tolerance): r for r in tolerance_table(val).itertuples()}
    return {
        "command": command_line("bench_variants.py"),
        "date": utc_now(),
        "machine": machine_info(),
        "device": str(device),
        "load_before": load_before,
        "load_after": _load_avg(),
        "dataset": {
            "name": store.name,
            "num_nodes": store.num_nodes,
            "num_edges": store.num_edges,
            "num_features": store.num_features,
            "num_classes": store.num_classes,
            "multi_label": bool(store.multi_label),
            "splits": [int(store.train_idx.numel()), int(store.val_idx.numel())]
            + [int(store.test_idx.numel())],
        },
        "plan": dataclasses.asdict(plan),
        "generation_s": gen_s,
        "variants": len(gen_rows),
        "trained": trained,
        "train_s": sum(float(r.train_time_s) for r in gen_rows),
        "profiling_s": prof_s,
        "sage_8x_vs_1x": [
            {"variant": v, "latency_ms": lat8, "full_ms": lat1}
            for v, lat8, lat1, _ in _latency_ratios(val)
        ],
        "tolerance_2": (
            {
                "baseline": str(tol[2.0].baseline),
                "variant": str(tol[2.0].variant),
                "relative_latency": float(tol[2.0].relative_latency),
            }
            if 2.0 in tol
            else None
        ),
        "repeat": [
            {"variant": v, "split": split, "first_ms": a, "second_ms": b}
            for v, split, a, b in repeat
        ],
        "report_path": shown(report),
        "report_section": "\n".join(_demote(report.read_text())),
    }


def render(results: dict[str, Any]) -> str:
    """``variants-<dataset>.md`` from a run's results."""
    d, plan, m = results["dataset"], results["plan"], results["machine"]
    load = " / ".join(f"{v:.1f}" for v in results["load_before"] or []) or "n/a"
    after = " / ".join(f"{v:.1f}" for v in results["load_after"] or []) or "n/a"
    gpu = m.get("gpu") if results["device"].startswith("cuda") else None
    lines = [
        f"# Variants of {d['name']}: generation, profile and report",
        "",
        f"Written by `{results['command']}` on {results['date'][:10]} {results['date'][11:16]} "
        "UTC.",
    ]
    if results.get("recovered_from"):
        lines += ["", results["recovered_from"]]
    lines += [
        "",
        f"- Machine: {m['cpu']}, {m['cores']} cores, {m['mem_gb']:.0f} GiB RAM, "
        f"{gpu or 'no GPU used'}; torch {m['torch']} (intra-op threads: {m['torch_threads']}), "
        f"Python {m['python']}. Load average (1/5/15 min) {load} before and {after} after (the "
        "benchmark itself accounts for about one per torch thread; more is other work on the "
        "same cores, and absolute times are then upper bounds).",
        f"- Dataset: {d['name']}, {d['num_nodes']:,} nodes, {d['num_edges']:,} edges, "
        f"{d['num_features']} features, {d['num_classes']} classes"
        f"{', multi-label' if d['multi_label'] else ''}; splits train/val/test "
        + "/".join(f"{n:,}" for n in d["splits"])
        + ".",
        f"- Plan: archs {', '.join(plan['archs'])}; rankings {', '.join(plan['rankings'])}; prune "
        f"{', '.join(f'{k}x' for k in plan['prunes'])}; TrainConfig defaults (hidden 256, "
        f"fanouts (25, 10), batch 1024) with at most {plan['max_epochs']} epochs, patience "
        f"{plan['patience']}; profile batch 1024, {plan['runs']} timed runs after warm-up, "
        f"device {results['device']}.",
        f"- Wall time: generation {results['generation_s']:.0f} s ({results['trained']} of "
        f"{results['variants']} variants trained in this run; training time recorded in the "
        f"manifests {results['train_s']:.0f} s), profiling {results['profiling_s']:.0f} s.",
        "",
        "## Headline",
        "",
    ]
    flickr = "flickr" in d["name"]
    if results["sage_8x_vs_1x"]:
        target = " (target <= 30 % on synth-flickr)" if flickr else ""
        lines.append(f"SAGE 8x latency (comm + comp, p50) as a share of SAGE 1x{target}:")
        lines.append("")
        for r in results["sage_8x_vs_1x"]:
            ratio = r["latency_ms"] / r["full_ms"]
            verdict = ""
            if flickr:
                verdict = " — meets the target" if ratio <= TARGET_RATIO else " — misses the target"
            lines.append(
                f"- {r['variant']}: {r['latency_ms']:.2f} ms vs {r['full_ms']:.2f} ms = "
                f"{100 * ratio:.0f} %{verdict}"
            )
    else:
        lines.append("No SAGE 1x/8x pair in this plan.")
    if results["tolerance_2"]:
        t = results["tolerance_2"]
        lines += [
            "",
            f"Within 2 accuracy points of the most accurate variant ({t['baseline']}), "
            f"the fastest is {t['variant']} at {100 * t['relative_latency']:.0f} % of its latency.",
        ]
    if results["repeat"]:
        lines += [
            "",
            "## Reproducibility of p50 latency",
            "",
            "The SAGE 1x and 8x variants profiled a second time, right after the first:",
            "",
            "| variant | split | first p50 ms | second p50 ms | second / first |",
            "| --- | --- | --- | --- | --- |",
        ]
        for r in results["repeat"]:
            a, b = r["first_ms"], r["second_ms"]
            lines.append(f"| {r['variant']} | {r['split']} | {a:.3f} | {b:.3f} | {b / a:.2f} |")
        worst = max(abs(r["second_ms"] / r["first_ms"] - 1) for r in results["repeat"])
        lines += ["", f"Largest difference: {100 * worst:.0f} % (target: within 20 %)."]
    lines += ["", "## Report", "", f"(`{results['report_path']}`, with its six plots next to it.)"]
    lines += ["", results["report_section"]]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small plans for `make bench`")
    parser.add_argument(
        "--data-root",
        default=os.environ.get("GNNAAS_DATA"),
        help="folder with Planetoid/Cora/raw (default: $GNNAAS_DATA)",
    )
    parser.add_argument(
        "--datasets",
        nargs="+",
        help="default: Cora synth-flickr synth-reddit "
        "(quick: Cora synth-flickr@0.25 synth-reddit@0.1)",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda (default: auto)")
    parser.add_argument("--epochs", type=int, help="max epochs for every dataset")
    parser.add_argument("--runs", type=int, help="timed runs per variant and split")
    parser.add_argument("--archs", nargs="+", help="override the plan's architectures")
    parser.add_argument("--rankings", nargs="+", help="override the plan's rankings")
    parser.add_argument(
        "--work",
        help="variants/ and profiles/ go here (default: the repo's "
        "variants/ and profiles/; quick: .cache/bench-quick)",
    )
    parser.add_argument(
        "--results",
        help="results pages (default: benchmarks/results; quick: "
        "the work folder, so quick runs never overwrite real results)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="torch threads for training and profiling (default: torch's; use 1 on a machine "
        "whose cores are shared, where several threads stall each other)",
    )
    parser.add_argument("--no-repeat", action="store_true", help="skip the p50 repeat check")
    parser.add_argument("--render", metavar="JSON", help="only rewrite the .md beside its JSON")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    args = parser.parse_args(argv)
    if args.render:
        render_saved(args.render, render)
        return 0
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.work is None:
        args.work = str(REPO / ".cache" / "bench-quick") if args.quick else str(REPO)
    if args.results is None:
        args.results = args.work if args.quick else str(RESULTS)
    datasets = args.datasets or list(QUICK_PLANS if args.quick else FULL_PLANS)
    datasets = ["Cora" if d.lower() == "cora" else d for d in datasets]
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    from gnnaas.utils import resolve_device

    device = resolve_device(args.device)
    _say(f"# bench_variants on {device}, torch threads {torch.get_num_threads()}")
    for name in datasets:
        results = run_dataset(name, args, device)
        results["command"] = command_line("bench_variants.py", argv)
        save_results(f"variants-{results['dataset']['name']}", results, render, Path(args.results))
    return 0


if __name__ == "__main__":
    from common import exit_status

    raise SystemExit(exit_status(main))
