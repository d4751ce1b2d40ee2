"""The ``gnnaas`` command: datasets, import, train, generate, profile, report, cache-plan, prepare,
infer, precompute, compact, serve.

Every command prints one line ``ErrorName: message`` and exits 1 on a user error; ``--debug``
shows the traceback instead. Heavy modules are imported inside the commands so ``gnnaas --help``
stays fast and a command's first progress line appears before torch is loaded.

Options that have an environment fallback default to ``None`` here and are resolved when the command
runs: ``--data-root`` ← ``GNNAAS_DATA``, ``--variants``/``--out`` of ``generate`` ←
``GNNAAS_VARIANTS_DIR``, ``--profiles``/``--out`` of ``profile`` and ``--profiles`` of
``cache-plan`` ← ``GNNAAS_PROFILES_DIR``,
``--device`` ← ``GNNAAS_DEVICE``; ``serve`` passes only the options given to its settings, so every
other ``GNNAAS_*`` server setting applies.

Long commands (train, generate, profile, prepare) print one line per phase on stderr and show a
progress bar per phase, also when stderr is not a terminal (then refreshed every few seconds, so
logs stay short); ``-q``/``--quiet`` silences both.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import math
import os
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gnnaas.errors import ConfigError, GnnaasError

__all__ = ["main"]

_log = logging.getLogger("gnnaas")

# The serving default leaves random out: its variants are below greedy's and lasso's at every
# prune factor (benchmarks/results/variants-cora-rankings.md), so they never reach the frontier
# a tolerance picks from; `--ranking random greedy lasso` generates the reference study's set.
_DEFAULT_RANKINGS = ("greedy", "lasso")
_DEFAULT_ARCHS = ("sage", "gin")
_DEFAULT_PRUNE = (1, 2, 4, 8)

# When stderr is a file or a pipe, tqdm redraws at most this often (seconds; tqdm reads
# TQDM_MININTERVAL when it is first imported).
_LOG_REFRESH_S = "5"


def _quiet(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "quiet", False))


def _progress(args: argparse.Namespace) -> bool:
    """Whether library functions draw progress bars."""
    return not _quiet(args)


def _say(args: argparse.Namespace, message: str) -> None:
    """One progress line on stderr (a phase starts), unless ``--quiet``."""
    if not _quiet(args):
        print(f"{args.command}: {message}", file=sys.stderr, flush=True)


def _start(args: argparse.Namespace, message: str | None = None) -> None:
    """Says ``message`` first, then applies ``--threads`` (importing torch takes seconds)."""
    if message is not None:
        _say(args, message)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)


def _env_default(value: str | None, env: str, default: str) -> str:
    """``value`` when given on the command line, else ``$env``, else ``default``."""
    if value is not None:
        return value
    return os.environ.get(env) or default


def _device(args: argparse.Namespace) -> str:
    return _env_default(args.device, "GNNAAS_DEVICE", "auto")


def _variants_dir(value: str | None) -> str:
    return _env_default(value, "GNNAAS_VARIANTS_DIR", "variants")


def _profiles_dir(value: str | None) -> str:
    return _env_default(value, "GNNAAS_PROFILES_DIR", "profiles")


def _serving_pipeline() -> dict[str, Any]:
    """The server's sampler, batch cap and inline threshold from the environment
    (``GNNAAS_SAMPLING``, ``GNNAAS_SEED``, ``GNNAAS_MAX_BATCH_NODES``,
    ``GNNAAS_INLINE_MAX_NODES``), so profiles measure the pipeline served."""
    from gnnaas.serving.core.settings import Settings

    settings = Settings()
    return {
        "sampling": settings.sampling,
        "sampler_seed": settings.seed,
        "max_batch_nodes": settings.max_batch_nodes,
        "inline_max_nodes": settings.inline_max_nodes,
        "threads": settings.torch_threads,
    }


def _profiling_pipeline(args: argparse.Namespace, device: Any) -> dict[str, Any]:
    """:func:`_serving_pipeline` with ``--threads`` (when given) instead of the server's
    ``GNNAAS_TORCH_THREADS`` (profiles are timed with the threads they will be served with),
    plus the feature cache the server builds on ``device`` (``GNNAAS_FEATURE_CACHE_MB``, on
    CUDA only)."""
    from gnnaas.serving.core.settings import Settings

    pipeline = _serving_pipeline()
    if args.threads is not None:
        pipeline["threads"] = args.threads
    pipeline["feature_cache_mb"] = Settings().feature_cache_mb if device.type == "cuda" else 0.0
    return pipeline


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
    _start(args)
    from gnnaas.data import list_datasets

    rows = [
        (d.name, d.num_nodes, d.num_edges, d.num_features, d.num_classes, d.multi_label, d.source)
        for d in list_datasets()
    ]
    _print_table(rows, ("name", "nodes", "edges", "features", "classes", "multi-label", "source"))
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    _start(args, f"importing {args.name}")
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


def _load(args: argparse.Namespace) -> Any:
    """The dataset's graph store; ``load_dataset`` falls back to ``$GNNAAS_DATA``."""
    from gnnaas.data import load_dataset

    return load_dataset(args.dataset, args.data_root, seed=args.seed)


