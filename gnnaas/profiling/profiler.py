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
(:func:`gnnaas.inference.settings.execution_settings`: threads, fused forward, compiled sampler,
inline threshold, device, versions); a server under other settings re-times the curve.
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from gnnaas.errors import ArtifactError, ConfigError
from gnnaas.inference import (
    INLINE_MAX_NODES,
    Executor,
    FeatureCache,
    InferencePath,
    StageTimes,
    Transfer,
    metric,
    score_parts,
)
from gnnaas.inference.lookup import LookupPath, PrecomputedAnswers
from gnnaas.inference.settings import execution_settings
from gnnaas.profiling.curves import CurveTimer, hit_ratio, service_sizes
from gnnaas.profiling.perfmodel import Calibration, calibrate, estimate
from gnnaas.profiling.table import (
    PROFILES_FILE,
    SERVICE_TIMES_FILE,
    read_profiles,
    read_service_times,
    write_profiles,
    write_service_times,
)
from gnnaas.profiling.timers import peak_memory_bytes, summarize
from gnnaas.typing import Device, PathType

if TYPE_CHECKING:
    from gnnaas.data import GraphStore
    from gnnaas.variants.manifest import Manifest
    from gnnaas.variants.repository import VariantRepository

__all__ = ["ProfileResult", "profile_dataset"]

_log = logging.getLogger(__name__)

_UNTIMED_SPLIT_RUNS = 5  # timed runs of a split profiled for its accuracy (test)


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


def _fanout_bound(fanouts: Sequence[int], max_degree: int) -> list[int]:
    return [int(s) if int(s) > 0 else max(1, max_degree) for s in fanouts]


def _channels(manifest: Manifest) -> list[int]:
    hidden = [manifest.hidden_channels] * (manifest.num_layers - 1)
    return [manifest.in_channels, *hidden, manifest.out_channels]


def _check_manifest(manifest: Manifest, store: GraphStore) -> None:
    if manifest.num_features != store.num_features:
        raise ArtifactError(
            f"variant {manifest.variant_id} was trained on {manifest.num_features} features but "
            f"{store.name} has {store.num_features}; regenerate with "
            f"`gnnaas generate --dataset {store.name} --force`"
        )
    if manifest.kept_features and max(manifest.kept_features) >= store.num_features:
        raise ArtifactError(
            f"variant {manifest.variant_id} keeps feature ids beyond {store.num_features}; "
            f"regenerate with `gnnaas generate --dataset {store.name} --force`"
        )
    if manifest.out_channels != store.num_classes:
        raise ArtifactError(
            f"variant {manifest.variant_id} predicts {manifest.out_channels} classes but "
            f"{store.name} has {store.num_classes}; regenerate the variant"
        )


