"""A compiled (numba) depth sampler: the same sampled trees, with no per-call overhead.

:class:`~gnnaas.sampling.DepthSampler`'s torch path runs a few dozen vectorized torch calls per
batch; for one seed their per-call overhead is most of the time, and for a thousand seeds the
temporaries of those calls cost more than the draws (``benchmarks/results/latency.md``,
"Sampling", measures both paths). The kernel here
walks the same computation tree in one compiled loop: for every (node, depth) row it takes the
same neighbors as the torch path (all of them when the degree is at most the fanout, else Floyd's
subset drawn from the same counter-based hash, :mod:`gnnaas.sampling.hashing`), so a node's
sampled tree is the same set of (node, depth) rows and edges whichever path serves its batch.
Only the order of rows within a depth (first seen here, frontier first there) and of a target's
edges may differ, which changes nothing but floating-point summation order
(``tests/sampling/test_fastpath.py`` checks both paths against each other).

The sampler chooses the path, not the user: the kernel samples every batch of a CPU graph once it
compiled (:func:`available`), and the torch path the rest: a graph on a GPU, a tree larger than
:data:`MAX_ENTRIES` rows, or a process where the kernel did not compile (numba is a dependency,
so only a broken install; the reason is logged once). The first use compiles the kernel (cached
on disk by numba when the package folder is writable).
"""

from __future__ import annotations

import functools
import logging
import threading

import numpy as np
import torch
from torch import Tensor

from gnnaas.sampling.subgraph import Block, SampledSubgraph

__all__ = ["MAX_ENTRIES", "available", "sample_depth_numba"]

_log = logging.getLogger(__name__)

try:  # a dependency; without it (a broken install) the torch path samples every batch
    import numba

    _NUMBA_ERROR: ImportError | None = None
except ImportError as exc:  # pragma: no cover - exercised where numba cannot be imported
    _NUMBA_ERROR = exc

_MASK32 = 0xFFFFFFFF
_GOLDEN32 = 0x9E3779B9
_C1 = 0x85EBCA6B
_C2 = 0xC2B2AE35

# Largest sampled tree (rows, and edges) the kernel builds, 1.5 GB of int64 buffers; a bigger one is
# sampled by the torch path. Without a fanout of -1 the bound is known before the call.
MAX_ENTRIES = 1 << 26
# First guess of the rows a hop adds per target when its fanout is -1 (all neighbors); the call is
# repeated with four times the room when the guess was short.
_FULL_GUESS = 64


@functools.cache
def available() -> bool:
    """Whether the compiled kernel runs in this process: numba imports and the kernel compiles.

    Checked once per process, on the first call (which compiles the kernel, or loads it from
    numba's cache); when it fails, the reason is logged once and the torch path samples every
    batch.
    """
    if _NUMBA_ERROR is not None:
        _log.warning("numba cannot be imported (%s): the torch sampler serves", _NUMBA_ERROR)
        return False
    empty = np.empty(0, np.int64)
    try:  # one seed of a two-node graph, with the argument types of every later call
        _kernel(
            np.array([0, 1, 1], np.int64),
            np.array([1], np.int64),
            empty,
            np.zeros(1, np.int64),
            empty,
            np.array([0], np.int64),
            np.array([1], np.int64),
            np.zeros(1, np.uint64),
            np.full(2, -1, np.int64),
            4,
        )
    except Exception as exc:  # numba's typing and lowering errors have no common base
        _log.warning("the compiled sampler did not compile (%s): the torch sampler serves", exc)
        return False
    return True