def _train_config(args: argparse.Namespace) -> Any:
    from gnnaas.variants.training import TrainConfig

    return TrainConfig(seed=args.seed, max_epochs=args.epochs)


def _cmd_train(args: argparse.Namespace) -> int:
    _start(args, f"loading dataset {args.dataset}")
    from gnnaas.utils import resolve_device
    from gnnaas.variants.training import train_model

    device = resolve_device(_device(args))
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
    _start(args, f"loading dataset {args.dataset}")
    from gnnaas.utils import resolve_device
    from gnnaas.variants.pipeline import generate_variants
    from gnnaas.variants.repository import VariantRepository

    if bool(args.from_model) != bool(args.model_config):
        raise ConfigError("--from-model and --model-config go together (weights, config)")
    device = resolve_device(_device(args))
    store = _load(args)
    out = _variants_dir(args.out)
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
            seed=_serving_pipeline()["sampler_seed"],
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
        rankings=args.ranking,
        prunes=args.prune,
        config=_train_config(args),
        device=device,
        force=force,
        progress=_progress(args),
        warm_start=warm,
        **_axes_options(args),
    )
    _print_generated(rows)
    return 0


def _axes_options(args: argparse.Namespace) -> dict[str, Any]:
    """``generate_variants``'s axis arguments from ``--axes``, ``--fanouts``,
    ``--width-divisors`` and ``--near``."""
    from gnnaas.variants.axes import parse_axes

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
        "axes": parse_axes(args.axes),
        "near": args.near,
        "width_divisors": args.width_divisors,
        "fanout_sets": fanout_sets,
        "sampler_seed": _serving_pipeline()["sampler_seed"],
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
    _start(args, f"loading dataset {args.dataset}")
    from gnnaas.utils import resolve_device
    from gnnaas.variants.master import add_user_variant
    from gnnaas.variants.repository import VariantRepository

    device = resolve_device(_device(args))
    store = _load(args)
    out = _variants_dir(args.variants)
    _say(args, f"checking and evaluating {args.weights} on {store.name}")
    manifest = add_user_variant(
        store,
        VariantRepository(out),
        args.weights,
        args.model_config,
        args.kept_features,
        seed=_serving_pipeline()["sampler_seed"],
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


def _cmd_profile(args: argparse.Namespace) -> int:
    _start(args, f"loading dataset {args.dataset}")
    from gnnaas.profiling.profiler import profile_dataset
    from gnnaas.utils import resolve_device
    from gnnaas.variants.repository import VariantRepository

    device = resolve_device(_device(args))
    store = _load(args)
    out = _profiles_dir(args.out)
    _say(args, f"profiling the variants of {store.name} on {device} into {out}")
    result = profile_dataset(
        store,
        VariantRepository(_variants_dir(args.variants)),
        Path(out),
        batch_size=args.batch_size,
        runs=args.runs,
        device=device,
        progress=_progress(args),
        only=args.only,
        **_profiling_pipeline(args, device),
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


def _cmd_report(args: argparse.Namespace) -> int:
    _start(args)
    from gnnaas.profiling.frontier import ROUTER_TIE_MARGIN
    from gnnaas.profiling.report import write_report

    margin = _env_default(args.tie_margin, "GNNAAS_TIE_MARGIN", str(ROUTER_TIE_MARGIN))
    bad = ConfigError(
        f"report: --tie-margin must be a number in [0, 10], as the server's (got {margin!r})"
    )
    try:
        tie_margin = float(margin)
    except ValueError:
        raise bad from None
    if not 0 <= tie_margin <= 10:  # also rejects NaN
        raise bad
    path = write_report(Path(_profiles_dir(args.profiles)) / args.dataset, tie_margin=tie_margin)
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
    _start(args, f"loading dataset {args.dataset}")
    from gnnaas.profiling.cacheplan import PlannedVariant, plan_cache, write_cache_plan
    from gnnaas.variants.repository import VariantRepository

    store = _load(args)
    repo = VariantRepository(_variants_dir(args.variants))
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
    pipeline = _serving_pipeline()
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
        sampling=pipeline["sampling"],
        progress=_progress(args),
    )
    table, ranking = write_cache_plan(plan, Path(_profiles_dir(args.profiles)) / store.name)
    print(
        f"dataset: {store.name} ({store.num_nodes:,} nodes, {store.num_features} features, "
        f"{full_bytes / 2**20:,.1f} MB of 1x features)"
    )
    print(
        f"budget_mb: {budget_mb:g} per variant ({budget_bytes / full_bytes:.3f} of the 1x features)"
    )
    print(
        f"seeds: {seeds_name} ({seeds.numel():,} nodes, batches of {args.batch_size}), "
        f"ranked by {args.by}, sampler {pipeline['sampling']} seed {pipeline['sampler_seed']}"
    )
    _print_table(
        [(r.variant, r.features_kept, r.cached_nodes, f"{r.hit_ratio:.4f}") for r in plan.rows],
        ("variant", "features_kept", "cached_nodes", "hit_ratio"),
    )
    print(f"wrote {table} and {ranking.name}")
    return 0


def _cmd_prepare(args: argparse.Namespace) -> int:
    """Generates and profiles default variants for a dataset unless they already exist."""
    _start(args, f"loading dataset {args.dataset}")
    from gnnaas.profiling.profiler import profile_dataset
    from gnnaas.profiling.table import has_profiles
    from gnnaas.utils import resolve_device
    from gnnaas.variants.pipeline import generate_variants
    from gnnaas.variants.repository import VariantRepository

    device = resolve_device(_device(args))
    store = _load(args)
    repo = VariantRepository(_variants_dir(args.variants))
    profiles = Path(_profiles_dir(args.profiles))
    _say(args, f"generating variants of {store.name} on {device} (existing ones are kept)")
    generate_variants(
        store,
        repo,
        archs=_DEFAULT_ARCHS,
        rankings=args.ranking,
        prunes=args.prune,
        config=_train_config(args),
        device=device,
        force=False,
        progress=_progress(args),
        **_axes_options(args),
    )
    pipeline = _profiling_pipeline(args, device)
    current = has_profiles(
        profiles / store.name,
        repo.list(store.name),
        sampling=pipeline["sampling"],
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
            **pipeline,
        )
    print(f"ready: {len(repo.list(store.name))} variants of {store.name}")
    return 0


def _cmd_compact(args: argparse.Namespace) -> int:
    """Folds a live graph's write log into a new snapshot (the server must be stopped)."""
    state_dir = args.state_dir or os.environ.get("GNNAAS_STATE_DIR")
    if not state_dir:
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


def _exact_run(args: argparse.Namespace, embeddings: bool) -> Any:
    """The exact pass of ``--variant`` (default: the most accurate by validation) with a bar."""
    from tqdm.auto import tqdm

    from gnnaas.variants.exact import exact_pass
    from gnnaas.variants.repository import VariantRepository

    _start(args, f"loading dataset {args.dataset}")
    store = _load(args)
    repo = VariantRepository(_variants_dir(args.variants))
    variant = args.variant
    if variant is None:
        trained = [m for m in repo.list(store.name) if m.precomputed is None]
        if not trained:
            raise ConfigError(
                f"no variants of {store.name} in {repo.root}; run `gnnaas prepare --dataset "
                f"{store.name}` or pass --variants"
            )
        variant = max(trained, key=lambda m: m.metrics.get("val_acc", 0.0)).variant_id
    state_dir = args.state_dir or os.environ.get("GNNAAS_STATE_DIR")
    _say(args, f"exact layer-wise pass of {store.name}/{variant} ({args.backend})")
    manifest = repo.manifest(store.name, variant)
    with tqdm(
        total=store.num_nodes * manifest.num_layers,
        desc=f"{args.command} {variant}",
        unit="node",
        unit_scale=True,
        disable=not _progress(args),
    ) as bar:
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
        )


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
    manifest = precompute(VariantRepository(_variants_dir(args.variants)), run)
    _print_exact(run)
    print(
        f"stored {manifest.variant_id}; profile it before serving: "
        f"gnnaas profile --dataset {manifest.dataset} --only {manifest.variant_id}"
    )
    return 0


