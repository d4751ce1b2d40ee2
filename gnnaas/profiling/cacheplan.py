"""Feature-cache planning: which nodes' rows to keep on the device, how many fit, the hit ratio.

A variant's device feature cache (:class:`gnnaas.inference.FeatureCache`) holds the pruned rows of
the nodes read most often. How often a node's row is read is counted, not guessed: the planning
seeds (the validation nodes, or recorded traffic) are served in batches of ``batch_size`` through
the serving sampler of the variant's fanouts (:meth:`gnnaas.runtime.RuntimeGraph.sampler`, the
server's seed) and every row of each batch's ``n_id`` is one read of that node's features
(:func:`count_reads`, one ``bincount`` per batch). Nodes are cached most read first (ties: the
node more in-neighbor lists name first, then the lower id); a budget of ``B`` bytes holds
``B // row_bytes`` of them, with ``row_bytes = features_kept × 4`` for float32, so an 8× variant
holds 8× the nodes of the 1× model. The *hit ratio* is the reads of the cached nodes over all
reads, on those seeds: what the profiler measures on the validation split when the cache is the
planned one.

``by="degree"`` ranks by how many in-neighbor lists name a node instead (its out-degree; the
in-degree on the undirected graphs gnnaas serves): no sampling, the fallback the server uses for
a variant whose fanouts have no plan (:func:`~gnnaas.runtime.caches.degree_ranking`). Its hit
ratio in a plan is still measured on the seeds' reads.

Files beside the profiles (``profiles/<dataset>/``), written atomically:

- ``cache_plan.csv`` (:data:`CACHE_PLAN_FILE`): one row per variant, :data:`CACHE_PLAN_COLUMNS`;
- ``cache_ranking.safetensors`` (:data:`~gnnaas.runtime.caches.CACHE_RANKING_FILE`): the
  caching order per fanouts, the format of :mod:`gnnaas.runtime.caches`, which reads it back
  (:func:`~gnnaas.runtime.caches.read_cache_ranking`) when the server and the profiler build their
  caches, and splits one budget over several variants
  (:func:`~gnnaas.runtime.caches.split_budget`).

Example:
    >>> variants = [PlannedVariant("1x", 1433, (25, 10)), PlannedVariant("8x", 179, (25, 10))]
    >>> plan = plan_cache(store, variants, 2**20, seeds=store.val_idx)  # doctest: +SKIP
    >>> [(r.variant, r.cached_nodes) for r in plan.rows]  # doctest: +SKIP
    [('1x', 182), ('8x', 1464)]
"""

from __future__ import annotations

import datetime as _dt
import io
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor

from gnnaas.runtime.caches import (
    CACHE_RANKING_FILE,
    RANKING_FORMAT,
    NodeRanking,
    _neighbor_counts,
    _rank,
    fanout_key,
    fanout_text,
)
from gnnaas.runtime.graph import SAMPLER, RuntimeGraph
from gnnaas.typing import PathType
from gnnaas.utils import atomic_write_bytes, atomic_write_text

if TYPE_CHECKING:
    from gnnaas.data import GraphStore

__all__ = [
    "CACHE_PLAN_COLUMNS",
    "CACHE_PLAN_FILE",
    "CACHE_RANKING_FILE",
    "CachePlan",
    "CachePlanRow",
    "PlannedVariant",
    "count_reads",
    "plan_cache",
    "write_cache_plan",
]

_log = logging.getLogger(__name__)

CACHE_PLAN_FILE = "cache_plan.csv"
CACHE_PLAN_COLUMNS: tuple[str, ...] = (
    "dataset",
    "variant",
    "fanouts",
    "features_kept",
    "row_bytes",
    "budget_mb",
    "cached_nodes",
    "cached_frac",
    "hit_ratio",
    "by",
    "seeds",
    "num_seeds",
    "batch_size",
    "sampling",
    "sampler_seed",
    "date",
)
"""Columns of ``cache_plan.csv``: ``fanouts`` as ``25-10``; ``cached_frac`` = cached nodes / all
nodes; ``hit_ratio`` in [0, 1]; ``seeds`` is ``val`` or the recorded traffic file's name."""


@dataclass(frozen=True)
class PlannedVariant:
    """What planning needs of a variant.

    Args:
        variant_id (str): its id (``sage-greedy-8x``, or ``8x`` for a default prune factor).
        features_kept (int): feature columns it reads (``in_channels``).
        fanouts (tuple[int, ...]): its serving fanouts, PyG order.
        element_size (int, optional): bytes per feature value. (default: ``4``, float32)
    """

    variant_id: str
    features_kept: int
    fanouts: tuple[int, ...]
    element_size: int = 4

    def __post_init__(self) -> None:
        if self.features_kept < 1 or self.element_size < 1:
            raise ValueError(
                f"PlannedVariant {self.variant_id}: features_kept and element_size must be >= 1 "
                f"(got {self.features_kept}, {self.element_size})"
            )

    @property
    def row_bytes(self) -> int:
        """Bytes of one node's pruned feature row."""
        return self.features_kept * self.element_size


