"""``gnnaas profile``, ``report``, ``cache-plan`` and ``prepare``: timings, plots, cache plans."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from gnnaas.cli.common import (
    _PROFILES_HELP,
    _VARIANTS_HELP,
    _add_data_args,
    _add_epochs,
    _add_quiet,
    _load,
    _pipeline,
    _positive_int,
    _print_table,
    _progress,
    _say,
    _start,
)
from gnnaas.cli.variants import (
    _DEFAULT_ARCHS,
    _DEFAULT_PRUNE,
    _add_plan_args,
    _plan_options,
    _train_config,
)
from gnnaas.errors import ConfigError

__all__ = ["add_parsers"]


def _cmd_profile(args: argparse.Namespace) -> int:
    settings = _start(args, f"loading dataset {args.dataset}", options={"profiles_dir": "--out"})
    from gnnaas.profiling.profiler import profile_dataset
    from gnnaas.utils import resolve_device
    from gnnaas.variants.repository import VariantRepository

    device = resolve_device(settings.device)
    store, version = _load(args), 0
    if settings.state_dir is not None:
        store, version = _live(args, store, settings.state_dir)
    out = settings.profiles_dir
    _say(args, f"profiling the variants of {store.name} on {device} into {out}")
    result = profile_dataset(
        store,
        VariantRepository(settings.variants_dir),
        out,
        batch_size=args.batch_size,
        runs=args.runs,
        device=device,
        progress=_progress(args),
        only=args.only,
        on_phase=lambda message: _say(args, message),
        graph_version=version,
        state_dir=settings.state_dir if version else None,
        **_pipeline(settings, device),
    )
    for variant_id, reason in result.skipped:
        print(f"skipped {variant_id}: {reason}")
    if args.only:
        print(
            f"timed {len(args.only)} variant(s), re-scored {result.num_profiled} for the paired "
            f"intervals -> {result.path}"
        )
    else:
        print(f"profiled {result.num_profiled} variants -> {result.path}")
    return 0


def _live(args: argparse.Namespace, store: Any, state_dir: Path) -> tuple[Any, int]:
    """``profile --state-dir``: the dataset as its live graph holds it now, and its version
    (every variant is profiled on it: a precomputed one's answers of that version cover its
    nodes, the others are timed on the graph they are served on); the dataset itself (version
    0) when nothing was written yet."""
    from gnnaas.data.live import live_store, state_folder

    if not state_folder(state_dir, store.name).is_dir():
        _say(args, f"no live state of {store.name} under {state_dir} yet: its graph as loaded")
        return store, 0
    live, version = live_store(store, state_dir)
    _say(
        args,
        f"live graph of {store.name} under {state_dir}: version {version}, "
        f"{live.num_nodes:,} nodes, {live.num_edges:,} edges",
    )
    return live, version


def _cmd_report(args: argparse.Namespace) -> int:
    margin = args.tie_margin
    if margin is not None:
        bad = ConfigError(
            f"report: --tie-margin must be a number in [0, 10], as the server's (got {margin!r})"
        )
        try:
            value = float(margin)
        except ValueError:
            raise bad from None
        if not 0 <= value <= 10:  # also rejects NaN
            raise bad
    settings = _start(args)  # else $GNNAAS_TIE_MARGIN, checked there
    from gnnaas.profiling.report import write_report

    path = write_report(settings.profiles_dir / args.dataset, tie_margin=settings.tie_margin)
    print(f"report -> {path}")
    return 0


def _budget_mb(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"cache-plan: --budget-mb must be a number of MB > 0 (got {text!r})")
    return value


def _plan_seeds(path: str, num_nodes: int) -> Any:
    """Recorded traffic seeds: a ``.npy`` array or a text file of node ids (whitespace or commas;
    ``#`` starts a comment)."""
    import numpy as np
    import torch

    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"cache-plan: --seeds {path!r} is not a file")
    try:
        if file.suffix == ".npy":
            values = np.load(file, allow_pickle=False)
        else:
            lines = (line.split("#", 1)[0] for line in file.read_text().splitlines())
            words = " ".join(lines).replace(",", " ").split()
            values = np.array([int(w) for w in words], dtype=np.int64)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"cache-plan: --seeds {path!r} is not a .npy array or a text file of node ids ({exc})"
        ) from None
    if values.ndim != 1 or values.size == 0 or not np.issubdtype(values.dtype, np.integer):
        raise ConfigError(
            f"cache-plan: --seeds {path!r} must hold a non-empty 1-D list of integer node ids "
            f"(got shape {values.shape}, dtype {values.dtype})"
        )
    bad = values[(values < 0) | (values >= num_nodes)]
    if bad.size:
        raise ConfigError(
            f"cache-plan: --seeds {path!r} has ids outside [0, {num_nodes}), e.g. {int(bad[0])}"
        )
    return torch.from_numpy(values.astype(np.int64))


