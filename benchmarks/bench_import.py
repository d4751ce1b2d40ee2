"""Import at scale: a synthetic graph exported to Parquet/npy, then ``gnnaas import``, timed.

Builds a synthetic preset (default ``synth-products``: 2.45 M nodes, 62 M edges, 100 features),
writes it the way a warehouse export would look (edges as Parquet with ``src,dst``, features and
labels as ``.npy``), then runs ``gnnaas import`` in a fresh process with its own ``GNNAAS_HOME``
and reports its wall time, its peak resident memory (the child's ``ru_maxrss``) and the size of the
store it wrote. Goal (issue 12): ≤ 2 min and peak ≤ 2× the store.

Writes ``import.json`` and ``import.md`` rendered from it (``benchmarks/results/`` unless
``--out``); ``--render import.json`` rewrites the page from a saved run.

Example:
    python benchmarks/bench_import.py                      # synth-products, full size
    python benchmarks/bench_import.py --dataset synth-products@0.1 --out /tmp/import
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from common import RESULTS, command_line, machine_info, render_saved, save_results

__all__ = ["main", "render"]


def export(name: str, folder: Path) -> dict[str, float]:
    """Writes ``edges.parquet`` (src, dst), ``x.npy`` and ``y.npy`` of dataset ``name``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gnnaas.data import load_dataset

    start = time.perf_counter()
    store = load_dataset(name, seed=0)
    built = time.perf_counter() - start
    start = time.perf_counter()
    rowptr, col = store.rowptr.numpy(), store.col.numpy()
    dst = np.repeat(np.arange(store.num_nodes, dtype=np.int64), np.diff(rowptr))
    pq.write_table(
        pa.table({"src": pa.array(col, pa.int64()), "dst": pa.array(dst, pa.int64())}),
        folder / "edges.parquet",
    )
    del dst
    np.save(folder / "x.npy", store.x.numpy())
    np.save(folder / "y.npy", store.y.numpy())
    return {
        "nodes": store.num_nodes,
        "edges": int(col.size),
        "features": store.num_features,
        "build_s": built,
        "export_s": time.perf_counter() - start,
    }


def render(results: dict[str, Any]) -> str:
    """``import.md`` from a run's results."""
    m, info = results["machine"], results["export"]
    peak, store, floor = results["peak_bytes"], results["store_bytes"], results["floor_bytes"]
    lines = [
        f"# Importing {results['dataset']} (`gnnaas import`)",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m.get('mem_gb', float('nan')):.0f} GB RAM; "
        f"command: `{results['command']}`.",
    ]
    if results.get("recovered_from"):
        lines += ["", results["recovered_from"]]
    lines += [
        "",
        f"Graph: {info['nodes']:,} nodes, {info['edges']:,} directed edges, {info['features']} "
        f"features; exported as Parquet edges (src, dst) + `.npy` features and labels: "
        f"{results['inputs_bytes'] / 2**30:.2f} GiB of input files (built in "
        f"{info['build_s']:.0f} s, written in {info['export_s']:.0f} s).",
        "",
        "| figure | value | goal |",
        "|---|---:|---|",
        f"| wall time of `gnnaas import` (fresh process) | {results['wall_s']:.1f} s | ≤ 120 s |",
        f"| peak resident memory of that process | {peak / 2**30:.2f} GiB | |",
        f"| store written | {store / 2**30:.2f} GiB | |",
        f"| peak / store | {peak / store:.2f}× | ≤ 2× |",
        f"| the same without the interpreter's own {floor / 2**30:.2f} GiB (torch, pyarrow "
        f"imported) | {(peak - floor) / store:.2f}× | |",
        "",
        "Output of the command:",
        "",
        "```",
        results["output"].strip(),
        "```",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="synth-products", help="(default: synth-products)")
    parser.add_argument("--workdir", default=None, help="where the exported files go (tmp)")
    parser.add_argument("--out", default=str(RESULTS), help="(default: benchmarks/results)")
    parser.add_argument("--render", metavar="JSON", help="only rewrite import.md beside its JSON")
    parser.add_argument("--export-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.render:
        render_saved(args.render, render)
        return 0
    work = Path(args.workdir or tempfile.mkdtemp(prefix="gnnaas-bench-import-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.export_only:  # the child that builds and writes the files
        (work / "export.json").write_text(json.dumps(export(args.dataset, work)))
        return 0
    # This process stays small (no torch): a child's peak RSS on Linux starts from its parent's
    # at spawn time, so the export and the import each run in a process of their own.
    print(f"exporting {args.dataset} to {work}", file=sys.stderr)
    subprocess.run(
        [
            sys.executable,
            __file__,
            "--export-only",
            "--dataset",
            args.dataset,
            "--workdir",
            str(work),
        ],
        check=True,
    )
    info = json.loads((work / "export.json").read_text())
    inputs = sum(f.stat().st_size for f in work.glob("*.*") if f.suffix in (".parquet", ".npy"))
    home = work / "home"
    shutil.rmtree(home, ignore_errors=True)  # a fresh data home: nothing imported yet
    # `gnnaas import` itself, reporting its own peak RSS when done.
    run_cli = "import resource, sys; from gnnaas.cli import main; rc = main(sys.argv[1:]); "
    run_cli += "print('maxrss_kib', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
    run_cli += "file=sys.stderr); sys.exit(rc)"
    cmd = [
        sys.executable, "-c", run_cli, "import", "bench-graph",
        "--edges", str(work / "edges.parquet"), "--features", str(work / "x.npy"),
        "--labels", str(work / "y.npy"),
    ]  # fmt: skip
    # The interpreter with gnnaas's imports alone (torch, pyarrow): the floor of any command.
    floor_cmd = "import gnnaas.cli, gnnaas.data.importer, torch, pyarrow, resource; "
    floor_cmd += "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    out = subprocess.run([sys.executable, "-c", floor_cmd], check=True, capture_output=True)
    floor = int(out.stdout.decode().split()[-1]) * 1024
    print("running: gnnaas import ...", file=sys.stderr)
    start = time.perf_counter()
    proc = subprocess.run(
        cmd, env={**os.environ, "GNNAAS_HOME": str(home)}, capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        return 1
    peak = int(proc.stderr.split("maxrss_kib")[-1].split()[0]) * 1024  # KiB on Linux
    results = {
        "dataset": args.dataset,
        "machine": machine_info(),
        "command": command_line("bench_import.py", argv),
        "export": info,
        "inputs_bytes": inputs,
        "wall_s": wall,
        "peak_bytes": peak,
        "store_bytes": sum(f.stat().st_size for f in home.rglob("*") if f.is_file()),
        "floor_bytes": floor,
        "output": proc.stdout,
    }
    save_results("import", results, render, Path(args.out))
    return 0


if __name__ == "__main__":
    from common import exit_status

    raise SystemExit(exit_status(main))
