"""One device budget over several variants' feature caches, by the hit ratio each gains.

A :class:`NodeRanking` is a caching order with its reads over the planning seeds, and so the
hit-ratio curve of a cache of any size. :func:`split_budget` hands one budget
(``GNNAAS_FEATURE_CACHE_MB``) out over several variants a step of bytes at a time, each step to
the variant whose hit ratio gains most for it, weighted by its traffic share;
:func:`assign_cache_nodes` turns the split into node ids. The server runs this at start-up with the
rankings :mod:`gnnaas.profiling.cacheplan` planned (or the degree fallback); kept apart from the
planning, which samples the graph and writes files, because the split needs neither.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
from torch import Tensor

__all__ = ["NodeRanking", "assign_cache_nodes", "split_budget"]

K = TypeVar("K", bound=Hashable)

_STEPS = 4096  # greedy steps of split_budget: fine enough for any budget, quick in Python


@dataclass(eq=False)
class NodeRanking:
    """Nodes in the order a cache takes them, with their reads over the planning seeds.

    Args:
        order (Tensor): ``[N]`` int64 every node id once, the first to cache first.
        reads (Tensor): ``[N]`` int64 reads of ``order[i]`` (its weight in :func:`split_budget`).
    """

    order: Tensor
    reads: Tensor
    _curve: np.ndarray | None = field(default=None, repr=False)

    @property
    def num_nodes(self) -> int:
        """Nodes ranked (``N``)."""
        return int(self.order.numel())

    @property
    def curve(self) -> np.ndarray:
        """``[N + 1]`` int64: reads of the first ``k`` nodes of the order, for each ``k``."""
        if self._curve is None:
            self._curve = np.concatenate([[0], np.cumsum(self.reads.numpy(), dtype=np.int64)])
        return self._curve

    @property
    def total_reads(self) -> int:
        """All reads over the seeds."""
        return int(self.curve[-1])

    def hit_ratio(self, cached_nodes: int) -> float:
        """Share of the reads that the first ``cached_nodes`` nodes serve, in [0, 1]."""
        k = min(max(int(cached_nodes), 0), self.num_nodes)
        total = self.total_reads
        return float(self.curve[k]) / total if total else 0.0


def _hits(ranking: NodeRanking, row_bytes: int, nbytes: float) -> float:
    """Reads served by ``nbytes`` of cache, with a partly filled last row counted pro rata (so
    the gain of a step smaller than a row is not 0)."""
    rows = nbytes / row_bytes
    k = min(int(rows), ranking.num_nodes)
    curve = ranking.curve
    if k >= ranking.num_nodes:
        return float(curve[-1])
    return float(curve[k]) + (rows - k) * float(curve[k + 1] - curve[k])


def split_budget(
    budget_bytes: int,
    variants: Mapping[K, tuple[NodeRanking, int]],
    shares: Mapping[K, float] | None = None,
    *,
    step_bytes: int | None = None,
) -> dict[K, int]:
    """Splits one device budget over several variants' caches.

    Greedy by marginal hit gain: the budget is handed out a step at a time, each step to the
    variant whose hit ratio (reads of its cached nodes / its reads) rises most for it, weighted
    by its traffic share. A variant's hit-ratio curve is concave when its nodes are cached most
    read first, so the greedy split is the best one for the planned reads. Bytes no variant gains
    from any more (every read node cached) are spread by share.

    Args:
        budget_bytes (int): the whole budget (``GNNAAS_FEATURE_CACHE_MB`` in bytes).
        variants (Mapping[K, tuple[NodeRanking, int]]): per variant, its caching order and its
            row bytes.
        shares (Mapping[K, float], optional): traffic share per variant (any non-negative
            weights; normalized). (default: ``None``: equal shares)
        step_bytes (int, optional): bytes per greedy step. (default: ``None``: the budget / 4096,
            rounded up)

    Returns:
        dict[K, int]: bytes per variant, in the order of ``variants``; they add up to
        ``budget_bytes`` exactly.

    Raises:
        ValueError: a negative budget, a row of less than a byte, a share that is negative or
            not finite, shares for unknown variants or summing to 0, or ``step_bytes < 1``.

    Example:
        >>> a = NodeRanking(torch.arange(2), torch.tensor([3, 1]))
        >>> split_budget(8, {"1x": (a, 4), "8x": (a, 1)}, step_bytes=1)
        {'1x': 6, '8x': 2}
    """
    if isinstance(budget_bytes, bool) or int(budget_bytes) < 0:
        raise ValueError(f"split_budget: budget_bytes must be >= 0 (got {budget_bytes!r})")
    budget = int(budget_bytes)
    keys = list(variants)
    if not keys:
        return {}
    for key, (_, row_bytes) in variants.items():
        if row_bytes < 1:
            raise ValueError(f"split_budget: row bytes of {key!r} must be >= 1 (got {row_bytes})")
    weights = _shares(keys, shares)
    step = step_bytes if step_bytes is not None else max(1, math.ceil(budget / _STEPS))
    if step < 1:
        raise ValueError(f"split_budget: step_bytes must be >= 1 (got {step_bytes})")
    given = dict.fromkeys(keys, 0)

    def gain(i: int, nbytes: int) -> float:
        ranking, row_bytes = variants[keys[i]]
        total = ranking.total_reads
        if not total or not weights[i]:
            return 0.0
        now = given[keys[i]]
        more = _hits(ranking, row_bytes, now + nbytes) - _hits(ranking, row_bytes, now)
        return weights[i] * more / total

    # Max-heap of (-gain of the next full step, variant index); only the chosen one changes.
    heap = [(-gain(i, step), i) for i in range(len(keys))]
    heapq.heapify(heap)
    left = budget
    while left > 0:
        best, i = heap[0]
        if best >= 0.0:
            break  # nothing gains any more
        nbytes = min(step, left)
        given[keys[i]] += nbytes
        left -= nbytes
        heapq.heapreplace(heap, (-gain(i, step), i))
    if left:
        for key, extra in zip(keys, _spread(left, weights), strict=True):
            given[key] += extra
    return given


def _shares(keys: list[K], shares: Mapping[K, float] | None) -> list[float]:
    if shares is None:
        return [1.0 / len(keys)] * len(keys)
    unknown = [k for k in shares if k not in set(keys)]
    if unknown:
        raise ValueError(f"split_budget: shares name unknown variants {unknown!r}")
    values = [float(shares.get(k, 0.0)) for k in keys]
    if any(not math.isfinite(v) or v < 0 for v in values) or sum(values) <= 0:
        raise ValueError(
            f"split_budget: shares must be finite, >= 0 and not all 0 (got {dict(shares)!r})"
        )
    total = sum(values)
    return [v / total for v in values]


def _spread(nbytes: int, weights: list[float]) -> list[int]:
    """``nbytes`` in integer parts proportional to ``weights`` (largest remainders first)."""
    exact = [nbytes * w for w in weights]
    parts = [int(math.floor(e)) for e in exact]
    short = nbytes - sum(parts)
    by_remainder = sorted(range(len(parts)), key=lambda i: (parts[i] - exact[i], i))
    for i in by_remainder[:short]:
        parts[i] += 1
    return parts


def assign_cache_nodes(
    budget_bytes: int,
    variants: Mapping[K, tuple[NodeRanking, int]],
    shares: Mapping[K, float] | None = None,
) -> dict[K, Tensor]:
    """The node ids each variant keeps on the device under one shared budget.

    Args:
        budget_bytes (int): the whole budget.
        variants (Mapping[K, tuple[NodeRanking, int]]): per variant, its caching order and its
            row bytes.
        shares (Mapping[K, float], optional): traffic shares. (default: ``None``: equal)

    Returns:
        dict[K, Tensor]: per variant, ``[K_v]`` int64 node ids (its first ``bytes // row_bytes``
        nodes, at most all); variants given less than a row are left out.
    """
    split = split_budget(budget_bytes, variants, shares)
    nodes: dict[K, Tensor] = {}
    for key, nbytes in split.items():
        ranking, row_bytes = variants[key]
        count = min(nbytes // row_bytes, ranking.num_nodes)
        if count:
            nodes[key] = ranking.order[:count].clone()
    return nodes