class _Profiler:
    """State shared by the variants of one dataset: samplers, rates, settings."""

    def __init__(
        self,
        store: GraphStore,
        *,
        batch_size: int,
        runs: int,
        warmup: int,
        service_runs: int,
        min_time_s: float,
        device: torch.device,
        calibration: Calibration,
        date: str,
        sampler_seed: int,
        sampling: str,
        max_batch_nodes: int | None,
        inline_max_nodes: int = INLINE_MAX_NODES,
    ) -> None:
        self.store = store
        self.batch_size = batch_size
        self.runs = runs
        self.warmup = warmup
        self.service_runs = service_runs
        self.min_time_s = min_time_s
        self.device = device
        self.calibration = calibration
        self.date = date
        self.sampler_seed = sampler_seed
        self.sampling = sampling
        self.max_batch_nodes = max_batch_nodes
        self.inline_max_nodes = inline_max_nodes
        self.max_degree = (
            int((store.rowptr[1:] - store.rowptr[:-1]).max()) if store.num_nodes else 1
        )
        self._samplers: dict[tuple[int, ...], Any] = {}
        self.settings = execution_settings(device, inline_max_nodes=inline_max_nodes)
        self.timer = CurveTimer(max(store.num_nodes, 1), inline_max_nodes=inline_max_nodes)

    def close(self) -> None:
        """Stops the curve timer's worker thread."""
        self.timer.close()

    def sampler(self, fanouts: Sequence[int]) -> Any:
        """The serving sampler for ``fanouts``, built as the server builds it, once."""
        from gnnaas.sampling import serving_sampler

        key = tuple(int(s) for s in fanouts)
        if key not in self._samplers:
            self._samplers[key] = serving_sampler(
                self.store.rowptr, self.store.col, key, seed=self.sampler_seed, mode=self.sampling
            )
        return self._samplers[key]

    def score_split(self, path: InferencePath, nodes: Tensor) -> tuple[np.ndarray, np.ndarray]:
        """The per-node score parts of one split, untimed (for paired intervals)."""
        nums, dens = [], []
        for batch in torch.split(nodes, self.batch_size):
            num, den = score_parts(path.run(batch).logits, self.store.y[batch])
            nums.append(num)
            dens.append(den)
        num_all, den_all = torch.cat(nums), torch.cat(dens)
        return num_all.cpu().numpy().astype(np.float64), den_all.cpu().numpy().astype(np.float64)

    def profile_split(
        self,
        path: InferencePath,
        manifest: Manifest,
        nodes: Tensor,
        split: str,
        *,
        timed: bool = True,
    ) -> tuple[dict[str, Any], tuple[np.ndarray, np.ndarray]]:
        """The profile row fields of one split that depend on running it, and its score parts.

        With ``timed`` the split's full batches are timed until ``runs`` timings exist and
        ``min_time_s`` has passed; without, only the accuracy pass's own timings count (the
        test split: its accuracy is what matters, the router reads the validation row and the
        service curve).
        """
        if nodes.numel() == 0:
            raise ArtifactError(f"{self.store.name} has no {split} nodes to profile")
        batches = list(torch.split(nodes, self.batch_size))
        full = [b for b in batches if b.numel() == batches[0].numel()]
        bound = math.prod(_fanout_bound(manifest.fanouts, self.max_degree))
        y = self.store.y

        for _ in range(self.warmup):
            path.run(batches[0])

        times: list[StageTimes] = []
        fracs: list[float] = []
        scores: list[float] = []
        nums: list[Tensor] = []
        dens: list[Tensor] = []
        moved: list[Transfer] = []  # every batch's feature rows (the cache's hit ratio)
        for batch in batches:  # accuracy pass, timing every full batch
            out = path.run(batch)
            moved.append(path.last_transfer)
            num, den = score_parts(out.logits, y[batch])  # [b] each, in split order
            nums.append(num)
            dens.append(den)
            scores.append(metric(num, den))
            if batch.numel() == batches[0].numel():
                times.append(out.times)
                fracs.append(out.num_sampled / (batch.numel() * bound))
        i = 0
        deadline = time.monotonic() + (self.min_time_s if timed else 0.0)
        runs = self.runs if timed else min(self.runs, _UNTIMED_SPLIT_RUNS)
        while len(times) < runs or time.monotonic() < deadline:
            times.append(path.run(full[i % len(full)]).times)
            i += 1

        num_all, den_all = torch.cat(nums), torch.cat(dens)  # [n] each
        accuracy = 100.0 * metric(num_all, den_all)
        if len(scores) > 1:
            accuracy_std = 100.0 * float(np.std(scores))
        else:
            p = accuracy / 100.0
            accuracy_std = 100.0 * math.sqrt(max(p * (1.0 - p), 0.0) / max(nodes.numel(), 1))

        stage = {
            "sample": summarize([t.sample_ms for t in times]).p50,
            "comp": summarize([t.compute_ms for t in times]).p50,
        }
        comm = summarize([t.comm_ms for t in times])
        latency = summarize([t.latency_ms for t in times])
        e2e = summarize([t.total_ms for t in times])
        comm_ms, comp_ms = comm.p50, stage["comp"]

        sub = path.sampler.sample(batches[0])
        mem_bytes = peak_memory_bytes(lambda: path.forward(sub), self.device)

        t = int(batches[0].numel())
        unique_frac = float(np.mean(fracs)) if fracs else 1.0
        pred = estimate(
            t,
            _fanout_bound(manifest.fanouts, self.max_degree),
            _channels(manifest),
            unique_frac=max(unique_frac, 1e-12),
            bw=self.calibration.bw,
            ops=self.calibration.ops,
        )
        fields = {
            "split": split,
            "batch_size": t,
            "num_batches": len(batches),
            "accuracy": accuracy,
            "accuracy_std": accuracy_std,
            "sample_ms": stage["sample"],
            "comm_ms": comm_ms,
            "comp_ms": comp_ms,
            "latency_ms": latency.p50,
            "latency_p95_ms": latency.p95,
            "latency_p99_ms": latency.p99,
            "latency_std_ms": latency.std,
            "e2e_ms": e2e.p50,
            "comm_comp": comm_ms / comp_ms if comp_ms > 0 else float("inf"),
            "mem_mb": mem_bytes / 2**20,
            "unique_frac": unique_frac,
            **_cache_fields(path, moved, batches[0].numel(), [b.numel() for b in batches]),
            "pred_comm_ms": pred.comm_ms,
            "pred_comp_ms": pred.comp_ms,
        }
        parts = (num_all.cpu().numpy().astype(np.float64), den_all.cpu().numpy().astype(np.float64))
        return fields, parts

    def service_times(self, executors: dict[str, Executor]) -> list[dict[str, Any]]:
        """The service curves (:meth:`gnnaas.profiling.curves.CurveTimer.curves`), each point
        stamped with the serving sampler and the execution settings it was measured under."""
        rows = self.timer.curves(
            executors,
            service_sizes(self.max_batch_nodes),
            service_runs=self.service_runs,
            min_time_s=self.min_time_s,
        )
        stamp = {"sampling": self.sampling, "sampler_seed": self.sampler_seed, **self.settings}
        return [{**row, **stamp} for row in rows]