def _bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (not yet listening), or a one-line error if taken.

    Binding first makes a busy port fail in a moment instead of after loading every model, and
    holds the port while they load; uvicorn starts listening on this very socket.
    """
    from gnnaas.errors import ConfigError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"serve: --host {host!r} cannot be resolved ({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"serve: port {port} is in use on {host}; pick another with --port "
                f"(or PORT=... with make serve)"
            ) from None
        raise ConfigError(f"serve: cannot bind {host}:{port} ({exc.strerror})") from None
    return sock


def _serve_workers(args: argparse.Namespace, sock: socket.socket, given: dict[str, Any]) -> int:
    """``serve --workers N``: N uvicorn processes on ``sock``
    (:mod:`gnnaas.serving.deploy.workers`)."""
    from gnnaas.serving.deploy.workers import reuse_port_socket, run_workers

    environment = {f"GNNAAS_{key.upper()}": _env_value(value) for key, value in given.items()}
    address, family = sock.getsockname(), sock.family
    sock.close()  # the workers bind their own SO_REUSEPORT sockets to this address
    try:
        reuse_port_socket(address, family).close()
    except OSError as exc:
        raise ConfigError(f"serve: cannot share {args.host}:{args.port} ({exc.strerror})") from None
    _say(args, f"starting {args.workers} workers; each loads the variants")
    run_workers(environment, address, family, workers=args.workers)
    return 0


def _env_value(value: Any) -> str:
    """A setting as its ``GNNAAS_*`` variable spells it (lists as JSON)."""
    if isinstance(value, list | tuple):
        return json.dumps([str(v) for v in value])
    return str(value)


def _serve_ray(args: argparse.Namespace, settings: Any) -> int:
    """``serve --backend ray``: gnnaas on Ray Serve until SIGINT or SIGTERM
    (:mod:`gnnaas.serving.deploy.ray`); the stop takes down every process it started."""
    try:
        from gnnaas.serving.deploy import ray as ray_backend
        from gnnaas.serving.deploy.ray_apps import parse_autoscale
    except ImportError as exc:
        raise ConfigError(
            f"serve: --backend ray needs Ray Serve ({exc}); "
            "install it with pip install 'gnnaas[ray]'"
        ) from None
    if args.workers > 1:
        raise ConfigError("serve: --workers is for --backend uvicorn; use --replicas with ray")
    autoscale = None
    if args.autoscale is not None:
        try:
            autoscale = parse_autoscale(args.autoscale)
        except ValueError as exc:
            raise ConfigError(f"serve: --{exc}") from None
    import signal
    import threading

    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    # Both signals stop the same way: Serve, Ray and every process of a local Ray's session.
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    where = f"the cluster at {args.address}" if args.address else "a local Ray"
    _say(args, f"starting gnnaas on {where}; each dataset replica loads its variants")
    try:
        ray_backend.start_ray(address=args.address, host=args.host, port=args.port)
        # Ray's core installs its own SIGTERM handler in this process (a stack dump, then an
        # abort): ours again, so that SIGTERM stops cleanly.
        for sig in previous:
            signal.signal(sig, on_signal)
        url = ray_backend.run_ray(
            settings,
            replicas=args.replicas,
            autoscale=autoscale,
            host=args.host,
            port=args.port,
            address=args.address,
            replica_cpus=args.replica_cpus,
            one_app=args.one_app,
            stop=stop.is_set,
        )
        _say(args, f"serving on {url} (Ctrl-C or SIGTERM stops it)")
        while not stop.wait(1.0):
            pass
    except ConfigError as exc:
        raise ConfigError(f"serve: {exc}") from None
    except KeyboardInterrupt:  # a signal while deploying
        pass
    finally:
        _say(args, "stopping")
        ray_backend.shutdown_ray()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def _cmd_ray_config(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    try:
        from gnnaas.serving.deploy import ray_apps
    except ImportError as exc:
        raise ConfigError(
            f"ray-config: needs Ray Serve ({exc}); install it with pip install 'gnnaas[ray]'"
        ) from None
    from gnnaas.serving.core.settings import Settings

    given = {
        "variants_dir": args.variants,
        "profiles_dir": args.profiles,
        "data_root": args.data_root,
        "datasets": args.dataset or None,
    }
    try:
        settings = Settings(**{k: v for k, v in given.items() if v is not None})
        autoscale = ray_apps.parse_autoscale(args.autoscale) if args.autoscale else None
    except ValidationError as exc:
        raise ConfigError(f"ray-config: {exc.errors()[0]['msg']}") from None
    except ValueError as exc:
        raise ConfigError(f"ray-config: --{exc}") from None
    text = ray_apps.serve_config(
        settings,
        replicas=args.replicas,
        autoscale=autoscale,
        host=args.host,
        port=args.port,
        replica_cpus=args.replica_cpus,
        one_app=args.one_app,
    )
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
        _say(args, f"wrote {args.output}; deploy it with `serve deploy {args.output}`")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    sock = _bind(args.host, args.port)
    if args.check_port:
        sock.close()
        return 0
    try:
        _start(args)
        import uvicorn
        from pydantic import ValidationError

        from gnnaas.errors import ConfigError
        from gnnaas.serving.core.settings import Settings

        given = {
            "variants_dir": args.variants,
            "profiles_dir": args.profiles,
            "device": args.device,
            "data_root": args.data_root,
            "datasets": args.dataset or None,
            "state_dir": args.state_dir,
        }
        # Options left out stay out, so GNNAAS_* variables and the settings' defaults apply.
        overrides = {key: value for key, value in given.items() if value is not None}
        try:
            settings = Settings(**overrides)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "settings"
            raise ConfigError(
                f"serve: {where}: {first['msg']} (check --options and GNNAAS_* variables)"
            ) from None
        if settings.state_dir is not None and (args.backend == "ray" or args.workers > 1):
            raise ConfigError(
                "serve: a live graph (--state-dir) is served by one process; drop --workers / "
                "--backend ray, or the state folder"
            )
        if args.backend == "ray":
            sock.close()  # Serve's proxy binds the port itself
            return _serve_ray(args, settings)
        if args.workers > 1:
            return _serve_workers(args, sock, overrides)
        _say(args, f"loading variants from {settings.variants_dir} ({settings.device})")
        # SIGHUP and POST /v1/admin/reload reread the folders above; their outcome is logged.
        # A SIGHUP while the models load is ignored (they are being read fresh anyway).
        import signal

        if hasattr(signal, "SIGHUP"):
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
        logging.getLogger("gnnaas.serving.core.reload").setLevel(logging.INFO)
        from gnnaas.serving.http.app import create_app

        app = create_app(settings, reload_on_sighup=True)
        config = uvicorn.Config(
            app, host=args.host, port=args.port, log_level="info", access_log=False
        )
        server = uvicorn.Server(config)
        try:
            server.run(sockets=[sock])
        except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it drained on: a clean stop
            pass
    finally:
        sock.close()
    return 0 if server.started else 3  # uvicorn's exit code for a failed start-up


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


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0 (got {text!r})") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0 (got {text!r})")
    return value


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


def _add_quiet(p: argparse.ArgumentParser) -> None:
    # SUPPRESS: `gnnaas -q CMD` and `gnnaas CMD -q` both work, neither resets the other.
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=argparse.SUPPRESS,
        help="no progress lines or bars on stderr (results and errors are still printed)",
    )


def _add_data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", required=True, help="dataset name (see `gnnaas datasets`)")
    p.add_argument(
        "--data-root",
        default=None,
        help="folder holding <Class>/<Name>/raw/ of real datasets (default: $GNNAAS_DATA)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed for splits, sampling, init (default: 0)"
    )
    p.add_argument(
        "--device",
        default=None,
        help="auto (CUDA when present), cpu or cuda[:n] (default: $GNNAAS_DEVICE or auto)",
    )
    _add_quiet(p)


def _add_served_folders(p: argparse.ArgumentParser) -> None:
    """``--variants``, ``--profiles``, ``--data-root`` of what a server serves (serve,
    ray-config); left out, the GNNAAS_* variables decide."""
    p.add_argument("--variants", default=None, help=_VARIANTS_HELP)
    p.add_argument("--profiles", default=None, help=_PROFILES_HELP)
    p.add_argument(
        "--data-root",
        default=None,
        help="folder holding real datasets (default: $GNNAAS_DATA_ROOT or $GNNAAS_DATA)",
    )


def _add_epochs(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--epochs",
        type=_positive_int,
        default=200,
        help="most training epochs per model; early stopping usually ends sooner (default: 200)",
    )


_VARIANTS_HELP = "variant repository (default: $GNNAAS_VARIANTS_DIR or variants)"
_PROFILES_HELP = "profiles folder (default: $GNNAAS_PROFILES_DIR or profiles)"


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gnnaas",
        description="Model-less GNN inference: generate, profile, serve feature-pruned variants.",
        epilog="Run `gnnaas COMMAND --help` for a command's options. A first run: "
        "`gnnaas prepare --dataset synth-small` then `gnnaas serve`.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress at INFO level")
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress lines or bars on stderr (results and errors are still printed)",
    )
    parser.add_argument(
        "--threads",
        type=_positive_int,
        default=None,
        help="torch intra-op threads (default: torch's choice; 1 is faster on a busy machine)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

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

    p = sub.add_parser(
        "train",
        help="train one full-feature model and print its accuracy",
        description="Train one full-feature model and print its validation and test accuracy.",
    )
    _add_data_args(p)
    p.add_argument("--arch", default="sage", help="architecture: sage or gin (default: sage)")
    _add_epochs(p)
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser(
        "generate",
        help="train the 1x model, rank features, train pruned variants",
        description="Train the 1x model, rank its input features and train the pruned variants "
        "into the variant repository; variants already there are kept unless --force.",
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
        "every variant is re-scored for the paired accuracy intervals",
    )
    p.set_defaults(func=_cmd_profile)

    p = sub.add_parser(
        "report",
        help="write report.md and plots from a dataset's profiles",
        description="Write report.md and its plots next to a dataset's profiles.csv.",
    )
    p.add_argument("--dataset", required=True, help="dataset name (see `gnnaas datasets`)")
    p.add_argument("--profiles", default=None, help=_PROFILES_HELP)
    p.add_argument(
        "--tie-margin",
        default=None,
        help="the router's tie margin the report's picks are made with, as the server's "
        "GNNAAS_TIE_MARGIN (default: $GNNAAS_TIE_MARGIN or 0.1, the server's default)",
    )
    p.set_defaults(func=_cmd_report)

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

    p = sub.add_parser(
        "serve",
        help="serve every profiled dataset over HTTP",
        description="Serve every dataset that has variants and profiles over HTTP. Options "
        "left out fall back to the GNNAAS_* variables (GNNAAS_VARIANTS_DIR, GNNAAS_DEVICE, ...).",
    )
    _add_served_folders(p)
    p.add_argument(
        "--dataset",
        nargs="*",
        help="serve only these datasets (default: $GNNAAS_DATASETS or all with profiles)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="TCP port to listen on (default: 8000)")
    p.add_argument(
        "--check-port",
        action="store_true",
        help="only check that --host/--port are free, then exit (make serve does it first)",
    )
    p.add_argument(
        "--device",
        default=None,
        help="auto, cpu or cuda[:n] (default: $GNNAAS_DEVICE or auto)",
    )
    p.add_argument(
        "--state-dir",
        default=None,
        help="make the graphs live: writes (with GNNAAS_WRITE_TOKEN) are logged here and "
        "replayed at start (default: $GNNAAS_STATE_DIR, else frozen graphs)",
    )
    p.add_argument(
        "--workers",
        type=_positive_int,
        default=1,
        help="server processes sharing the port; graphs and features are memory-mapped once, "
        "/metrics sums over them, SIGHUP to this process restarts them with fresh variants "
        "(default: 1)",
    )
    _add_ray_args(p)
    p.add_argument(
        "--backend",
        choices=("uvicorn", "ray"),
        default="uvicorn",
        help="uvicorn: this process serves (default); ray: one Ray Serve application per "
        "dataset, each replica the whole server, and a catalog at / (needs the [ray] extra)",
    )
    p.add_argument(
        "--address",
        default=None,
        help="with --backend ray: a running Ray cluster, e.g. <head>:6379 (default: start a "
        "local Ray)",
    )
    _add_quiet(p)
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser(
        "ray-config",
        help="write a Ray Serve config for this repository",
        description="Write the Ray Serve config (YAML) that serves this repository's variants "
        "with `serve deploy`: one application per dataset and a catalog at /. Folders are "
        "written as absolute paths, which every node of the cluster must see.",
    )
    _add_served_folders(p)
    p.add_argument(
        "--dataset",
        nargs="*",
        help="deploy only these datasets (default: every dataset with variants and profiles)",
    )
    p.add_argument(
        "--host", default="0.0.0.0", help="address Serve's proxies listen on (default: 0.0.0.0)"
    )
    p.add_argument("--port", type=int, default=8000, help="their TCP port (default: 8000)")
    _add_ray_args(p)
    p.add_argument(
        "--output",
        "-o",
        default="gnnaas-serve.yaml",
        help="file to write, '-' for stdout (default: gnnaas-serve.yaml)",
    )
    _add_quiet(p)
    p.set_defaults(func=_cmd_ray_config)
    return parser


def _add_ray_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--replicas",
        type=_positive_int,
        default=1,
        help="with Ray: replicas of each dataset's application (default: 1)",
    )
    p.add_argument(
        "--autoscale",
        default=None,
        metavar="MIN:MAX",
        help="with Ray: let Serve scale each dataset between MIN and MAX replicas on requests in "
        "flight (overrides --replicas)",
    )
    p.add_argument(
        "--replica-cpus",
        type=_positive_float,
        default=1.0,
        help="with Ray: CPUs Ray reserves for each replica, a reservation for placement, not a "
        "limit (default: 1)",
    )
    p.add_argument(
        "--one-app",
        action="store_true",
        help="with Ray: one application serving every dataset at /v1/datasets (each replica "
        "holds them all) instead of one per dataset",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gnnaas`` console script."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    func: Callable[[argparse.Namespace], int] = args.func
    # Bars stay on when stderr is a file or pipe, redrawn every few seconds instead of 10x/s.
    refresh = not sys.stderr.isatty() and "TQDM_MININTERVAL" not in os.environ
    if refresh:
        os.environ["TQDM_MININTERVAL"] = _LOG_REFRESH_S
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
    finally:
        if refresh:
            os.environ.pop("TQDM_MININTERVAL", None)


if __name__ == "__main__":
    sys.exit(main())
