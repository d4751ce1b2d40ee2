"""Precomputed answers served as a variant: a lookup, exact where the graph has not changed.

A precomputed variant (``<base>@exact``, ``gnnaas precompute``) holds every node's exact output
(full neighborhoods, :mod:`gnnaas.inference.layerwise`) and embedding. :class:`LookupPath` is the
:class:`~gnnaas.inference.InferencePath` of such a variant: a batch whose nodes are all fresh is
answered by indexing the tables (the ``gather`` stage; no sampling, no forward); a stale node (its
``k``-hop upstream neighborhood changed since, :class:`gnnaas.data.live.Staleness`) or a node added
since is computed by the base model over its full neighborhood on the current graph, through the
inherited path with a sampler whose fanouts are all ``-1``. Answers are therefore exact either way;
only their latency differs, which is why the router sends requests for stale nodes elsewhere.

Shapes:
    - **tables:** ``logits`` ``[N0, C]``, ``embeddings`` ``[N0, H]`` (``N0`` nodes precomputed).
    - **output:** as :class:`~gnnaas.inference.InferencePath`.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gnnaas.inference.path import InferencePath, PathOutput, Sampler, StageTimes
from gnnaas.typing import Device

__all__ = ["LookupPath", "PrecomputedAnswers"]


@dataclass(eq=False)
class PrecomputedAnswers:
    """A precomputed variant's tables and which of their rows are stale.

    Args:
        logits (Tensor): ``[N0, C]`` exact outputs of the base model.
        embeddings (Tensor | None): ``[N0, H]`` exact last-layer inputs.
        graph_version (int): version of the graph they were computed on.
        staleness (Any, optional): a :class:`~gnnaas.data.live.Staleness` of the live graph
            (``stale`` flags by node id), ``None`` for a graph that takes no writes.
            (default: ``None``)
    """

    logits: Tensor
    embeddings: Tensor | None
    graph_version: int
    staleness: Any = None

    @property
    def num_nodes(self) -> int:
        """Nodes with a precomputed row."""
        return int(self.logits.size(0))

    def covers(self, num_nodes: int) -> bool:
        """Whether every node below ``num_nodes`` has its exact answer here: the graph takes no
        writes and the tables hold that many rows (the router then checks no node)."""
        return self.staleness is None and self.num_nodes >= num_nodes

    def fresh(self, nodes: Tensor) -> Tensor:
        """``[n]`` bool: whether each node's precomputed row is its exact answer now."""
        inside = nodes < self.num_nodes
        if self.staleness is None:
            return inside
        stale = torch.from_numpy(self.staleness.stale[nodes.numpy()])
        return inside & ~stale

    def any_stale(self, nodes: np.ndarray) -> bool:
        """Whether any of ``nodes`` has no exact row now (the router's check, no tensors)."""
        if self.staleness is not None:
            return self.staleness.any_stale(nodes)
        return bool((nodes >= self.num_nodes).any())

    @property
    def stale_fraction(self) -> float:
        """Share of the graph's nodes now served by computing (0 without writes)."""
        return 0.0 if self.staleness is None else self.staleness.stale_fraction


class LookupPath(InferencePath):
    """The path of a precomputed variant (see the module docstring).

    Args:
        model (torch.nn.Module): the base variant's model (for stale nodes).
        features (Tensor): ``[N, F_kept]`` the base variant's feature rows.
        sampler (Sampler): the serving sampler with every fanout ``-1`` (exact neighborhoods).
        answers (PrecomputedAnswers): the tables.
        device (str | torch.device, optional): where stale nodes are computed. (default: ``"cpu"``)
    """

    def __init__(
        self,
        model: torch.nn.Module,
        features: Tensor,
        sampler: Sampler,
        answers: PrecomputedAnswers,
        device: Device = "cpu",
    ) -> None:
        super().__init__(model, features, sampler, device)
        self.answers = answers
        self.computed = 0  # stale nodes computed instead of looked up, read by tests

    def __repr__(self) -> str:
        return f"{type(self).__name__}(nodes={self.answers.num_nodes}, device={self.device})"

    def _lookup(self, seeds: Tensor, embed: bool) -> tuple[Tensor, Tensor | None]:
        logits = self.answers.logits.index_select(0, seeds)  # [B, C]
        table = self.answers.embeddings
        emb = table.index_select(0, seeds) if embed and table is not None else None
        return logits, emb

    def run(self, seeds: Tensor, embed: bool = False) -> PathOutput:
        """Answers unique ``seeds``: fresh ones from the tables, stale ones computed exactly.

        Returns:
            PathOutput: as :meth:`InferencePath.run`; ``num_sampled`` counts the looked-up rows
            plus the nodes sampled for stale ones, ``gather_ms`` the lookup.
        """
        t0 = time.perf_counter()
        fresh = self.answers.fresh(seeds)
        if bool(fresh.all()):
            logits, emb = self._lookup(seeds, embed)
            lookup_ms = (time.perf_counter() - t0) * 1e3
            return PathOutput(logits, StageTimes(0.0, lookup_ms, 0.0), int(seeds.numel()), emb)
        stale = seeds[~fresh]
        computed = super().run(stale, embed=embed)
        self.computed += int(stale.numel())
        t1 = time.perf_counter()
        hit = seeds[fresh]
        logits = computed.logits.new_empty((seeds.numel(), computed.logits.size(1)))
        logits[~fresh] = computed.logits
        emb = None
        if embed and computed.embeddings is not None and self.answers.embeddings is not None:
            emb = computed.embeddings.new_empty((seeds.numel(), computed.embeddings.size(1)))
            emb[~fresh] = computed.embeddings
        if hit.numel():
            hit_logits, hit_emb = self._lookup(hit, embed)
            logits[fresh] = hit_logits
            if emb is not None and hit_emb is not None:
                emb[fresh] = hit_emb
        lookup_ms = (time.perf_counter() - t1) * 1e3
        times = dataclasses.replace(computed.times, gather_ms=computed.times.gather_ms + lookup_ms)
        return PathOutput(logits, times, computed.num_sampled + int(hit.numel()), emb)

    def forward(self, sub: Any, embed: bool = False) -> Tensor:
        """The looked-up logits of ``sub``'s seeds (the profiler's memory probe)."""
        return self._lookup(sub.n_id[: sub.batch_size], False)[0]
