"""The profiler: accuracy and latency breakdown of every variant of a dataset (ARCHITECTURE.md §5).

For each variant and each split (``val``, ``test``) the profiler runs batched inference over the
split's nodes on the full graph with consistent sampling and the variant's own fanouts:

1. ``warmup`` untimed runs on the first batch;
2. one pass over every batch (accuracy, per-batch accuracy, and a timing of each full batch);
3. more timed runs cycling over the full batches until ``runs`` timings exist and at least
   ``min_time_s`` has passed (a fast variant's runs then span enough time that a short burst of
   other work on a shared machine does not move its p50).

Each run is timed per stage: ``sample`` (k-hop sampling), ``gather`` (the variant's pruned columns
``store.feature_subset(kept)[n_id]`` and the host→device copy of them and of the blocks), ``comp``
(forward pass, device synchronized) and ``d2h`` (outputs back to the host). ``comm = gather + d2h``,
``latency = comm + comp`` and ``e2e = sample + latency``. Reported times are p50 over the timed
runs; ``latency_p95_ms``, ``latency_p99_ms`` and ``latency_std_ms`` describe the same runs.

``accuracy_std`` is the standard deviation of the per-batch accuracy over the split's batches.
When a split fits in one batch (Cora's validation set at batch size 1024) it is the binomial
standard error of that batch's accuracy, ``100·sqrt(p(1-p)/n)``, instead of a meaningless 0.

``mem_mb`` is the peak memory newly allocated while serving one batch (gather, copies, forward,
outputs): ``torch.cuda.max_memory_allocated`` on CUDA, torch's profiler memory accounting on the
CPU (see :func:`gnnaas.profiling.timers.peak_memory_bytes`). ``unique_frac`` is the mean over full
batches of ``len(n_id) / (t·∏ s_k)``; fanouts of ``-1`` are bounded by the maximum in-degree.
``pred_comm_ms`` and ``pred_comp_ms`` come from :mod:`gnnaas.profiling.perfmodel` with rates
calibrated once per call.

Besides ``profiles.csv`` the profiler writes ``service_times.csv``: p50 stage times of batches
of 1, 32, 256 and 1024 nodes drawn from all nodes (``min(size, num_nodes)`` nodes per batch), the
router's cost model.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from gnnaas.errors import ArtifactError, ConfigError
from gnnaas.profiling.perfmodel import Calibration, calibrate, estimate
from gnnaas.profiling.table import (
    PROFILES_FILE,
    SERVICE_TIME_BATCH_SIZES,
    SERVICE_TIMES_FILE,
    write_profiles,
    write_service_times,
)
from gnnaas.profiling.timers import StageClock, peak_memory_bytes, summarize
from gnnaas.typing import Device, PathType

if TYPE_CHECKING:
    from gnnaas.data import GraphStore
    from gnnaas.variants.repository import Manifest, VariantRepository

__all__ = ["ProfileResult", "profile_dataset"]

_log = logging.getLogger(__name__)

_WEIGHTS_FILE = "weights.safetensors"


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
    """

    path: Path
    service_times_path: Path
    num_profiled: int
    skipped: list[tuple[str, str]]
    calibration: Calibration
    rows: list[dict[str, Any]] = field(default_factory=list, repr=False)


@dataclass
class _Run:
    """One timed batch: stage times (ms), outputs on the host and the sampled node count."""

    times_ms: dict[str, float]
    out: Tensor
    num_sampled: int


class _VariantRunner:
    """Sample → gather → forward → copy back for one loaded variant."""

    def __init__(
        self, model: torch.nn.Module, features: Tensor, sampler: Any, device: torch.device
    ) -> None:
        self.model = model
        self.features = features  # [N, F_kept] on the host
        self.sampler = sampler
        self.device = device

    def _move(self, rows: Tensor, blocks: list[Any]) -> tuple[Tensor, list[Any]]:
        if self.device.type == "cpu":
            return rows, blocks  # the copy is a no-op on the CPU; the code path stays the same
        rows = rows.pin_memory().to(self.device, non_blocking=True)
        blocks = [
            dataclasses.replace(b, edge_index=b.edge_index.to(self.device, non_blocking=True))
            for b in blocks
        ]
        return rows, blocks

    def forward_sampled(self, sub: Any) -> Tensor:
        """Gather, copy, forward and copy back one sampled batch (untimed; for memory)."""
        rows, blocks = self._move(self.features.index_select(0, sub.n_id), list(sub.blocks))
        out: Tensor = self.model(rows, blocks)
        return out.to("cpu")

    def run(self, seeds: Tensor) -> _Run:
        """One timed batch."""
        clock = StageClock(self.device)
        with clock.stage("sample"):
            sub = self.sampler.sample(seeds)
        with clock.stage("gather"):
            rows = self.features.index_select(0, sub.n_id)  # [N_s, F_kept]
            rows, blocks = self._move(rows, list(sub.blocks))
        with clock.stage("comp"):
            out = self.model(rows, blocks)  # [t, C]
        with clock.stage("d2h"):
            out = out.to("cpu")
        return _Run(clock.times_ms, out, int(sub.n_id.numel()))


