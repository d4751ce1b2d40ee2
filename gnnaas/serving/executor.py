"""Executor: serves one batch of requests with one variant (sample → gather → forward).

A batch merges the node ids of several requests. The executor dedupes them, samples their k-hop
neighborhoods once with the serving sampler (consistent per node, so a node's answer does not
depend on its batch-mates), gathers the variant's kept feature columns for the sampled nodes, runs
one forward pass under :func:`torch.inference_mode` and scatters the rows back to each request,
with the time of each stage. It is blocking and meant to run in a worker thread; torch releases
the GIL.

Shapes:
    - requests: ``R`` tensors of node ids ``[n_r]``
    - seeds: ``[B]`` unique node ids, ``B <= sum(n_r)``
    - x: ``[N_s, F_kept]`` features of the sampled nodes, seeds first
    - output: ``[B, C]`` logits, then ``[n_r, C]`` per request
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

__all__ = ["ExecRequest", "ExecResult", "Executor", "Sampler", "StageTimes"]


class Sampler(Protocol):
    """What the executor needs from a sampler (``gnnaas.sampling.NeighborSampler`` fits)."""

    def sample(self, seeds: Tensor) -> Any:
        """Returns an object with ``n_id`` (seeds first), ``batch_size`` and ``blocks``."""
        ...


@dataclass(frozen=True)
class ExecRequest:
    """One request inside a batch.

    Args:
        nodes (Sequence[int] | Tensor): ``n`` node ids (a list, or an int64 CPU tensor),
            validated by the caller.
        proba (bool, optional): return probabilities instead of classes. (default: ``False``)
    """

    nodes: Sequence[int] | Tensor
    proba: bool = False


@dataclass(frozen=True)
class StageTimes:
    """Wall time (ms) of each stage of one batch."""

    sample_ms: float
    gather_ms: float
    compute_ms: float

    @property
    def total_ms(self) -> float:
        """Sum of the stages."""
        return self.sample_ms + self.gather_ms + self.compute_ms


@dataclass(frozen=True)
class ExecResult:
    """One request's answer.

    Args:
        predictions (list): one entry per requested node, in request order: a class id, or for
            multi-label a 0/1 list; with ``proba`` a list of class probabilities.
        times (StageTimes): the stages of the batch that served it (shared by the batch).
    """

    predictions: list[Any]
    times: StageTimes


class Executor:
    """Blocking batch handler for one variant.

    Args:
        model (torch.nn.Module): the variant's GNN, called as ``model(x, blocks)``.
        features (Tensor): ``[N, F_kept]`` the store's pruned feature copy for this variant
            (``store.feature_subset(kept)``), computed once.
        sampler (Sampler): the dataset's consistent serving sampler for this variant's fanouts.
        device (torch.device | str, optional): where the forward pass runs. (default: ``"cpu"``)
        multi_label (bool, optional): sigmoid outputs and 0/1 classes. (default: ``False``)
        name (str, optional): for ``repr`` and logs. (default: ``"executor"``)
    """

    def __init__(
        self,
        model: torch.nn.Module,
        features: Tensor,
        sampler: Sampler,
        *,
        device: torch.device | str = "cpu",
        multi_label: bool = False,
        name: str = "executor",
    ) -> None:
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.features = features
        self.sampler = sampler
        self.multi_label = multi_label
        self.name = name
        self.calls = 0  # batches served, read by tests and benchmarks

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.name!r}, device={self.device}, "
            f"features={tuple(self.features.shape)})"
        )

    def _sync(self) -> None:
        # Intended sync: stage clocks are only meaningful once queued device work is done.
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __call__(self, requests: Sequence[ExecRequest]) -> list[ExecResult]:
        """Serves ``requests`` with one sampled forward pass; one result per request, in order."""
        self.calls += 1
        t0 = time.perf_counter()
        if all(isinstance(r.nodes, Tensor) for r in requests):
            merged = torch.cat([torch.as_tensor(r.nodes) for r in requests])
        else:  # one conversion per batch, not per request
            merged = torch.tensor(
                list(itertools.chain.from_iterable(r.nodes for r in requests)), dtype=torch.long
            )
        seeds, inverse = torch.unique(merged, return_inverse=True)  # [B], [sum n_r]
        sub = self.sampler.sample(seeds)
        t1 = time.perf_counter()

        x = self.features.index_select(0, sub.n_id)  # [N_s, F_kept]
        blocks = sub.blocks
        if self.device.type != "cpu":
            x = x.to(self.device, non_blocking=True)
            blocks = [
                dataclasses.replace(b, edge_index=b.edge_index.to(self.device)) for b in blocks
            ]
        self._sync()
        t2 = time.perf_counter()

        want_proba = any(r.proba for r in requests)
        with torch.inference_mode():
            logits = self.model(x, blocks)[inverse]  # [sum n_r, C]
            if self.multi_label:
                classes = (logits > 0).to(torch.int8).cpu()
                proba = torch.sigmoid(logits).cpu() if want_proba else None
            else:
                classes = logits.argmax(dim=-1).cpu()
                proba = torch.softmax(logits, dim=-1).cpu() if want_proba else None
        t3 = time.perf_counter()  # .cpu() above synchronizes

        times = StageTimes((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3)
        results = []
        start = 0
        for r in requests:
            stop = start + len(r.nodes)
            source = proba if r.proba and proba is not None else classes
            results.append(ExecResult(source[start:stop].tolist(), times))
            start = stop
        return results
