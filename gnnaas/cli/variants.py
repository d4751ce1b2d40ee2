"""``gnnaas train``, ``gnnaas generate`` and ``gnnaas variants add``: models into the repository."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gnnaas.cli.common import (
    _VARIANTS_HELP,
    _add_data_args,
    _add_epochs,
    _load,
    _positive_int,
    _print_table,
    _progress,
    _say,
    _settings,
    _start,
)
from gnnaas.errors import ConfigError
from gnnaas.variants.progress import LONG_PLAN_S

__all__ = ["add_parsers"]

# The serving default leaves random out: its variants are below greedy's and lasso's at every
# prune factor (benchmarks/results/variants-cora-rankings.md), so they never reach the frontier
# a tolerance picks from; `--ranking random greedy lasso` generates the reference study's set.
_DEFAULT_RANKINGS = ("greedy", "lasso")
_DEFAULT_ARCHS = ("sage", "gin")
_DEFAULT_PRUNE = (1, 2, 4, 8)


def _train_config(args: argparse.Namespace) -> Any:
    from gnnaas.variants.training import TrainConfig

    return TrainConfig(seed=args.seed, max_epochs=args.epochs)


def _cmd_train(args: argparse.Namespace) -> int:
    settings = _start(args, f"loading dataset {args.dataset}")
    from gnnaas.utils import resolve_device
    from gnnaas.variants.training import train_model

    device = resolve_device(settings.device)
    _check_archs([args.arch])  # before the dataset loads
    store = _load(args)
    _say(args, f"training {args.arch} on {store.name} ({device})")
    result = train_model(
        store, args.arch, _train_config(args), device=device, progress=_progress(args)
    )
    print(f"dataset: {store.name}")
    print(f"arch: {args.arch}")
    print(f"device: {device}")
    print(f"epochs: {result.epochs}")
    print(f"train_time_s: {result.train_time_s:.2f}")
    print(f"val_acc: {result.val_acc:.4f}")
    print(f"test_acc: {result.test_acc:.4f}")
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    if bool(args.from_model) != bool(args.model_config):
        raise ConfigError("--from-model and --model-config go together (weights, config)")
    settings = _start(args, f"loading dataset {args.dataset}", options={"variants_dir": "--out"})
    from gnnaas.utils import resolve_device
    from gnnaas.variants.pipeline import generate_variants
    from gnnaas.variants.repository import VariantRepository

    device = resolve_device(settings.device)
    plan = _plan_options(args, args.arch)  # before the dataset loads
    store = _load(args)
    out = settings.variants_dir
    repo = VariantRepository(out)
    archs, force, warm = args.arch, args.force, bool(args.warm_start)
    if args.from_model:
        from gnnaas.variants.master import import_master

        _say(args, f"checking and evaluating your model {args.from_model} on {store.name}")
        manifest, _ = import_master(
            store,
            repo,
            args.from_model,
            args.model_config,
            seed=settings.seed,
            device=str(device),
            force=force,
        )
        _say(
            args,
            f"stored it as {manifest.variant_id}: val_acc "
            f"{100 * manifest.metrics['val_acc']:.2f}%, test_acc "
            f"{100 * manifest.metrics['test_acc']:.2f}% (served pipeline)",
        )
        # Its arch only; its pruned variants are stale now whatever is stored.
        archs, force = [manifest.arch], True
        warm = args.warm_start is not False
    _say(args, f"generating variants of {store.name} on {device} into {out}")
    rows = generate_variants(
        store,
        repo,
        archs=archs,
        prunes=args.prune,
        config=_train_config(args),
        device=device,
        force=force,
        progress=_progress(args),
        warm_start=warm,
        **plan,
    )
    _print_generated(rows)
    return 0


def _check_archs(archs: Sequence[str]) -> None:
    """Refuses an unknown architecture (one :class:`ConfigError` line)."""
    from gnnaas.models import Arch

    for arch in archs:
        Arch.parse(arch)


def _plan_options(args: argparse.Namespace, archs: Sequence[str]) -> dict[str, Any]:
    """``generate_variants``'s ``rankings`` and axis arguments (``--ranking``, ``--axes``,
    ``--fanouts``, ``--width-divisors``, ``--near``), checked with ``archs`` before the dataset
    loads, so that a typo fails in a moment rather than after loading a large graph. (A prune
    factor above the number of features needs the dataset: ``generate_variants`` checks it.)

    Raises:
        ConfigError: an unknown architecture, ranking or axis, or malformed fanouts.
    """
    from gnnaas.variants.axes import parse_axes
    from gnnaas.variants.ranking import Ranking

    _check_archs(archs)
    rankings = [Ranking.parse(r).value for r in args.ranking]

    fanout_sets = None
    if args.fanouts is not None:
        fanout_sets = []
        for text in args.fanouts:
            try:
                values = tuple(int(v) for v in text.split("."))
            except ValueError:
                raise ConfigError(
                    f"--fanouts takes dotted fanouts per set, e.g. 10.5 (got {text!r})"
                ) from None
            if any(v < 1 for v in values):
                raise ConfigError(f"--fanouts values must be >= 1 (got {text!r})")
            fanout_sets.append(values)
    return {
        "rankings": rankings,
        "axes": parse_axes(args.axes),
        "near": args.near,
        "width_divisors": args.width_divisors,
        "fanout_sets": fanout_sets,
        "sampler_seed": _settings(args).seed,
    }


def _print_generated(rows: Sequence[Any]) -> None:
    _print_table(
        [
            (
                r.variant_id,
                r.features_kept,
                f"{100 * r.val_acc:.2f}",
                f"{r.train_time_s:.1f}",
                r.status,
                r.base,
            )
            for r in rows
        ],
        ("variant", "features", "val_acc_%", "time_s", "status", "from"),
    )


def _cmd_variants_add(args: argparse.Namespace) -> int:
    settings = _start(args, f"loading dataset {args.dataset}")
    from gnnaas.utils import resolve_device
    from gnnaas.variants.master import add_user_variant
    from gnnaas.variants.repository import VariantRepository

    device = resolve_device(settings.device)
    store = _load(args)
    out = settings.variants_dir
    _say(args, f"checking and evaluating {args.weights} on {store.name}")
    manifest = add_user_variant(
        store,
        VariantRepository(out),
        args.weights,
        args.model_config,
        args.kept_features,
        seed=settings.seed,
        device=str(device),
        force=args.force,
    )
    print(f"variant: {manifest.variant_id}")
    print(f"features_kept: {manifest.in_channels} of {manifest.num_features}")
    print(f"val_acc: {manifest.metrics['val_acc']:.4f}")
    print(f"test_acc: {manifest.metrics['test_acc']:.4f}")
    print(f"stored: {Path(out) / store.name / manifest.variant_id}")
    print(
        f"next: gnnaas profile --dataset {store.name} --only {manifest.variant_id}, then reload "
        "a running server (SIGHUP or POST /v1/admin/reload)"
    )
    return 0


def _add_plan_args(p: argparse.ArgumentParser) -> None:
    """The options of the variant plan (``generate`` and ``prepare``)."""
    from gnnaas.variants.axes import AXES, DEFAULT_AXES, DEFAULT_NEAR, DEFAULT_WIDTH_DIVISORS

    p.add_argument(
        "--ranking",
        nargs="+",
        default=list(_DEFAULT_RANKINGS),
        help="feature rankings: random, greedy and/or lasso (default: greedy lasso)",
    )
    p.add_argument(
        "--prune",
        nargs="+",
        type=_positive_int,
        default=list(_DEFAULT_PRUNE),
        help="prune factors k: keep f/k features (default: 1 2 4 8)",
    )
    p.add_argument(
        "--axes",
        nargs="+",
        default=list(DEFAULT_AXES),
        metavar="AXIS",
        help=f"variant axes: {', '.join(AXES)} (features: the trained prune factors; width: "
        "narrower models distilled from the most accurate; fanouts: the same weights sampled "
        "with smaller fanouts where they bind on this graph; precision: int8 twins where int8 "
        f"is faster here) (default: {' '.join(DEFAULT_AXES)})",
    )
    p.add_argument(
        "--fanouts",
        nargs="+",
        default=None,
        metavar="F",
        help="serving fanout sets of the fanouts axis, dotted per layer, e.g. 10.10 10.5 "
        "(default: chosen from the graph's degrees)",
    )
    p.add_argument(
        "--width-divisors",
        nargs="+",
        type=_positive_int,
        default=None,
        metavar="D",
        help=f"distilled widths are the hidden width divided by each D "
        f"(default: {' '.join(str(d) for d in DEFAULT_WIDTH_DIVISORS)})",
    )
    p.add_argument(
        "--near",
        type=float,
        default=None,
        metavar="POINTS",
        help="trained variants within POINTS validation points of the most accurate get fanout "
        f"variants (default: {DEFAULT_NEAR:g})",
    )


def add_parsers(sub: Any) -> None:
    """Adds ``train``, ``generate`` and ``variants`` to the subcommands ``sub``."""
    _add_train_parser(sub)
    _add_generate_parser(sub)
    _add_variants_parser(sub)


def _add_train_parser(sub: Any) -> None:
    p = sub.add_parser(
        "train",
        help="train one full-feature model and print its accuracy",
        description="Train one full-feature model and print its validation and test accuracy.",
    )
    _add_data_args(p)
    p.add_argument("--arch", default="sage", help="architecture: sage or gin (default: sage)")
    _add_epochs(p)
    p.set_defaults(func=_cmd_train)


def _add_generate_parser(sub: Any) -> None:
    p = sub.add_parser(
        "generate",
        help="train the 1x model, rank features, train pruned variants",
        description="Train the 1x model, rank its input features and train the pruned variants "
        "into the variant repository; variants already there are kept unless --force. Each "
        "model's epochs are shown as they finish (loss, validation accuracy, seconds per epoch), "
        f"and a plan that may train for more than {LONG_PLAN_S / 60:g} minutes says so after its "
        "first epoch, with an estimate.",
    )
    _add_data_args(p)
    p.add_argument(
        "--arch",
        nargs="+",
        default=list(_DEFAULT_ARCHS),
        help="architectures: sage and/or gin (default: sage gin)",
    )
    _add_plan_args(p)
    p.add_argument("--out", default=None, help=_VARIANTS_HELP)
    _add_epochs(p)
    p.add_argument("--force", action="store_true", help="retrain variants that already exist")
    p.add_argument(
        "--from-model",
        metavar="FILE",
        default=None,
        help="your trained PyG GraphSAGE or GIN state dict (.safetensors) as the 1x model; its "
        "pruned variants are ranked from it and (re)trained in its layout",
    )
    p.add_argument(
        "--model-config",
        metavar="FILE",
        default=None,
        help='JSON for --from-model: {"class": "GraphSAGE"|"GIN", "in_channels", '
        '"hidden_channels", "num_layers", "out_channels"[, "dropout"]}',
    )
    p.add_argument(
        "--warm-start",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="start each pruned variant from the 1x model's weights on its kept features "
        "(default: on with --from-model, off otherwise)",
    )
    p.set_defaults(func=_cmd_generate)


def _add_variants_parser(sub: Any) -> None:
    p = sub.add_parser(
        "variants",
        help="manage the variant repository (add a variant you trained)",
        description="Manage the variant repository.",
    )
    vsub = p.add_subparsers(dest="variants_command", metavar="ACTION", required=True)
    p = vsub.add_parser(
        "add",
        help="add a pruned variant you trained (PyG GraphSAGE/GIN) on features you chose",
        description="Check, evaluate and store a pruned variant you trained, as "
        "<arch>-user-<k>x (k = features / kept); profile it with `gnnaas profile --only ID`.",
    )
    _add_data_args(p)
    p.add_argument("--variants", default=None, help=_VARIANTS_HELP)
    p.add_argument("--weights", required=True, metavar="FILE", help="state dict, .safetensors")
    p.add_argument(
        "--model-config", required=True, metavar="FILE", help="JSON, as for generate --from-model"
    )
    p.add_argument(
        "--kept-features",
        required=True,
        metavar="FILE",
        help="the model's input columns: a JSON list or .npy of feature ids, in its input order",
    )
    p.add_argument("--force", action="store_true", help="replace a variant with the same id")
    p.set_defaults(func=_cmd_variants_add)
