"""``gnnaas compact``, ``infer`` and ``precompute``: the live graph's log, exact passes."""

from __future__ import annotations

import argparse
from typing import Any

from gnnaas.cli.common import (
    _VARIANTS_HELP,
    _add_data_args,
    _load,
    _positive_int,
    _print_table,
    _progress,
    _say,
    _settings,
    _start,
)
from gnnaas.errors import ConfigError

__all__ = ["add_parsers"]


def _cmd_compact(args: argparse.Namespace) -> int:
    """Folds a live graph's write log into a new snapshot (the server must be stopped)."""
    state_dir = _settings(args).state_dir
    if state_dir is None:
        raise ConfigError("compact: pass --state-dir (or set GNNAAS_STATE_DIR), as for serve")
    from gnnaas.data.live import compact, state_folder

    _start(args, f"loading dataset {args.dataset}")
    store = _load(args)
    if not state_folder(state_dir, store.name).is_dir():
        raise ConfigError(
            f"compact: no live state of {store.name} under {state_dir} (nothing was written)"
        )
    summary = compact(store, state_dir)
    print(
        f"compacted {store.name}: version {summary['version']}, {summary['records']} log records "
        f"folded, {summary['num_nodes']:,} nodes, {summary['num_edges']:,} edges"
    )
    return 0


class _LayerBar:
    """The exact pass's progress: one bar of the graph's nodes per layer ("layer 1/2"), since the
    pass computes every node's state once per layer (a bar over nodes × layers would count twice
    the nodes of a two-layer model's graph)."""

    def __init__(self, desc: str, disable: bool) -> None:
        self.desc, self.disable = desc, disable
        self.bar: Any = None
        self.num_nodes = self.num_layers = self.layer = self.done = 0

    def start(self, num_nodes: int, num_layers: int) -> None:
        from tqdm.auto import tqdm

        self.num_nodes, self.num_layers, self.layer, self.done = num_nodes, num_layers, 1, 0
        self.bar = tqdm(
            total=num_nodes,
            desc=self._label(),
            unit="node",
            unit_scale=True,
            disable=self.disable,
        )

    def _label(self) -> str:
        return f"{self.desc} layer {self.layer}/{self.num_layers}"

    def update(self, nodes: int) -> None:
        if self.bar is None:
            return
        if self.done >= self.num_nodes and self.layer < self.num_layers:  # the next layer
            self.layer, self.done = self.layer + 1, 0
            self.bar.reset(total=self.num_nodes)
            self.bar.set_description(self._label())
        self.done += nodes
        self.bar.update(nodes)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _exact_run(args: argparse.Namespace, embeddings: bool) -> Any:
    """The exact pass of ``--variant`` (default: the most accurate by validation) with a bar."""
    from gnnaas.variants.exact import exact_pass
    from gnnaas.variants.repository import VariantRepository

    settings = _start(args, f"loading dataset {args.dataset}")
    store = _load(args)
    repo = VariantRepository(settings.variants_dir)
    variant = args.variant
    if variant is None:
        trained = [m for m in repo.list(store.name) if m.precomputed is None]
        if not trained:
            raise ConfigError(
                f"no variants of {store.name} in {repo.root}; run `gnnaas prepare --dataset "
                f"{store.name}` or pass --variants"
            )
        variant = max(trained, key=lambda m: m.metrics.get("val_acc", 0.0)).variant_id
    state_dir = settings.state_dir
    _say(args, f"exact layer-wise pass of {store.name}/{variant} ({args.backend})")
    bar = _LayerBar(f"{args.command} {variant}", disable=not _progress(args))
    try:
        return exact_pass(
            store,
            repo,
            variant,
            state_dir=state_dir,
            chunk_size=args.chunk_size,
            embeddings=embeddings,
            backend=args.backend,
            address=args.address,
            progress=bar.update,
            on_start=bar.start,
        )
    finally:
        bar.close()


def _print_exact(run: Any) -> None:
    print(
        f"{run.manifest.dataset}/{run.manifest.variant_id}: {run.num_nodes:,} nodes, "
        f"{run.num_edges:,} edges, graph version {run.graph_version}, {run.seconds:.2f} s "
        f"({run.num_nodes / max(run.seconds, 1e-9):,.0f} nodes/s), needs ~"
        f"{run.peak_bytes / 2**20:,.0f} MB beyond the features"
    )
    rows = [
        (split, f"{a['exact']:.2f}", f"{a['sampled']:.2f}", f"{a['exact'] - a['sampled']:+.2f}")
        for split, a in run.accuracy.items()
    ]
    if rows:
        _print_table(rows, ("split", "exact %", "sampled %", "exact - sampled"))


