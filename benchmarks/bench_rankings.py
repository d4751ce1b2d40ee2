"""Feature rankings on a real graph: accuracy of every variant, generation time, ranking cost.

Runs ``gnnaas generate`` for all 2 archs × 3 rankings × 4 prune factors into a fresh folder (timed,
wall clock, as a user would run it), runs it again to check that nothing is retrained, times each
ranking on the stored 1× models, and writes a markdown report with the checks of issue 4:
the lasso and greedy 8× variants lose at most 5 validation points against the 1× model and beat
the random 8× variant by at least 5.

Usage (one intra-op thread: on a 2-core machine shared with other jobs, two threads contend and
training runs several times slower)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_rankings.py --dataset Cora \\
        --data-root ../shared/data --results benchmarks/results/variants-cora-rankings.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ARCHS = ("sage", "gin")
RANKINGS = ("random", "greedy", "lasso")
PRUNES = (1, 2, 4, 8)


def _gnnaas(args: list[str]) -> tuple[float, str]:
    exe = Path(sys.executable).with_name("gnnaas")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "gnnaas.cli"]
    start = time.perf_counter()
    proc = subprocess.run([*cmd, *args], capture_output=True, text=True, check=False)
    wall_s = time.perf_counter() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"gnnaas {' '.join(args)} failed with exit code {proc.returncode}")
    return wall_s, proc.stdout


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()}-core {platform.machine()} CPU ({cpu}), {mem_gb:.0f} GB RAM"


def _time_rankings(store: Any, out: Path, seed: int, repeats: int) -> dict[tuple[str, str], float]:
    from gnnaas.variants import VariantRepository, rank_features

    repo = VariantRepository(out)
    times: dict[tuple[str, str], float] = {}
    for arch in ARCHS:
        model = repo.load(store.name, f"{arch}-full-1x").model
        for ranking in RANKINGS:
            runs = []
            for _ in range(repeats):
                start = time.perf_counter()
                rank_features(ranking, model, store, seed=seed)
                runs.append(time.perf_counter() - start)
            times[(arch, ranking)] = statistics.median(runs)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="Cora")
    parser.add_argument("--data-root", default=os.environ.get("GNNAAS_DATA", "../shared/data"))
    parser.add_argument("--out", help="variant repository (default: a fresh temporary folder)")
    parser.add_argument("--epochs", type=int, default=200, help="max epochs (default: 200)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="ranking timing repeats")
    parser.add_argument("--date", default=dt.date.today().isoformat())
    parser.add_argument("--machine-note", default="", help="appended to the machine line")
    parser.add_argument("--note", action="append", default=[], help="a line under Notes")
    parser.add_argument("--results", help="write the markdown report here (default: stdout)")
    args = parser.parse_args()

    import torch

    threads = os.environ.get("OMP_NUM_THREADS")
    env = f"OMP_NUM_THREADS={threads} " if threads else ""

    from gnnaas.data import load_dataset
    from gnnaas.variants import VariantRepository

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="gnnaas-variants-"))
    common = ["--dataset", args.dataset, "--data-root", args.data_root, "--device", "cpu"]
    common += ["--seed", str(args.seed), "--epochs", str(args.epochs), "--out", str(out)]
    load_before = os.getloadavg()
    first_s, first_table = _gnnaas(["generate", *common])
    load_after = os.getloadavg()
    second_s, second_table = _gnnaas(["generate", *common])
    retrained = [line for line in second_table.splitlines() if line.rstrip().endswith("trained")]

    store = load_dataset(args.dataset, args.data_root, seed=args.seed)
    manifests = {m.variant_id: m for m in VariantRepository(out).list(store.name)}
    rank_s = _time_rankings(store, out, args.seed, args.repeats)

    def get(arch: str, ranking: str, k: int) -> Any:
        return manifests[f"{arch}-full-1x" if k == 1 else f"{arch}-{ranking}-{k}x"]

    lines = [
        f"# Feature rankings on {store.name}: {len(ARCHS)} archs × {len(RANKINGS)} rankings × "
        f"{len(PRUNES)} prune factors",
        "",
        f"- date: {args.date}",
        f"- machine: {_machine()}, no GPU{args.machine_note}",
        f"- torch {torch.__version__}, intra-op threads {torch.get_num_threads()} "
        f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}); load average "
        f"(1 min) {load_before[0]:.1f} before and {load_after[0]:.1f} after the first run",
        f"- dataset: {store.name}, {store.num_nodes} nodes, {store.num_edges} edges, "
        f"{store.num_features} features, {store.num_classes} classes; inductive split "
        f"{store.train_idx.numel()}/{store.val_idx.numel()}/{store.test_idx.numel()} "
        f"(train/val/test, seed {args.seed})",
        f"- command: `{env}.venv/bin/python benchmarks/bench_rankings.py --dataset "
        f"{args.dataset} --data-root {args.data_root} --date {args.date} --results <this file>`, "
        f"which runs `{env}gnnaas generate --dataset {args.dataset} --data-root {args.data_root} "
        f"--out <tmpdir> --device cpu --seed {args.seed} --epochs {args.epochs}` twice",
        "- training: `TrainConfig` defaults (hidden 256, 2 layers, fanouts (25, 10), batch 1024, "
        "early stopping on validation); every variant of an arch uses the same config",
        "",
        "## Generation time",
        "",
        f"- first `gnnaas generate` (all {len(ARCHS)} × {len(RANKINGS)} × {len(PRUNES)} variants: "
        f"{len(manifests)} trained models, the 1× shared by the rankings; wall clock including "
        f"start-up and data loading): **{first_s:.1f} s** (target ≤ 300 s)",
        f"- second run without `--force`: {second_s:.1f} s, variants retrained: {len(retrained)}",
        "",
        "## Accuracy per variant",
        "",
        "Accuracies in %; the 1× row is shared by the three rankings.",
        "",
        "| arch | ranking | k | features kept | val acc | test acc | train time s | epochs |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for arch in ARCHS:
        for ranking in RANKINGS:
            for k in PRUNES:
                m = get(arch, ranking, k)
                name = "full" if k == 1 else ranking
                lines.append(
                    f"| {arch} | {name} | {k} | {m.in_channels} | "
                    f"{100 * m.metrics['val_acc']:.2f} | {100 * m.metrics['test_acc']:.2f} | "
                    f"{m.metrics['train_time_s']:.1f} | {int(m.metrics['epochs'])} |"
                )
    lines += [
        "",
        "## Checks (validation accuracy, points)",
        "",
        "| arch | ranking | 8× val | drop vs 1× (≤ 5) | gain vs random 8× (≥ 5) | pass |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    all_pass = True
    for arch in ARCHS:
        full = 100 * get(arch, "", 1).metrics["val_acc"]
        rand = 100 * get(arch, "random", 8).metrics["val_acc"]
        for ranking in ("greedy", "lasso"):
            val = 100 * get(arch, ranking, 8).metrics["val_acc"]
            ok = full - val <= 5.0 and val - rand >= 5.0
            all_pass &= ok
            lines.append(
                f"| {arch} | {ranking} | {val:.2f} | {full - val:.2f} | {val - rand:.2f} | "
                f"{'yes' if ok else 'NO'} |"
            )
    lines += [
        "",
        f"All checks pass: **{'yes' if all_pass else 'NO'}**.",
        "",
        "## Ranking cost",
        "",
        f"Median of {args.repeats} runs of `rank_features` on the stored 1× model (lasso: "
        "Gram matrix over the training graph's first-layer aggregation, then 100 epochs of "
        "proximal steps), next to the median training time of one variant.",
        "",
        "| arch | random s | greedy s | lasso s | median variant train s |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for arch in ARCHS:
        train = statistics.median(
            m.metrics["train_time_s"] for m in manifests.values() if m.arch == arch
        )
        lines.append(
            f"| {arch} | {rank_s[(arch, 'random')]:.4f} | {rank_s[(arch, 'greedy')]:.4f} | "
            f"{rank_s[(arch, 'lasso')]:.3f} | {train:.1f} |"
        )
    if args.note:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in args.note]
    lines += ["", "## `gnnaas generate` output (first run)", "", "```", first_table.rstrip(), "```"]
    text = "\n".join(lines) + "\n"
    if args.results:
        Path(args.results).parent.mkdir(parents=True, exist_ok=True)
        Path(args.results).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    if not args.out:
        shutil.rmtree(out, ignore_errors=True)
    return 0 if all_pass else 1


if __name__ == "__main__":
    sys.exit(main())
