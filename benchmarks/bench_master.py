"""A user's PyG master model through ``generate --from-model``: cold vs warm-started variants.

Trains ``torch_geometric.nn.models.GraphSAGE`` the way a plain PyG script does (full graph, the
dataset's training nodes, Adam), saves it as safetensors, imports it as the 1× variant
(:func:`gnnaas.variants.master.import_master`, evaluated on the serving path) and generates the
pruned variants twice from it: initialized at random ("cold") and warm-started from the master's
weights restricted to the kept features ("warm"). Prints and writes the validation and test
accuracy, epochs and training time of every variant.

Writes ``master.json`` and ``master.md`` rendered from it (``benchmarks/results/`` unless
``--out``); ``--render master.json`` rewrites the page from a saved run.

Example:
    python benchmarks/bench_master.py --dataset Cora --data-root ../shared/data
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import RESULTS, command_line, machine_info, render_saved, save_results

__all__ = ["main", "render"]


def train_plain_pyg(store: Any, hidden: int, epochs: int) -> tuple[Any, float]:
    """Full-graph GraphSAGE on the training nodes; its own full-graph test accuracy."""
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn.models import GraphSAGE

    torch.manual_seed(0)
    model = GraphSAGE(store.num_features, hidden, num_layers=2, out_channels=store.num_classes)
    dst = torch.repeat_interleave(
        torch.arange(store.num_nodes), store.rowptr[1:] - store.rowptr[:-1]
    )
    edge_index = torch.stack([store.col, dst])
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    for _ in range(epochs):
        model.train()
        opt.zero_grad()
        out = model(store.x, edge_index)
        F.cross_entropy(out[store.train_idx], store.y[store.train_idx]).backward()
        opt.step()
    model.eval()
    with torch.inference_mode():
        pred = model(store.x, edge_index).argmax(-1)
    return model, float((pred[store.test_idx] == store.y[store.test_idx]).float().mean())


def run(args: argparse.Namespace, argv: list[str] | None) -> dict[str, Any]:
    """The master trained and imported, then its pruned variants cold and warm."""
    import torch
    from safetensors.torch import save_file

    from gnnaas.data import load_dataset
    from gnnaas.variants.master import import_master
    from gnnaas.variants.pipeline import generate_variants
    from gnnaas.variants.repository import VariantRepository
    from gnnaas.variants.training import TrainConfig

    torch.set_num_threads(1)
    store = load_dataset(args.dataset, args.data_root, seed=0)
    model, script_acc = train_plain_pyg(store, args.hidden, args.epochs)
    tmp = Path(tempfile.mkdtemp(prefix="gnnaas-bench-master-"))
    weights, config = tmp / "master.safetensors", tmp / "master.json"
    save_file(model.state_dict(), str(weights))
    config.write_text(
        json.dumps(
            {
                "class": "GraphSAGE",
                "in_channels": store.num_features,
                "hidden_channels": args.hidden,
                "num_layers": 2,
                "out_channels": store.num_classes,
            }
        )
    )
    runs: dict[str, Any] = {}
    for warm in (False, True):
        repo = VariantRepository(tmp / ("warm" if warm else "cold"))
        manifest, _ = import_master(store, repo, weights, config)
        start = time.perf_counter()
        rows = generate_variants(store, repo, archs=["sage"], config=TrainConfig(), warm_start=warm)
        total = time.perf_counter() - start
        runs["warm" if warm else "cold"] = {
            "master": manifest,
            "seconds": total,
            "variants": [repo.manifest(store.name, r.variant_id) for r in rows[1:]],
        }
        print(f"{'warm' if warm else 'cold'}: {total:.1f} s", file=sys.stderr)
    master = runs["cold"]["master"]

    def figures(m: Any) -> dict[str, float]:
        return {k: float(m.metrics[k]) for k in ("val_acc", "test_acc", "epochs")}

    return {
        "dataset": store.name,
        "machine": machine_info(),
        "command": command_line("bench_master.py", argv),
        "hidden": args.hidden,
        "epochs": args.epochs,
        "script_test_acc": script_acc,
        "master": {"variant": master.variant_id, **figures(master)},
        "seconds": {k: runs[k]["seconds"] for k in ("cold", "warm")},
        "variants": [
            {"variant": cold.variant_id, "cold": figures(cold), "warm": figures(warm)}
            for cold, warm in zip(runs["cold"]["variants"], runs["warm"]["variants"], strict=True)
        ],
    }


def render(results: dict[str, Any]) -> str:
    """``master.md`` from a run's results."""
    m, master = results["machine"], results["master"]
    lines = [
        f"# A PyG master model's variants, cold vs warm start ({results['dataset']})",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, one torch thread. "
        f"Command: `{results['command']}`.",
    ]
    if results.get("recovered_from"):
        lines += ["", results["recovered_from"]]
    lines += [
        "",
        f"Master: PyG `GraphSAGE` (hidden {results['hidden']}, 2 layers) trained "
        f"{results['epochs']} epochs in a plain PyG script: its own full-graph test accuracy "
        f"**{results['script_test_acc'] * 100:.2f} %**; imported as `{master['variant']}`, "
        f"served with sampled (25, 10) neighborhoods: val {master['val_acc'] * 100:.2f} %, "
        f"test **{master['test_acc'] * 100:.2f} %**.",
        "",
        f"Pruned variants (default `TrainConfig`, early stopping on validation): cold "
        f"{results['seconds']['cold']:.1f} s in all, warm {results['seconds']['warm']:.1f} s.",
        "",
        "| variant | cold val % | cold test % | cold epochs "
        "| warm val % | warm test % | warm epochs |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in results["variants"]:
        cold, warm = row["cold"], row["warm"]
        lines.append(
            f"| {row['variant']} | {cold['val_acc'] * 100:.2f} | {cold['test_acc'] * 100:.2f} | "
            f"{int(cold['epochs'])} | {warm['val_acc'] * 100:.2f} | "
            f"{warm['test_acc'] * 100:.2f} | {int(warm['epochs'])} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="Cora")
    parser.add_argument("--data-root", default=None, help="(default: $GNNAAS_DATA)")
    parser.add_argument("--hidden", type=int, default=32, help="master hidden width (default 32)")
    parser.add_argument("--epochs", type=int, default=100, help="master epochs (default 100)")
    parser.add_argument("--out", default=str(RESULTS), help="(default: benchmarks/results)")
    parser.add_argument("--render", metavar="JSON", help="only rewrite master.md beside its JSON")
    args = parser.parse_args(argv)
    if args.render:
        render_saved(args.render, render)
        return 0
    save_results("master", run(args, argv), render, Path(args.out))
    return 0


if __name__ == "__main__":
    from common import exit_status

    raise SystemExit(exit_status(main))
