"""The profiler: accuracy and latency of every variant of a dataset (docs/architecture.md).

Every batch runs through :class:`gnnaas.inference.InferencePath` with the serving sampler built as
the server builds it (:func:`gnnaas.sampling.serving_sampler` with the variant's fanouts, seed
``0`` and ``depth`` mode by default), so the profile measures the pipeline that is served. For
each variant and each split (``val``, ``test``) the profiler runs batched inference over the
split's nodes on the full graph:

1. ``warmup`` untimed runs on the first batch;
2. one pass over every batch (accuracy, per-node score parts, and a timing of each full batch);
3. on the validation split, more timed runs cycling over the full batches until ``runs``
   timings exist and at least ``min_time_s`` has passed (a fast variant's runs then span enough
   time that a short burst of other work on a shared machine does not move its p50); on the
   test split, whose accuracy is what counts, a few runs only.

Each run is timed per stage (:class:`gnnaas.inference.StageTimes`): ``sample`` (k-hop sampling),
``gather`` (the variant's pruned columns ``store.feature_subset(kept)[n_id]`` and the host→device
copy of them and of the blocks), ``comp`` (forward pass) and ``copy`` (outputs back to the host).
``comm = gather + copy``, ``latency = comm + comp`` and ``e2e = sample + latency``. Reported times
are p50 over the timed runs; ``latency_p95_ms``, ``latency_p99_ms`` and ``latency_std_ms``
describe the same runs.

``accuracy_std`` is the standard deviation of the per-batch accuracy over the split's batches.
When a split fits in one batch (Cora's validation set at batch size 1024) it is the binomial
standard error of that batch's accuracy, ``100·sqrt(p(1-p)/n)``, instead of a meaningless 0.
The per-node score parts (:func:`gnnaas.inference.score_parts`) of every (variant, split) go to
:func:`gnnaas.profiling.uncertainty.add_accuracy_intervals`, which adds the interval columns.

``mem_mb`` is the peak memory newly allocated while serving one batch (gather, copies, forward,
outputs): ``torch.cuda.max_memory_allocated`` on CUDA, torch's profiler memory accounting on the
CPU (see :func:`gnnaas.profiling.timers.peak_memory_bytes`). ``unique_frac`` is the mean over full
batches of ``len(n_id) / (t·∏ s_k)``; fanouts of ``-1`` are bounded by the maximum in-degree.
``pred_comm_ms`` and ``pred_comp_ms`` come from :mod:`gnnaas.profiling.perfmodel` with rates
calibrated once per call.

With ``feature_cache_mb`` (the server's ``GNNAAS_FEATURE_CACHE_MB``; ``gnnaas profile`` passes it
on CUDA only, where the server caches) every trained variant runs with the device feature cache
the server would build for this dataset (:mod:`gnnaas.inference.cache`): the budget split over
the dataset's variants with equal traffic shares
(:func:`gnnaas.profiling.cacheplan.assign_cache_nodes`), nodes in the order of
``cache_ranking.safetensors`` beside the profiles when ``gnnaas cache-plan`` wrote one for the
sampler, else by neighbor count. Timings, service curves included, are then
those of the cached path; ``cache_nodes``, ``hit_ratio`` and ``copied_kb`` record the cache and
what each batch moved (:data:`~gnnaas.profiling.table.CACHE_COLUMNS`; without a cache they are
0, 0 and every sampled row's bytes).

Besides ``profiles.csv`` the profiler writes ``service_times.csv``, the router's cost model: each
variant's service curve, measured by timing the server's own batch handler
(:class:`~gnnaas.inference.Executor`: dedupe, the path, classes per request as lists) at
:data:`~gnnaas.profiling.table.SERVICE_TIME_BATCH_SIZES` target nodes drawn from all nodes
(``min(size, num_nodes)`` nodes per batch; sizes above ``max_batch_nodes`` are left out). Its
``e2e_ms`` is the wall time of that call (p50); the server times the same call in its worker
thread and publishes the two side by side (``drift`` in ``/v1/datasets/{d}/variants``). Every
curve point records the execution settings it was measured under
(:func:`gnnaas.inference.settings.execution_settings`: threads, inline threshold, device,
versions); a server under other settings re-times the curve.

This module decides what is measured, in which order, and writes the files; the measuring itself
is :mod:`gnnaas.profiling.measurement`'s, and the checks and files a run starts from (the variants
listed or skipped, precomputed answers, the rows ``--only`` keeps, the planned caches) are
:mod:`gnnaas.profiling.inputs`'s.
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from gnnaas.errors import ArtifactError, ConfigError
from gnnaas.inference import INLINE_MAX_NODES, Executor, FeatureCache, InferencePath
from gnnaas.inference.lookup import LookupPath
from gnnaas.profiling.inputs import (
    check_manifest,
    kept_profiles,
    planned_caches,
    precomputed_answers,
    served_size_kb,
    unlisted_variants,
)
from gnnaas.profiling.measurement import DatasetProfiler
from gnnaas.profiling.perfmodel import Calibration, calibrate
from gnnaas.profiling.table import (
    PROFILES_FILE,
    SERVICE_TIMES_FILE,
    write_profiles,
    write_service_times,
)
from gnnaas.typing import Device, PathType

if TYPE_CHECKING:
    from gnnaas.data import GraphStore
    from gnnaas.variants.repository import VariantRepository

__all__ = ["ProfileResult", "profile_dataset"]

_log = logging.getLogger(__name__)


@dataclass
class ProfileResult:
    """What :func:`profile_dataset` did.

    Args:
        path (Path): the ``profiles.csv`` written.
        service_times_path (Path): the ``service_times.csv`` written.
        num_profiled (int): variants profiled.
        skipped (list[tuple[str, str]]): ``(variant_id, reason)`` of variants not profiled.
        calibration (Calibration): the ``BW``/``OPS`` used for the predictions.
        rows (list[dict[str, Any]]): the rows of ``profiles.csv``.
        parts (dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]): per-node score parts
            ``(num, den)`` of every ``(variant_id, split)``, in the split's node order (the same
            for every variant; see :func:`gnnaas.inference.score_parts`).
    """

    path: Path
    service_times_path: Path
    num_profiled: int
    skipped: list[tuple[str, str]]
    calibration: Calibration
    rows: list[dict[str, Any]] = field(default_factory=list, repr=False)
    parts: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = field(
        default_factory=dict, repr=False
    )


def profile_dataset(
    store: GraphStore,
    repo: VariantRepository,
    out_dir: PathType,
    *,
    batch_size: int = 1024,
    runs: int = 30,
    device: Device = "cpu",
    progress: bool = False,
    warmup: int = 2,
    service_runs: int | None = None,
    min_time_s: float = 0.5,
    variants: Sequence[str] | None = None,
    calibration: Calibration | None = None,
    threads: int | None = None,
    sampler_seed: int = 0,
    sampling: str = "depth",
    max_batch_nodes: int | None = None,
    only: Sequence[str] | None = None,
    inline_max_nodes: int = INLINE_MAX_NODES,
    feature_cache_mb: float = 0.0,
    on_phase: Callable[[str], None] | None = None,
) -> ProfileResult:
    """Profiles every variant of ``store`` and writes ``<out_dir>/<dataset>/profiles.csv``.

    Args:
        store (GraphStore): the dataset (full graph; its name selects the variants), or its
            live graph as a server's state folder holds it (:func:`gnnaas.data.live.live_store`,
            ``gnnaas profile --state-dir``).
        repo (VariantRepository): where the variants are.
        out_dir (str or PathLike): the profiles folder (``profiles``); files go to
            ``<out_dir>/<store.name>/``.
        batch_size (int, optional): target nodes per batch. (default: ``1024``)
        runs (int, optional): timed runs per variant and split, after warm-up; every batch of
            a split is timed once even when there are more batches than runs. (default: ``30``)
        device (str or torch.device, optional): where the models run. (default: ``"cpu"``)
        progress (bool, optional): show a progress bar over variants. (default: ``False``)
        warmup (int, optional): untimed runs before timing each split. (default: ``2``)
        service_runs (int, optional): least timed runs per batch size of
            ``service_times.csv``; sizes keep being timed until ``min_time_s / 4`` has passed
            (at most 200 runs). (default: ``max(3, runs // 3)``)
        min_time_s (float, optional): keep timing a split until this much time has passed, even
            after ``runs`` runs: the runs of a fast variant then span enough time for a short
            burst of other work on the machine not to move its p50. Service curves are timed in
            interleaved rounds over every variant, which spreads such bursts too.
            (default: ``0.5``)
        variants (Sequence[str], optional): profile only these variant ids. (default: all)
        calibration (Calibration, optional): ``BW``/``OPS`` to use instead of measuring them.
        threads (int, optional): torch intra-op threads while profiling (restored afterwards);
            ``None`` keeps the current setting (``OMP_NUM_THREADS`` or torch's default). On a
            machine whose cores are busy with other work, several threads wait on each other at
            every parallel region and p50s inflate and scatter; one thread measures steadily.
            (default: ``None``)
        sampler_seed (int, optional): key of the serving sampler's draws; the server's
            ``GNNAAS_SEED``. (default: ``0``)
        sampling (str, optional): the serving sampler's mode, the server's
            ``GNNAAS_SAMPLING`` (``depth`` or ``shared``). (default: ``"depth"``)
        max_batch_nodes (int, optional): the server's largest batch (``GNNAAS_MAX_BATCH_NODES``):
            service-curve batch sizes above it are left out and it becomes a point of the
            curve. (default: ``None``, every size)
        inline_max_nodes (int, optional): the server's ``GNNAAS_INLINE_MAX_NODES``: service-curve
            batches of at most this many nodes are timed on the calling thread, as the server runs
            them on its event loop; larger ones in a worker thread. (default: ``16``)
        only (Sequence[str], optional): time only these variants (a new or changed one) and
            keep every other variant's latency rows and service curve from the existing
            files; all variants are still scored (untimed), so the paired accuracy intervals
            stay comparable. Needs existing profiles of the dataset. When one of them cannot
            be timed, nothing is written. (default: ``None``)
        feature_cache_mb (float, optional): the server's ``GNNAAS_FEATURE_CACHE_MB``: profile
            with the device feature caches it would build (see the module docstring), on
            whatever ``device`` is given; ``0`` profiles without. (default: ``0.0``)
        on_phase (Callable[[str], None], optional): called with a short description when a
            phase after the bar over variants starts (the service curves, the accuracy
            intervals, the files), so that a command can say what it does meanwhile.
            (default: ``None``)

    Returns:
        ProfileResult: paths written, number profiled, skipped variants with their reasons.

    Raises:
        ArtifactError: the repository has no variant of the dataset, or none could be profiled;
            with ``only``: no existing profiles, an unknown id, another variant missing
            from the existing profiles, or one of ``only`` that could not be timed (its reason;
            the files are left as they were).

    Example:
        >>> repo = VariantRepository("variants")
        >>> result = profile_dataset(store, repo, "profiles")  # doctest: +SKIP
        >>> result.num_profiled, result.skipped  # doctest: +SKIP
        (24, [])
    """
    for name, value in (("batch_size", batch_size), ("runs", runs)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"profile_dataset: {name} must be an integer >= 1 (got {value!r})")
    if warmup < 0 or min_time_s < 0:
        raise ValueError(
            f"profile_dataset: warmup and min_time_s must be >= 0 (got {warmup}, {min_time_s})"
        )
    if threads is not None and threads < 1:
        raise ValueError(f"profile_dataset: threads must be >= 1 (got {threads})")
    if sampling not in ("depth", "shared"):
        raise ValueError(
            f"profile_dataset: sampling must be 'depth' or 'shared' (got {sampling!r})"
        )
    if max_batch_nodes is not None and (isinstance(max_batch_nodes, bool) or max_batch_nodes < 1):
        raise ValueError(
            f"profile_dataset: max_batch_nodes must be an integer >= 1 (got {max_batch_nodes!r})"
        )
    if not (math.isfinite(feature_cache_mb) and feature_cache_mb >= 0):
        raise ValueError(
            f"profile_dataset: feature_cache_mb must be a finite number >= 0 "
            f"(got {feature_cache_mb!r})"
        )
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _profile_dataset(
            store,
            repo,
            Path(out_dir),
            batch_size=batch_size,
            runs=runs,
            device=torch.device(device),
            progress=progress,
            warmup=warmup,
            service_runs=service_runs,
            min_time_s=min_time_s,
            variants=variants,
            calibration=calibration,
            sampler_seed=sampler_seed,
            sampling=sampling,
            max_batch_nodes=max_batch_nodes,
            only=only,
            inline_max_nodes=inline_max_nodes,
            feature_cache_mb=feature_cache_mb,
            on_phase=on_phase or (lambda message: None),
        )
    finally:
        torch.set_num_threads(previous_threads)


def _warn_if_busy() -> None:
    try:
        load = os.getloadavg()[0]
    except OSError:
        return
    cores = os.cpu_count() or 1
    threads = torch.get_num_threads()
    if load > cores and threads > 1:
        _log.warning(
            "the machine is busy (load average %.1f on %d cores): with %d torch threads the "
            "timings will be inflated and noisy; profile with one thread (`gnnaas --threads 1 "
            "profile ...`) or on a quiet machine",
            load,
            cores,
            threads,
        )


def _profile_dataset(
    store: GraphStore,
    repo: VariantRepository,
    out_dir: Path,
    *,
    batch_size: int,
    runs: int,
    device: torch.device,
    progress: bool,
    warmup: int,
    service_runs: int | None,
    min_time_s: float,
    variants: Sequence[str] | None,
    calibration: Calibration | None,
    sampler_seed: int,
    sampling: str,
    max_batch_nodes: int | None,
    only: Sequence[str] | None = None,
    inline_max_nodes: int = INLINE_MAX_NODES,
    feature_cache_mb: float = 0.0,
    on_phase: Callable[[str], None],
) -> ProfileResult:
    from tqdm.auto import tqdm

    from gnnaas.profiling.uncertainty import add_accuracy_intervals

    dev = device
    _warn_if_busy()
    manifests = repo.list(store.name)
    skipped = unlisted_variants(repo, store.name, {m.variant_id for m in manifests})
    if variants is not None:
        wanted = set(variants)
        manifests = [m for m in manifests if m.variant_id in wanted]
        skipped = [s for s in skipped if s[0] in wanted]
    if not manifests and not skipped:
        raise ArtifactError(
            f"no variants of {store.name} in {repo.root}; "
            f"generate them with `gnnaas generate --dataset {store.name}`"
        )
    kept_rows, kept_curves = (
        kept_profiles(out_dir / store.name, manifests, set(only)) if only else ({}, [])
    )

    calibration = calibration or calibrate(dev)
    _log.info(
        "calibration: bw_gb_s: %.2f ops_g_s: %.1f", calibration.bw / 1e9, calibration.ops / 1e9
    )
    date = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    prof = DatasetProfiler(
        store,
        batch_size=batch_size,
        runs=runs,
        warmup=warmup,
        service_runs=service_runs if service_runs is not None else max(3, runs // 3),
        min_time_s=min_time_s,
        device=dev,
        calibration=calibration,
        date=date,
        sampler_seed=sampler_seed,
        sampling=sampling,
        max_batch_nodes=max_batch_nodes,
        inline_max_nodes=inline_max_nodes,
    )
    common = {
        "dataset": store.name,
        "device": str(dev) if dev.type == "cpu" else f"{dev} ({torch.cuda.get_device_name(dev)})",
        "threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "date": date,
    }

    cache_nodes = (
        planned_caches(
            store,
            manifests,
            out_dir / store.name,
            feature_cache_mb,
            sampler_seed=sampler_seed,
            sampling=sampling,
        )
        if feature_cache_mb > 0
        else {}
    )
    rows: list[dict[str, Any]] = []
    parts: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
    executors: dict[str, Executor] = {}  # all kept for the interleaved service curves
    bar = tqdm(manifests, desc=f"profile {store.name}", unit="variant", disable=not progress)
    # No outer inference_mode: the path applies it where the server does (not to sampling).
    try:
        for listed in bar:
            variant_id = listed.variant_id
            bar.set_postfix_str(variant_id)
            try:
                loaded = repo.load(store.name, variant_id, device=dev)
                manifest = loaded.manifest
                check_manifest(manifest, store)
            except (ArtifactError, ConfigError) as exc:
                _log.warning("skipping variant %s: %s", variant_id, exc)
                skipped.append((variant_id, str(exc)))
                continue
            features = store.feature_subset(manifest.kept_features)
            try:
                answers = precomputed_answers(repo, manifest, store)
            except ArtifactError as exc:
                _log.warning("skipping variant %s: %s", variant_id, exc)
                skipped.append((variant_id, str(exc)))
                continue
            sampler = prof.sampler(manifest.fanouts)
            nodes = cache_nodes.get(variant_id) if answers is None else None
            cache = None if nodes is None else FeatureCache(features, nodes, dev)
            inference: InferencePath = (
                InferencePath(loaded.model, features, sampler, dev, cache=cache)
                if answers is None
                else LookupPath(loaded.model, features, sampler, answers, dev)
            )
            folder = repo.path(store.name, variant_id)
            size_kb = sum(f.stat().st_size for f in folder.glob("*.safetensors")) / 1024
            head = {
                **common,
                "variant": variant_id,
                "arch": manifest.arch,
                "ranking": manifest.ranking,
                "prune": manifest.prune,
                "features_kept": manifest.in_channels,
                "size_kb": served_size_kb(loaded.model, size_kb),
                "fanouts": ".".join(str(f) for f in manifest.fanouts),
                "hidden_channels": manifest.hidden_channels,
                "precision": manifest.precision,
                "base": "" if manifest.base is None else manifest.base["variant"],
            }
            if variant_id in kept_rows:  # --only another variant: score it, keep its timings
                for split, nodes in (("val", store.val_idx), ("test", store.test_idx)):
                    parts[(variant_id, split)] = prof.score_split(inference, nodes)
                    rows.append(kept_rows[variant_id][split])
                del loaded, inference
                continue
            for split, nodes in (("val", store.val_idx), ("test", store.test_idx)):
                fields, parts[(variant_id, split)] = prof.profile_split(
                    inference, manifest, nodes, split, timed=split == "val"
                )
                row = {**head, **fields}
                rows.append(row)
                _log.info(
                    "variant: %s split: %s accuracy: %.2f latency_ms: %.3f comm_comp: %.3f",
                    variant_id,
                    split,
                    row["accuracy"],
                    row["latency_ms"],
                    row["comm_comp"],
                )
            executor = Executor(
                loaded.model,
                features,
                prof.sampler(manifest.fanouts),
                device=dev,
                multi_label=manifest.multi_label,
                name=variant_id,
                answers=answers,
                cache=cache,
            )
            executors[variant_id] = executor
            del loaded, inference, executor, cache
        if executors:
            on_phase(
                f"timing the service curves of {len(executors)} variant(s) in interleaved rounds"
            )
        service_rows = kept_curves + (prof.service_times(executors) if executors else [])
    finally:
        prof.close()

    if not rows:
        reasons = "; ".join(f"{v}: {r}" for v, r in skipped)
        raise ArtifactError(f"no variant of {store.name} could be profiled ({reasons})")
    untimed = [(v, r) for v, r in skipped if only and v in only]
    if untimed:  # --only X that X could not be timed: keep every file as it was
        reasons = "; ".join(f"{v}: {r}" for v, r in untimed)
        raise ArtifactError(f"could not time {reasons}; no profile was changed")
    on_phase(f"bootstrapping the paired accuracy intervals of {len(rows) // 2} variant(s)")
    add_accuracy_intervals(rows, parts)
    folder = Path(out_dir) / store.name
    on_phase(f"writing {PROFILES_FILE} and {SERVICE_TIMES_FILE} to {folder}")
    path = write_profiles(rows, folder / PROFILES_FILE)
    service_path = write_service_times(service_rows, folder / SERVICE_TIMES_FILE)
    num_profiled = len({r["variant"] for r in rows})
    _log.info("profiled: %d skipped: %d path: %s", num_profiled, len(skipped), path)
    return ProfileResult(
        path=path,
        service_times_path=service_path,
        num_profiled=num_profiled,
        skipped=skipped,
        calibration=calibration,
        rows=rows,
        parts=parts,
    )