def _kept_profiles(
    folder: Path, manifests: Sequence[Manifest], only: set[str]
) -> tuple[dict[str, dict[str, dict[str, Any]]], list[dict[str, Any]]]:
    """For ``profile --only``: the existing rows and curves of every variant not in ``only``.

    Returns:
        tuple: ``{variant: {split: row}}`` and the service-curve rows of those variants.
    """
    listed = {m.variant_id for m in manifests}
    unknown = sorted(only - listed)
    if unknown:
        raise ArtifactError(
            f"--only names variants that are not in the repository: {', '.join(unknown)}"
        )
    try:
        frame, curves = read_profiles(folder), read_service_times(folder)
    except ArtifactError as exc:
        raise ArtifactError(
            f"--only needs existing profiles to keep ({exc}); profile every variant first"
        ) from None
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    for record in frame.to_dict("records"):
        rows.setdefault(str(record["variant"]), {})[str(record["split"])] = record
    others = listed - only
    missing = sorted(v for v in others if set(rows.get(v, {})) != {"val", "test"})
    if missing:
        raise ArtifactError(
            f"--only keeps the other variants' profiles, but {', '.join(missing)} "
            "have none; profile every variant first"
        )
    kept_curves = [r for r in curves.to_dict("records") if r["variant"] in others]
    return {v: rows[v] for v in others}, kept_curves


def _answers(
    repo: VariantRepository, manifest: Manifest, store: GraphStore
) -> PrecomputedAnswers | None:
    """A precomputed variant's tables (``None`` for a trained variant), checked against the
    dataset: one row per node."""
    if manifest.precomputed is None:
        return None
    tables = repo.load_answers(manifest)
    answered, version = tables["logits"].size(0), int(manifest.precomputed["graph_version"])
    if answered != store.num_nodes:
        redo = (
            f"`gnnaas precompute --dataset {store.name} --variant "
            f"{manifest.precomputed['base']}` (with the server's --state-dir for a live graph)"
        )
        if version > 0:  # the answers of a live graph: profile on that graph
            raise ArtifactError(
                f"its answers cover {answered} nodes, those of the live graph at version "
                f"{version}, and {store.name} as profiled here has {store.num_nodes}; profile "
                f"it with --state-dir (the server's) to time it on the live graph, or run {redo} "
                "again"
            )
        raise ArtifactError(
            f"its answers cover {answered} nodes, {store.name} as profiled here has "
            f"{store.num_nodes}; run {redo} again"
        )
    return PrecomputedAnswers(
        tables["logits"], tables.get("embeddings"), manifest.precomputed["graph_version"]
    )


