"""The one execution path: sample → gather → copy → forward → copy back.

The server's executor, the profiler (accuracy, latency and service curves) and evaluation during
generation all run a batch through :class:`InferencePath`, so a profiled time or accuracy is one of
the pipeline that is served (docs/architecture.md §5). A path holds one variant: its model, the
store's pruned feature copy for it and the serving sampler for its fanouts
(:meth:`gnnaas.runtime.RuntimeGraph.sampler`).

Stages of :meth:`InferencePath.run`, as the profile columns define them:

- ``sample``: the k-hop neighborhood of the seeds (host);
- ``gather``: the kept feature rows of the sampled nodes (``features.index_select(0, n_id)``,
  into a reused buffer, pinned on CUDA) and their host→device copy with the blocks
  (``non_blocking``). With a :class:`~gnnaas.inference.cache.FeatureCache` only the rows of
  nodes it does not hold (the misses) are gathered and copied, in one copy, and the input is
  assembled on the device in ``n_id`` order from the resident rows and the copied ones
  (:attr:`InferencePath.last_transfer` says how many rows each batch took from where);
- ``compute``: the forward pass under :func:`torch.inference_mode`;
- ``copy``: the outputs back to the host.

On the CPU the stages are clocked with :func:`time.perf_counter`. On CUDA the device stages are
timed with CUDA events and the only synchronization is the blocking device→host copy of the
outputs (the caller needs their values), so timing adds no sync of its own.

Shapes:
    - **input:** ``seeds`` ``[B]`` unique int64 node ids on the host.
    - **gathered:** ``x`` ``[N_s, F_kept]`` rows of the sampled nodes, seeds first.
    - **output:** ``logits`` ``[B, C]`` on the host, in seed order; with ``embed=True`` also
      ``embeddings`` ``[B, H]`` (the model's last hidden layer, ``H = hidden_channels``).

Example:
    >>> path = InferencePath(model, store.feature_subset(keep), sampler)  # doctest: +SKIP
    >>> out = path.run(torch.tensor([0, 5, 7]), embed=True)  # doctest: +SKIP
    >>> out.logits.shape, out.embeddings.shape, out.times.total_ms > 0  # doctest: +SKIP
    (torch.Size([3, 7]), torch.Size([3, 256]), True)
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

from gnnaas.inference.cache import FeatureCache, Transfer
from gnnaas.typing import Device

__all__ = ["GATHER_BUFFER_LIMIT_BYTES", "InferencePath", "PathOutput", "Sampler", "StageTimes"]

GATHER_BUFFER_LIMIT_BYTES = 256 * 2**20
"""Largest gather buffer a path keeps for reuse (bytes); larger gathers allocate per batch."""


class Sampler(Protocol):
    """What the path needs from a sampler (:class:`~gnnaas.sampling.DepthSampler` fits)."""

    def sample(self, seeds: Tensor) -> Any:
        """Returns an object with ``n_id`` (seeds first), ``batch_size`` and ``blocks``."""
        ...


@dataclass(frozen=True)
class StageTimes:
    """Wall time (ms) of each stage of one batch (see the module docstring).

    Args:
        sample_ms (float): k-hop sampling.
        gather_ms (float): gather of the kept feature rows plus their host→device copy.
        compute_ms (float): the forward pass.
        copy_ms (float, optional): outputs device→host (0 on the CPU). (default: ``0.0``)
    """

    sample_ms: float
    gather_ms: float
    compute_ms: float
    copy_ms: float = 0.0

    @property
    def comm_ms(self) -> float:
        """Moving data to and from the model: ``gather_ms + copy_ms`` (docs/architecture.md §5
        ``comm_ms``)."""
        return self.gather_ms + self.copy_ms

    @property
    def latency_ms(self) -> float:
        """``comm_ms + compute_ms`` (docs/architecture.md §5 ``latency_ms``)."""
        return self.comm_ms + self.compute_ms

    @property
    def total_ms(self) -> float:
        """Every stage, sampling included (docs/architecture.md §5 ``e2e_ms``)."""
        return self.sample_ms + self.latency_ms


class PathOutput(NamedTuple):
    """What :meth:`InferencePath.run` returns (read its fields by name).

    Args:
        logits (Tensor): ``[B, C]`` outputs on the host, one row per seed, in order.
        times (StageTimes): the batch's stage times.
        num_sampled (int): rows gathered (sampled nodes, seeds included).
        embeddings (Tensor, optional): ``[B, H]`` the seeds' embeddings on the host, in the same
            order (the input of the model's last convolution, see
            :meth:`gnnaas.models.GNN.forward`); ``None`` unless asked for. (default: ``None``)
    """

    logits: Tensor
    times: StageTimes
    num_sampled: int
    embeddings: Tensor | None = None


class _Staged(NamedTuple):
    """A batch's input on the host when a cache serves part of it."""

    where: Tensor  # [2H + M] hit positions in n_id, their rows in the cache, miss positions
    hits: int  # H
    missed: Tensor  # [M, F_kept] the misses' rows (the reused gather buffer)


