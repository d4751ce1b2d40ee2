"""A user's PyG master model through ``generate --from-model``: cold vs warm-started variants.

Trains ``torch_geometric.nn.models.GraphSAGE`` the way a plain PyG script does (full graph, the
dataset's training nodes, Adam), saves it as safetensors, imports it as the 1× variant
(:func:`gnnaas.variants.master.import_master`, evaluated on the serving path) and generates the
pruned variants twice from it: initialized at random ("cold") and warm-started from the master's
weights restricted to the kept features ("warm"). Prints and writes the validation and test
accuracy, epochs and training time of every variant.

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

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch_geometric.nn.models import GraphSAGE

from gnnaas.data import load_dataset
from gnnaas.variants.master import import_master
from gnnaas.variants.pipeline import generate_variants
from gnnaas.variants.repository import VariantRepository
from gnnaas.variants.training import TrainConfig

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_router import machine_info  # noqa: E402


def train_plain_pyg(store, hidden: int, epochs: int) -> tuple[GraphSAGE, float]:  # type: ignore[no-untyped-def]
    """Full-graph GraphSAGE on the training nodes; its own full-graph test accuracy."""
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="Cora")
    parser.add_argument("--data-root", default=None, help="(default: $GNNAAS_DATA)")
    parser.add_argument("--hidden", type=int, default=32, help="master hidden width (default 32)")
    parser.add_argument("--epochs", type=int, default=100, help="master epochs (default 100)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "master.md"))
    args = parser.parse_args(argv)
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
    runs = {}
    for warm in (False, True):
        repo = VariantRepository(tmp / ("warm" if warm else "cold"))
        manifest, _ = import_master(store, repo, weights, config)
        start = time.perf_counter()
        rows = generate_variants(store, repo, archs=["sage"], config=TrainConfig(), warm_start=warm)
        total = time.perf_counter() - start
        runs[warm] = (
            manifest,
            total,
            [(r, repo.manifest(store.name, r.variant_id)) for r in rows[1:]],
        )
        print(f"{'warm' if warm else 'cold'}: {total:.1f} s", file=sys.stderr)
    master = runs[False][0]
    machine = machine_info()
    lines = [
        f"# A PyG master model's variants, cold vs warm start ({store.name})",
        "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores, torch {torch.__version__}, "
        "one torch thread. Command: `python benchmarks/bench_master.py "
        + " ".join(sys.argv[1:] if argv is None else argv)
        + "`.",
        "",
        f"Master: PyG `GraphSAGE` (hidden {args.hidden}, 2 layers) trained {args.epochs} epochs "
        f"in a plain PyG script: its own full-graph test accuracy **{script_acc * 100:.2f} %**; "
        f"imported as `{master.variant_id}`, served with sampled (25, 10) neighborhoods: val "
        f"{master.metrics['val_acc'] * 100:.2f} %, "
        f"test **{master.metrics['test_acc'] * 100:.2f} %**.",
        "",
        f"Pruned variants (default `TrainConfig`, early stopping on validation): cold "
        f"{runs[False][1]:.1f} s in all, warm {runs[True][1]:.1f} s.",
        "",
        "| variant | cold val % | cold test % | cold epochs "
        "| warm val % | warm test % | warm epochs |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (_, cold), (_, warm) in zip(runs[False][2], runs[True][2], strict=True):
        lines.append(
            f"| {cold.variant_id} | {cold.metrics['val_acc'] * 100:.2f} | "
            f"{cold.metrics['test_acc'] * 100:.2f} | {int(cold.metrics['epochs'])} | "
            f"{warm.metrics['val_acc'] * 100:.2f} | {warm.metrics['test_acc'] * 100:.2f} | "
            f"{int(warm.metrics['epochs'])} |"
        )
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