@dataclass(frozen=True)
class CachePlanRow:
    """One variant's plan: how many nodes fit in the budget and the hit ratio they give.

    Args:
        variant (str): the variant id.
        fanouts (tuple[int, ...]): its fanouts.
        features_kept (int): its feature columns.
        row_bytes (int): bytes of one row.
        cached_nodes (int): rows that fit in the budget (at most every node).
        hit_ratio (float): reads of the cached nodes / all reads, in [0, 1].
    """

    variant: str
    fanouts: tuple[int, ...]
    features_kept: int
    row_bytes: int
    cached_nodes: int
    hit_ratio: float


@dataclass(eq=False)
class CachePlan:
    """The outcome of :func:`plan_cache`.

    Args:
        dataset (str): the graph's name.
        num_nodes (int): its nodes.
        num_edges (int): its edges.
        budget_bytes (int): the budget each variant was planned for (alone).
        by (str): ``access`` or ``degree``.
        seeds (str): ``val`` or the recorded traffic's name.
        num_seeds (int): planning seeds.
        batch_size (int): seeds per sampled batch.
        sampling (str): the serving sampler (:data:`~gnnaas.runtime.SAMPLER`).
        sampler_seed (int): the serving sampler's seed.
        rows (list[CachePlanRow]): one per variant, in the order given.
        rankings (dict[tuple[int, ...], NodeRanking]): the caching order per fanouts.
        date (str): when it was planned (UTC, ISO 8601).
    """

    dataset: str
    num_nodes: int
    num_edges: int
    budget_bytes: int
    by: str
    seeds: str
    num_seeds: int
    batch_size: int
    sampling: str
    sampler_seed: int
    rows: list[CachePlanRow]
    rankings: dict[tuple[int, ...], NodeRanking]
    date: str = field(
        default_factory=lambda: _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    )

    def records(self) -> list[dict[str, Any]]:
        """The rows of ``cache_plan.csv`` (:data:`CACHE_PLAN_COLUMNS`)."""
        return [
            {
                "dataset": self.dataset,
                "variant": r.variant,
                "fanouts": fanout_text(r.fanouts),
                "features_kept": r.features_kept,
                "row_bytes": r.row_bytes,
                "budget_mb": self.budget_bytes / 2**20,
                "cached_nodes": r.cached_nodes,
                "cached_frac": r.cached_nodes / self.num_nodes if self.num_nodes else 0.0,
                "hit_ratio": r.hit_ratio,
                "by": self.by,
                "seeds": self.seeds,
                "num_seeds": self.num_seeds,
                "batch_size": self.batch_size,
                "sampling": self.sampling,
                "sampler_seed": self.sampler_seed,
                "date": self.date,
            }
            for r in self.rows
        ]


def count_reads(
    sampler: Any,
    seeds: Tensor,
    num_nodes: int,
    *,
    batch_size: int = 1024,
    progress: bool = False,
) -> Tensor:
    """How many times each node's feature row is read when ``seeds`` are served.

    The seeds are cut into batches of ``batch_size`` in the order given; each batch is
    deduplicated (as the server's executor does with a merged batch) and sampled, and every row of
    its ``n_id`` is one read (a node reached at two depths is read twice; one reached twice at
    the same depth of a batch, once).

    Args:
        sampler (Sampler): the serving sampler (anything with ``sample(seeds).n_id``).
        seeds (Tensor): ``[S]`` int64 node ids (repeats allowed).
        num_nodes (int): nodes of the graph.
        batch_size (int, optional): seeds per batch. (default: ``1024``)
        progress (bool, optional): show a progress bar over batches. (default: ``False``)

    Returns:
        Tensor: ``[num_nodes]`` int64 reads per node.

    Raises:
        ValueError: ``batch_size < 1``.
    """
    if batch_size < 1:
        raise ValueError(f"count_reads: batch_size must be >= 1 (got {batch_size})")
    from tqdm.auto import tqdm

    reads = torch.zeros(num_nodes, dtype=torch.long)
    batches = torch.split(seeds, batch_size)
    for batch in tqdm(batches, desc="count reads", unit="batch", disable=not progress):
        n_id = sampler.sample(torch.unique(batch)).n_id  # [N_s] seeds first
        reads += torch.bincount(n_id, minlength=num_nodes)
    return reads


def _rankings(
    graph: RuntimeGraph,
    fanout_sets: Iterable[tuple[int, ...]],
    seeds: Tensor,
    by: str,
    *,
    batch_size: int,
    progress: bool,
) -> dict[tuple[int, ...], NodeRanking]:
    """The caching order of ``graph``'s nodes for each of ``fanout_sets``: by the reads its
    sampler makes from ``seeds`` (``by="access"``), or by in-neighbor lists (``"degree"``)."""
    store = graph.store
    num_nodes = int(store.num_nodes)
    neighbor_counts = _neighbor_counts(store.col, num_nodes)
    rankings: dict[tuple[int, ...], NodeRanking] = {}
    for fanouts in fanout_sets:
        sampler = graph.sampler(fanouts)
        reads = count_reads(sampler, seeds, num_nodes, batch_size=batch_size, progress=progress)
        if by == "access":
            order = _rank(reads, neighbor_counts)
        else:
            order = _rank(neighbor_counts, torch.zeros_like(neighbor_counts))
        rankings[fanouts] = NodeRanking(order, reads[order])
    return rankings