if _NUMBA_ERROR is None:

    @numba.njit(cache=True, nogil=True, inline="always")
    def _fmix32(h: np.uint64) -> np.uint64:  # pragma: no cover - compiled
        mask = np.uint64(_MASK32)
        h ^= h >> np.uint64(16)
        h = (h * np.uint64(_C1)) & mask
        h ^= h >> np.uint64(13)
        h = (h * np.uint64(_C2)) & mask
        h ^= h >> np.uint64(16)
        return h

    @numba.njit(cache=True, nogil=True, inline="always")
    def _draw(node, key, k, deg, a, chosen):  # pragma: no cover - compiled
        """The ``k`` of ``deg`` neighbor positions (from ``a``) of ``node`` into ``chosen``:
        Floyd's sampling without replacement driven by the hash of (node, hop key, i), the
        draws of the torch path (:mod:`gnnaas.sampling.hashing`)."""
        mask = np.uint64(_MASK32)
        golden = np.uint64(_GOLDEN32)
        base = _fmix32(_fmix32(np.uint64(node) ^ key))
        for i in range(k):
            h = _fmix32((np.uint64(i) * golden + base) & mask)
            j = deg - k + i
            pos = np.int64((h * np.uint64(j + 1)) >> np.uint64(32))
            for q in range(i):
                if chosen[q] == a + pos:
                    pos = j
                    break
            chosen[i] = a + pos

    @numba.njit(cache=True, nogil=True)
    def _kernel(
        rowptr, col, over_idx, over_ptr, over_col, seeds, fanouts, keys, node_row, cap
    ):  # pragma: no cover - compiled; checked against the torch path by the tests
        """Rows (global ids) depth by depth and edges (source row, target row); the edge count
        is ``-1`` when ``cap`` rows or edges were not enough (``node_row`` is clean either way).

        A node with ``over_idx[node] >= 0`` takes its in-neighbors from the overlay CSR
        ``over_col[over_ptr[o]:over_ptr[o + 1]]`` instead of the base graph (a live graph's
        changed and new nodes); an empty ``over_idx`` means no overlay."""
        overlay = over_idx.shape[0] > 0
        num_hops = fanouts.shape[0]
        rows = np.empty(cap, np.int64)
        src = np.empty(cap, np.int64)
        dst = np.empty(cap, np.int64)
        counts = np.zeros(num_hops + 1, np.int64)
        n = seeds.shape[0]
        rows[:n] = seeds
        counts[0] = n
        lo, hi, e = 0, n, 0
        chosen = np.empty(max(1, fanouts.max()), np.int64)
        for d in range(num_hops):
            k = fanouts[d]
            key = np.uint64(keys[d])
            start_next = hi
            for t in range(lo, hi):
                node = rows[t]
                if overlay and over_idx[node] >= 0:  # a live graph's changed or new node
                    o = over_idx[node]
                    adj = over_col
                    a = over_ptr[o]
                    deg = over_ptr[o + 1] - a
                else:
                    adj = col
                    a = rowptr[node]
                    deg = rowptr[node + 1] - a
                full = k < 0 or deg <= k  # every neighbor, positions a .. a + deg - 1
                m = deg if full else k
                if not full:
                    _draw(node, key, k, deg, a, chosen)
                if e + m > cap or hi + m > cap:
                    for r in range(start_next, hi):  # leave the map clean for its next user
                        node_row[rows[r]] = -1
                    return rows, src, dst, counts, -1
                for i in range(m):
                    nbr = adj[a + i] if full else adj[chosen[i]]
                    r = node_row[nbr]
                    if r < start_next:  # not yet a row of depth d + 1
                        r = hi
                        node_row[nbr] = hi
                        rows[hi] = nbr
                        hi += 1
                    src[e] = r
                    dst[e] = t
                    e += 1
            for r in range(start_next, hi):  # clean the map for the next depth and call
                node_row[rows[r]] = -1
            counts[d + 1] = hi - start_next
            lo = start_next
        return rows, src, dst, counts, e


_POOL_SIZE = 8
_NO_OVERLAY = (np.empty(0, np.int64), np.zeros(1, np.int64), np.empty(0, np.int64))