def _batch_score(out: Tensor, y: Tensor, multi_label: bool) -> tuple[float, float, float]:
    """``(score, numerator, denominator)`` of one batch; F1-micro counts for multi-label."""
    if multi_label:
        pred = out > 0
        true = y > 0.5
        tp = float((pred & true).sum())
        wrong = float((pred ^ true).sum())  # fp + fn
        num, den = 2 * tp, 2 * tp + wrong
    else:
        num, den = float((out.argmax(dim=-1) == y).sum()), float(y.numel())
    return (num / den if den > 0 else 1.0), num, den


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
        self.max_degree = (
            int((store.rowptr[1:] - store.rowptr[:-1]).max()) if store.num_nodes else 1
        )
        self._samplers: dict[tuple[tuple[int, ...], int], Any] = {}
        perm_gen = torch.Generator().manual_seed(0)
        self._service_nodes = torch.randperm(store.num_nodes, generator=perm_gen)

    def sampler(self, fanouts: Sequence[int], seed: int) -> Any:
        from gnnaas.sampling import NeighborSampler

        key = (tuple(int(s) for s in fanouts), int(seed))
        if key not in self._samplers:
            self._samplers[key] = NeighborSampler(
                self.store.rowptr, self.store.col, list(key[0]), consistent=True, seed=key[1]
            )
        return self._samplers[key]

    def profile_split(
        self, runner: _VariantRunner, manifest: Manifest, nodes: Tensor, split: str
    ) -> dict[str, Any]:
        """The profile row fields of one split that depend on running it."""
        if nodes.numel() == 0:
            raise ArtifactError(f"{self.store.name} has no {split} nodes to profile")
        batches = list(torch.split(nodes, self.batch_size))
        full = [b for b in batches if b.numel() == batches[0].numel()]
        bound = math.prod(_fanout_bound(manifest.fanouts, self.max_degree))
        y = self.store.y

        for _ in range(self.warmup):
            runner.run(batches[0])

        timed: list[dict[str, float]] = []
        fracs: list[float] = []
        scores: list[float] = []
        num = den = 0.0
        for batch in batches:  # accuracy pass, timing every full batch
            run = runner.run(batch)
            score, n, d = _batch_score(run.out, y[batch], manifest.multi_label)
            scores.append(score)
            num, den = num + n, den + d
            if batch.numel() == batches[0].numel():
                timed.append(run.times_ms)
                fracs.append(run.num_sampled / (batch.numel() * bound))
        i = 0
        deadline = time.monotonic() + self.min_time_s
        while len(timed) < self.runs or time.monotonic() < deadline:
            timed.append(runner.run(full[i % len(full)]).times_ms)
            i += 1

        accuracy = 100.0 * num / den if den > 0 else 0.0
        if len(scores) > 1:
            accuracy_std = 100.0 * float(np.std(scores))
        else:
            p = accuracy / 100.0
            accuracy_std = 100.0 * math.sqrt(max(p * (1.0 - p), 0.0) / max(nodes.numel(), 1))

        stage = {k: summarize([t[k] for t in timed]).p50 for k in ("sample", "gather", "comp")}
        comm = [t["gather"] + t["d2h"] for t in timed]
        latency = summarize([c + t["comp"] for c, t in zip(comm, timed, strict=True)])
        e2e = summarize([c + t["comp"] + t["sample"] for c, t in zip(comm, timed, strict=True)])
        comm_ms, comp_ms = summarize(comm).p50, stage["comp"]

        sub = runner.sampler.sample(batches[0])
        mem_bytes = peak_memory_bytes(lambda: runner.forward_sampled(sub), self.device)

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
        return {
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
            "pred_comm_ms": pred.comm_ms,
            "pred_comp_ms": pred.comp_ms,
        }

    def service_times(self, runner: _VariantRunner, variant_id: str) -> list[dict[str, Any]]:
        """p50 stage times per batch size, seeds drawn from a fixed permutation of all nodes."""
        rows = []
        num_nodes = self._service_nodes.numel()
        for size in SERVICE_TIME_BATCH_SIZES:
            t = min(size, num_nodes)
            windows = [
                self._service_nodes.roll(-((r * t) % num_nodes))[:t]
                for r in range(self.service_runs + 1)
            ]
            runner.run(windows[0])  # warm-up
            timed = [runner.run(w).times_ms for w in windows[1:]]
            gather = [x["gather"] + x["d2h"] for x in timed]
            rows.append(
                {
                    "variant": variant_id,
                    "batch_size": size,
                    "sample_ms": summarize([x["sample"] for x in timed]).p50,
                    "gather_ms": summarize(gather).p50,
                    "compute_ms": summarize([x["comp"] for x in timed]).p50,
                    "e2e_ms": summarize(
                        [g + x["comp"] + x["sample"] for g, x in zip(gather, timed, strict=True)]
                    ).p50,
                }
            )
        return rows


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
    min_time_s: float = 1.0,
    variants: Sequence[str] | None = None,
    calibration: Calibration | None = None,
    threads: int | None = None,
) -> ProfileResult:
    """Profiles every variant of ``store`` and writes ``<out_dir>/<dataset>/profiles.csv``.

    Args:
        store (GraphStore): the dataset (full graph; its name selects the variants).
        repo (VariantRepository): where the variants are.
        out_dir (str or PathLike): the profiles folder (``profiles``); files go to
            ``<out_dir>/<store.name>/``.
        batch_size (int, optional): target nodes per batch. (default: ``1024``)
        runs (int, optional): timed runs per variant and split, after warm-up; every batch of
            a split is timed once even when there are more batches than runs. (default: ``30``)
        device (str or torch.device, optional): where the models run. (default: ``"cpu"``)
        progress (bool, optional): show a progress bar over variants. (default: ``False``)
        warmup (int, optional): untimed runs before timing each split. (default: ``2``)
        service_runs (int, optional): timed runs per batch size of ``service_times.csv``.
            (default: ``max(3, runs // 3)``)
        min_time_s (float, optional): keep timing a split until this much time has passed, even
            after ``runs`` runs: the runs of a fast variant then span enough time for a short
            burst of other work on the machine not to move its p50. (default: ``1.0``)
        variants (Sequence[str], optional): profile only these variant ids. (default: all)
        calibration (Calibration, optional): ``BW``/``OPS`` to use instead of measuring them.
        threads (int, optional): torch intra-op threads while profiling (restored afterwards);
            ``None`` keeps the current setting (``OMP_NUM_THREADS`` or torch's default). On a
            machine whose cores are busy with other work, several threads wait on each other at
            every parallel region and p50s inflate and scatter; one thread measures steadily.
            (default: ``None``)

    Returns:
        ProfileResult: paths written, number profiled, skipped variants with their reasons.

    Raises:
        ArtifactError: the repository has no variant of the dataset, or none could be profiled.

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
            "timings will be inflated and noisy; profile with one thread (OMP_NUM_THREADS=1) "
            "or on a quiet machine",
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
) -> ProfileResult:
    from tqdm.auto import tqdm

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
    )
    common = {
        "dataset": store.name,
        "device": str(dev) if dev.type == "cpu" else f"{dev} ({torch.cuda.get_device_name(dev)})",
        "threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "date": date,
    }

    rows: list[dict[str, Any]] = []
    service_rows: list[dict[str, Any]] = []
    bar = tqdm(manifests, desc=f"profile {store.name}", unit="variant", disable=not progress)
    with torch.inference_mode():
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
            runner = _VariantRunner(
                loaded.model, features, prof.sampler(manifest.fanouts, manifest.seed), dev
            )
            weights = repo.path(store.name, variant_id) / _WEIGHTS_FILE
            size_kb = weights.stat().st_size / 1024
            head = {
                **common,
                "variant": variant_id,
                "arch": manifest.arch,
                "ranking": manifest.ranking,
                "prune": manifest.prune,
                "features_kept": manifest.in_channels,
                "size_kb": size_kb,
            }
            for split, nodes in (("val", store.val_idx), ("test", store.test_idx)):
                row = {**head, **prof.profile_split(runner, manifest, nodes, split)}
                rows.append(row)
                _log.info(
                    "variant: %s split: %s accuracy: %.2f latency_ms: %.3f comm_comp: %.3f",
                    variant_id,
                    split,
                    row["accuracy"],
                    row["latency_ms"],
                    row["comm_comp"],
                )
            service_rows.extend(prof.service_times(runner, variant_id))
            del loaded, runner

    if not rows:
        reasons = "; ".join(f"{v}: {r}" for v, r in skipped)
        raise ArtifactError(f"no variant of {store.name} could be profiled ({reasons})")
    folder = Path(out_dir) / store.name
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
    )
