"""The profiler: accuracy and latency of every variant of a dataset (docs/architecture.md).

Every variant is opened by the runtime as the server opens it (:func:`gnnaas.runtime.open_variant`
on a :class:`~gnnaas.runtime.RuntimeGraph` with the server's sampler seed), and every batch runs
through the executor the server serves with (:meth:`gnnaas.runtime.RuntimeVariant.executor`, its
:class:`~gnnaas.inference.InferencePath` for the stage timings), so the profile measures the
pipeline that is served by construction. For
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
the server would build for this dataset (:func:`gnnaas.runtime.plan_feature_caches`, the
server's own planning: the budget split over the dataset's variants with equal traffic shares,
nodes in the order of ``cache_ranking.safetensors`` beside the profiles when ``gnnaas
cache-plan`` wrote one for the sampler, else by neighbor count). Timings, service curves
included, are then those of the cached path; ``cache_nodes``, ``hit_ratio`` and ``copied_kb``
record the cache and what each batch moved (:data:`~gnnaas.profiling.table.CACHE_COLUMNS`;
without a cache they are 0, 0 and every sampled row's bytes).

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
is :mod:`gnnaas.profiling.measurement`'s, and what a variant runs with (the checks against the
graph, precomputed answers, planned caches) the runtime's.
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
from gnnaas.inference import INLINE_MAX_NODES, Executor
from gnnaas.profiling.measurement import DatasetProfiler
from gnnaas.profiling.perfmodel import Calibration, calibrate
from gnnaas.profiling.table import (
    PROFILES_FILE,
    SERVICE_TIMES_FILE,
    read_profiles,
    read_service_times,
    write_profiles,
    write_service_times,
)
from gnnaas.runtime import (
    CacheDemand,
    RuntimeGraph,
    open_variant,
    plan_feature_caches,
    served_size_kb,
)
from gnnaas.typing import Device, PathType

if TYPE_CHECKING:
    from gnnaas.data import GraphStore
    from gnnaas.variants.manifest import Manifest
    from gnnaas.variants.repository import VariantRepository

__all__ = ["ProfileOptions", "ProfileResult", "profile_dataset"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProfileOptions:
    """How a profile run measures: the timing knobs and the server's pipeline it matches.

    Args:
        batch_size (int, optional): target nodes per batch. (default: ``1024``)
        runs (int, optional): timed runs per variant and split, after warm-up; every batch of
            a split is timed once even when there are more batches than runs. (default: ``30``)
        warmup (int, optional): untimed runs before timing each split. (default: ``2``)
        service_runs (int, optional): least timed runs per batch size of
            ``service_times.csv``; sizes keep being timed until ``min_time_s / 4`` has passed
            (at most 200 runs). (default: ``max(3, runs // 3)``)
        min_time_s (float, optional): keep timing a split until this much time has passed, even
            after ``runs`` runs: the runs of a fast variant then span enough time for a short
            burst of other work on the machine not to move its p50. Service curves are timed in
            interleaved rounds over every variant, which spreads such bursts too.
            (default: ``0.5``)
        threads (int, optional): torch intra-op threads while profiling (restored afterwards);
            ``None`` keeps the current setting. On a machine whose cores are busy with other
            work, several threads wait on each other at every parallel region and p50s inflate
            and scatter; one thread measures steadily. (default: ``None``)
        sampler_seed (int, optional): key of the serving sampler's draws; the server's
            ``GNNAAS_SEED``. (default: ``0``)
        max_batch_nodes (int, optional): the server's largest batch (``GNNAAS_MAX_BATCH_NODES``):
            service-curve batch sizes above it are left out and it becomes a point of the
            curve. (default: ``None``, every size)
        inline_max_nodes (int, optional): the server's ``GNNAAS_INLINE_MAX_NODES``: service-curve
            batches of at most this many nodes are timed on the calling thread, as the server runs
            them on its event loop; larger ones in a worker thread. (default: ``16``)
        feature_cache_mb (float, optional): the server's ``GNNAAS_FEATURE_CACHE_MB``: profile
            with the device feature caches it would build (see the module docstring), on
            whatever device is given; ``0`` profiles without. (default: ``0.0``)
        graph_version (int, optional): the version of the live graph the store is a snapshot
            of (``gnnaas profile --state-dir``), which a precomputed variant's answers must be
            of; ``0`` for the dataset as loaded. (default: ``0``)
        state_dir (str | Path, optional): the server's state folder that live graph was read
            from, named in the commands a precomputed variant's mismatch suggests.
            (default: ``None``)

    Raises:
        ValueError: a value out of its range.
    """

    batch_size: int = 1024
    runs: int = 30
    warmup: int = 2
    service_runs: int | None = None
    min_time_s: float = 0.5
    threads: int | None = None
    sampler_seed: int = 0
    max_batch_nodes: int | None = None
    inline_max_nodes: int = INLINE_MAX_NODES
    feature_cache_mb: float = 0.0
    graph_version: int = 0
    state_dir: str | Path | None = None

    def __post_init__(self) -> None:
        for name in ("batch_size", "runs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"profile_dataset: {name} must be an integer >= 1 (got {value!r})")
        if self.warmup < 0 or self.min_time_s < 0:
            raise ValueError(
                "profile_dataset: warmup and min_time_s must be >= 0 "
                f"(got {self.warmup}, {self.min_time_s})"
            )
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"profile_dataset: threads must be >= 1 (got {self.threads})")
        cap = self.max_batch_nodes
        if cap is not None and (isinstance(cap, bool) or cap < 1):
            raise ValueError(
                f"profile_dataset: max_batch_nodes must be an integer >= 1 (got {cap!r})"
            )
        if not (math.isfinite(self.feature_cache_mb) and self.feature_cache_mb >= 0):
            raise ValueError(
                "profile_dataset: feature_cache_mb must be a finite number >= 0 "
                f"(got {self.feature_cache_mb!r})"
            )


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
    device: Device = "cpu",
    progress: bool = False,
    variants: Sequence[str] | None = None,
    only: Sequence[str] | None = None,
    calibration: Calibration | None = None,
    on_phase: Callable[[str], None] | None = None,
    **options: Any,
) -> ProfileResult:
    """Profiles every variant of ``store`` and writes ``<out_dir>/<dataset>/profiles.csv``.

    Args:
        store (GraphStore): the dataset (full graph; its name selects the variants), or its
            live graph as a server's state folder holds it (:func:`gnnaas.data.live.live_store`,
            ``gnnaas profile --state-dir``, with ``graph_version``).
        repo (VariantRepository): where the variants are.
        out_dir (str or PathLike): the profiles folder (``profiles``); files go to
            ``<out_dir>/<store.name>/``.
        device (str or torch.device, optional): where the models run. (default: ``"cpu"``)
        progress (bool, optional): show a progress bar over variants. (default: ``False``)
        variants (Sequence[str], optional): profile only these variant ids. (default: all)
        only (Sequence[str], optional): time only these variants (a new or changed one) and
            keep every other variant's latency rows and service curve from the existing
            files; all variants are still scored (untimed), so the paired accuracy intervals
            stay comparable. Needs existing profiles of the dataset. When one of them cannot
            be timed, nothing is written. (default: ``None``)
        calibration (Calibration, optional): ``BW``/``OPS`` to use instead of measuring them.
        on_phase (Callable[[str], None], optional): called with a short description when a
            phase after the bar over variants starts (the service curves, the accuracy
            intervals, the files), so that a command can say what it does meanwhile.
            (default: ``None``)
        **options: the fields of :class:`ProfileOptions` (``batch_size``, ``runs``,
            ``threads``, ``sampler_seed``, ``max_batch_nodes``, ...).

    Returns:
        ProfileResult: paths written, number profiled, skipped variants with their reasons.

    Raises:
        ValueError: an option out of its range (:class:`ProfileOptions`).
        ArtifactError: the repository has no variant of the dataset, or none could be profiled;
            with ``only``: no existing profiles, an unknown id, another variant missing
            from the existing profiles, or a variant that could not be opened or timed (its
            reason; the files are left as they were: writing them would drop its rows).

    Example:
        >>> repo = VariantRepository("variants")
        >>> result = profile_dataset(store, repo, "profiles")  # doctest: +SKIP
        >>> result.num_profiled, result.skipped  # doctest: +SKIP
        (24, [])
    """
    opts = ProfileOptions(**options)
    previous_threads = torch.get_num_threads()
    if opts.threads is not None:
        torch.set_num_threads(opts.threads)
    try:
        run = _ProfileRun(store, repo, Path(out_dir), torch.device(device), opts)
        return run.run(variants, only, calibration, progress, on_phase or (lambda message: None))
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


class _ProfileRun:
    """One :func:`profile_dataset`: the variants listed, measured one by one, then the files."""

    def __init__(
        self,
        store: GraphStore,
        repo: VariantRepository,
        out_dir: Path,
        device: torch.device,
        opts: ProfileOptions,
    ) -> None:
        self.store, self.repo, self.device, self.opts = store, repo, device, opts
        self.folder = out_dir / store.name
        self.graph = RuntimeGraph(
            store, seed=opts.sampler_seed, version=opts.graph_version, state_dir=opts.state_dir
        )
        self.skipped: list[tuple[str, str]] = []
        self.rows: list[dict[str, Any]] = []
        self.parts: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
        self.executors: dict[str, Executor] = {}  # all kept for the interleaved service curves

    def run(
        self,
        variants: Sequence[str] | None,
        only: Sequence[str] | None,
        calibration: Calibration | None,
        progress: bool,
        on_phase: Callable[[str], None],
    ) -> ProfileResult:
        _warn_if_busy()
        manifests = self._manifests(variants)
        kept_rows, kept_curves = (
            kept_profiles(self.folder, manifests, set(only)) if only else ({}, [])
        )
        calibration = calibration or calibrate(self.device)
        _log.info(
            "calibration: bw_gb_s: %.2f ops_g_s: %.1f", calibration.bw / 1e9, calibration.ops / 1e9
        )
        prof = self._profiler(calibration)
        try:
            self._measure_all(prof, manifests, kept_rows, progress)
            if self.executors:
                on_phase(
                    f"timing the service curves of {len(self.executors)} variant(s) in "
                    "interleaved rounds"
                )
            service_rows = kept_curves + (
                prof.service_times(self.executors) if self.executors else []
            )
        finally:
            prof.close()
        return self._write(service_rows, calibration, only, on_phase)

    def _manifests(self, variants: Sequence[str] | None) -> list[Manifest]:
        """The variants to profile; the folders the repository could not read are skipped."""
        store = self.store
        manifests, self.skipped = self.repo.scan(store.name)
        if variants is not None:
            wanted = set(variants)
            manifests = [m for m in manifests if m.variant_id in wanted]
            self.skipped = [s for s in self.skipped if s[0] in wanted]
        if not manifests and not self.skipped:
            raise ArtifactError(
                f"no variants of {store.name} in {self.repo.root}; "
                f"generate them with `gnnaas generate --dataset {store.name}`"
            )
        return manifests

    def _profiler(self, calibration: Calibration) -> DatasetProfiler:
        opts = self.opts
        self.date = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return DatasetProfiler(
            self.graph,
            batch_size=opts.batch_size,
            runs=opts.runs,
            warmup=opts.warmup,
            service_runs=opts.service_runs
            if opts.service_runs is not None
            else max(3, opts.runs // 3),
            min_time_s=opts.min_time_s,
            device=self.device,
            calibration=calibration,
            date=self.date,
            max_batch_nodes=opts.max_batch_nodes,
            inline_max_nodes=opts.inline_max_nodes,
        )

    def _measure_all(
        self,
        prof: DatasetProfiler,
        manifests: Sequence[Manifest],
        kept_rows: dict[str, dict[str, dict[str, Any]]],
        progress: bool,
    ) -> None:
        """Every variant, in repository order, under a bar (no outer ``inference_mode``: the path
        applies it where the server does, not to sampling)."""
        from tqdm.auto import tqdm

        caches = self._planned_caches(manifests) if self.opts.feature_cache_mb > 0 else {}
        bar = tqdm(
            manifests, desc=f"profile {self.store.name}", unit="variant", disable=not progress
        )
        for manifest in bar:
            bar.set_postfix_str(manifest.variant_id)
            try:
                self._measure(prof, manifest, caches.get(manifest.variant_id), kept_rows)
            except (ArtifactError, ConfigError) as exc:
                _log.warning("skipping variant %s: %s", manifest.variant_id, exc)
                self.skipped.append((manifest.variant_id, str(exc)))

    def _planned_caches(self, manifests: Sequence[Manifest]) -> dict[str, torch.Tensor]:
        """The device feature caches a server serving this dataset alone would build."""
        element = self.store.x.element_size()
        demands = [
            CacheDemand(
                m.variant_id, self.graph, self.folder, tuple(m.fanouts), m.in_channels * element
            )
            for m in manifests
            if m.precomputed is None  # answers are looked up: no feature is read
        ]
        return plan_feature_caches(demands, int(self.opts.feature_cache_mb * 2**20))  # type: ignore[return-value]

    def _measure(
        self,
        prof: DatasetProfiler,
        manifest: Manifest,
        cache_nodes: torch.Tensor | None,
        kept_rows: dict[str, dict[str, dict[str, Any]]],
    ) -> None:
        """One variant: opened as the server opens it, scored (and timed unless its timings are
        kept), its executor kept for the service curves."""
        variant = open_variant(self.repo, manifest, self.graph, self.device)
        if variant.problem is not None:
            raise ArtifactError(variant.problem)
        variant.cache_nodes = cache_nodes
        executor = variant.executor(self.graph, self.device)
        path, variant_id = executor.path, manifest.variant_id
        splits = (("val", self.store.val_idx), ("test", self.store.test_idx))
        if variant_id in kept_rows:  # --only another variant: score it, keep its timings
            for split, nodes in splits:
                self.parts[(variant_id, split)] = prof.score_split(path, nodes)
                self.rows.append(kept_rows[variant_id][split])
            return
        head = self._head(manifest, variant.model)
        for split, nodes in splits:
            fields, self.parts[(variant_id, split)] = prof.profile_split(
                path, manifest, nodes, split, timed=split == "val"
            )
            row = {**head, **fields}
            self.rows.append(row)
            _log.info(
                "variant: %s split: %s accuracy: %.2f latency_ms: %.3f comm_comp: %.3f",
                variant_id,
                split,
                row["accuracy"],
                row["latency_ms"],
                row["comm_comp"],
            )
        self.executors[variant_id] = executor

    def _head(self, manifest: Manifest, model: torch.nn.Module) -> dict[str, Any]:
        """The columns of a variant's rows that do not depend on running it."""
        dev = self.device
        folder = self.repo.path(self.store.name, manifest.variant_id)
        stored_kb = sum(f.stat().st_size for f in folder.glob("*.safetensors")) / 1024
        return {
            "dataset": self.store.name,
            "device": str(dev)
            if dev.type == "cpu"
            else f"{dev} ({torch.cuda.get_device_name(dev)})",
            "threads": torch.get_num_threads(),
            "torch_version": torch.__version__,
            "date": self.date,
            "variant": manifest.variant_id,
            "arch": manifest.arch,
            "ranking": manifest.ranking,
            "prune": manifest.prune,
            "features_kept": manifest.in_channels,
            "size_kb": served_size_kb(model, stored_kb),
            "fanouts": ".".join(str(f) for f in manifest.fanouts),
            "hidden_channels": manifest.hidden_channels,
            "precision": manifest.precision,
            "base": "" if manifest.base is None else manifest.base["variant"],
        }

    def _write(
        self,
        service_rows: list[dict[str, Any]],
        calibration: Calibration,
        only: Sequence[str] | None,
        on_phase: Callable[[str], None],
    ) -> ProfileResult:
        """The accuracy intervals, then both files (nothing when a variant of ``only`` failed)."""
        from gnnaas.profiling.uncertainty import add_accuracy_intervals

        rows, skipped, name = self.rows, self.skipped, self.store.name
        if not rows:
            reasons = "; ".join(f"{v}: {r}" for v, r in skipped)
            raise ArtifactError(f"no variant of {name} could be profiled ({reasons})")
        if only and skipped:  # keep every file as it was: a variant's rows would be lost
            reasons = "; ".join(f"{v}: {r}" for v, r in skipped)
            what = "time" if all(v in only for v, _ in skipped) else "open"
            raise ArtifactError(f"could not {what} {reasons}; no profile was changed")
        on_phase(f"bootstrapping the paired accuracy intervals of {len(rows) // 2} variant(s)")
        add_accuracy_intervals(rows, self.parts)
        on_phase(f"writing {PROFILES_FILE} and {SERVICE_TIMES_FILE} to {self.folder}")
        path = write_profiles(rows, self.folder / PROFILES_FILE)
        service_path = write_service_times(service_rows, self.folder / SERVICE_TIMES_FILE)
        num_profiled = len({r["variant"] for r in rows})
        _log.info("profiled: %d skipped: %d path: %s", num_profiled, len(skipped), path)
        return ProfileResult(
            path=path,
            service_times_path=service_path,
            num_profiled=num_profiled,
            skipped=skipped,
            calibration=calibration,
            rows=rows,
            parts=self.parts,
        )


def kept_profiles(
    folder: Path, manifests: Sequence[Manifest], only: set[str]
) -> tuple[dict[str, dict[str, dict[str, Any]]], list[dict[str, Any]]]:
    """For ``profile --only``: the existing rows and curves of every variant not in ``only``.

    Returns:
        tuple: ``{variant: {split: row}}`` and the service-curve rows of those variants.

    Raises:
        ArtifactError: ``only`` names an unknown variant, or the other variants have no
            profiles to keep.
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
