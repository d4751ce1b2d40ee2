"""Feature-cache plans with a budget holding 10% of the 1× features (issue 28's figure).

For each dataset (default Cora, synth-flickr@0.2, synth-reddit) the budget is
``0.1 × num_nodes × num_features × 4 B / 2^20`` MiB, printed, and ``gnnaas cache-plan`` runs with
it (a child process: the command a user runs, its table and its ``cache_plan.csv``). The
variants are those of ``--variants`` (default ``variants``); a dataset without any is planned for
the default prune factors 1, 2, 4, 8 at fanouts (25, 10), as the command says. Pure CPU.

Writes ``cache-plan.json`` (every row) and one ``cache-plan-<dataset>.md`` per dataset, generated
from it (``benchmarks/results/`` unless ``--out``); ``--render cache-plan.json`` rewrites the
Markdown from a saved run.

Example:
    python benchmarks/bench_cache_plan.py
    python benchmarks/bench_cache_plan.py --datasets Cora --out /tmp/plans
"""

from __future__ import annotations

import argparse
import csv
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import (
    REPO,
    RESULTS,
    command_line,
    machine_info,
    render_saved,
    save_results,
    say,
    utc_now,
)

__all__ = ["main", "render"]

DATASETS = ("Cora", "synth-flickr@0.2", "synth-reddit")
SHARE = 0.1  # of the 1x features


def plan(dataset: str, args: argparse.Namespace, profiles: Path) -> dict[str, Any]:
    """One dataset: its budget, the command, its printed table and its cache_plan.csv rows."""
    from gnnaas.data import load_dataset

    store = load_dataset(dataset, args.data_root)
    full_bytes = store.num_nodes * store.num_features * store.x.element_size()
    budget_mb = SHARE * full_bytes / 2**20
    say(f"{dataset}: budget {budget_mb:.4f} MB = {SHARE} of the 1x features ({full_bytes:,} B)")
    command = [
        "gnnaas",
        "--threads",
        "1",
        "cache-plan",
        "--dataset",
        dataset,
        "--budget-mb",
        f"{budget_mb:.6f}",
        "--variants",
        args.variants,
        "-q",
    ]
    if args.data_root:
        command[4:4] = ["--data-root", args.data_root]
    env = {**os.environ, "GNNAAS_PROFILES_DIR": str(profiles)}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "gnnaas.cli", *command[1:]],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{shlex.join(command)} failed:\n{done.stderr}")
    seconds = time.perf_counter() - start
    say(done.stdout.rstrip())
    with (profiles / store.name / "cache_plan.csv").open() as f:
        rows = list(csv.DictReader(f))
    return {
        "dataset": store.name,
        "num_nodes": store.num_nodes,
        "num_edges": store.num_edges,
        "num_features": store.num_features,
        "full_mb": full_bytes / 2**20,
        "budget_mb": budget_mb,
        "command": shlex.join(command),
        "seconds": seconds,
        # The plan's files go to a scratch folder: its path is no figure and no reader's path.
        "printed": done.stdout.replace(str(profiles), "<profiles>"),
        "rows": [
            {
                "variant": r["variant"],
                "fanouts": r["fanouts"],
                "features_kept": int(r["features_kept"]),
                "cached_nodes": int(r["cached_nodes"]),
                "cached_frac": float(r["cached_frac"]),
                "hit_ratio": float(r["hit_ratio"]),
                "by": r["by"],
                "seeds": r["seeds"],
                "num_seeds": int(r["num_seeds"]),
            }
            for r in rows
        ],
    }


def _ratio_line(entry: dict[str, Any]) -> str:
    """The issue's check, from the rows: the most pruned variants' hit ratio over the 1x ones'."""
    rows = entry["rows"]
    widest = max(r["features_kept"] for r in rows)
    narrowest = min(r["features_kept"] for r in rows)
    wide = [r["hit_ratio"] for r in rows if r["features_kept"] == widest]
    narrow = [r["hit_ratio"] for r in rows if r["features_kept"] == narrowest]
    low, high = min(wide), min(narrow)
    ratio = high / low if low > 0 else float("inf")
    verdict = "holds" if high >= 2 * low else "does not hold"
    return (
        f"Most pruned ({narrowest} features) vs 1× ({widest} features): hit ratio {high:.4f} vs "
        f"{low:.4f}, {ratio:.2f}×; the issue's check (at least 2×) {verdict}."
    )


def render(results: dict[str, Any]) -> dict[str, str]:
    """One ``cache-plan-<dataset>.md`` per dataset, from the results."""
    m = results["machine"]
    pages = {}
    for entry in results["datasets"]:
        lines = [
            f"# Feature-cache plan: {entry['dataset']}",
            "",
            f"Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, torch {m['torch']} "
            f"(pure CPU). Date: {results['date']}. Written by `{results['bench']}` from "
            f"`cache-plan.json`; data root {results['data_root']}.",
            "",
            f"Graph: {entry['num_nodes']:,} nodes, {entry['num_edges']:,} edges, "
            f"{entry['num_features']} features ({entry['full_mb']:.1f} MB of 1× features, "
            "float32).",
            f"Budget: {entry['budget_mb']:.4f} MB per variant = {SHARE:.0%} of the 1× features. "
            f"Planning seeds: {entry['rows'][0]['seeds']} ({entry['rows'][0]['num_seeds']:,} "
            f"nodes, batches of 1,024), nodes ranked by {entry['rows'][0]['by']}.",
            "",
            f"Command ({entry['seconds']:.1f} s): `{entry['command']}`",
            "",
            "| variant | fanouts | features_kept | cached_nodes | cached share of nodes | "
            "hit_ratio |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for r in entry["rows"]:
            lines.append(
                f"| {r['variant']} | {r['fanouts']} | {r['features_kept']} | "
                f"{r['cached_nodes']:,} | {r['cached_frac']:.3f} | {r['hit_ratio']:.4f} |"
            )
        lines += ["", _ratio_line(entry), ""]
        if "planned for the default prune factors" in entry["printed"]:
            lines += [
                "The dataset had no variants in the repository: the rows are the default prune "
                "factors (⌊f/k⌋ features), as `gnnaas cache-plan` plans them.",
                "",
            ]
        pages[f"cache-plan-{entry['dataset']}.md"] = "\n".join(lines)
    return pages


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the plans and writes the results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), help="graphs to plan")
    parser.add_argument("--variants", default="variants", help="variant repository")
    parser.add_argument("--data-root", default=None, help="real datasets (default: $GNNAAS_DATA)")
    parser.add_argument("--out", default=None, help="(default: benchmarks/results)")
    parser.add_argument("--render", metavar="JSON", help="only rewrite the .md beside its JSON")
    args = parser.parse_args(argv)
    if args.render:
        render_saved(args.render, render)
        return 0
    results: dict[str, Any] = {
        "date": utc_now(),
        "machine": machine_info(),
        "bench": command_line("bench_cache_plan.py", argv),
        # Which setting named the raw files (no machine path in the results).
        "data_root": "--data-root"
        if args.data_root
        else "$GNNAAS_DATA"
        if os.environ.get("GNNAAS_DATA")
        else "(none)",
        "datasets": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for dataset in args.datasets:
            results["datasets"].append(plan(dataset, args, Path(tmp)))
    save_results("cache-plan", results, render, Path(args.out) if args.out else RESULTS)
    return 0


if __name__ == "__main__":
    from common import exit_status

    raise SystemExit(exit_status(main))
