"""Train/validation/test splits (docs/architecture.md §3).

A dataset keeps its own split when it trains on at least 10% of its nodes; otherwise (Cora's
public split trains on 140 of 2,708 nodes) it gets a seeded, stratified 60/20/20 split.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["MIN_TRAIN_FRACTION", "choose_split", "stratified_split"]

#: a dataset's own split is used only when it trains on at least this fraction of nodes
MIN_TRAIN_FRACTION = 0.10


def _strata(y: Tensor) -> Tensor:
    """One stratum per node: its label, or its first positive label when multi-label."""
    if y.dim() == 2:
        return y.argmax(dim=1)  # first maximum: the first positive label (0 when none)
    return y.long()


def stratified_split(
    y: Tensor,
    fractions: tuple[float, float, float] = (0.6, 0.2, 0.2),
    *,
    seed: int = 0,
) -> tuple[Tensor, Tensor, Tensor]:
    """A seeded split that keeps each class's share in every part.

    Each class's nodes are shuffled and cut at ``round(fraction * class size)``; multi-label
    nodes are stratified by their first positive label. Vectorized: one permutation and one sort.

    Args:
        y (Tensor): ``[N]`` labels or ``[N, C]`` 0/1 multi-label matrix.
        fractions (tuple[float, float, float], optional): train, validation, test shares, summing
            to 1. (default: ``(0.6, 0.2, 0.2)``)
        seed (int, optional): seed of the shuffle. (default: ``0``)

    Returns:
        tuple[Tensor, Tensor, Tensor]: sorted int64 ``train_idx``, ``val_idx``, ``test_idx``.

    Example:
        >>> train, val, test = stratified_split(torch.tensor([0, 1] * 50), seed=1)
        >>> len(train), len(val), len(test)
        (60, 20, 20)
    """
    if len(fractions) != 3 or min(fractions) < 0 or abs(sum(fractions) - 1.0) > 1e-6:
        raise ValueError(
            f"stratified_split: fractions must be 3 shares summing to 1 (got {fractions})"
        )
    strata = _strata(y)
    n = strata.numel()
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=gen)
    # Stable sort by stratum after a shuffle: each class's nodes come in random order.
    labels, order = strata[perm].sort(stable=True)
    nodes = perm[order]
    _, counts = torch.unique_consecutive(labels, return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    size = counts.repeat_interleave(counts)
    rank = torch.arange(n) - starts.repeat_interleave(counts)  # position inside its class
    train_cut = torch.round(size * fractions[0])
    val_cut = torch.round(size * (fractions[0] + fractions[1]))
    train = nodes[rank < train_cut].sort().values
    val = nodes[(rank >= train_cut) & (rank < val_cut)].sort().values
    test = nodes[rank >= val_cut].sort().values
    return train, val, test


def choose_split(
    y: Tensor,
    own: tuple[Tensor, Tensor, Tensor] | None,
    *,
    seed: int = 0,
) -> tuple[Tensor, Tensor, Tensor]:
    """The dataset's own split when it trains on ≥ 10% of nodes, else :func:`stratified_split`.

    Args:
        y (Tensor): ``[N]`` or ``[N, C]`` labels.
        own (tuple[Tensor, Tensor, Tensor], optional): the dataset's train/val/test node ids.
        seed (int, optional): seed of the fallback split. (default: ``0``)

    Returns:
        tuple[Tensor, Tensor, Tensor]: int64 ``train_idx``, ``val_idx``, ``test_idx``.
    """
    n = y.size(0)
    if own is not None and own[0].numel() >= MIN_TRAIN_FRACTION * n:
        train, val, test = (t.long() for t in own)
        return train, val, test
    return stratified_split(y, seed=seed)
