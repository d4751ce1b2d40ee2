"""A dataset's graph as its variants run on it: the store or its live graph, and the samplers.

:class:`RuntimeGraph` is what every variant of a dataset shares when it runs: the graph store (or
the live graph a server's state folder holds), the pruned feature copy of each variant's kept
columns, and the serving sampler of each distinct fanouts, built once. It is the one place a
serving sampler is built (:func:`sampled_path` and :func:`training_sampler` build the others), so
the server, the profiler and evaluation during generation sample the same trees
(docs/architecture.md §2): a :class:`~gnnaas.sampling.DepthSampler` keyed by the seed, one row per
(node, depth), so a node's tree, and its answer, never depend on its batch-mates.

Example:
    >>> graph = RuntimeGraph(store, seed=0)  # doctest: +SKIP
    >>> graph.sampler((25, 10)) is graph.sampler([25, 10])  # doctest: +SKIP
    True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from gnnaas.inference.path import InferencePath, Sampler
from gnnaas.sampling import DepthSampler, NeighborSampler
from gnnaas.typing import Device

__all__ = ["SAMPLER", "GraphSource", "RuntimeGraph", "sampled_path", "training_sampler"]

SAMPLER = "depth"
"""The serving sampler's name, recorded with every service curve (``sampling`` in
``service_times.csv``) and cache ranking: a curve or ranking made with another sampler is
another pipeline's and is not used."""


class GraphSource(Protocol):
    """What a :class:`RuntimeGraph` needs of a graph store (``gnnaas.data.GraphStore`` fits)."""

    name: str
    rowptr: Tensor
    col: Tensor
    num_classes: int
    multi_label: bool

    @property
    def num_nodes(self) -> int:
        """Number of nodes."""
        ...

    @property
    def num_features(self) -> int:
        """Number of feature columns."""
        ...

    def feature_subset(self, keep: Tensor | Sequence[int]) -> Tensor:
        """The contiguous ``x[:, keep]`` (cached by the store)."""
        ...


def _serving_sampler(
    rowptr: Tensor, col: Tensor, fanouts: tuple[int, ...], seed: int, live: Any = None
) -> Sampler:
    return DepthSampler(rowptr, col, fanouts, seed=seed, live=live)


def training_sampler(
    rowptr: Tensor, col: Tensor, fanouts: Sequence[int], *, seed: int = 0
) -> NeighborSampler:
    """The sampler of training mini-batches (PyG ``NeighborLoader`` semantics, fresh draws per
    call from the caller's generator): a node's neighbors vary between epochs, which serving
    never wants."""
    return NeighborSampler(rowptr, col, tuple(int(f) for f in fanouts), seed=seed)


def sampled_path(
    model: torch.nn.Module,
    features: Tensor,
    rowptr: Tensor,
    col: Tensor,
    fanouts: Sequence[int],
    *,
    seed: int = 0,
    device: Device = "cpu",
) -> InferencePath:
    """The served execution path of a model that is not (yet) a stored variant, over a graph
    given as its CSR: what evaluation during generation and the exact pass's comparison run.

    Args:
        model (torch.nn.Module): the model (put in eval mode).
        features (Tensor): ``[N, F_kept]`` the rows it reads.
        rowptr (Tensor): ``[N + 1]`` CSR row pointer over incoming edges.
        col (Tensor): ``[E]`` in-neighbors.
        fanouts (Sequence[int]): its sampling fanouts, PyG order.
        seed (int, optional): the sampler's key (``GNNAAS_SEED``). (default: ``0``)
        device (str | torch.device, optional): where it runs. (default: ``"cpu"``)
    """
    sampler = _serving_sampler(rowptr, col, tuple(int(f) for f in fanouts), seed)
    return InferencePath(model, features, sampler, device)


class RuntimeGraph:
    """One dataset's graph as its variants run on it.

    Args:
        store (GraphSource): the dataset's graph store.
        seed (int, optional): the serving sampler's key (``GNNAAS_SEED``). (default: ``0``)
        live (Any, optional): the live graph served from a state folder, a
            :class:`~gnnaas.serving.core.live.LiveState` (its ``graph`` and the ``trackers`` of
            staleness the precomputed variants join); ``None`` for a graph that takes no
            writes. (default: ``None``)
        state_dir (str | Path, optional): that state folder (named in messages, and where the
            log of writes since a precomputed variant's answers is read). (default: ``None``)
        version (int, optional): the version of the graph ``store`` holds when it is a snapshot
            of a live graph (``gnnaas profile --state-dir``); ``0`` for the dataset as loaded.
            (default: ``0``)
        sampler_factory (Callable, optional): ``fanouts -> sampler`` instead of the serving
            sampler (tests with toy samplers). (default: ``None``)
    """

    def __init__(
        self,
        store: GraphSource,
        *,
        seed: int = 0,
        live: Any = None,
        state_dir: str | Path | None = None,
        version: int = 0,
        sampler_factory: Callable[[tuple[int, ...]], Sampler] | None = None,
    ) -> None:
        self.store = store
        self.seed = int(seed)
        self.live = live
        self.state_dir = None if state_dir is None else Path(state_dir)
        self._version = int(version)
        self._sampler_factory = sampler_factory
        self._samplers: dict[tuple[int, ...], Sampler] = {}

    def __repr__(self) -> str:
        kind = "live" if self.live is not None else f"version {self._version}"
        return f"{type(self).__name__}({self.name!r}, {kind}, seed={self.seed})"

    @property
    def name(self) -> str:
        """The dataset's name."""
        return self.store.name

    @property
    def num_nodes(self) -> int:
        """Nodes of the graph (now, for a live graph)."""
        if self.live is not None:
            return int(self.live.graph.num_nodes)
        return int(self.store.num_nodes)

    @property
    def num_edges(self) -> int:
        """Edges of the store's CSR (the base graph of a live one)."""
        return int(self.store.col.numel())

    @property
    def version(self) -> int:
        """The graph's version: the live graph's now, else the store's (0 unless a snapshot)."""
        return int(self.live.graph.version) if self.live is not None else self._version

    @property
    def multi_label(self) -> bool:
        """Whether nodes have several labels (sigmoid outputs)."""
        return bool(self.store.multi_label)

    def version_reader(self) -> Callable[[], int] | None:
        """What an executor reads the graph's version with, once per batch (``None``: fixed)."""
        if self.live is None:
            return None
        graph = self.live.graph
        return lambda: graph.version

    def features(self, kept: Tensor) -> Tensor:
        """A variant's feature rows: the store's pruned copy, or the live graph's buffer."""
        if self.live is not None:
            return self.live.graph.features(kept)
        return self.store.feature_subset(kept)

    def sampler(self, fanouts: Sequence[int]) -> Sampler:
        """The serving sampler for ``fanouts``, built once and shared by the variants."""
        key = tuple(int(f) for f in fanouts)
        hit = self._samplers.get(key)
        if hit is None:
            if self._sampler_factory is not None:
                hit = self._sampler_factory(key)
            elif self.live is not None:  # the live graph's base and overlay
                live = self.live.graph
                hit = _serving_sampler(live.rowptr, live.col, key, self.seed, live)
            else:
                hit = _serving_sampler(self.store.rowptr, self.store.col, key, self.seed)
            self._samplers[key] = hit
        return hit
