"""Service curves: each variant's batch time by batch size, timed as the server runs a batch.

Used by the profiler (``service_times.csv``) and by a server whose execution settings differ
from those a curve was measured under (it re-times the curve at start-up,
:mod:`gnnaas.serving.core.retime`), so both measure the same call the same way: the server's batch
handler (:class:`~gnnaas.inference.Executor`: dedupe, sample, gather, copy, forward, copy back,
classes per request as lists) with one request of the batch's nodes, batches of at most
``inline_max_nodes`` nodes on the calling thread (as the server runs them on its event loop),
larger ones on a worker thread.

Example:
    >>> with CurveTimer(store.num_nodes, inline_max_nodes=16) as timer:  # doctest: +SKIP
    ...     rows = timer.curves({"sage-full-1x": executor}, [1, 64], service_runs=5)
"""

from __future__ import annotations

import concurrent.futures
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from gnnaas.inference import ExecRequest, ExecResult, StageTimes
from gnnaas.inference.cache import Transfer
from gnnaas.profiling.table import SERVICE_TIME_BATCH_SIZES
from gnnaas.profiling.timers import summarize

__all__ = ["CurveTimer", "Handler", "hit_ratio", "service_sizes"]

Handler = Callable[[Sequence[ExecRequest]], list[ExecResult]]
"""A variant's blocking batch handler (:class:`~gnnaas.inference.Executor` fits)."""

_MAX_RUNS = 200
_ROUNDS = 5
_GAP_S = 0.002


def service_sizes(max_batch_nodes: int | None) -> list[int]:
    """The batch sizes of a service curve: :data:`SERVICE_TIME_BATCH_SIZES` up to the server's
    largest batch, which becomes a point of the curve."""
    cap = max_batch_nodes
    sizes = [s for s in SERVICE_TIME_BATCH_SIZES if cap is None or s <= cap]
    if cap is not None and cap not in sizes and cap < SERVICE_TIME_BATCH_SIZES[-1]:
        sizes.append(cap)
    return sizes


def _timed_batch(handler: Handler, seeds: Tensor) -> tuple[float, ExecResult]:
    """One batch through the handler, timed where it runs (ms, result)."""
    start = time.perf_counter()
    (result,) = handler([ExecRequest(seeds)])
    return (time.perf_counter() - start) * 1e3, result


class CurveTimer:
    """Times service curves over a graph's nodes (a context manager: it owns a worker thread).

    Args:
        num_nodes (int): nodes of the graph; seeds come from a fixed permutation of them.
        inline_max_nodes (int): batches of at most this many nodes run on the calling thread.

    Batches are timed where the server runs them: on glibc a worker thread allocates from its
    own arena, which costs measurably more per small batch than the main thread.
    """

    def __init__(self, num_nodes: int, *, inline_max_nodes: int) -> None:
        if num_nodes < 1:
            raise ValueError(f"CurveTimer needs a graph with nodes (got num_nodes={num_nodes})")
        self.inline_max_nodes = inline_max_nodes
        self.nodes = torch.randperm(num_nodes, generator=torch.Generator().manual_seed(0))
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gnnaas-curve")

    def __enter__(self) -> CurveTimer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stops the worker thread."""
        self._worker.shutdown(wait=True)

    def timed(self, handler: Handler, seeds: Tensor) -> tuple[float, ExecResult]:
        """One batch timed on the thread the server runs a batch of that size on."""
        if seeds.numel() <= self.inline_max_nodes:
            return _timed_batch(handler, seeds)
        return self._worker.submit(_timed_batch, handler, seeds).result()

    def curves(
        self,
        handlers: Mapping[str, Handler],
        sizes: Sequence[int],
        *,
        service_runs: int,
        min_time_s: float,
    ) -> list[dict[str, Any]]:
        """The p50 times per variant and batch size (one row each: ``variant``, ``batch_size``,
        ``sample_ms``, ``gather_ms``, ``compute_ms``, ``e2e_ms``).

        Variants are timed in interleaved rounds (every variant and size a short slot per
        round), so a transient slowdown of the machine spreads over all curves instead of
        shifting one variant's; each (variant, size) gets at least ``service_runs`` runs and
        small batches keep running for ``min_time_s / 4`` in all (at most 200 runs). ``e2e_ms``
        is the handler's wall time, the call the server's batcher times; ``hit_ratio`` and
        ``copied_kb`` describe the feature rows its batches moved
        (:class:`~gnnaas.inference.cache.Transfer`; NaN for a handler without them).
        """
        num_nodes = self.nodes.numel()
        runs: dict[tuple[str, int], list[tuple[float, StageTimes, Transfer | None]]] = {
            (v, size): [] for v in handlers for size in sizes
        }
        for handler in handlers.values():
            for size in sizes:  # warm-up
                self.timed(handler, self.nodes[: min(size, num_nodes)])
        per_round = max(1, math.ceil(service_runs / _ROUNDS))
        slot_s = min_time_s / 4 / _ROUNDS
        offset = 1
        for _ in range(_ROUNDS):
            for size in sizes:
                t = min(size, num_nodes)
                for variant_id, handler in handlers.items():
                    timed = runs[(variant_id, size)]
                    deadline = time.monotonic() + slot_s
                    done = 0
                    while done < per_round or (
                        time.monotonic() < deadline and len(timed) < _MAX_RUNS
                    ):
                        seeds = self.nodes.roll(-((offset * t) % num_nodes))[:t]
                        offset += 1
                        # A served batch follows other work (HTTP, the client), not a twin of
                        # itself: an idle gap before each timed batch measures it as served
                        # (back to back, small batches ran faster than the server saw them;
                        # benchmarks/results/idle.md measures a batch's time after idle gaps).
                        time.sleep(_GAP_S)
                        ms, result = self.timed(handler, seeds)
                        path = getattr(handler, "path", None)
                        timed.append((ms, result.times, getattr(path, "last_transfer", None)))
                        done += 1
        rows = []
        for variant_id in handlers:
            for size in sizes:
                wall = [ms for ms, _, _ in runs[(variant_id, size)]]
                stages = [st for _, st, _ in runs[(variant_id, size)]]
                moved = [tr for _, _, tr in runs[(variant_id, size)] if tr is not None]
                rows.append(
                    {
                        "variant": variant_id,
                        "batch_size": size,
                        "sample_ms": summarize([x.sample_ms for x in stages]).p50,
                        "gather_ms": summarize([x.comm_ms for x in stages]).p50,
                        "compute_ms": summarize([x.compute_ms for x in stages]).p50,
                        "e2e_ms": summarize(wall).p50,
                        "hit_ratio": hit_ratio(moved) if moved else math.nan,
                        "copied_kb": (
                            sum(t.copied_bytes for t in moved) / len(moved) / 1024
                            if moved
                            else math.nan
                        ),
                    }
                )
        return rows


def hit_ratio(moved: Sequence[Transfer]) -> float:
    """Feature rows read from the device cache / all rows read, over batches (0 without
    rows)."""
    rows = sum(t.rows for t in moved)
    return sum(t.hits for t in moved) / rows if rows else 0.0
