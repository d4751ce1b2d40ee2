"""A device feature cache: the pruned feature rows of a variant's most read nodes, on its device.

On a GPU the cost of serving a sampled GNN is moving the sampled nodes' features across PCIe.
:class:`FeatureCache` keeps the rows of a planned set of nodes (the most read ones, planned by
:mod:`gnnaas.profiling.cacheplan`) resident on the device; :class:`~gnnaas.inference.InferencePath`
then gathers on the host only the rows of the other sampled nodes (the *misses*), into its reused
(pinned) buffer, copies them host→device in one copy and assembles the batch's input on the device
in ``n_id`` order: cached rows from the device copy, missed rows from the copy. A pruned variant's
rows are narrower, so the same bytes hold more nodes: its hit ratio and its latency improve
together.

The answers are those without a cache: the input rows are the same values in the same order. On
the CPU device the same code runs with the "device" copy a host tensor (what the tests check);
the server builds caches only on CUDA (``GNNAAS_FEATURE_CACHE_MB``), where the host features are
not already local.

A cache is a copy of the features it was built from: a graph whose features change (a live graph)
is not cached.

Shapes:
    - **features:** ``[N, F_kept]`` the variant's pruned rows on the host.
    - **nodes:** ``[K]`` unique node ids kept on the device; ``rows`` ``[K, F_kept]``.
    - **per batch:** ``n_id`` ``[N_s]`` → ``H`` hits (rows from ``rows``) and ``N_s - H`` misses
      (rows copied from the host).

Example:
    >>> x = torch.arange(12.0).view(6, 2)
    >>> cache = FeatureCache(x, torch.tensor([4, 1]))
    >>> cache
    FeatureCache(nodes=2, width=2, device=cpu)
    >>> cache.slot.tolist()
    [-1, 1, -1, -1, 0, -1]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gnnaas.typing import Device

__all__ = ["FeatureCache", "Transfer"]


@dataclass(frozen=True)
class Transfer:
    """The feature rows one batch read, and how many came from the device cache.

    Args:
        rows (int): feature rows the batch's forward pass reads (``N_s``, one per sampled row).
        hits (int): of those, rows served from the device cache (0 without one).
        row_bytes (int): bytes of one pruned feature row (``F_kept`` × element size).
    """

    rows: int
    hits: int
    row_bytes: int

    @property
    def hit_ratio(self) -> float:
        """``hits / rows`` in [0, 1] (0 for an empty batch)."""
        return self.hits / self.rows if self.rows else 0.0

    @property
    def copied_bytes(self) -> int:
        """Feature bytes gathered on the host for the host→device copy: the misses' rows.

        On the CPU device the copy is a no-op, but this counts the same rows, so the figure is
        what a GPU path would move (the index tensors and the blocks are not counted).
        """
        return (self.rows - self.hits) * self.row_bytes


class FeatureCache:
    """The feature rows of ``nodes``, resident on ``device`` (see the module docstring).

    Args:
        features (Tensor): ``[N, F_kept]`` the variant's pruned features on the host (the
            path's ``features``).
        nodes (Tensor): ``[K]`` unique int64 node ids in ``[0, N)`` whose rows to keep.
        device (str | torch.device, optional): where the rows live: the model's device.
            (default: ``"cpu"``)

    Raises:
        TypeError: ``nodes`` is not an int64 tensor.
        ValueError: ``features`` is not 2-D on the host, or ``nodes`` is not 1-D, has repeats or
            ids out of range.
    """

    def __init__(self, features: Tensor, nodes: Tensor, device: Device = "cpu") -> None:
        if features.dim() != 2 or features.device.type != "cpu":
            raise ValueError(
                f"FeatureCache: features must be a 2-D [N, F_kept] tensor on the host (got "
                f"shape {tuple(features.shape)} on {features.device})"
            )
        if not isinstance(nodes, Tensor) or nodes.dtype != torch.int64:
            got = nodes.dtype if isinstance(nodes, Tensor) else type(nodes).__name__
            raise TypeError(f"FeatureCache: nodes must be an int64 tensor (got {got})")
        num_nodes = features.size(0)
        if nodes.dim() != 1:
            raise ValueError(f"FeatureCache: nodes must be 1-D (got shape {tuple(nodes.shape)})")
        nodes = nodes.cpu()
        if nodes.numel() and (int(nodes.min()) < 0 or int(nodes.max()) >= num_nodes):
            raise ValueError(
                f"FeatureCache: nodes must be ids in [0, {num_nodes}) (got "
                f"{int(nodes.min())}..{int(nodes.max())})"
            )
        self.slot = torch.full((num_nodes,), -1, dtype=torch.long)  # [N] row in `rows`, or -1
        self.slot[nodes] = torch.arange(nodes.numel())
        if int((self.slot >= 0).sum()) != nodes.numel():
            raise ValueError("FeatureCache: nodes must not repeat")
        self.nodes = nodes
        self.device = torch.device(device)
        self.rows = features.index_select(0, nodes).to(self.device)  # [K, F_kept]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(nodes={self.num_cached}, width={self.rows.size(1)}, "
            f"device={self.device})"
        )

    @property
    def num_cached(self) -> int:
        """Nodes whose rows are resident (``K``)."""
        return int(self.nodes.numel())

    @property
    def nbytes(self) -> int:
        """Bytes the resident rows take on the device."""
        return self.rows.numel() * self.rows.element_size()