def _cmd_cache_plan(args: argparse.Namespace) -> int:
    budget_mb = _budget_mb(args.budget_mb)
    settings = _start(args, f"loading dataset {args.dataset}")
    from gnnaas.profiling.cacheplan import PlannedVariant, plan_cache, write_cache_plan
    from gnnaas.variants.repository import VariantRepository

    store = _load(args)
    repo = VariantRepository(settings.variants_dir)
    manifests = repo.list(store.name)
    element = store.x.element_size()
    variants: list[PlannedVariant] = []
    for m in manifests:
        if m.precomputed is not None:
            print(f"skipped {m.variant_id}: precomputed (its answers are looked up, no features)")
        elif m.num_features != store.num_features:
            print(
                f"skipped {m.variant_id}: trained on {m.num_features} features, "
                f"{store.name} has {store.num_features}"
            )
        else:
            variants.append(PlannedVariant(m.variant_id, m.in_channels, tuple(m.fanouts), element))
    if manifests and not variants:
        raise ConfigError(f"cache-plan: no variant of {store.name} in {repo.root} reads features")
    if not manifests:
        prunes = " ".join(str(k) for k in _DEFAULT_PRUNE)
        print(
            f"variants: none of {store.name} in {repo.root}; planned for the default prune "
            f"factors {prunes} at fanouts (25, 10)"
        )
        variants = [
            PlannedVariant(f"{k}x", max(1, store.num_features // k), (25, 10), element)
            for k in _DEFAULT_PRUNE
        ]
    if args.seeds is not None:
        seeds, seeds_name = _plan_seeds(args.seeds, store.num_nodes), Path(args.seeds).name
    else:
        seeds, seeds_name = store.val_idx, "val"
        if seeds.numel() == 0:
            raise ConfigError(
                f"cache-plan: {store.name} has no validation nodes; pass --seeds FILE "
                "(recorded traffic)"
            )
    pipeline = _pipeline(settings)
    budget_bytes = int(budget_mb * 2**20)
    full_bytes = store.num_nodes * store.num_features * element
    _say(args, f"counting the feature reads of {seeds.numel()} seeds ({seeds_name})")
    plan = plan_cache(
        store,
        variants,
        budget_bytes,
        seeds=seeds,
        seeds_name=seeds_name,
        by=args.by,
        batch_size=args.batch_size,
        sampler_seed=pipeline["sampler_seed"],
        progress=_progress(args),
    )
    table, ranking = write_cache_plan(plan, settings.profiles_dir / store.name)
    print(
        f"dataset: {store.name} ({store.num_nodes:,} nodes, {store.num_features} features, "
        f"{full_bytes / 2**20:,.1f} MB of 1x features)"
    )
    print(
        f"budget_mb: {budget_mb:g} per variant ({budget_bytes / full_bytes:.3f} of the 1x features)"
    )
    print(
        f"seeds: {seeds_name} ({seeds.numel():,} nodes, batches of {args.batch_size}), "
        f"ranked by {args.by}, sampler seed {pipeline['sampler_seed']}"
    )
    _print_table(
        [(r.variant, r.features_kept, r.cached_nodes, f"{r.hit_ratio:.4f}") for r in plan.rows],
        ("variant", "features_kept", "cached_nodes", "hit_ratio"),
    )
    print(f"wrote {table} and {ranking.name}")
    return 0


def _cmd_prepare(args: argparse.Namespace) -> int:
    """Generates and profiles default variants for a dataset unless they already exist."""
    settings = _start(args, f"loading dataset {args.dataset}")
    from gnnaas.profiling.profiler import profile_dataset
    from gnnaas.profiling.table import has_profiles
    from gnnaas.utils import resolve_device
    from gnnaas.variants.pipeline import generate_variants
    from gnnaas.variants.repository import VariantRepository

    device = resolve_device(settings.device)
    plan = _plan_options(args, _DEFAULT_ARCHS)  # before the dataset loads
    store = _load(args)
    repo = VariantRepository(settings.variants_dir)
    profiles = settings.profiles_dir
    _say(args, f"generating variants of {store.name} on {device} (existing ones are kept)")
    generate_variants(
        store,
        repo,
        archs=_DEFAULT_ARCHS,
        prunes=args.prune,
        config=_train_config(args),
        device=device,
        force=False,
        progress=_progress(args),
        **plan,
    )
    pipeline = _pipeline(settings, device)
    current = has_profiles(
        profiles / store.name,
        repo.list(store.name),
        sampler_seed=pipeline["sampler_seed"],
    )
    if current:
        _say(args, f"profiles of {store.name} are up to date in {profiles}")
    else:
        _say(args, f"profiling the variants of {store.name} on {device}")
        profile_dataset(
            store,
            repo,
            profiles,
            batch_size=1024,
            runs=args.runs,
            device=device,
            progress=_progress(args),
            on_phase=lambda message: _say(args, message),
            **pipeline,
        )
    print(f"ready: {len(repo.list(store.name))} variants of {store.name}")
    return 0


def add_parsers(sub: Any) -> None:
    """Adds ``profile``, ``report``, ``cache-plan`` and ``prepare`` to the subcommands ``sub``."""
    _add_profile_parser(sub)
    _add_report_parser(sub)
    _add_cache_plan_parser(sub)
    _add_prepare_parser(sub)


def _add_profile_parser(sub: Any) -> None:
    p = sub.add_parser(
        "profile",
        help="profile every variant of a dataset",
        description="Measure accuracy and latency of every variant of a dataset; writes "
        "profiles.csv and the service curves.",
    )
    _add_data_args(p)
    p.add_argument("--variants", default=None, help=_VARIANTS_HELP)
    p.add_argument("--out", default=None, help=_PROFILES_HELP)
    p.add_argument(
        "--batch-size",
        type=_positive_int,
        default=1024,
        help="target nodes per profiled batch (default: 1024)",
    )
    p.add_argument(
        "--runs", type=_positive_int, default=30, help="timed runs per variant (default: 30)"
    )
    p.add_argument(
        "--only",
        nargs="+",
        metavar="ID",
        default=None,
        help="time only these variants (e.g. one just added) and keep the others' timings; "
        "every variant is re-scored for the paired accuracy intervals; if one cannot be timed, "
        "nothing is written and the command fails",
    )
    p.add_argument(
        "--state-dir",
        default=None,
        help="profile on the live graph of `serve --state-dir` as the folder holds it now (read "
        "only): every variant, timed or re-scored, on the graph the server serves, as a "
        "precomputed variant of that graph needs (default: $GNNAAS_STATE_DIR, else the "
        "dataset's graph)",
    )
    p.set_defaults(func=_cmd_profile)


def _add_report_parser(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="write report.md and plots from a dataset's profiles",
        description="Write report.md and its plots next to a dataset's profiles.csv.",
    )
    p.add_argument("--dataset", required=True, help="dataset name (see `gnnaas datasets`)")
    p.add_argument("--profiles", default=None, help=_PROFILES_HELP)
    p.add_argument(
        "--data-root",
        default=None,
        help="taken as every dataset command takes it, so that the options of `gnnaas profile` "
        "work here too; unused: the report reads only the dataset's profiles, never its graph",
    )
    p.add_argument(
        "--tie-margin",
        default=None,
        help="the router's tie margin the report's picks are made with, as the server's "
        "GNNAAS_TIE_MARGIN (default: $GNNAAS_TIE_MARGIN or 0.1, the server's default)",
    )
    p.set_defaults(func=_cmd_report)


def _add_cache_plan_parser(sub: Any) -> None:
    p = sub.add_parser(
        "cache-plan",
        help="plan each variant's device feature cache for a memory budget",
        description="For each variant of a dataset (or, with none, the default prune factors 1 2 "
        "4 8 at fanouts 25 10), rank the nodes by how often the serving sampler reads their "
        "features when the validation nodes (or --seeds) are served, and report how many nodes "
        "fit in --budget-mb of device memory and the share of feature reads they serve (the hit "
        "ratio, 0 to 1). Pure CPU. Writes cache_plan.csv and cache_ranking.safetensors beside "
        "the dataset's profiles, which the server and the profiler read when "
        "GNNAAS_FEATURE_CACHE_MB is set on a GPU.",
    )
    p.add_argument("--dataset", required=True, help="dataset name (see `gnnaas datasets`)")
    p.add_argument(
        "--data-root",
        default=None,
        help="folder holding <Class>/<Name>/raw/ of real datasets (default: $GNNAAS_DATA)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the dataset's split, as for generate (default: 0)",
    )
    p.add_argument("--variants", default=None, help=_VARIANTS_HELP)
    p.add_argument(
        "--profiles",
        default=None,
        help="profiles folder written into (default: $GNNAAS_PROFILES_DIR or profiles)",
    )
    p.add_argument(
        "--budget-mb",
        required=True,
        metavar="MB",
        help="device memory for one variant's cached feature rows, in MiB (a number > 0)",
    )
    p.add_argument(
        "--by",
        choices=("access", "degree"),
        default="access",
        help="rank nodes by sampled feature reads (access) or by how many nodes list them as a "
        "neighbor (degree, the cheap fallback); the hit ratio is measured on the seeds either "
        "way (default: access)",
    )
    p.add_argument(
        "--seeds",
        default=None,
        metavar="FILE",
        help="recorded traffic: node ids as .npy or text (whitespace or commas), served in "
        "batches in file order (default: the validation nodes)",
    )
    p.add_argument(
        "--batch-size",
        type=_positive_int,
        default=1024,
        help="seeds per sampled batch, as the profiler's batches (default: 1024)",
    )
    _add_quiet(p)
    p.set_defaults(func=_cmd_cache_plan)


def _add_prepare_parser(sub: Any) -> None:
    p = sub.add_parser(
        "prepare",
        help="generate and profile default variants unless present",
        description="Generate the default variants (sage and gin; greedy and lasso at 1 2 4 8x; "
        "then distilled widths, smaller fanouts and int8 where they pay; see generate) and "
        "profile them, skipping what is already there. `make serve` runs it.",
    )
    _add_data_args(p)
    _add_plan_args(p)
    p.add_argument("--variants", default=None, help=_VARIANTS_HELP)
    p.add_argument("--profiles", default=None, help=_PROFILES_HELP)
    _add_epochs(p)
    p.add_argument(
        "--runs", type=_positive_int, default=10, help="timed runs per variant (default: 10)"
    )
    p.set_defaults(func=_cmd_prepare)