def _cmd_infer(args: argparse.Namespace) -> int:
    """Exact layer-wise inference over every node, written to Parquet."""
    from gnnaas.variants.exact import write_parquet

    if not str(args.out).endswith(".parquet"):
        raise ConfigError(f"--out must name a .parquet file (got {args.out!r})")
    run = _exact_run(args, embeddings=args.embeddings)
    path = write_parquet(run, args.out)
    _print_exact(run)
    print(f"wrote {run.num_nodes:,} rows -> {path} (sha256 {run.checksum()[:16]}...)")
    return 0


def _cmd_precompute(args: argparse.Namespace) -> int:
    """Stores a variant's exact answers as the variant ``<id>@exact``."""
    from gnnaas.variants.exact import precompute
    from gnnaas.variants.repository import VariantRepository

    run = _exact_run(args, embeddings=True)
    settings = _settings(args)
    manifest = precompute(VariantRepository(settings.variants_dir), run)
    _print_exact(run)
    # Profiled on the graph it answers for: the live one when it was computed on it.
    live = "" if settings.state_dir is None else f" --state-dir {settings.state_dir}"
    print(
        f"stored {manifest.variant_id}; profile it before serving: "
        f"gnnaas profile --dataset {manifest.dataset} --only {manifest.variant_id}{live}"
    )
    return 0


def add_parsers(sub: Any) -> None:
    """Adds ``compact``, ``infer`` and ``precompute`` to the subcommands ``sub``."""
    p = sub.add_parser(
        "compact",
        help="fold a live graph's write log into a new snapshot",
        description="Fold the write log of a live graph (written by `serve --state-dir`) into a "
        "new base snapshot, atomically, so that start-up replays nothing and the overlay is "
        "empty. Stop the server first (the state folder is locked while it runs).",
    )
    _add_data_args(p)
    p.add_argument(
        "--state-dir", default=None, help="the server's --state-dir (default: $GNNAAS_STATE_DIR)"
    )
    p.set_defaults(func=_cmd_compact)

    for name, helptext, description in (
        (
            "infer",
            "exact layer-wise inference over every node, to Parquet",
            "Run a variant over every node of the graph with full neighborhoods, one layer at a "
            "time over chunks of nodes (each node's hidden state computed once), and write one "
            "row per node (node, prediction, optionally embedding) to a Parquet file whose "
            "metadata holds the variant, the graph version and a sha256. Prints the exact and "
            "the sampled pass's accuracy on the validation and test nodes. Memory: the features, "
            "two layers' hidden states and one chunk.",
        ),
        (
            "precompute",
            "store a variant's exact answers as the routed variant <id>@exact",
            "Run the exact layer-wise pass of a variant and store every node's prediction and "
            "embedding as the variant <id>@exact: once profiled (`gnnaas profile --only "
            "<id>@exact`) the router serves it as a lookup when it is the fastest within a "
            "request's tolerance; nodes a live-graph write changed are served by the others.",
        ),
    ):
        p = sub.add_parser(name, help=helptext, description=description)
        _add_data_args(p)
        p.add_argument("--variants", default=None, help=_VARIANTS_HELP)
        p.add_argument(
            "--variant",
            default=None,
            help="the variant id (default: the most accurate by validation accuracy)",
        )
        if name == "infer":
            p.add_argument("--out", required=True, help="the .parquet file to write")
            p.add_argument(
                "--embeddings",
                action="store_true",
                help="also write each node's last hidden layer (the variant's hidden width)",
            )
        p.add_argument(
            "--chunk-size",
            type=_positive_int,
            default=16_384,
            help="target nodes per chunk; bounds the memory beyond two layers' states "
            "(default: 16384)",
        )
        p.add_argument(
            "--state-dir",
            default=None,
            help="run on the live graph of `serve --state-dir` as it is now (read only; "
            "default: $GNNAAS_STATE_DIR, else the dataset's graph)",
        )
        p.add_argument(
            "--backend",
            choices=("local", "ray"),
            default="local",
            help="local: this process; ray: Ray tasks over node ranges, one barrier per layer "
            "(extra [ray]) (default: local)",
        )
        p.add_argument(
            "--address",
            default=None,
            help="Ray cluster to join with --backend ray (default: start a local one)",
        )
        p.set_defaults(func=_cmd_infer if name == "infer" else _cmd_precompute)