def _size_kb(model: torch.nn.Module, stored_kb: float) -> float:
    """The served weights' size: the stored files', or for an int8 model its parameters and
    buffers as it holds them (1-byte weights in its quantized linear layers)."""
    if getattr(model, "precision", "fp32") != "int8":
        return stored_kb
    from gnnaas.models import model_bytes

    return model_bytes(model) / 1024


def _cache_fields(
    path: InferencePath, moved: Sequence[Transfer], full: int, sizes: Sequence[int]
) -> dict[str, Any]:
    """The :data:`~gnnaas.profiling.table.CACHE_COLUMNS` of a split's accuracy pass."""
    copied = [t.copied_bytes for t, size in zip(moved, sizes, strict=True) if size == full]
    return {
        "cache_nodes": 0 if path.cache is None else path.cache.num_cached,
        "hit_ratio": hit_ratio(moved),
        "copied_kb": float(np.mean(copied)) / 1024 if copied else 0.0,
    }


def _planned_caches(
    store: GraphStore,
    manifests: Sequence[Manifest],
    folder: Path,
    budget_mb: float,
    *,
    sampler_seed: int,
    sampling: str,
) -> dict[str, Tensor]:
    """The node ids each trained variant would keep on the device if the server served this
    dataset alone with ``budget_mb`` (equal traffic shares)."""
    from gnnaas.profiling.cacheplan import assign_cache_nodes, degree_ranking, read_cache_ranking

    rankings: dict[tuple[int, ...], Any] = {}
    entries = {}
    for m in manifests:
        if m.precomputed is not None:
            continue  # answers are looked up: no feature is read
        fanouts = tuple(int(f) for f in m.fanouts)
        if fanouts not in rankings:
            ranking, source = read_cache_ranking(
                folder,
                fanouts,
                num_nodes=store.num_nodes,
                num_edges=store.num_edges,
                sampler_seed=sampler_seed,
                sampling=sampling,
            )
            if ranking is None:
                _log.info("feature cache, fanouts %s: by neighbor count (%s)", fanouts, source)
                ranking = degree_ranking(store.col, store.num_nodes)
            rankings[fanouts] = ranking
        entries[m.variant_id] = (rankings[fanouts], m.in_channels * store.x.element_size())
    return assign_cache_nodes(int(budget_mb * 2**20), entries)


def _unlisted_variants(
    repo: VariantRepository, dataset: str, listed: set[str]
) -> list[tuple[str, str]]:
    """Folders the repository skipped when listing (unreadable manifests), with the reason."""
    folder = Path(repo.root) / dataset
    if not folder.is_dir():
        return []
    skipped = []
    for child in sorted(folder.iterdir()):
        if child.name.startswith(".") or not child.is_dir() or child.name in listed:
            continue
        try:
            repo.manifest(dataset, child.name)
            reason = "not listed by the repository"
        except (ArtifactError, ConfigError) as exc:
            reason = str(exc)
        skipped.append((child.name, reason))
    return skipped


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
    skipped = _unlisted_variants(repo, store.name, {m.variant_id for m in manifests})
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
        _kept_profiles(out_dir / store.name, manifests, set(only)) if only else ({}, [])
    )

    calibration = calibration or calibrate(dev)
    _log.info(
        "calibration: bw_gb_s: %.2f ops_g_s: %.1f", calibration.bw / 1e9, calibration.ops / 1e9
    )
    date = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    prof = _Profiler(
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
        _planned_caches(
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
                _check_manifest(manifest, store)
            except (ArtifactError, ConfigError) as exc:
                _log.warning("skipping variant %s: %s", variant_id, exc)
                skipped.append((variant_id, str(exc)))
                continue
            features = store.feature_subset(manifest.kept_features)
            try:
                answers = _answers(repo, manifest, store)
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
                "size_kb": _size_kb(loaded.model, size_kb),
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
