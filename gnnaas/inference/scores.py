"""Per-node score parts, from which every profiled or evaluated accuracy is summed.

A split's metric is ``sum(num) / sum(den)`` over its nodes:

- single-label: ``num = 1`` when the arg-max class is right, else ``0``; ``den = 1``
  (accuracy);
- multi-label (logits thresholded at 0): ``num = 2·tp`` and ``den = 2·tp + fp + fn`` of the
  node's labels (F1-micro; ``1.0`` when no node has a positive label or prediction).

Keeping the parts per node (not per batch) lets the profiler give the uncertainty code the
paired, per-node view it needs (docs/architecture.md §5).

Example:
    >>> num, den = score_parts(torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0]))
    >>> num.tolist(), den.tolist(), metric(num, den)
    ([1.0, 0.0], [1.0, 1.0], 0.5)
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["metric", "score_parts"]


def score_parts(logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Per-node numerator and denominator of the metric (see the module docstring).

    Args:
        logits (Tensor): ``[B, C]`` model outputs.
        y (Tensor): ``[B]`` int64 class ids, or ``[B, C]`` 0/1 labels (multi-label).

    Returns:
        tuple[Tensor, Tensor]: ``num`` and ``den``, ``[B]`` float64 each, on ``logits``' device.

    Raises:
        ValueError: ``y`` does not match ``logits`` in shape.
    """
    y = y.to(logits.device)
    if y.dim() == 2:
        if y.shape != logits.shape:
            raise ValueError(
                f"score_parts: multi-label y must have the logits' shape {tuple(logits.shape)} "
                f"(got {tuple(y.shape)})"
            )
        pred, true = logits > 0, y > 0.5
        tp = (pred & true).sum(dim=1, dtype=torch.float64)
        wrong = (pred ^ true).sum(dim=1, dtype=torch.float64)  # fp + fn
        return 2 * tp, 2 * tp + wrong
    if y.dim() != 1 or y.numel() != logits.size(0):
        raise ValueError(
            f"score_parts: y must hold one class id per row of logits ({logits.size(0)}) "
            f"(got shape {tuple(y.shape)})"
        )
    num = (logits.argmax(dim=-1) == y).to(torch.float64)
    return num, torch.ones_like(num)


def metric(num: Tensor, den: Tensor) -> float:
    """``sum(num) / sum(den)`` in ``[0, 1]``; ``1.0`` when ``den`` sums to 0 (nothing to get wrong).

    Args:
        num (Tensor): per-node numerators.
        den (Tensor): per-node denominators.

    Returns:
        float: the metric.
    """
    total = float(den.sum())
    return float(num.sum()) / total if total > 0 else 1.0
