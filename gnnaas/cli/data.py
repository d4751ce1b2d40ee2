"""``gnnaas datasets`` and ``gnnaas import``: the datasets gnnaas knows, and your own graph."""

from __future__ import annotations

import argparse
from typing import Any

from gnnaas.cli.common import _add_quiet, _print_table, _say, _start

__all__ = ["add_parsers"]


def _cmd_datasets(args: argparse.Namespace) -> int:
    _start(args)
    from gnnaas.data import list_datasets

    # A synthetic graph never built here has only its preset's target edge count: "~".
    rows = [
        (
            d.name,
            d.num_nodes,
            d.num_edges if d.edges_exact else f"~{d.num_edges}",
            d.num_features,
            d.num_classes,
            d.multi_label,
            d.source,
        )
        for d in list_datasets()
    ]
    _print_table(rows, ("name", "nodes", "edges", "features", "classes", "multi-label", "source"))
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    settings = _start(args, f"importing {args.name}")
    from gnnaas.data import import_graph

    result = import_graph(
        args.name,
        edges=args.edges,
        features=args.features,
        labels=args.labels,
        splits=args.splits,
        from_pyg=args.from_pyg,
        undirected=args.undirected,
        multi_label=args.multi_label,
        force=args.force,
        home=settings.home_dir,
        on_phase=lambda message: _say(args, message),
    )
    train, val, test = result.split_sizes
    split = f"{result.split} (train {train}, val {val}, test {test})"
    if result.split_replaced:
        split += "; the given split trains on fewer than 10% of nodes, so it is not used"
    print(f"dataset: {result.name}")
    print(f"nodes: {result.num_nodes}")
    print(f"edges: {result.num_edges}")
    print(f"features: {result.num_features}")
    print(f"classes: {result.num_classes}{' (multi-label)' if result.multi_label else ''}")
    print(f"isolated_nodes: {result.num_isolated}")
    print(f"split: {split}")
    print(f"store: {result.path}")
    print(f"import_time_s: {result.import_time_s:.2f}")
    return 0


def add_parsers(sub: Any) -> None:
    """Adds ``datasets`` and ``import`` to the subcommands ``sub``."""
    p = sub.add_parser(
        "datasets", help="list the datasets gnnaas knows", description="List known datasets."
    )
    p.set_defaults(func=_cmd_datasets)

    p = sub.add_parser(
        "import",
        help="check and store your own graph as a dataset",
        description="Check a graph given as files and store it as dataset NAME under gnnaas's data "
        "home ($GNNAAS_HOME, default ~/.local/share/gnnaas); afterwards NAME works wherever a "
        "dataset name does. Nothing is written when a check fails.",
    )
    p.add_argument("name", metavar="NAME", help="name of the new dataset (case-insensitive)")
    p.add_argument(
        "--edges", default=None, help="CSV or Parquet edge table with integer columns src,dst"
    )
    p.add_argument(
        "--features", default=None, help="node features: .npy [N, F] or Parquet, one row per node"
    )
    p.add_argument(
        "--labels",
        default=None,
        help="node labels: .npy [N] class ids or [N, C] 0/1, or CSV/Parquet with a label column",
    )
    p.add_argument(
        "--splits",
        default=None,
        help='JSON {"train": [...], "val": [...], "test": [...]} or CSV/Parquet with a split '
        "column (default: seeded, stratified 60/20/20)",
    )
    p.add_argument(
        "--from-pyg",
        default=None,
        metavar="FILE",
        help="instead of the files above: a PyG Data saved as safetensors (x, edge_index, y, "
        "optional train_mask/val_mask/test_mask)",
    )
    p.add_argument(
        "--undirected", action="store_true", help="add every edge in both directions, once"
    )
    p.add_argument(
        "--multi-label", action="store_true", help="labels are an [N, C] 0/1 matrix (.npy)"
    )
    p.add_argument("--force", action="store_true", help="replace a dataset imported as NAME")
    _add_quiet(p)
    p.set_defaults(func=_cmd_import)
