"""A variant's device feature cache: which nodes' rows it holds, under one budget for all.

A variant's device feature cache (:class:`gnnaas.inference.FeatureCache`) holds the pruned rows of
the nodes read most often. :class:`NodeRanking` is a caching order with its reads over the
planning seeds (the order ``gnnaas cache-plan`` planned, :mod:`gnnaas.profiling.cacheplan`, read
back by :func:`read_cache_ranking`; else by neighbor count, :func:`degree_ranking`), and so the
hit-ratio curve of a cache of any size. :func:`split_budget` hands one budget
(``GNNAAS_FEATURE_CACHE_MB``) out over several variants a step of bytes at a time, each step to
the variant whose hit ratio gains most for it, weighted by its traffic share;
:func:`assign_cache_nodes` turns the split into node ids, and :func:`plan_feature_caches` does the
whole for the variants a server (or the profiler, measuring what a server would build) serves.

The ranking file (``profiles/<dataset>/cache_ranking.safetensors``, :data:`CACHE_RANKING_FILE`):
per fanouts ``f`` (key ``25_10``), ``order.<f>`` ``[N]`` int64 node ids in caching order and
``reads.<f>`` ``[N]`` their reads over the seeds, plus text metadata (graph size, sampler,
seeds); never pickled.
"""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch
from torch import Tensor

from gnnaas.runtime.graph import SAMPLER
from gnnaas.typing import PathType

if TYPE_CHECKING:
    from gnnaas.runtime.graph import RuntimeGraph

__all__ = [
    "CACHE_RANKING_FILE",
    "RANKING_FORMAT",
    "CacheDemand",
    "NodeRanking",
    "assign_cache_nodes",
    "degree_ranking",
    "fanout_key",
    "fanout_text",
    "plan_feature_caches",
    "read_cache_ranking",
    "split_budget",
]

_log = logging.getLogger(__name__)

CACHE_RANKING_FILE = "cache_ranking.safetensors"
RANKING_FORMAT = "1"
"""The ranking file's format, in its metadata."""

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


def _neighbor_counts(col: Tensor, num_nodes: int) -> Tensor:
    """``[N]`` int64: in how many in-neighbor lists each node appears."""
    return torch.bincount(col, minlength=num_nodes)


def _rank(primary: Tensor, secondary: Tensor) -> Tensor:
    """Node ids by ``primary`` descending, then ``secondary`` descending, then id ascending."""
    order = torch.sort(secondary, descending=True, stable=True).indices
    return order[torch.sort(primary[order], descending=True, stable=True).indices]


def degree_ranking(col: Tensor, num_nodes: int) -> NodeRanking:
    """The no-sampling fallback: nodes by how many in-neighbor lists name them.

    Args:
        col (Tensor): ``[E]`` the CSR's in-neighbors (``store.col``).
        num_nodes (int): nodes of the graph.

    Returns:
        NodeRanking: the order, with the neighbor counts as reads (a proxy of the traffic).
    """
    counts = _neighbor_counts(col, num_nodes)
    order = _rank(counts, torch.zeros_like(counts))
    return NodeRanking(order, counts[order])


def fanout_text(fanouts: Sequence[int]) -> str:
    """Fanouts as a table shows them: ``25-10``."""
    return "-".join(str(int(f)) for f in fanouts)


def fanout_key(fanouts: Sequence[int]) -> str:
    """Fanouts as the ranking file's keys name them: ``25_10``."""
    return "_".join(str(int(f)) for f in fanouts)


def read_cache_ranking(
    folder: PathType,
    fanouts: Sequence[int],
    *,
    num_nodes: int,
    num_edges: int,
    sampler_seed: int = 0,
) -> tuple[NodeRanking | None, str]:
    """The planned caching order for ``fanouts``, if ``folder`` holds one for this graph.

    Args:
        folder (str or PathLike): ``profiles/<dataset>``.
        fanouts (Sequence[int]): the variant's fanouts.
        num_nodes (int): nodes of the served graph.
        num_edges (int): edges of the served graph.
        sampler_seed (int, optional): the server's sampler seed. (default: ``0``)

    Returns:
        tuple[NodeRanking | None, str]: the ranking and where it comes from, or ``None`` and
        why there is none (no file, another graph or sampler, no plan for these fanouts).
    """
    from safetensors import SafetensorError, safe_open

    path = Path(folder) / CACHE_RANKING_FILE
    if not path.is_file():
        return None, f"no {CACHE_RANKING_FILE} in {path.parent}"
    key = fanout_key(fanouts)
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            expected = {
                "format": RANKING_FORMAT,
                "num_nodes": str(num_nodes),
                "num_edges": str(num_edges),
                "sampling": SAMPLER,
                "sampler_seed": str(sampler_seed),
            }
            stale = [k for k, v in expected.items() if meta.get(k) != v]
            if stale:
                return None, f"{path} was planned for another graph or sampler ({', '.join(stale)})"
            if f"order.{key}" not in f.keys():  # safe_open has no __contains__
                return None, f"{path} has no plan for fanouts {fanout_text(fanouts)}"
            order, reads = f.get_tensor(f"order.{key}"), f.get_tensor(f"reads.{key}")
    except (OSError, SafetensorError) as exc:
        return None, f"{path} is unreadable ({exc})"
    if order.shape != (num_nodes,) or reads.shape != (num_nodes,):
        return None, f"{path} holds a ranking of another size"
    return NodeRanking(order.long(), reads.long()), f"{path} (by {meta.get('by', '?')})"


@dataclass(frozen=True)
class CacheDemand:
    """One variant that wants a share of the device feature cache.

    Args:
        key (Hashable): how the variant is named in the result (e.g. ``(dataset, variant_id)``).
        graph (RuntimeGraph): the graph it reads (its size, edges and sampler seed).
        folder (Path): ``profiles/<dataset>``, where a planned ranking may be.
        fanouts (tuple[int, ...]): its sampling fanouts (a ranking is per fanouts).
        row_bytes (int): bytes of one of its feature rows (kept columns x element size).
    """

    key: Hashable
    graph: RuntimeGraph
    folder: Path
    fanouts: tuple[int, ...]
    row_bytes: int


def plan_feature_caches(
    demands: Iterable[CacheDemand], budget_bytes: int
) -> dict[Hashable, Tensor]:
    """The node ids each variant keeps on the device under one budget, equal traffic shares
    (none is known before serving): nodes in the planned order for their graph and fanouts
    (:func:`read_cache_ranking`), else by neighbor count (:func:`degree_ranking`).

    The server calls it at start-up for every trained variant of its graphs that take no
    writes, and the profiler for one dataset's, so a profile measures the cache a server builds.

    Returns:
        dict[Hashable, Tensor]: per demand key, ``[K]`` int64 node ids; keys given less than a
        row are left out.
    """
    rankings: dict[tuple[int, tuple[int, ...]], NodeRanking] = {}
    entries: dict[Hashable, tuple[NodeRanking, int]] = {}
    for d in demands:
        graph = d.graph
        key = (id(graph), d.fanouts)
        if key not in rankings:
            ranking, source = read_cache_ranking(
                d.folder,
                d.fanouts,
                num_nodes=graph.num_nodes,
                num_edges=graph.num_edges,
                sampler_seed=graph.seed,
            )
            if ranking is None:
                ranking = degree_ranking(graph.store.col, graph.num_nodes)
                source = f"neighbor counts ({source})"
            _log.info("dataset %s, fanouts %s: caching order from %s", graph.name, key[1], source)
            rankings[key] = ranking
        entries[d.key] = (rankings[key], d.row_bytes)
    return assign_cache_nodes(int(budget_bytes), entries)
