"""The serving sampler: consistent k-hop sampling, a node's answer independent of its batch-mates.

``NeighborSampler(consistent=True)`` draws each node's neighbors from a hash of (node, hop, seed),
but it numbers every node once per sample (PyG ``NeighborLoader`` semantics): a node that is a seed
of one request and a hop-1 neighbor of another is expanded only at hop 0, with hop 0's fanout and
draws, so the second request's hidden states, and its answer, change with the batch.

:class:`DepthSampler` keeps one row per (node, depth) instead: a node reached at depth ``d`` is
expanded with depth ``d``'s fanout and draws whatever else is in the batch, and rows are shared only
between equal (node, depth) pairs, whose subtrees are identical. The seed's computation tree is
therefore exactly the one it has alone, and requests still share work where their trees overlap.
Each depth is one call to a one-hop consistent :class:`~gnnaas.sampling.NeighborSampler`.

It is the serving sampler: the runtime builds one per graph and fanouts
(:meth:`gnnaas.runtime.RuntimeGraph.sampler`) for the server, the profiler and evaluation during
generation alike, so every figure measures the served pipeline.

Shapes:
    - **input:** ``seeds`` ``[B]`` unique int64 node ids.
    - **output:** ``n_id`` ``[N_0 + ... + N_L]`` with the ``N_d`` rows of depth ``d`` in order
      (``n_id[:B] == seeds``); ``blocks[l].size == (N_0 + ... + N_{L-l}, N_0 + ... + N_{L-1-l})``.

Example:
    >>> rowptr, col = torch.tensor([0, 1, 2]), torch.tensor([1, 0])
    >>> sub = DepthSampler(rowptr, col, (1, 1)).sample(torch.tensor([0, 1]))
    >>> sub.n_id.tolist(), [b.size for b in sub.blocks]
    ([0, 1, 0, 1, 0, 1], [(6, 4), (4, 2)])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from gnnaas.sampling import fastpath
from gnnaas.sampling.neighbor import NeighborSampler
from gnnaas.sampling.subgraph import Block, SampledSubgraph

__all__ = ["DepthSampler", "LiveAdjacency"]

# Distinct, fixed keys per depth; depth d of seed s draws with seed s + d * _DEPTH_STRIDE.
_DEPTH_STRIDE = 1_000_003


class LiveAdjacency(Protocol):
    """What :class:`DepthSampler` reads from a live graph (:class:`gnnaas.data.live.LiveGraph`):
    its node count, how many nodes it can hold, the overlay of changed and new nodes for the
    compiled kernel, and the merged graph for the torch path. Read between writes only (the
    server applies writes between batches)."""

    @property
    def num_nodes(self) -> int: ...

    @property
    def capacity(self) -> int: ...

    @property
    def version(self) -> int: ...

    def overlay_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None: ...

    def merged_csr(self) -> tuple[Tensor, Tensor]: ...


class DepthSampler:
    """Consistent k-hop sampler with one row per (node, depth) (see the module docstring).

    Args:
        rowptr (Tensor): ``[N + 1]`` int64 CSR row pointer over incoming edges.
        col (Tensor): ``[E]`` int64 in-neighbors.
        fanouts (Sequence[int]): neighbors per target for each hop, PyG order; ``-1`` keeps all.
        seed (int, optional): key of the draws. (default: ``0``)
        fast_path (bool, optional): sample a CPU graph with the compiled kernel when it compiled
            (:func:`gnnaas.sampling.fastpath.available`); ``False`` keeps the torch path, which
            samples the same trees (to compare the two). (default: ``True``)
        live (LiveAdjacency, optional): the live graph over ``rowptr``/``col``: its changed and
            new nodes are read from it, so a node's draws depend on (node, depth, its current
            neighbors) and the sampler stays consistent per graph version. (default: ``None``)
    """

    def __init__(
        self,
        rowptr: Tensor,
        col: Tensor,
        fanouts: Sequence[int],
        *,
        seed: int = 0,
        fast_path: bool = True,
        live: LiveAdjacency | None = None,
    ) -> None:
        self.fanouts = tuple(int(f) for f in fanouts)
        self.seed = seed
        self._live = live
        self._hops = self._build_hops(rowptr, col)
        self._hops_version = -1  # the live version _hops were built for (-1: the base graph)
        self._fast = None
        if fast_path and rowptr.device.type == "cpu" and fastpath.available():
            self._fast = (
                rowptr.contiguous().numpy(),
                col.contiguous().numpy(),
                np.asarray(self.fanouts, dtype=np.int64),
                np.asarray([hop._keys[0] for hop in self._hops], dtype=np.uint64),
                fastpath._Maps(rowptr.numel() - 1 if live is None else live.capacity),
            )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(fanouts={self.fanouts}, seed={self.seed})"

    def _build_hops(self, rowptr: Tensor, col: Tensor) -> list[NeighborSampler]:
        return [
            NeighborSampler(rowptr, col, (k,), consistent=True, seed=self.seed + d * _DEPTH_STRIDE)
            for d, k in enumerate(self.fanouts)
        ]

    def sample(self, seeds: Tensor, generator: torch.Generator | None = None) -> SampledSubgraph:
        """Samples the depth-separated k-hop neighborhood of unique ``seeds``.

        ``generator`` is accepted for interface compatibility and ignored (draws are hashed).
        On a CPU graph the compiled kernel samples the same tree (:mod:`gnnaas.sampling.fastpath`)
        in far fewer calls (``benchmarks/results/latency.md`` measures both paths); the torch
        path samples what it does not take.
        """
        overlay = None if self._live is None else self._live.overlay_arrays()
        if overlay is not None:
            seeds = _check_live_seeds(seeds, self._live.num_nodes)  # type: ignore[union-attr]
        if self._fast is not None:
            if overlay is None:
                seeds = self._hops[0]._check_seeds(seeds)
            rowptr, col, fanouts, keys, maps = self._fast
            sub = fastpath.sample_depth_numba(rowptr, col, seeds, fanouts, keys, maps, overlay)
            if sub is not None:
                return sub
        if overlay is not None and self._hops_version != self._live.version:  # type: ignore[union-attr]
            # The torch path reads the merged graph, rebuilt only when this path runs (O(E)).
            self._hops = self._build_hops(*self._live.merged_csr())  # type: ignore[union-attr]
            self._hops_version = self._live.version  # type: ignore[union-attr]
        levels = [seeds]  # global ids of the rows of each depth
        edges: list[tuple[Tensor, Tensor]] = []  # (src row in depth d + 1, dst row in depth d)
        for hop in self._hops:
            sub = hop.sample(levels[-1])
            src, dst = sub.blocks[0].edge_index  # src indexes sub.n_id, dst the frontier
            # The distinct sources become the next depth's rows (frontier nodes included: at
            # depth d + 1 they are other rows than at depth d).
            used = torch.zeros(sub.n_id.numel(), dtype=torch.bool, device=src.device)
            used[src] = True
            picked = used.nonzero().view(-1)  # [N_{d+1}]
            remap = torch.empty(sub.n_id.numel(), dtype=torch.long, device=src.device)
            remap[picked] = torch.arange(picked.numel(), device=src.device)
            levels.append(sub.n_id[picked])
            edges.append((remap[src], dst))

        offsets = [0]
        for level in levels:
            offsets.append(offsets[-1] + level.numel())
        num_hops = len(self._hops)
        shifted = [
            torch.stack([src + offsets[d + 1], dst + offsets[d]])
            for d, (src, dst) in enumerate(edges)
        ]
        blocks = []
        for layer in range(num_hops):
            h = num_hops - layer  # depths 0 .. h-1 are targets of this layer
            edge_index = torch.cat(shifted[:h], dim=1)
            blocks.append(Block(edge_index, (offsets[h + 1], offsets[h])))
        return SampledSubgraph(
            torch.cat(levels), seeds.numel(), blocks, [level.numel() for level in levels]
        )


def _check_live_seeds(seeds: Tensor, num_nodes: int) -> Tensor:
    if seeds.dtype != torch.int64 or seeds.dim() != 1:
        raise TypeError("DepthSampler.sample: seeds must be a 1-D int64 tensor")
    if seeds.numel() and (int(seeds.min()) < 0 or int(seeds.max()) >= num_nodes):
        raise ValueError(f"DepthSampler.sample: seeds must be node ids in [0, {num_nodes})")
    return seeds
