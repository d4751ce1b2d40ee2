"""Measuring one variant on one dataset: its splits' accuracy, stage timings and memory, its curve.

:class:`DatasetProfiler` holds what the variants of a dataset share (its
:class:`~gnnaas.runtime.RuntimeGraph`, the calibrated rates, the execution settings, the curve
timer) and runs the measurements
:mod:`gnnaas.profiling.profiler` describes: a split's accuracy pass and timed runs
(:meth:`~DatasetProfiler.profile_split`), an untimed scoring pass
(:meth:`~DatasetProfiler.score_split`) and the service curves
(:meth:`~DatasetProfiler.service_times`). Kept apart from
:func:`~gnnaas.profiling.profiler.profile_dataset`, which decides what to measure and writes the
files, so that how a number is measured reads in one place.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from gnnaas.errors import ArtifactError
from gnnaas.inference import (
    INLINE_MAX_NODES,
    Executor,
    InferencePath,
    StageTimes,
    Transfer,
    metric,
    score_parts,
)
from gnnaas.inference.settings import execution_settings
from gnnaas.profiling.curves import CurveTimer, hit_ratio, service_sizes
from gnnaas.profiling.perfmodel import Calibration, estimate
from gnnaas.profiling.timers import peak_memory_bytes, summarize
from gnnaas.runtime import SAMPLER, RuntimeGraph

if TYPE_CHECKING:
    from gnnaas.variants.manifest import Manifest

__all__ = ["DatasetProfiler"]

_UNTIMED_SPLIT_RUNS = 5  # timed runs of a split profiled for its accuracy (test)


def _fanout_bound(fanouts: Sequence[int], max_degree: int) -> list[int]:
    return [int(s) if int(s) > 0 else max(1, max_degree) for s in fanouts]


def _channels(manifest: Manifest) -> list[int]:
    hidden = [manifest.hidden_channels] * (manifest.num_layers - 1)
    return [manifest.in_channels, *hidden, manifest.out_channels]


@dataclass
class _Scored:
    """What a split's accuracy pass collects, batch by batch."""

    nums: list[Tensor] = field(default_factory=list)
    dens: list[Tensor] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    times: list[StageTimes] = field(default_factory=list)  # of the full batches
    moved: list[Transfer] = field(default_factory=list)  # every batch's feature rows
    unique_frac: float = 1.0


