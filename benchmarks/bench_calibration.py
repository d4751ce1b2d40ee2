"""Do the synthetic presets lose accuracy under feature pruning the way the real graphs do?

For each dataset (default synth-small, synth-flickr@0.2 and synth-arxiv@0.05, the presets whose
features were calibrated): every variant of SAGE and GIN × random, greedy and lasso rankings × prune
factors 1, 2, 4, 8 (feature axis only), trained by ``generate_variants`` with the default
``TrainConfig`` (seed 0) into a scratch folder, one torch thread; then each variant's validation
and test accuracy from its manifest, the generation's wall time, and the preset's feature
parameters (strong and weak signal columns). The reading: is the 1× model the most accurate
variant of its architecture, how many points greedy/lasso 8× lose against it, how far random 8×
falls below them (docs/architecture.md §3 asks for a few points, and clearly below).

Writes ``synthetic-calibration.json`` and ``synthetic-calibration.md`` rendered from it (full run:
``benchmarks/results/``; ``--quick``, synth-small with a few epochs: ``<workdir>/results/`` unless
``--out`` says otherwise); ``--render JSON`` rewrites the page from a saved run.

Example:
    python benchmarks/bench_calibration.py
    python benchmarks/bench_calibration.py --quick
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gnnaas.stats import median

from common import RESULTS, command_line, machine_info, render_saved, save_results, say, utc_now

__all__ = ["main", "render"]

DATASETS = ("synth-small", "synth-flickr@0.2", "synth-arxiv@0.05")
ARCHS = ("sage", "gin")
RANKINGS = ("greedy", "lasso", "random")
PRUNES = (1, 2, 4, 8)


def calibrate(dataset: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Every variant of ``dataset`` trained; its preset's feature parameters and the accuracies."""
    from gnnaas.data import load_dataset
    from gnnaas.data.synthetic import PRESETS, parse_synthetic_name
    from gnnaas.variants.pipeline import generate_variants
    from gnnaas.variants.repository import VariantRepository
    from gnnaas.variants.training import TrainConfig

    start = time.perf_counter()
    store = load_dataset(dataset, seed=0)
    preset, scale, _ = parse_synthetic_name(dataset)
    cfg = PRESETS[preset].scaled(scale)
    repo = VariantRepository(work / dataset.replace("@", "_at_"))
    config = TrainConfig(seed=0, **({"max_epochs": args.epochs} if args.epochs else {}))
    generate_variants(
        store,
        repo,
        archs=args.archs,
        rankings=RANKINGS,
        prunes=PRUNES,
        config=config,
        axes=("features",),
        progress=sys.stderr.isatty(),
    )
    seconds = time.perf_counter() - start
    variants = {
        m.variant_id: {
            "val_acc": float(m.metrics["val_acc"]),
            "test_acc": float(m.metrics["test_acc"]),
        }
        for m in repo.list(store.name)
    }
    say(f"{dataset}: {len(variants)} variants in {seconds:.0f} s")
    informative = cfg.informative_count
    return {
        "dataset": store.name,
        "num_nodes": store.num_nodes,
        "num_val": int(store.val_idx.numel()),
        "num_features": store.num_features,
        "features": {
            "num_informative": informative,
            "signal": cfg.signal,
            "num_weak": cfg.num_weak,
            "weak_signal": cfg.weak_signal,
            "noise_columns": store.num_features - informative - cfg.num_weak,
        },
        "train_config": {"max_epochs": config.max_epochs, "patience": config.patience},
        "seconds": seconds,
        "variants": variants,
    }


def _acc(entry: dict[str, Any], arch: str, ranking: str, k: int) -> dict[str, float] | None:
    return entry["variants"].get(f"{arch}-full-1x" if k == 1 else f"{arch}-{ranking}-{k}x")


def _reading(entry: dict[str, Any], archs: list[str]) -> list[str]:
    """What the table says, per architecture, in validation points."""
    lines = []
    for arch in archs:
        full = _acc(entry, arch, "", 1)
        if full is None:
            continue
        mine = [v for k, v in entry["variants"].items() if k.startswith(f"{arch}-")]
        best_val = max(mine, key=lambda v: v["val_acc"]) is full
        best_test = max(mine, key=lambda v: v["test_acc"]) is full
        eights = [_acc(entry, arch, r, 8) for r in ("greedy", "lasso")]
        drops = [100 * (full["val_acc"] - e["val_acc"]) for e in eights if e is not None]
        rand = _acc(entry, arch, "random", 8)
        parts = [
            f"1× {'is' if best_val else 'is not'} the most accurate {arch.upper()} variant on "
            f"validation ({'and' if best_test else 'but not'} on test)"
        ]
        if drops:
            parts.append(
                f"greedy/lasso 8× lose {min(drops):.1f}–{max(drops):.1f} validation points"
            )
        if rand is not None and eights and all(e is not None for e in eights):
            gap = [100 * (e["val_acc"] - rand["val_acc"]) for e in eights if e is not None]
            parts.append(f"random 8× sits {min(gap):.1f}–{max(gap):.1f} points below them")
        lines.append(f"- {arch.upper()}: " + "; ".join(parts) + ".")
    return lines


