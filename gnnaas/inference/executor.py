"""Executor: serves one batch of requests with one variant through the shared inference path.

A batch merges the node ids of several requests. The executor hands them to
:meth:`gnnaas.inference.InferencePath.predict`, the routine the profiler measures too: it dedupes
them (:func:`torch.unique`), samples their k-hop neighborhoods once with the serving sampler
(consistent per node, so a node's answer does not depend on its batch-mates), gathers the
variant's kept feature columns for the sampled nodes, runs one forward pass under
:func:`torch.inference_mode` and scatters the rows back; the executor then splits them per request,
with the time of each stage. It is blocking: the server runs it in the variant's worker thread
(torch releases the GIL), or on the event loop's thread for batches of at most
:data:`INLINE_MAX_NODES` nodes. The profiler times this very call, on the same kind of thread, for
a variant's service curve (``service_times.csv``), and the server's batcher times it for the
predicted-vs-measured record, so both sides measure the same work.

Shapes:
    - requests: ``R`` tensors of node ids ``[n_r]``
    - seeds: ``[B]`` unique node ids, ``B <= sum(n_r)``
    - x: ``[N_s, F_kept]`` features of the sampled nodes, seeds first
    - output: ``[B, C]`` logits (and ``[B, H]`` embeddings when a request asks for them), then
      ``[n_r, C]`` (or ``[n_r, H]``) per request
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, get_args

import torch
from torch import Tensor

from gnnaas.inference.cache import FeatureCache
from gnnaas.inference.lookup import LookupPath, PrecomputedAnswers
from gnnaas.inference.path import InferencePath, Sampler, StageTimes

__all__ = [
    "ExecRequest",
    "ExecResult",
    "Executor",
    "INLINE_MAX_NODES",
    "Output",
    "Sampler",
    "StageTimes",
    "embedding_dim",
]

Output: TypeAlias = Literal["class", "proba", "embedding"]
"""What a request asks for per node: its class, its class probabilities or its embedding."""

_OUTPUTS = frozenset(get_args(Output))

INLINE_MAX_NODES = 16
"""Batches of at most this many nodes run on the server's event-loop thread instead of the
variant's worker thread (``GNNAAS_INLINE_MAX_NODES``), and the profiler times them on its main
thread to match. For such batches the hand-off between threads costs more than the parallelism
it buys, so running them on the loop lowers a small request's latency
(``benchmarks/results/latency.md``, the last two rows of "Sequential single-node requests")."""


def embedding_dim(model: torch.nn.Module) -> int | None:
    """The width of ``model``'s embeddings (``output="embedding"``).

    Args:
        model (torch.nn.Module): a variant's model.

    Returns:
        int | None: its ``embedding_dim`` when it states one, else for a
        :class:`~gnnaas.models.GNN` its ``hidden_channels`` (``in_channels`` for a one-layer
        model, whose embedding is its input); ``None`` for a model that states neither.

    Example:
        >>> from gnnaas.models import build_model
        >>> embedding_dim(build_model("sage", 1433, 256, 7))
        256
    """
    stated = getattr(model, "embedding_dim", None)
    if stated is None:
        layers = getattr(model, "num_layers", None)
        stated = getattr(model, "in_channels" if layers == 1 else "hidden_channels", None)
    return stated if isinstance(stated, int) else None


@dataclass(frozen=True)
class ExecRequest:
    """One request inside a batch.

    Args:
        nodes (Sequence[int] | Tensor): ``n`` node ids (a list, or an int64 CPU tensor),
            validated by the caller.
        output (str, optional): per node, ``"class"`` (its class id), ``"proba"`` (its class
            probabilities) or ``"embedding"`` (the variant's last hidden layer, ``hidden_channels``
            floats). (default: ``"class"``)
    """

    nodes: Sequence[int] | Tensor
    output: Output = "class"

    def __post_init__(self) -> None:
        if self.output not in _OUTPUTS:
            raise ValueError(
                f"ExecRequest: output must be 'class', 'proba' or 'embedding' (got {self.output!r})"
            )


@dataclass(frozen=True)
class ExecResult:
    """One request's answer.

    Args:
        predictions (list): one entry per requested node, in request order: a class id, or for
            multi-label a 0/1 list; for ``output="proba"`` a list of class probabilities; for
            ``output="embedding"`` a list of ``hidden_channels`` floats.
        times (StageTimes): the stages of the batch that served it (shared by the batch).
        graph_version (int, optional): version of the (live) graph the batch read.
            (default: ``0``)
    """

    predictions: list[Any]
    times: StageTimes
    graph_version: int = 0


class Executor:
    """Blocking batch handler for one variant.

    Args:
        model (torch.nn.Module): the variant's GNN, called as ``model(x, blocks)``.
        features (Tensor): ``[N, F_kept]`` the store's pruned feature copy for this variant
            (``store.feature_subset(kept)``), computed once.
        sampler (Sampler): the dataset's serving sampler for this variant's fanouts
            (:meth:`gnnaas.runtime.RuntimeGraph.sampler`).
        device (torch.device | str, optional): where the forward pass runs. (default: ``"cpu"``)
        multi_label (bool, optional): sigmoid outputs and 0/1 classes. (default: ``False``)
        name (str, optional): for ``repr`` and logs. (default: ``"executor"``)
        graph_version (Callable[[], int], optional): the live graph's version, read once per batch
            (writes are applied between batches). (default: ``None``: version 0)
        answers (PrecomputedAnswers, optional): a precomputed variant's tables: batches are
            looked up (:class:`~gnnaas.inference.lookup.LookupPath`; ``model``, ``features`` and
            a sampler with every fanout ``-1`` compute its stale nodes). (default: ``None``)
        cache (FeatureCache, optional): rows of ``features`` resident on ``device``
            (:mod:`gnnaas.inference.cache`); not for a precomputed variant. (default: ``None``)

    Raises:
        ValueError: a cache is given with ``answers`` (a lookup reads no features).
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
        graph_version: Callable[[], int] | None = None,
        answers: PrecomputedAnswers | None = None,
        cache: FeatureCache | None = None,
    ) -> None:
        if cache is not None and answers is not None:
            raise ValueError(
                f"Executor {name!r}: a precomputed variant (answers) takes no feature cache"
            )
        self.device = torch.device(device)
        self.graph_version = graph_version
        self.model = model.to(self.device).eval()
        self.features = features
        self.sampler = sampler
        if answers is None:
            self.path = InferencePath(self.model, features, sampler, self.device, cache=cache)
        else:
            self.path = LookupPath(self.model, features, sampler, answers, self.device)
        self.multi_label = multi_label
        self.name = name
        self.calls = 0  # batches served, read by tests and benchmarks

    @property
    def last_batch_seeds(self) -> int:
        """Unique nodes of the last batch (its requests' nodes, deduplicated): the batch size the
        profiled service curve is indexed by. Read after the batch, from the batcher's callback."""
        return self.path.last_num_seeds

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.name!r}, device={self.device}, "
            f"features={tuple(self.features.shape)})"
        )

    def __call__(self, requests: Sequence[ExecRequest]) -> list[ExecResult]:
        """Serves ``requests`` with one sampled forward pass; one result per request, in order."""
        self.calls += 1
        version = 0 if self.graph_version is None else self.graph_version()
        if all(isinstance(r.nodes, Tensor) for r in requests):
            merged = torch.cat([torch.as_tensor(r.nodes) for r in requests])
        else:  # one conversion per batch, not per request
            merged = torch.tensor(
                list(itertools.chain.from_iterable(r.nodes for r in requests)), dtype=torch.long
            )
        wanted = {r.output for r in requests}
        # [sum n_r, C] (and [sum n_r, H]) on the host; embeddings only when a request wants them
        out = self.path.predict(merged, embed="embedding" in wanted)
        logits = out.logits

        with torch.inference_mode():
            if self.multi_label:
                classes = (logits > 0).to(torch.int8)
                proba = torch.sigmoid(logits) if "proba" in wanted else None
            else:
                classes = logits.argmax(dim=-1)
                proba = torch.softmax(logits, dim=-1) if "proba" in wanted else None
        sources = {"class": classes}  # each output some request of the batch asked for
        if proba is not None:
            sources["proba"] = proba
        if out.embeddings is not None:
            sources["embedding"] = out.embeddings
        elif "embedding" in wanted:  # a path without them (precomputed tables kept none)
            raise ValueError(f"{self.name}: this variant's path returned no embeddings")

        results = []
        start = 0
        for r in requests:
            stop = start + len(r.nodes)
            source = sources[r.output]
            results.append(ExecResult(source[start:stop].tolist(), out.times, version))
            start = stop
        return results