class DatasetProfiler:
    """State shared by the variants of one dataset: its graph, rates, settings."""

    def __init__(
        self,
        graph: RuntimeGraph,
        *,
        batch_size: int,
        runs: int,
        warmup: int,
        service_runs: int,
        min_time_s: float,
        device: torch.device,
        calibration: Calibration,
        date: str,
        max_batch_nodes: int | None,
        inline_max_nodes: int = INLINE_MAX_NODES,
    ) -> None:
        self.graph = graph
        self.store = store = graph.store
        self.batch_size = batch_size
        self.runs = runs
        self.warmup = warmup
        self.service_runs = service_runs
        self.min_time_s = min_time_s
        self.device = device
        self.calibration = calibration
        self.date = date
        self.max_batch_nodes = max_batch_nodes
        self.inline_max_nodes = inline_max_nodes
        self.max_degree = (
            int((store.rowptr[1:] - store.rowptr[:-1]).max()) if store.num_nodes else 1
        )
        self.settings = execution_settings(device, inline_max_nodes=inline_max_nodes)
        self.timer = CurveTimer(max(store.num_nodes, 1), inline_max_nodes=inline_max_nodes)

    def close(self) -> None:
        """Stops the curve timer's worker thread."""
        self.timer.close()

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
        for _ in range(self.warmup):
            path.run(batches[0])
        scored = self._accuracy_pass(path, manifest, batches)
        times = scored.times + self._timed_runs(path, batches, len(scored.times), timed)
        num_all, den_all = torch.cat(scored.nums), torch.cat(scored.dens)  # [n] each
        fields = {
            "split": split,
            "batch_size": int(batches[0].numel()),
            "num_batches": len(batches),
            **self._accuracy_fields(num_all, den_all, scored.scores, nodes.numel()),
            **self._time_fields(times),
            "mem_mb": self._peak_mb(path, batches[0]),
            "unique_frac": scored.unique_frac,
            **_cache_fields(path, scored.moved, batches[0].numel(), [b.numel() for b in batches]),
            **self._predicted(manifest, int(batches[0].numel()), scored.unique_frac),
        }
        parts = (num_all.cpu().numpy().astype(np.float64), den_all.cpu().numpy().astype(np.float64))
        return fields, parts

    def _accuracy_pass(
        self, path: InferencePath, manifest: Manifest, batches: list[Tensor]
    ) -> _Scored:
        """One pass over every batch: its score parts, and a timing of each full batch."""
        bound = math.prod(_fanout_bound(manifest.fanouts, self.max_degree))
        y = self.store.y
        scored = _Scored()
        fracs: list[float] = []
        for batch in batches:
            out = path.run(batch)
            scored.moved.append(path.last_transfer)
            num, den = score_parts(out.logits, y[batch])  # [b] each, in split order
            scored.nums.append(num)
            scored.dens.append(den)
            scored.scores.append(metric(num, den))
            if batch.numel() == batches[0].numel():
                scored.times.append(out.times)
                fracs.append(out.num_sampled / (batch.numel() * bound))
        scored.unique_frac = float(np.mean(fracs)) if fracs else 1.0
        return scored

    def _timed_runs(
        self, path: InferencePath, batches: list[Tensor], have: int, timed: bool
    ) -> list[StageTimes]:
        """More runs over the full batches until ``runs`` timings exist (``have`` already) and,
        when ``timed``, ``min_time_s`` has passed."""
        full = [b for b in batches if b.numel() == batches[0].numel()]
        times: list[StageTimes] = []
        deadline = time.monotonic() + (self.min_time_s if timed else 0.0)
        runs = self.runs if timed else min(self.runs, _UNTIMED_SPLIT_RUNS)
        while have + len(times) < runs or time.monotonic() < deadline:
            times.append(path.run(full[len(times) % len(full)]).times)
        return times

    @staticmethod
    def _accuracy_fields(
        num: Tensor, den: Tensor, scores: list[float], count: int
    ) -> dict[str, float]:
        """``accuracy`` and ``accuracy_std`` (module docstring of the profiler)."""
        accuracy = 100.0 * metric(num, den)
        if len(scores) > 1:
            accuracy_std = 100.0 * float(np.std(scores))
        else:
            p = accuracy / 100.0
            accuracy_std = 100.0 * math.sqrt(max(p * (1.0 - p), 0.0) / max(count, 1))
        return {"accuracy": accuracy, "accuracy_std": accuracy_std}

    @staticmethod
    def _time_fields(times: list[StageTimes]) -> dict[str, float]:
        """The stage times' p50s and the latency's spread."""
        comm = summarize([t.comm_ms for t in times])
        comp = summarize([t.compute_ms for t in times]).p50
        latency = summarize([t.latency_ms for t in times])
        return {
            "sample_ms": summarize([t.sample_ms for t in times]).p50,
            "comm_ms": comm.p50,
            "comp_ms": comp,
            "latency_ms": latency.p50,
            "latency_p95_ms": latency.p95,
            "latency_p99_ms": latency.p99,
            "latency_std_ms": latency.std,
            "e2e_ms": summarize([t.total_ms for t in times]).p50,
            "comm_comp": comm.p50 / comp if comp > 0 else float("inf"),
        }

    def _peak_mb(self, path: InferencePath, batch: Tensor) -> float:
        """Peak memory newly allocated by one forward of ``batch``'s sampled tree (MiB)."""
        sub = path.sampler.sample(batch)
        return peak_memory_bytes(lambda: path.forward(sub), self.device) / 2**20

    def _predicted(self, manifest: Manifest, batch: int, unique_frac: float) -> dict[str, float]:
        """The analytical model's comm and comp for a batch of ``batch`` seeds."""
        pred = estimate(
            batch,
            _fanout_bound(manifest.fanouts, self.max_degree),
            _channels(manifest),
            unique_frac=max(unique_frac, 1e-12),
            bw=self.calibration.bw,
            ops=self.calibration.ops,
        )
        return {"pred_comm_ms": pred.comm_ms, "pred_comp_ms": pred.comp_ms}

    def service_times(self, executors: dict[str, Executor]) -> list[dict[str, Any]]:
        """The service curves (:meth:`gnnaas.profiling.curves.CurveTimer.curves`), each point
        stamped with the serving sampler and the execution settings it was measured under."""
        rows = self.timer.curves(
            executors,
            service_sizes(self.max_batch_nodes),
            service_runs=self.service_runs,
            min_time_s=self.min_time_s,
        )
        stamp = {"sampling": SAMPLER, "sampler_seed": self.graph.seed, **self.settings}
        return [{**row, **stamp} for row in rows]


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