class InferencePath:
    """Sample → gather → copy → forward → copy back for one variant.

    Args:
        model (torch.nn.Module): the variant's GNN on ``device``, called as ``model(x, blocks)``;
            put in ``eval()`` mode here.
        features (Tensor): ``[N, F_kept]`` the store's pruned feature copy for the variant
            (``store.feature_subset(kept)``), on the host.
        sampler (Sampler): the serving sampler for the variant's fanouts.
        device (str | torch.device, optional): where the forward pass runs. (default: ``"cpu"``)
        cache (FeatureCache, optional): rows of ``features`` resident on ``device``; batches
            then copy only the other rows (the answers are the same). (default: ``None``)

    A path is not meant for concurrent calls (one batch at a time, like one lane of the server):
    it reuses one gather buffer (pinned on CUDA), so calls are serialized by a lock.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        features: Tensor,
        sampler: Sampler,
        device: Device = "cpu",
        *,
        cache: FeatureCache | None = None,
    ) -> None:
        if features.dim() != 2:
            raise ValueError(
                f"InferencePath: features must be a 2-D [N, F_kept] tensor "
                f"(got shape {tuple(features.shape)})"
            )
        if features.device.type != "cpu":
            raise ValueError(
                f"InferencePath: features must live on the host (got {features.device}); "
                "the path copies the gathered rows to the device"
            )
        self.model = model.eval()
        configure = getattr(model, "configure_fanouts", None)
        if configure is not None:  # a GIN sampled past its training fanouts scales its sums
            configure(getattr(sampler, "fanouts", None))
        self.features = features
        self.sampler = sampler
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        self._buffer: Tensor | None = None  # [capacity, F_kept] gather buffer (pinned on CUDA)
        self._lock = threading.Lock()
        self.last_num_seeds = 0  # unique nodes of the last predict() batch
        if cache is not None:
            _check_cache(cache, features, self.device)
        self.cache = cache
        self._row_bytes = features.size(1) * features.element_size()
        self._last_io = (0, 0)  # (rows read, rows from the cache) of the last run() batch

    @property
    def last_transfer(self) -> Transfer:
        """The feature rows the last :meth:`run` batch read and how many came from the cache.
        Read after the batch, from the thread that ran it (calls are serialized)."""
        rows, hits = self._last_io
        return Transfer(rows, hits, self._row_bytes)

    def __repr__(self) -> str:
        cache = "" if self.cache is None else f", cache={self.cache.num_cached}"
        return (
            f"{type(self).__name__}(features={tuple(self.features.shape)}, "
            f"sampler={self.sampler!r}, device={self.device}{cache})"
        )

    # -- stages ----------------------------------------------------------------------------------

    def _gather(self, n_id: Tensor) -> Tensor:
        """``features[n_id]`` on the host, into a reused buffer (pinned on CUDA).

        A large fresh buffer per batch is a fresh ``mmap`` whose pages fault in on first touch,
        every batch; a reused one has its pages resident, so a large gather costs its copy and
        little more. Buffers grow to the largest batch seen, up to
        :data:`GATHER_BUFFER_LIMIT_BYTES` per path; a larger gather gets a tensor of its own.
        """
        n, width = int(n_id.numel()), self.features.size(1)
        row_bytes = max(width * self.features.element_size(), 1)
        if not self._cuda and n * row_bytes > GATHER_BUFFER_LIMIT_BYTES:
            return self.features.index_select(0, n_id)  # [N_s, F_kept]
        if self._buffer is None or self._buffer.size(0) < n:
            old = 0 if self._buffer is None else self._buffer.size(0)
            limit = max(GATHER_BUFFER_LIMIT_BYTES // row_bytes, n)
            capacity = min(max(n, 2 * old), limit)
            self._buffer = None  # release the old one before taking the new
            self._buffer = torch.empty(
                (capacity, width), dtype=self.features.dtype, pin_memory=self._cuda
            )
        out = self._buffer[:n]
        torch.index_select(self.features, 0, n_id, out=out)  # [N_s, F_kept]
        return out

    def _stage(self, cache: FeatureCache, n_id: Tensor) -> _Staged:
        """The host half of a cached gather: which rows are hits, and the misses' rows gathered
        into the reused buffer (pinned on CUDA, like the index)."""
        slot = cache.slot.index_select(0, n_id)  # [N_s] row in the cache, or -1
        hit = slot >= 0
        hit_pos = hit.nonzero().view(-1)  # [H]
        miss_pos = (~hit).nonzero().view(-1)  # [M]
        where = torch.cat([hit_pos, slot.index_select(0, hit_pos), miss_pos])  # [2H + M]
        if self._cuda:
            where = where.pin_memory()
        missed = self._gather(n_id.index_select(0, miss_pos))  # [M, F_kept]
        return _Staged(where, int(hit_pos.numel()), missed)

    def _assemble(self, cache: FeatureCache, staged: _Staged, num_rows: int) -> Tensor:
        """The device half: one copy of the missed rows (and the index), then ``[N_s, F_kept]``
        in ``n_id`` order on the device, from the resident rows and the copied ones."""
        h = staged.hits
        where = staged.where.to(self.device, non_blocking=True)  # no-op on the CPU
        missed = staged.missed.to(self.device, non_blocking=True)  # the one copy of rows
        x = torch.empty(
            (num_rows, self.features.size(1)), dtype=self.features.dtype, device=self.device
        )
        x.index_copy_(0, where[:h], cache.rows.index_select(0, where[h : 2 * h]))
        x.index_copy_(0, where[2 * h :], missed)
        return x  # [N_s, F_kept]

    def _blocks_to_device(self, blocks: list[Any]) -> list[Any]:
        if not self._cuda:
            return blocks
        return [
            dataclasses.replace(
                b, edge_index=b.edge_index.pin_memory().to(self.device, non_blocking=True)
            )
            for b in blocks
        ]

    def _to_device(self, x: Tensor, blocks: list[Any]) -> tuple[Tensor, list[Any]]:
        if not self._cuda:
            return x, blocks  # the copy is a no-op on the CPU
        return x.to(self.device, non_blocking=True), self._blocks_to_device(blocks)

    def _inputs(self, n_id: Tensor, blocks: list[Any]) -> tuple[Tensor, list[Any]]:
        """Gather and copy, untimed: ``x`` ``[N_s, F_kept]`` and the blocks on the device."""
        cache = self.cache
        if cache is None:
            return self._to_device(self._gather(n_id), blocks)
        x = self._assemble(cache, self._stage(cache, n_id), int(n_id.numel()))
        return x, self._blocks_to_device(blocks)

    def _call_model(
        self, x: Tensor, blocks: list[Any], embed: bool
    ) -> tuple[Tensor | None, Tensor]:
        """``(embeddings [B, H] or None, logits [B, C])`` on the model's device."""
        if not embed:
            return None, self.model(x, blocks)  # so a model without ``embed`` still serves logits
        emb, out = self.model(x, blocks, embed=True)
        return emb, out

    def _execute(
        self, sub: Any, sample_ms: float, t1: float, embed: bool = False
    ) -> tuple[StageTimes, Tensor, Tensor | None]:
        """Gather → copy → forward → copy back of ``sub``, timed (under inference_mode)."""
        num_rows = int(sub.n_id.numel())
        blocks = list(sub.blocks)
        cache = self.cache
        if cache is None:
            staged = None
            x = self._gather(sub.n_id)  # [N_s, F_kept]
            self._last_io = (num_rows, 0)
        else:
            staged = self._stage(cache, sub.n_id)
            self._last_io = (num_rows, staged.hits)
            if not self._cuda:  # the host is the device: assembling is part of the gather
                x = self._assemble(cache, staged, num_rows)
        t2 = time.perf_counter()
        if not self._cuda:
            emb, out = self._call_model(x, blocks, embed)  # [B, H], [B, C], already on the host
            if emb is not None:
                # a one-layer model's embeddings are rows of the reused gather buffer
                emb = emb.clone()
            t3 = time.perf_counter()
            return StageTimes(sample_ms, (t2 - t1) * 1e3, (t3 - t2) * 1e3), out, emb
        # Events record on the current device's stream: make that this path's device (cuda:1
        # while cuda:0 is current would otherwise time the wrong stream).
        with torch.cuda.device(self.device):
            events = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            events[0].record()
            if cache is None or staged is None:
                x, blocks = self._to_device(x, blocks)
            else:
                x, blocks = self._assemble(cache, staged, num_rows), self._blocks_to_device(blocks)
            events[1].record()
            emb, out = self._call_model(x, blocks, embed)
            events[2].record()
            if emb is not None:
                # pinned and asynchronous: the blocking copy below waits for it on the stream
                emb = emb.to("cpu", non_blocking=True)
            out = out.to("cpu")  # intended sync: the caller needs the values
            events[3].record()
            events[3].synchronize()  # already reached: the copy above blocked
        h2d, comp, d2h = (a.elapsed_time(b) for a, b in zip(events, events[1:], strict=False))
        return StageTimes(sample_ms, (t2 - t1) * 1e3 + h2d, comp, d2h), out, emb

    def forward(self, sub: Any, embed: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Gather, copy, forward and copy back one already sampled batch (untimed).

        Args:
            sub (SampledSubgraph): the sampler's output for the seeds.
            embed (bool, optional): also return the seeds' embeddings. (default: ``False``)

        Returns:
            Tensor | tuple[Tensor, Tensor]: ``[B, C]`` logits on the host; with ``embed`` the
            pair ``(embeddings [B, H], logits [B, C])``, as :meth:`gnnaas.models.GNN.forward`.
        """
        with self._lock, torch.inference_mode():
            x, blocks = self._inputs(sub.n_id, list(sub.blocks))
            emb, out = self._call_model(x, blocks, embed)
            if emb is None:
                return out.to("cpu")
            return emb.to("cpu", copy=True), out.to("cpu")  # a copy: never the gather buffer

    def run(self, seeds: Tensor, embed: bool = False) -> PathOutput:
        """Runs one batch of unique ``seeds`` through every stage, timing each.

        Args:
            seeds (Tensor): ``[B]`` unique int64 node ids on the host.
            embed (bool, optional): also return the seeds' embeddings (the model must take
                ``embed=True``, as :class:`~gnnaas.models.GNN` does). (default: ``False``)

        Returns:
            PathOutput: ``logits`` ``[B, C]`` on the host, ``times``, ``num_sampled`` and, with
            ``embed``, ``embeddings`` ``[B, H]`` on the host.
        """
        with self._lock:
            t0 = time.perf_counter()
            sub = self.sampler.sample(seeds)  # index tensors only: no autograd state to skip
            t1 = time.perf_counter()
            with torch.inference_mode():
                times, out, emb = self._execute(sub, (t1 - t0) * 1e3, t1, embed)
        return PathOutput(out, times, int(sub.n_id.numel()), emb)

    def predict(self, nodes: Tensor, embed: bool = False) -> PathOutput:
        """Runs any ``nodes`` (repeats allowed) as one batch of their unique ids.

        What the server does with a merged batch of requests: :func:`torch.unique` of the nodes,
        :meth:`run`, then the rows scattered back to the nodes' order.

        Args:
            nodes (Tensor): ``[n]`` int64 node ids on the host.
            embed (bool, optional): also return the nodes' embeddings. (default: ``False``)

        Returns:
            PathOutput: ``logits`` ``[n, C]`` (and with ``embed`` ``embeddings`` ``[n, H]``) in
            ``nodes`` order; ``times`` and ``num_sampled`` of the deduplicated batch (the dedupe
            is counted in ``sample_ms``).
        """
        t0 = time.perf_counter()
        seeds, inverse = torch.unique(nodes, return_inverse=True)  # [B], [n]
        dedupe_ms = (time.perf_counter() - t0) * 1e3
        self.last_num_seeds = int(seeds.numel())  # the batch size the service curve is indexed by
        out = self.run(seeds, embed)
        times = dataclasses.replace(out.times, sample_ms=out.times.sample_ms + dedupe_ms)
        emb = None if out.embeddings is None else out.embeddings[inverse]  # [n, H]
        return PathOutput(out.logits[inverse], times, out.num_sampled, emb)  # [n, C]


def _check_cache(cache: FeatureCache, features: Tensor, device: torch.device) -> None:
    """A cache must hold rows of these very features, on the path's device."""
    if cache.slot.numel() != features.size(0) or cache.rows.size(1) != features.size(1):
        raise ValueError(
            f"InferencePath: the cache was built from other features (its rows are "
            f"[{cache.slot.numel()}, {cache.rows.size(1)}], the path's "
            f"{list(features.shape)})"
        )
    if cache.rows.dtype != features.dtype:
        raise ValueError(
            f"InferencePath: the cache holds {cache.rows.dtype} rows, the features are "
            f"{features.dtype}"
        )
    if cache.device != device:
        raise ValueError(
            f"InferencePath: the cache lives on {cache.device}, the model runs on {device}; "
            "build it with FeatureCache(features, nodes, device)"
        )
