"""A runnable variant: from its files and a graph to the executor that serves its batches.

:func:`open_variant` reads one variant from the repository for a :class:`~gnnaas.runtime.graph.
RuntimeGraph` (its manifest checked against the graph, its weights with their checksum, a
precomputed variant's answers by :func:`~gnnaas.runtime.answers.open_answers`) into a
:class:`RuntimeVariant`, whose :meth:`~RuntimeVariant.executor` builds the batch handler the server
serves with and the profiler measures (:class:`~gnnaas.inference.Executor`: the variant's model,
the graph's pruned features and serving sampler, its device feature cache). The server
(:mod:`gnnaas.serving.core.registry`), the profiler (:mod:`gnnaas.profiling.profiler`) and the
benchmarks build their executors here and nowhere else, so what is profiled is what is served by
construction.

Example:
    >>> graph = RuntimeGraph(store)  # doctest: +SKIP
    >>> manifest = repo.manifest(store.name, "sage-full-1x")  # doctest: +SKIP
    >>> variant = open_variant(repo, manifest, graph)  # doctest: +SKIP
    >>> variant.executor(graph)([ExecRequest([0, 1])])[0].predictions  # doctest: +SKIP
    [3, 5]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gnnaas.errors import ArtifactError
from gnnaas.inference.cache import FeatureCache
from gnnaas.inference.executor import Executor
from gnnaas.inference.lookup import PrecomputedAnswers
from gnnaas.runtime.answers import open_answers
from gnnaas.runtime.graph import RuntimeGraph
from gnnaas.typing import Device

__all__ = ["RuntimeVariant", "check_manifest", "open_variant", "served_size_kb"]


@dataclass(eq=False)
class RuntimeVariant:
    """One variant ready to run on its dataset's graph.

    Args:
        dataset (str): dataset name.
        variant_id (str): e.g. ``sage-lasso-4x``.
        arch (str): ``sage`` or ``gin``.
        ranking (str): ``full``, ``random``, ``greedy`` or ``lasso``.
        prune (int): prune factor.
        kept_features (Tensor): ``[F_kept]`` int64 feature columns the model reads.
        fanouts (tuple[int, ...]): neighbor fanouts, PyG order.
        model (torch.nn.Module): the model in ``eval()`` mode.
        answers (PrecomputedAnswers, optional): a precomputed variant's tables and staleness
            (``<base>@exact``); ``None`` for a trained variant, or a precomputed one whose
            answers do not fit the graph (``problem`` says why). (default: ``None``)
        hidden_channels (int, optional): the model's hidden width. (default: ``None``)
        precision (str, optional): ``fp32`` or ``int8``. (default: ``"fp32"``)
        base (str, optional): the variant it derives from. (default: ``None``)
        cache_nodes (Tensor, optional): ``[K]`` node ids whose pruned feature rows its executor
            keeps on the device (:func:`~gnnaas.runtime.caches.plan_feature_caches`).
            (default: ``None``: no cache)
        problem (str, optional): why it cannot be served as what it is (a precomputed variant
            whose answers are of another graph); it still runs, computing. (default: ``None``)
    """

    dataset: str
    variant_id: str
    arch: str
    ranking: str
    prune: int
    kept_features: Tensor
    fanouts: tuple[int, ...]
    model: torch.nn.Module
    answers: PrecomputedAnswers | None = None
    hidden_channels: int | None = None
    precision: str = "fp32"
    base: str | None = None
    cache_nodes: Tensor | None = None
    problem: str | None = None

    @property
    def features_kept(self) -> int:
        """Number of kept feature columns."""
        return int(self.kept_features.numel())

    @property
    def lookup(self) -> bool:
        """Whether its batches are answered from precomputed tables."""
        return self.answers is not None

    def executor(self, graph: RuntimeGraph, device: Device = "cpu") -> Executor:
        """The blocking batch handler of this variant on ``graph``: what the server serves
        with and the profiler times (its :attr:`~gnnaas.inference.Executor.path` runs each batch).

        Args:
            graph (RuntimeGraph): the dataset's graph (its features and serving sampler).
            device (str | torch.device, optional): where the forward passes run.
                (default: ``"cpu"``)
        """
        features = graph.features(self.kept_features)
        nodes = None if self.answers is not None else self.cache_nodes
        return Executor(
            self.model,
            features,
            graph.sampler(self.fanouts),
            device=device,
            multi_label=graph.multi_label,
            name=f"{self.dataset}/{self.variant_id}",
            graph_version=graph.version_reader(),
            answers=self.answers,
            cache=None if nodes is None else FeatureCache(features, nodes, torch.device(device)),
        )


def check_manifest(manifest: Any, graph: RuntimeGraph) -> None:
    """Raises :class:`ArtifactError` when a variant does not fit the graph: another feature
    count, kept feature ids beyond it, or another number of classes."""
    store, name = graph.store, graph.name
    redo = f"regenerate with `gnnaas generate --dataset {name} --force`"
    if manifest.num_features != store.num_features:
        raise ArtifactError(
            f"it was trained on {manifest.num_features} features, {name} has "
            f"{store.num_features}; {redo}"
        )
    if manifest.kept_features and max(manifest.kept_features) >= store.num_features:
        raise ArtifactError(f"it keeps feature ids beyond {store.num_features}; {redo}")
    if manifest.out_channels != store.num_classes:
        raise ArtifactError(
            f"it predicts {manifest.out_channels} classes, {name} has {store.num_classes}; {redo}"
        )


def open_variant(
    repo: Any, manifest: Any, graph: RuntimeGraph, device: Device = "cpu"
) -> RuntimeVariant:
    """One variant of ``graph``'s dataset, read from ``repo`` and checked against the graph.

    Args:
        repo (VariantRepository): the variant repository.
        manifest (Manifest): the variant's manifest (from ``repo.scan`` or ``repo.manifest``).
        graph (RuntimeGraph): the graph it will run on.
        device (str | torch.device, optional): where its model goes. (default: ``"cpu"``)

    Returns:
        RuntimeVariant: the variant; a precomputed one whose answers do not fit the graph has
        none and says why in ``problem``.

    Raises:
        ArtifactError: it does not fit the graph (:func:`check_manifest`), or its weights or
            answer tables cannot be read (checksum, format).
    """
    check_manifest(manifest, graph)
    loaded = repo.load(graph.name, manifest.variant_id, device=device)
    answers = problem = None
    if manifest.precomputed is not None:
        answers, problem = open_answers(repo, manifest, graph)
    return RuntimeVariant(
        dataset=graph.name,
        variant_id=manifest.variant_id,
        arch=manifest.arch,
        ranking=manifest.ranking,
        prune=manifest.prune,
        kept_features=torch.as_tensor(manifest.kept_features, dtype=torch.long),
        fanouts=tuple(int(f) for f in manifest.fanouts),
        model=loaded.model,
        answers=answers,
        hidden_channels=manifest.hidden_channels,
        precision=manifest.precision,
        base=None if manifest.base is None else manifest.base["variant"],
        problem=problem,
    )


def served_size_kb(model: torch.nn.Module, stored_kb: float) -> float:
    """The served weights' size: the stored files', or for an int8 model its parameters and
    buffers as it holds them (1-byte weights in its quantized linear layers)."""
    if getattr(model, "precision", "fp32") != "int8":
        return stored_kb
    from gnnaas.models import model_bytes

    return model_bytes(model) / 1024
