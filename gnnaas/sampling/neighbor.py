"""A vectorized k-hop neighbor sampler with PyG ``NeighborLoader`` semantics.

PyG's ``NeighborLoader`` needs pyg-lib or torch-sparse; this sampler needs torch only, runs on
whatever device the CSR lives on, and has no Python loop over nodes or edges (only over hops and
over the ``fanout`` steps of Floyd's algorithm).

Semantics, per hop ``h`` with fanout ``k_h``:

- the targets of hop 0 are the seeds; the targets of hop ``h > 0`` are the nodes first reached at
  hop ``h - 1`` (nodes already in the sample are not expanded again);
- each target keeps a uniform random ``k_h``-subset of its in-neighbors (without replacement), or
  all of them when its degree is at most ``k_h`` or ``k_h == -1``;
- newly reached nodes are appended to ``n_id`` in order of first appearance, in target order, so
  ``n_id`` is seeds first, then the nodes of hop 0, then those of hop 1, ...

The layer-``l`` block (forward order) holds the edges of hops ``0 .. L-1-l``: its targets are the
nodes reached within ``L-1-l`` hops, a prefix of its sources. It is what ``trim_to_layer`` in PyG
hands each convolution, in the ``conv((x, x[:size[1]]), edge_index)`` form.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Sequence

import torch
from torch import Tensor

from gnnaas.sampling.hashing import hop_key, node_draws
from gnnaas.sampling.subgraph import Block, SampledSubgraph

__all__ = ["NeighborSampler"]

# The node-id -> local-id map is a dense vector that reads `unseen` for nodes not in the sample.
# During relabelling, a not-yet-numbered neighbor temporarily holds `first` + the position of its
# first appearance in the hop (below `unseen`, above any local id). int32 halves the memory
# traffic of the map (a visible part of a sample) and fits graphs with N + E < 2**30; int64 fits
# all.
_MAP_SENTINELS = {torch.int32: ((1 << 31) - 1, 1 << 30), torch.int64: (1 << 62, 1 << 61)}
_POOL_SIZE = 8  # idle maps kept per sampler (one is in use per concurrent sample() call)


class NeighborSampler:
    r"""Samples k-hop neighborhoods of seed nodes as PyG-ready bipartite blocks.

    Uniform without replacement, with ``NeighborLoader``'s semantics (see the module docstring).
    A target of degree ``d`` keeps a uniform ``min(d, k)``-subset of its in-neighbors, drawn by
    Floyd's algorithm vectorized over targets: ``k`` steps, step ``i`` draws ``t`` uniform in
    ``[0, d - k + i]`` and keeps ``t``, or ``d - k + i`` when ``t`` was already kept (steps with
    ``d - k + i < 0`` are skipped, so a target with ``d <= k`` keeps all its neighbors). Draws
    are 32-bit integers mapped to ``[0, n)`` by multiply-shift, so a position's probability is
    exact up to a relative bias below ``d / 2**32``.

    The draws come from a counter-based hash of (node id, hop, key) (:mod:`.hashing`):

    - random mode (default, training): the key is drawn from ``generator`` at every call (torch's
      global RNG when ``None``), so the same generator state gives the same sample;
    - ``consistent=True`` (serving): the key is ``seed``, so a node's sampled neighbors at a
      given hop do not depend on the other seeds of its batch nor on the call: the sample of
      seed ``s`` alone is the sample of ``s`` in any batch. (A node reached at a later hop is
      expanded where it is first reached, so the *set* of nodes expanded at hop ``h > 0`` still
      depends on the batch; each of them gets the same neighbors wherever it is expanded.)

    ``sample()`` may be called from several threads at once: the graph is read-only and each call
    takes its own node-id map (``N`` int32 entries; int64 when ``N + E >= 2**30``) from a small
    lock-protected pool, so a call costs ``O(sampled nodes + edges)``, not ``O(N)``.

    Args:
        rowptr (Tensor): ``[N + 1]`` int64 CSR row pointer over *incoming* edges.
        col (Tensor): ``[E]`` int64; the in-neighbors of node ``i`` are
            ``col[rowptr[i]:rowptr[i + 1]]``. Same device as ``rowptr``.
        fanouts (Sequence[int]): neighbors per target for each hop, PyG order (``(25, 10)``: 25
            of each seed, then 10 of each node reached at the first hop); ``-1`` keeps all.
        consistent (bool, optional): draws depend on (node, hop, ``seed``) only.
            (default: ``False``)
        seed (int, optional): key of the consistent draws; unused in random mode.
            (default: ``0``)

    Shapes:
        - **input:** ``seeds`` :math:`(B,)` int64 node ids.
        - **output:** ``n_id`` :math:`(N_s,)` with ``n_id[:B] == seeds``; ``L = len(fanouts)``
          blocks, ``blocks[l].size == (N_{\le L-l}, N_{\le L-1-l})`` where :math:`N_{\le h}` counts
          the nodes reached within ``h`` hops (:math:`N_{\le 0} = B`).

    Example:
        >>> rowptr, col = torch.tensor([0, 2, 3, 4]), torch.tensor([1, 2, 0, 0])
        >>> sampler = NeighborSampler(rowptr, col, (2, 2))
        >>> sub = sampler.sample(torch.tensor([0]))
        >>> sub.n_id.tolist(), [b.size for b in sub.blocks]
        ([0, 1, 2], [(3, 3), (3, 1)])
    """

    def __init__(
        self,
        rowptr: Tensor,
        col: Tensor,
        fanouts: Sequence[int],
        *,
        consistent: bool = False,
        seed: int = 0,
    ) -> None:
        name = type(self).__name__
        _check_tensors(name, rowptr, col)
        self._fanouts = _check_fanouts(name, fanouts)
        if not isinstance(consistent, bool):
            raise TypeError(f"{name}: consistent must be a bool (got {consistent!r})")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"{name}: seed must be an int (got {seed!r})")
        deg = _checked_degrees(name, rowptr, col)  # [N]
        num_nodes = deg.numel()

        self.rowptr = rowptr
        self.col = col
        self.deg = deg
        self.consistent = consistent
        self.seed = seed
        self._keys = [hop_key(seed, hop) for hop in range(len(self._fanouts))]
        self._map_dtype = torch.int32 if num_nodes + col.numel() < 1 << 30 else torch.int64
        self._unseen, self._first = _MAP_SENTINELS[self._map_dtype]
        self._pool: list[Tensor] = []
        self._lock = threading.Lock()

    @property
    def fanouts(self) -> tuple[int, ...]:
        """Neighbors per target for each hop (PyG order; ``-1`` = all)."""
        return self._fanouts

    @property
    def num_nodes(self) -> int:
        """Number of nodes ``N`` of the graph."""
        return int(self.deg.numel())

    @property
    def num_edges(self) -> int:
        """Number of edges ``E`` of the graph."""
        return int(self.col.numel())

    @property
    def device(self) -> torch.device:
        """The device of the graph (and of every sample)."""
        return self.col.device

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_nodes={self.num_nodes}, num_edges={self.num_edges}, "
            f"fanouts={self._fanouts}, consistent={self.consistent})"
        )

    def sample(self, seeds: Tensor, generator: torch.Generator | None = None) -> SampledSubgraph:
        """Samples the k-hop neighborhood of ``seeds``.

        Args:
            seeds (Tensor): ``[B]`` int64 node ids in ``[0, N)``, expected unique (a repeated
                seed gets one output row per copy, all with the same neighbors; a neighbor equal
                to it maps to one of the copies). Moved to the graph's device.
            generator (torch.Generator, optional): source of the random draws (one 62-bit key
                per call); ``None`` uses torch's global RNG. Ignored when ``consistent=True``.
                (default: ``None``)

        Returns:
            SampledSubgraph: ``n_id`` (seeds first), ``batch_size == B`` and one block per hop.

        Raises:
            TypeError: ``seeds`` is not an int64 tensor.
            ValueError: ``seeds`` is not 1-D or holds ids outside ``[0, N)``.
        """
        seeds = self._check_seeds(seeds)
        keys = self._keys if self.consistent else self._random_keys(generator)
        device = self.device
        batch_size = seeds.numel()
        # A map from the pool reads `unseen` everywhere; after an exception it is simply dropped.
        mapping = self._acquire()
        mapping.index_copy_(0, seeds, torch.arange(batch_size, device=device, dtype=mapping.dtype))
        nodes = [seeds]  # global ids: the seeds, then the new nodes of each hop
        hops: list[tuple[Tensor, Tensor]] = []  # (local source, local target) of each edge
        lo, num = 0, batch_size  # this hop's targets are local ids [lo, num)
        for fanout, key in zip(self._fanouts, keys, strict=True):
            dst, nbr = self._sample_hop(nodes[-1], fanout, key, lo)
            if num + nbr.numel() >= self._first:  # only with many duplicate seeds
                raise ValueError(
                    f"{type(self).__name__}.sample: {nbr.numel()} edges in one hop overflow the "
                    f"node map; sample fewer (unique) seeds per call"
                )
            local, new_nodes = _relabel(mapping, nbr, num, self._first)
            hops.append((local, dst))
            nodes.append(new_nodes)
            lo, num = num, num + new_nodes.numel()
        n_id = torch.cat(nodes)
        # Clean the map for the next call: a dense fill is far cheaper per entry than a scatter,
        # so a sample that touched more than a 32nd of the map refills it whole.
        if 32 * n_id.numel() >= mapping.numel():
            mapping.fill_(self._unseen)
        else:
            mapping.index_fill_(0, n_id, self._unseen)
        self._release(mapping)

        # All edges in one [2, E] buffer, hop by hop; block l holds hops 0 .. L-1-l, a prefix.
        ends = [0]
        for local, _ in hops:
            ends.append(ends[-1] + local.numel())
        edge_index = torch.empty((2, ends[-1]), dtype=torch.int64, device=device)
        for (local, dst), a, b in zip(hops, ends[:-1], ends[1:], strict=True):
            edge_index[0, a:b] = local  # widened to int64 if the map is int32
            edge_index[1, a:b] = dst
        counts = [n.numel() for n in nodes]
        reached = [sum(counts[: h + 1]) for h in range(len(counts))]  # nodes within h hops
        num_hops = len(self._fanouts)
        blocks = [
            Block(edge_index[:, : ends[h]], (reached[h], reached[h - 1]))
            for h in range(num_hops, 0, -1)
        ]
        return SampledSubgraph(n_id, batch_size, blocks, counts)

    def _random_keys(self, generator: torch.Generator | None) -> list[int]:
        device = generator.device if generator is not None else torch.device("cpu")
        # One host sync per call: a fresh 62-bit key, from which each hop gets its own.
        call_key = int(torch.randint(1 << 62, (1,), generator=generator, device=device))
        return [hop_key(call_key, hop) for hop in range(len(self._fanouts))]

    def _sample_hop(
        self, frontier: Tensor, fanout: int, key: int, lo: int
    ) -> tuple[Tensor, Tensor]:
        """Samples the neighbors of ``frontier``, whose local ids are ``lo, lo + 1, ...``.

        Returns:
            tuple[Tensor, Tensor]: ``dst`` (local id of the target) and ``nbr`` (global id of
            the neighbor), one entry per sampled edge, grouped by target in frontier order.
        """
        device = frontier.device
        m = frontier.numel()
        ar = torch.arange(lo, lo + m, device=device)  # local ids of the targets
        start = self.rowptr.index_select(0, frontier)  # [M]
        deg = self.deg.index_select(0, frontier)  # [M]
        if fanout < 0:  # all neighbors
            total = int(deg.sum())
            rows = torch.repeat_interleave(torch.arange(m, device=device), deg, output_size=total)
            first = (deg.cumsum(0) - deg).index_select(0, rows)
            pos = torch.arange(total, device=device) - first + start.index_select(0, rows)
            return rows.add_(lo), self.col.index_select(0, pos)

        big = (deg > fanout).nonzero().view(-1)  # targets that keep a proper subset
        num_big = big.numel()
        if 10 * num_big >= 9 * m:
            # Mostly high-degree targets: Floyd on every row (a row with deg <= fanout keeps all
            # its neighbors, its first fanout - deg steps skipped), then drop the skipped slots.
            pos = _floyd(node_draws(frontier, key, fanout), deg)  # [k, M]
            pos += start
            pos = pos.t().contiguous()  # [M, k], target-major
            if num_big == m:  # every target keeps `fanout` neighbors
                return ar.repeat_interleave(fanout), self.col.index_select(0, pos.view(-1))
            keep = pos >= start.unsqueeze(1)
        else:
            # Mostly low-degree targets: all positions, then Floyd on the few high-degree rows.
            pos = start.unsqueeze(1) + torch.arange(fanout, device=device)  # [M, k]
            if num_big:
                sub = _floyd(
                    node_draws(frontier.index_select(0, big), key, fanout),
                    deg.index_select(0, big),
                )
                sub += start.index_select(0, big)
                pos.index_copy_(0, big, sub.t())
            keep = torch.arange(fanout, device=device) < deg.unsqueeze(1)  # [M, k]
        counts = deg.clamp(max=fanout)  # [M]
        total = int(counts.sum())  # host sync: the size of the outputs
        rows = torch.repeat_interleave(ar, counts, output_size=total)
        return rows, self.col.index_select(0, pos.masked_select(keep))

    # -- helpers ---------------------------------------------------------------------------

    def _check_seeds(self, seeds: Tensor) -> Tensor:
        name = f"{type(self).__name__}.sample"
        if not isinstance(seeds, Tensor):
            raise TypeError(
                f"{name}: seeds must be an int64 torch.Tensor (got {type(seeds).__name__})"
            )
        if seeds.dtype != torch.int64:
            raise TypeError(f"{name}: seeds must be int64 (got {seeds.dtype}); use seeds.long()")
        if seeds.dim() != 1:
            raise ValueError(f"{name}: seeds must be 1-D (got shape {tuple(seeds.shape)})")
        seeds = seeds.to(self.device)
        if seeds.numel():
            # One host sync per call: out-of-range ids would read out of bounds below.
            low, high = int(seeds.min()), int(seeds.max())
            if low < 0 or high >= self.num_nodes:
                bad = low if low < 0 else high
                raise ValueError(
                    f"{name}: seeds must be node ids in [0, {self.num_nodes}) (got {bad})"
                )
        return seeds

    def _acquire(self) -> Tensor:
        with self._lock:
            if self._pool:
                return self._pool.pop()
        # A normal tensor even when created under inference_mode: pooled maps are updated in
        # place by later calls, which may run outside it (an inference tensor would refuse).
        with torch.inference_mode(False):
            return torch.full(
                (self.num_nodes,), self._unseen, dtype=self._map_dtype, device=self.device
            )

    def _release(self, mapping: Tensor) -> None:
        with self._lock:
            if len(self._pool) < _POOL_SIZE:
                self._pool.append(mapping)


def _floyd(draws: Tensor, deg: Tensor) -> Tensor:
    """Floyd's algorithm vectorized over rows: a uniform ``min(deg, k)``-subset of ``[0, deg)``.

    Step ``i`` has ``j = deg - k + i``; it draws ``t`` uniform in ``[0, j]`` and keeps ``t``, or
    ``j`` when ``t`` is already kept. Steps with ``j < 0`` are skipped and yield ``j`` (negative).

    Shapes:
        - **input:** ``draws`` :math:`(k, M)` uniform in ``[0, 2**32)`` (overwritten),
          ``deg`` :math:`(M,)`.
        - **output:** :math:`(k, M)`: kept positions in ``[0, deg)``; negative on skipped steps,
          which are the first ``k - min(deg, k)`` of each row.
    """
    k = draws.size(0)
    top = deg + torch.arange(-k, 0, device=deg.device).unsqueeze(1)  # [k, M]: j = deg - k + i
    # t = floor(draw * (j + 1) / 2**32) in [0, j]; the product stays < 2**63 as j < 2**31.
    out = draws.mul_(top.clamp(min=-1).add_(1)).bitwise_right_shift_(32)
    torch.minimum(out, top, out=out)  # skipped steps (j < 0) yield j
    for i in range(1, k):
        t = out[i]
        # t is taken iff it equals an earlier kept value of its row ([i, M] compare, OR over i).
        taken = (out[:i] == t).view(torch.uint8).amax(0).view(torch.bool)
        torch.where(taken, top[i], t, out=t)
    return out


def _relabel(mapping: Tensor, nbr: Tensor, num: int, first: int) -> tuple[Tensor, Tensor]:
    """Maps global neighbor ids to local ids; numbers new nodes from ``num`` on, first seen first.

    ``mapping`` holds the local id of every node in the sample (``< first``) and a larger
    sentinel elsewhere; a scatter-min of ``first + position`` leaves each new node with its first
    position (deterministic on every device) and does not touch the nodes already numbered.

    Returns:
        tuple[Tensor, Tensor]: local ids ``[E_h]`` (``mapping``'s dtype) and the new nodes'
        global ids ``[U]`` in order of first appearance.
    """
    device, dtype = nbr.device, mapping.dtype
    key = torch.arange(first, first + nbr.numel(), device=device, dtype=dtype)  # [E_h]
    mapping.scatter_reduce_(0, nbr, key, reduce="amin")
    is_first = mapping.index_select(0, nbr) == key  # first appearance of a new node
    new_nodes = nbr.masked_select(is_first)  # [U]
    ids = torch.arange(num, num + new_nodes.numel(), device=device, dtype=dtype)
    mapping.index_copy_(0, new_nodes, ids)
    return mapping.index_select(0, nbr), new_nodes


def _check_tensors(name: str, rowptr: Tensor, col: Tensor) -> None:
    """The CSR's tensors: 1-D int64, on one device, ``rowptr`` not empty."""
    for arg, t in (("rowptr", rowptr), ("col", col)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: {arg} must be a torch.Tensor (got {type(t).__name__})")
        if t.dtype != torch.int64:
            raise TypeError(f"{name}: {arg} must be int64 (got {t.dtype})")
        if t.dim() != 1:
            raise ValueError(f"{name}: {arg} must be 1-D (got shape {tuple(t.shape)})")
    if rowptr.device != col.device:
        raise ValueError(
            f"{name}: rowptr and col must be on one device (got {rowptr.device} and {col.device})"
        )
    if rowptr.numel() == 0:
        raise ValueError(f"{name}: rowptr must have num_nodes + 1 >= 1 entries (got 0)")


def _checked_degrees(name: str, rowptr: Tensor, col: Tensor) -> Tensor:
    """``[N]`` in-degrees, once the CSR is checked (a few passes over the graph, so that
    ``sample`` can index without checks)."""
    deg = rowptr[1:] - rowptr[:-1]  # [N]
    num_nodes = deg.numel()
    first, last = int(rowptr[0]), int(rowptr[-1])
    if first != 0 or last != col.numel():
        raise ValueError(
            f"{name}: rowptr must start at 0 and end at col.numel() = {col.numel()} "
            f"(got {first} and {last})"
        )
    if num_nodes and int(deg.min()) < 0:
        raise ValueError(f"{name}: rowptr must be non-decreasing")
    if col.numel() and (int(col.min()) < 0 or int(col.max()) >= num_nodes):
        raise ValueError(f"{name}: col must hold node ids in [0, {num_nodes})")
    if num_nodes and int(deg.max()) >= 1 << 31:
        raise ValueError(f"{name}: node degrees must be < 2**31")
    if num_nodes > 1 << 32:
        raise ValueError(f"{name}: node ids are hashed as 32-bit ints (got {num_nodes} nodes)")
    return deg


def _check_fanouts(name: str, fanouts: Sequence[int]) -> tuple[int, ...]:
    if isinstance(fanouts, (str, bytes)) or not isinstance(fanouts, Sequence):
        raise TypeError(f"{name}: fanouts must be a sequence of ints (got {fanouts!r})")
    values = list(fanouts)
    if not values:
        raise ValueError(f"{name}: fanouts must hold one int per hop (got {values})")
    for i, f in enumerate(values):
        try:
            values[i] = operator.index(f)
        except TypeError:
            raise TypeError(f"{name}: fanouts must be ints >= 1 or -1 (got {values})") from None
        if isinstance(f, bool):
            raise TypeError(f"{name}: fanouts must be ints >= 1 or -1 (got {values})")
    bad = [f for f in values if f < 1 and f != -1]
    if bad:
        raise ValueError(f"{name}: fanouts must be ints >= 1 or -1 (got {bad})")
    return tuple(values)