def plan_cache(
    store: GraphStore,
    variants: Sequence[PlannedVariant],
    budget_bytes: int,
    *,
    seeds: Tensor | None = None,
    seeds_name: str = "val",
    by: Literal["access", "degree"] = "access",
    batch_size: int = 1024,
    sampler_seed: int = 0,
    progress: bool = False,
) -> CachePlan:
    """Plans each variant's cache for ``budget_bytes`` of device memory (each alone).

    Args:
        store (GraphStore): the graph (``rowptr``, ``col``, ``val_idx``).
        variants (Sequence[PlannedVariant]): the variants to plan for.
        budget_bytes (int): device bytes for one variant's rows.
        seeds (Tensor, optional): ``[S]`` planning seeds (recorded traffic). (default: ``None``:
            ``store.val_idx``)
        seeds_name (str, optional): what the seeds are, for the table. (default: ``"val"``)
        by (str, optional): ``access``: most read first; ``degree``: named by the most
            in-neighbor lists first. (default: ``"access"``)
        batch_size (int, optional): seeds per sampled batch. (default: ``1024``)
        sampler_seed (int, optional): the server's ``GNNAAS_SEED``. (default: ``0``)
        progress (bool, optional): show progress bars while counting. (default: ``False``)

    Returns:
        CachePlan: one row per variant and the caching order per distinct fanouts.

    Raises:
        ValueError: no variants, ``budget_bytes < 1``, an unknown ``by``, or no seeds.
    """
    if not variants:
        raise ValueError("plan_cache: variants must name at least one variant (got none)")
    if isinstance(budget_bytes, bool) or int(budget_bytes) < 1:
        raise ValueError(f"plan_cache: budget_bytes must be >= 1 (got {budget_bytes!r})")
    if by not in ("access", "degree"):
        raise ValueError(f"plan_cache: by must be 'access' or 'degree' (got {by!r})")
    seeds = store.val_idx if seeds is None else seeds
    if seeds.numel() == 0:
        raise ValueError(f"plan_cache: no planning seeds ({seeds_name} of {store.name} is empty)")
    num_nodes = int(store.num_nodes)
    graph = RuntimeGraph(store, seed=sampler_seed)
    fanout_sets = dict.fromkeys(tuple(int(f) for f in v.fanouts) for v in variants)
    rankings = _rankings(graph, fanout_sets, seeds, by, batch_size=batch_size, progress=progress)
    rows = []
    for v in variants:
        ranking = rankings[tuple(int(f) for f in v.fanouts)]
        cached = min(int(budget_bytes) // v.row_bytes, num_nodes)
        rows.append(
            CachePlanRow(
                v.variant_id,
                tuple(v.fanouts),
                v.features_kept,
                v.row_bytes,
                cached,
                ranking.hit_ratio(cached),
            )
        )
    return CachePlan(
        dataset=store.name,
        num_nodes=num_nodes,
        num_edges=int(store.num_edges),
        budget_bytes=int(budget_bytes),
        by=by,
        seeds=seeds_name,
        num_seeds=int(seeds.numel()),
        batch_size=batch_size,
        sampling=SAMPLER,
        sampler_seed=sampler_seed,
        rows=rows,
        rankings=rankings,
    )


def write_cache_plan(plan: CachePlan, folder: PathType) -> tuple[Path, Path]:
    """Writes ``cache_plan.csv`` and ``cache_ranking.safetensors`` into ``folder``, atomically.

    Args:
        plan (CachePlan): what :func:`plan_cache` returned.
        folder (str or PathLike): ``profiles/<dataset>``.

    Returns:
        tuple[Path, Path]: the table and the ranking file.
    """
    import pandas as pd
    from safetensors.torch import save

    folder = Path(folder)
    buf = io.StringIO()
    frame = pd.DataFrame.from_records(plan.records(), columns=list(CACHE_PLAN_COLUMNS))
    frame.to_csv(buf, index=False, float_format="%.6g", lineterminator="\n")
    table = folder / CACHE_PLAN_FILE
    atomic_write_text(table, buf.getvalue())
    tensors: dict[str, Tensor] = {}
    for fanouts, ranking in plan.rankings.items():
        key = fanout_key(fanouts)
        tensors[f"order.{key}"] = ranking.order.contiguous()
        tensors[f"reads.{key}"] = ranking.reads.contiguous()
    metadata = {
        "format": RANKING_FORMAT,
        "dataset": plan.dataset,
        "num_nodes": str(plan.num_nodes),
        "num_edges": str(plan.num_edges),
        "by": plan.by,
        "seeds": plan.seeds,
        "num_seeds": str(plan.num_seeds),
        "batch_size": str(plan.batch_size),
        "sampling": plan.sampling,
        "sampler_seed": str(plan.sampler_seed),
        "date": plan.date,
    }
    ranking_path = folder / CACHE_RANKING_FILE
    atomic_write_bytes(ranking_path, save(tensors, metadata=metadata))
    return table, ranking_path
