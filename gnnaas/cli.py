"""The ``gnnaas`` command: datasets, train, generate, profile, report, prepare, serve.

Every command prints one line ``ErrorName: message`` and exits 1 on a user error; ``--debug``
shows the traceback instead. Heavy modules are imported inside the commands so ``gnnaas --help``
stays fast.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gnnaas.errors import GnnaasError

__all__ = ["main"]

_log = logging.getLogger("gnnaas")

_DEFAULT_RANKINGS = ("random", "greedy", "lasso")
_DEFAULT_ARCHS = ("sage", "gin")
_DEFAULT_PRUNE = (1, 2, 4, 8)


def _progress() -> bool:
    return sys.stderr.isatty()


def _print_table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> None:
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for i, row in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))


# ----------------------------------------------------------------------------------------------
# commands


def _cmd_datasets(args: argparse.Namespace) -> int:
    from gnnaas.data import list_datasets

    rows = [
        (d.name, d.num_nodes, d.num_edges, d.num_features, d.num_classes, d.multi_label, d.source)
        for d in list_datasets()
    ]
    _print_table(rows, ("name", "nodes", "edges", "features", "classes", "multi-label", "source"))
    return 0


def _load(args: argparse.Namespace) -> Any:
    from gnnaas.data import load_dataset

    return load_dataset(args.dataset, args.data_root, seed=args.seed)


def _train_config(args: argparse.Namespace) -> Any:
    from gnnaas.variants.training import TrainConfig

    return TrainConfig(seed=args.seed, max_epochs=args.epochs)


def _cmd_train(args: argparse.Namespace) -> int:
    from gnnaas.utils import resolve_device
    from gnnaas.variants.training import train_model

    device = resolve_device(args.device)
    store = _load(args)
    result = train_model(store, args.arch, _train_config(args), device=device, progress=_progress())
    print(f"dataset: {store.name}")
    print(f"arch: {args.arch}")
    print(f"device: {device}")
    print(f"epochs: {result.epochs}")
    print(f"train_time_s: {result.train_time_s:.2f}")
    print(f"val_acc: {result.val_acc:.4f}")
    print(f"test_acc: {result.test_acc:.4f}")
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    from gnnaas.utils import resolve_device
    from gnnaas.variants.pipeline import generate_variants
    from gnnaas.variants.repository import VariantRepository

    device = resolve_device(args.device)
    store = _load(args)
    rows = generate_variants(
        store,
        VariantRepository(args.out),
        archs=args.arch,
        rankings=args.ranking,
        prunes=args.prune,
        config=_train_config(args),
        device=device,
        force=args.force,
        progress=_progress(),
    )
    _print_table(
        [
            (
                r.variant_id,
                r.features_kept,
                f"{100 * r.val_acc:.2f}",
                f"{r.train_time_s:.1f}",
                r.status,
            )
            for r in rows
        ],
        ("variant", "features", "val_acc_%", "train_s", "status"),
    )
    return 0


def _cmd_profile(args: argparse.Namespace) -> int:
    from gnnaas.profiling.profiler import profile_dataset
    from gnnaas.utils import resolve_device
    from gnnaas.variants.repository import VariantRepository

    device = resolve_device(args.device)
    store = _load(args)
    result = profile_dataset(
        store,
        VariantRepository(args.variants),
        Path(args.out),
        batch_size=args.batch_size,
        runs=args.runs,
        device=device,
        progress=_progress(),
    )
    for variant_id, reason in result.skipped:
        print(f"skipped {variant_id}: {reason}")
    print(f"profiled {result.num_profiled} variants -> {result.path}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from gnnaas.profiling.report import write_report

    path = write_report(Path(args.profiles) / args.dataset)
    print(f"report -> {path}")
    return 0


def _cmd_prepare(args: argparse.Namespace) -> int:
    """Generates and profiles default variants for a dataset unless they already exist."""
    from gnnaas.profiling.profiler import profile_dataset
    from gnnaas.profiling.table import has_profiles
    from gnnaas.utils import resolve_device
    from gnnaas.variants.pipeline import generate_variants
    from gnnaas.variants.repository import VariantRepository

    device = resolve_device(args.device)
    repo = VariantRepository(args.variants)
    store = _load(args)
    generate_variants(
        store,
        repo,
        archs=_DEFAULT_ARCHS,
        rankings=_DEFAULT_RANKINGS,
        prunes=_DEFAULT_PRUNE,
        config=_train_config(args),
        device=device,
        force=False,
        progress=_progress(),
    )
    if not has_profiles(Path(args.profiles) / store.name, repo.list(store.name)):
        profile_dataset(
            store,
            repo,
            Path(args.profiles),
            batch_size=1024,
            runs=args.runs,
            device=device,
            progress=_progress(),
        )
    print(f"ready: {len(repo.list(store.name))} variants of {store.name}")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn
    from pydantic import ValidationError

    from gnnaas.errors import ConfigError
    from gnnaas.serving.app import create_app
    from gnnaas.serving.settings import Settings

    overrides: dict[str, Any] = {
        "variants_dir": args.variants,
        "profiles_dir": args.profiles,
        "device": args.device,
    }
    if args.data_root is not None:
        overrides["data_root"] = args.data_root
    if args.dataset:
        overrides["datasets"] = args.dataset
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "settings"
        raise ConfigError(
            f"serve: {where}: {first['msg']} (check --options and GNNAAS_* variables)"
        ) from None
    app = create_app(settings)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info", access_log=False)
    return 0


# ----------------------------------------------------------------------------------------------
# parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 (got {text!r})") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 (got {text!r})")
    return value


def _add_data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", required=True, help="dataset name (see `gnnaas datasets`)")
    p.add_argument(
        "--data-root",
        default=os.environ.get("GNNAAS_DATA"),
        help="folder holding <Class>/<Name>/raw/ of real datasets (default: $GNNAAS_DATA)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed for splits, sampling, init (default: 0)"
    )
    p.add_argument(
        "--device", default="auto", help="auto (CUDA when present), cpu or cuda (default: auto)"
    )


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gnnaas",
        description="Model-less GNN inference: generate, profile, serve feature-pruned variants.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress at INFO level")
    parser.add_argument(
        "--threads",
        type=_positive_int,
        default=None,
        help="torch intra-op threads (default: torch's choice; 1 is faster on a busy machine)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("datasets", help="list the datasets gnnaas knows")
    p.set_defaults(func=_cmd_datasets)

    p = sub.add_parser("train", help="train one full-feature model and print its accuracy")
    _add_data_args(p)
    p.add_argument("--arch", default="sage", help="sage or gin (default: sage)")
    p.add_argument("--epochs", type=_positive_int, default=200, help="max epochs (default: 200)")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("generate", help="train the 1x model, rank features, train pruned variants")
    _add_data_args(p)
    p.add_argument("--arch", nargs="+", default=list(_DEFAULT_ARCHS), help="sage and/or gin")
    p.add_argument(
        "--ranking", nargs="+", default=list(_DEFAULT_RANKINGS), help="random greedy lasso"
    )
    p.add_argument(
        "--prune",
        nargs="+",
        type=_positive_int,
        default=list(_DEFAULT_PRUNE),
        help="prune factors k: keep f/k features (default: 1 2 4 8)",
    )
    p.add_argument("--out", default="variants", help="variant repository (default: variants)")
    p.add_argument("--epochs", type=_positive_int, default=200, help="max epochs (default: 200)")
    p.add_argument("--force", action="store_true", help="retrain variants that already exist")
    p.set_defaults(func=_cmd_generate)

    p = sub.add_parser("profile", help="profile every variant of a dataset")
    _add_data_args(p)
    p.add_argument("--variants", default="variants", help="variant repository (default: variants)")
    p.add_argument("--out", default="profiles", help="profiles folder (default: profiles)")
    p.add_argument("--batch-size", type=_positive_int, default=1024, help="(default: 1024)")
    p.add_argument("--runs", type=_positive_int, default=30, help="timed runs (default: 30)")
    p.set_defaults(func=_cmd_profile)

    p = sub.add_parser("report", help="write report.md and plots from a dataset's profiles")
    p.add_argument("--dataset", required=True, help="dataset name")
    p.add_argument("--profiles", default="profiles", help="profiles folder (default: profiles)")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("prepare", help="generate and profile default variants unless present")
    _add_data_args(p)
    p.add_argument("--variants", default="variants", help="variant repository (default: variants)")
    p.add_argument("--profiles", default="profiles", help="profiles folder (default: profiles)")
    p.add_argument("--epochs", type=_positive_int, default=200, help="max epochs (default: 200)")
    p.add_argument("--runs", type=_positive_int, default=10, help="timed runs (default: 10)")
    p.set_defaults(func=_cmd_prepare)

    p = sub.add_parser("serve", help="serve every profiled dataset over HTTP")
    p.add_argument("--variants", default="variants", help="variant repository (default: variants)")
    p.add_argument("--profiles", default="profiles", help="profiles folder (default: profiles)")
    p.add_argument(
        "--data-root",
        default=os.environ.get("GNNAAS_DATA"),
        help="folder holding real datasets (default: $GNNAAS_DATA)",
    )
    p.add_argument("--dataset", nargs="*", help="serve only these datasets (default: all)")
    p.add_argument("--host", default="127.0.0.1", help="(default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="(default: 8000)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda (default: auto)")
    p.set_defaults(func=_cmd_serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gnnaas`` console script."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    func: Callable[[argparse.Namespace], int] = args.func
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    try:
        return func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (GnnaasError, FileNotFoundError, PermissionError) as exc:
        if args.debug:
            raise
        red, reset = ("\033[31m", "\033[0m") if sys.stderr.isatty() else ("", "")
        print(f"{red}{type(exc).__name__}: {exc}{reset}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