def render(results: dict[str, Any]) -> str:
    """``synthetic-calibration.md`` from a run's results."""
    m = results["machine"]
    archs = results["archs"]
    lines = [
        "# Synthetic presets: accuracy under feature pruning (calibration)",
        "",
        f"Date: {results['date'][:10]}. Machine: {m['cpu']}, {m['cores']} cores, "
        f"{m['mem_gb']} GB, {m.get('gpu') or 'no GPU'}; torch {m['torch']}, one torch thread; "
        f"load average before the run "
        + " / ".join(f"{v:.2f}" for v in results["load_before"])
        + f". Command: `{results['command']}`.",
        "",
        "Every variant trained by `generate_variants` (default `TrainConfig`: hidden 256, fanouts "
        "(25, 10), batch 1024, seed 0; feature axis only) into a scratch folder; accuracy in % "
        f'from the variants\' manifests, "val / test". Generator version '
        f"{results['generator_version']}.",
        "",
        "| dataset | features | strong columns × signal | weak columns × signal (→ half) | "
        "noise columns |",
        "|---|---:|---:|---:|---:|",
    ]
    for e in results["datasets"]:
        f = e["features"]
        lines.append(
            f"| {e['dataset']} | {e['num_features']} | {f['num_informative']} × {f['signal']:g} "
            f"| {f['num_weak']} × {f['weak_signal']:g} | {f['noise_columns']} |"
        )
    for e in results["datasets"]:
        t = e["train_config"]
        lines += [
            "",
            f"## {e['dataset']} ({e['num_nodes']:,} nodes; val {e['num_val']:,} nodes, so one "
            f"node is {100 / e['num_val']:.2f} points)",
            "",
            f"At most {t['max_epochs']} epochs, patience {t['patience']}; wall time of the "
            f"generation (graph build included): {e['seconds']:.0f} s.",
            "",
            "| arch | ranking | " + " | ".join(f"{k}× val / test" for k in PRUNES) + " |",
            "|---|---|" + "---:|" * len(PRUNES),
        ]
        for arch in archs:
            for ranking in RANKINGS:
                cells = []
                for k in PRUNES:
                    a = _acc(e, arch, ranking, k)
                    cells.append(
                        "–"
                        if a is None
                        else f"{100 * a['val_acc']:.1f} / {100 * a['test_acc']:.1f}"
                    )
                lines.append(f"| {arch} | {ranking} | " + " | ".join(cells) + " |")
        lines += ["", *_reading(e, archs)]
        val = e["num_val"]
        p = median(v["val_acc"] for v in e["variants"].values())
        lines += [
            "",
            f"One run, one seed: at the median accuracy ({100 * p:.1f}%) a figure over {val:,} "
            f"validation nodes has a standard error of about "
            f"{100 * (p * (1 - p) / val) ** 0.5:.1f} points.",
        ]
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="synth-small, SAGE, 3 epochs")
    parser.add_argument("--datasets", nargs="+", help=f"(default: {' '.join(DATASETS)})")
    parser.add_argument("--archs", nargs="+", choices=ARCHS, help="(default: sage gin)")
    parser.add_argument("--epochs", type=int, help="most epochs (default: TrainConfig's)")
    parser.add_argument("--workdir", default=".cache/bench", help="(default: .cache/bench)")
    parser.add_argument(
        "--out", help="results folder (default: benchmarks/results, quick: <workdir>/results)"
    )
    parser.add_argument("--render", metavar="JSON", help="only rewrite the .md beside its JSON")
    args = parser.parse_args(argv)
    if args.render:
        render_saved(args.render, render)
        return 0
    if args.quick:
        args.datasets = args.datasets or ["synth-small"]
        args.archs = args.archs or ["sage"]
        args.epochs = args.epochs or 3
    args.datasets = args.datasets or list(DATASETS)
    args.archs = args.archs or list(ARCHS)
    import torch

    from gnnaas.data.synthetic import GENERATOR_VERSION

    torch.set_num_threads(1)
    results: dict[str, Any] = {
        "date": utc_now(),
        "machine": machine_info(),
        "command": command_line("bench_calibration.py", argv),
        "load_before": list(os.getloadavg()),
        "generator_version": GENERATOR_VERSION,
        "archs": args.archs,
        "datasets": [],
    }
    with tempfile.TemporaryDirectory(prefix="gnnaas-calibration-") as tmp:
        for dataset in args.datasets:
            results["datasets"].append(calibrate(dataset, args, Path(tmp)))
    quick_out = Path(args.workdir) / "results"
    out = Path(args.out) if args.out else (quick_out if args.quick else RESULTS)
    save_results("synthetic-calibration", results, render, out)
    return 0


if __name__ == "__main__":
    from common import exit_status

    raise SystemExit(exit_status(main))