class _Maps:
    """Per-graph node → row maps (all ``-1`` between calls), one per concurrent caller."""

    def __init__(self, num_nodes: int) -> None:
        self.num_nodes = num_nodes
        self._pool: list[np.ndarray] = []
        self._lock = threading.Lock()

    def acquire(self) -> np.ndarray:
        with self._lock:
            if self._pool:
                return self._pool.pop()
        return np.full(self.num_nodes, -1, dtype=np.int64)

    def release(self, node_row: np.ndarray) -> None:
        with self._lock:
            if len(self._pool) < _POOL_SIZE:
                self._pool.append(node_row)


def _capacity(num_seeds: int, fanouts: np.ndarray) -> tuple[int, bool]:
    """Room for the rows (and edges) of a tree, and whether it is a bound rather than a guess."""
    cap = reach = num_seeds
    exact = True
    for f in fanouts.tolist():
        exact = exact and f > 0
        reach *= f if f > 0 else _FULL_GUESS
        cap += reach
        if cap >= MAX_ENTRIES:
            return MAX_ENTRIES, False
    return cap, exact


def sample_depth_numba(
    rowptr: np.ndarray,
    col: np.ndarray,
    seeds: Tensor,
    fanouts: np.ndarray,
    keys: np.ndarray,
    maps: _Maps,
    overlay: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> SampledSubgraph | None:
    """The depth-separated sample of unique ``seeds`` (``None``: let the torch path run).

    Args:
        rowptr (np.ndarray): ``[N + 1]`` int64 CSR row pointer (incoming edges).
        col (np.ndarray): ``[E]`` int64 in-neighbors.
        seeds (Tensor): ``[B]`` int64 unique node ids (CPU).
        fanouts (np.ndarray): ``[L]`` int64 neighbors per hop, PyG order; ``-1`` keeps all.
        keys (np.ndarray): ``[L]`` uint64 hash keys of the depths (those of the torch path).
        maps (_Maps): the graph's node → row maps (as many entries as nodes, new ones included).
        overlay (tuple, optional): ``(over_idx, over_ptr, over_col)``, the adjacency of a live
            graph's changed and new nodes (:class:`gnnaas.data.live.LiveGraph`). (default: ``None``)

    Returns:
        SampledSubgraph | None: as :meth:`DepthSampler.sample` builds it.
    """
    seeds_np = seeds.contiguous().numpy()
    over_idx, over_ptr, over_col = _NO_OVERLAY if overlay is None else overlay
    cap, exact = _capacity(seeds_np.shape[0], fanouts)
    node_row = maps.acquire()
    try:
        while True:
            rows, src, dst, counts, num_edges = _kernel(
                rowptr, col, over_idx, over_ptr, over_col, seeds_np, fanouts, keys, node_row, cap
            )
            if num_edges >= 0 or exact or cap >= MAX_ENTRIES:
                break
            cap = min(4 * cap, MAX_ENTRIES)
    finally:
        maps.release(node_row)
    if num_edges < 0:
        return None
    counts_list = [int(c) for c in counts]
    total = sum(counts_list)
    n_id = torch.from_numpy(rows[:total])
    # Edges are in depth order: edges of depth d (targets at depth d) come before depth d + 1.
    src_t = torch.from_numpy(src[:num_edges])
    dst_t = torch.from_numpy(dst[:num_edges])
    edge_index = torch.stack([src_t, dst_t])
    offsets = np.cumsum([0, *counts_list])
    num_hops = len(counts_list) - 1
    # Edges whose target lies in depths 0 .. h-1 are a prefix: the edges of those depths.
    ends = [0]
    for h in range(1, num_hops + 1):
        ends.append(int(np.searchsorted(dst[:num_edges], offsets[h], side="left")))
    blocks = []
    for layer in range(num_hops):
        h = num_hops - layer  # depths 0 .. h-1 are targets of this layer
        blocks.append(Block(edge_index[:, : ends[h]], (int(offsets[h + 1]), int(offsets[h]))))
    return SampledSubgraph(n_id, seeds.numel(), blocks, counts_list)
