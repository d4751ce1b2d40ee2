"""Input feature rankings: random, greedy and lasso (docs/architecture.md §4).

Every ranking is a pure function that returns an int64 permutation of all input feature ids, most
important first; a variant with prune factor ``k`` keeps the first ``num_features // k`` of them.

- ``random``: a seeded permutation (the baseline).
- ``greedy``: the L1 norm of each feature's column in the trained 1× model's first-layer weight(s),
  summed over them (SAGE: neighbor and root weights; GIN: the first Linear of the first MLP).
- ``lasso``: a mask β (init 1) minimizing ‖A¹X⁰W¹ − A¹(β⊙X⁰)W¹‖² + λ‖β‖₁ with the 1× model's
  first-layer aggregation and weights over training nodes, λ raised by a fixed step every epoch;
  ranked by |β|.

The first layer is linear in its input before the bias, so the lasso objective is a quadratic form
in δ = 1 − β: with H_i the aggregated inputs of the layer's linear maps (SAGE: neighbor mean and
root; GIN: (1 + ε)x + Σ neighbors) and W_i their weights, ‖Σ_i (H_i diag δ) W_iᵀ‖² / n = δᵀQδ with
Q = Σ_ij (H_iᵀH_j / n) ⊙ (W_iᵀW_j). Q is computed once (a few matmuls); each epoch is then a few
proximal-gradient (ISTA) steps of one [F, F] mat-vec each, so the ranking costs well under a second
for thousands of features.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from enum import StrEnum
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from gnnaas.errors import ConfigError

if TYPE_CHECKING:
    from gnnaas.data import GraphStore
    from gnnaas.models import GNN

__all__ = [
    "Ranking",
    "first_layer_terms",
    "greedy_ranking",
    "greedy_scores",
    "lasso_ranking",
    "random_ranking",
    "rank_features",
]

_log = logging.getLogger(__name__)

_GATHER_ELEMENTS = 1 << 24  # floats gathered at once when aggregating neighbors (64 MB)
_SPARSE_DENSITY = 0.1  # below this share of non-zeros, the lasso's Gram products go sparse


class Ranking(StrEnum):
    """A feature ranking method; accepts plain strings (``Ranking("lasso")``, any case)."""

    RANDOM = "random"
    GREEDY = "greedy"
    LASSO = "lasso"

    @classmethod
    def _missing_(cls, value: object) -> Ranking | None:
        if isinstance(value, str):
            for member in cls:
                if member.value == value.strip().lower():
                    return member
        return None

    @classmethod
    def parse(cls, value: str | Ranking) -> Ranking:
        """Returns the ranking named ``value``.

        Raises:
            ConfigError: the name is not a ranking; the message lists the choices.
        """
        try:
            return cls(value)
        except ValueError:
            choices = ", ".join(m.value for m in cls)
            raise ConfigError(
                f"unknown ranking {str(value)!r}; choose one of: {choices} (e.g. --ranking lasso)"
            ) from None


def random_ranking(num_features: int, *, seed: int = 0) -> Tensor:
    """A seeded random permutation of ``num_features`` feature ids.

    Args:
        num_features (int): number of input features ``F``.
        seed (int, optional): seed of the permutation. (default: ``0``)

    Returns:
        Tensor: ``[F]`` int64 permutation.

    Example:
        >>> random_ranking(4, seed=0).sort().values.tolist()
        [0, 1, 2, 3]
    """
    if num_features < 1:
        raise ValueError(f"random_ranking expects num_features >= 1 (got {num_features})")
    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(num_features, generator=generator, dtype=torch.int64)


def greedy_scores(weights: Sequence[Tensor]) -> Tensor:
    """Per-feature L1 norm of the input columns of the first-layer weights, summed.

    Args:
        weights (Sequence[Tensor]): first-layer weight matrices, each ``[out, F]`` as in
            ``torch.nn.Linear`` (e.g. ``model.first_layer_weights()``).

    Returns:
        Tensor: ``[F]`` float32 scores, larger is more important.
    """
    if not weights:
        raise ValueError("greedy_scores expects at least one weight matrix (got none)")
    num_features = weights[0].shape[-1]
    score = torch.zeros(num_features, dtype=torch.float32)
    for w in weights:
        if w.dim() != 2 or w.shape[1] != num_features:
            raise ValueError(
                f"greedy_scores expects [out, {num_features}] weights (got {tuple(w.shape)})"
            )
        score += w.detach().abs().sum(dim=0).float().cpu()
    return score


def greedy_ranking(weights: Sequence[Tensor]) -> Tensor:
    """Ranks features by :func:`greedy_scores`, descending; ties go to the lower feature id.

    Args:
        weights (Sequence[Tensor]): first-layer weight matrices, each ``[out, F]``.

    Returns:
        Tensor: ``[F]`` int64 permutation, most important first.

    Example:
        >>> greedy_ranking([torch.tensor([[0.1, -2.0, 0.5]])]).tolist()
        [1, 2, 0]
    """
    return _argsort_desc(greedy_scores(weights))


def lasso_ranking(
    terms: Sequence[tuple[Tensor, Tensor]],
    *,
    epochs: int = 100,
    inner_steps: int = 3,
    lam_step: float | None = None,
    tie_break: Tensor | None = None,
) -> Tensor:
    """Ranks features by a lasso mask on the first layer's output.

    Minimizes :math:`f(\\beta) = \\lVert\\sum_i H_i W_i^\\top - \\sum_i (H_i \\operatorname{diag}
    \\beta) W_i^\\top\\rVert^2 / n + \\lambda \\lVert\\beta\\rVert_1` from :math:`\\beta = 1` by
    proximal gradient descent (soft-thresholding keeps exact zeros), with
    :math:`\\lambda = t \\cdot` ``lam_step`` in epoch ``t``. Features are ranked by :math:`|\\beta|`
    at the end; features tied there (typically at zero) by the last epoch they were still non-zero
    (the lasso path: later is more important), then by ``tie_break`` (descending), then by id.

    Args:
        terms (Sequence[tuple[Tensor, Tensor]]): pairs ``(H_i, W_i)``: ``H_i`` the ``[n, F]``
            aggregated inputs of one linear map of the first layer over ``n`` training nodes,
            ``W_i`` its ``[out, F]`` weight (see :func:`first_layer_terms`).
        epochs (int, optional): number of epochs, each raising λ by ``lam_step``. (default: ``100``)
        inner_steps (int, optional): proximal-gradient steps per epoch. (default: ``3``)
        lam_step (float, optional): the λ increment per epoch; ``None`` picks
            :math:`\\lambda_{max} / epochs`, where :math:`\\lambda_{max}` is the smallest λ whose
            minimizer is :math:`\\beta = 0`, so the path visits every feature. (default: ``None``)
        tie_break (Tensor, optional): ``[F]`` scores to order features tied on |β| and on the path
            (e.g. :func:`greedy_scores`). (default: ``None``)

    Returns:
        Tensor: ``[F]`` int64 permutation, most important first.

    Shapes:
        **input:** ``H_i`` :math:`(n, F)`, ``W_i`` :math:`(out_i, F)`
        **output:** :math:`(F)`
    """
    if not terms:
        raise ValueError("lasso_ranking expects at least one (H, W) term (got none)")
    if epochs < 1 or inner_steps < 1:
        raise ValueError(
            f"lasso_ranking expects epochs >= 1 and inner_steps >= 1 (got {epochs}, {inner_steps})"
        )
    if lam_step is not None and (not math.isfinite(lam_step) or lam_step < 0):
        raise ValueError(f"lasso_ranking expects lam_step >= 0 (got {lam_step})")
    q = _lasso_gram(terms)  # [F, F], f(β) = (1-β)ᵀ Q (1-β) + λ‖β‖₁
    num_features = q.shape[0]
    ones = torch.ones(num_features, dtype=q.dtype)
    grad_at_zero = 2.0 * (q @ ones)  # -∂/∂β of the quadratic at β = 0
    lam_max = float(grad_at_zero.abs().max())
    lipschitz = 2.0 * _top_eigenvalue(q)
    if lam_max <= 0.0 or lipschitz <= 0.0:
        _log.warning("lasso: the first layer's output does not depend on any feature; using ties")
        return _rank_lexicographic([torch.zeros(num_features)], tie_break)
    step = 1.0 / lipschitz
    lam_inc = lam_max / epochs if lam_step is None else lam_step

    beta = ones.clone()
    last_alive = torch.zeros(num_features, dtype=torch.int64)
    for epoch in range(1, epochs + 1):
        lam = epoch * lam_inc
        for _ in range(inner_steps):
            grad = -2.0 * (q @ (ones - beta))  # [F]
            z = beta - step * grad
            beta = z.sign() * (z.abs() - step * lam).clamp_min(0.0)
        last_alive[beta != 0] = epoch
    alive = int((beta != 0).sum())
    _log.info(
        "lasso: features=%d epochs=%d lam_max=%.4g lam_final=%.4g alive=%d",
        num_features,
        epochs,
        lam_max,
        epochs * lam_inc,
        alive,
    )
    return _rank_lexicographic([beta.abs(), last_alive.to(q.dtype)], tie_break)


def first_layer_terms(
    model: torch.nn.Module,
    x: Tensor,
    rowptr: Tensor,
    col: Tensor,
    nodes: Tensor,
) -> list[tuple[Tensor, Tensor]]:
    """The ``(H_i, W_i)`` pairs of a model's first convolution over ``nodes`` (for the lasso).

    The first layer's pre-bias output on ``nodes`` is ``sum_i H_i @ W_i.T``, aggregated over every
    in-neighbor of each node in the graph given as CSR (``rowptr``, ``col``):

    - ``SAGEConv`` (mean or sum aggregation):
      ``[(aggr_neigh(x), lin_l.weight), (x, lin_r.weight)]``;
    - ``GINConv``: ``[((1 + eps) x + sum_neigh(x), W)]`` with ``W`` the first Linear of its MLP.

    Args:
        model (torch.nn.Module): a trained gnnaas ``GNN`` whose ``convs[0]`` is a PyG
            ``SAGEConv`` or ``GINConv``.
        x (Tensor): ``[N, F]`` node features of the graph.
        rowptr (Tensor): ``[N + 1]`` CSR row pointers over incoming edges.
        col (Tensor): ``[E]`` in-neighbor ids.
        nodes (Tensor): ``[n]`` ids of the target nodes.

    Returns:
        list[tuple[Tensor, Tensor]]: ``(H_i [n, F], W_i [out, F])`` pairs, float32 on the CPU.
    """
    from torch_geometric.nn import GINConv, SAGEConv
    from torch_geometric.nn.aggr import SumAggregation

    convs = getattr(model, "convs", None)
    if not convs:
        name = type(model).__name__
        raise TypeError(f"first_layer_terms expects a model with .convs (got {name})")
    conv = convs[0]
    x = x.detach().float().cpu()
    nodes = nodes.cpu()
    if isinstance(conv, SAGEConv):
        if getattr(conv, "project", False):
            raise TypeError("first_layer_terms does not support SAGEConv(project=True)")
        is_sum = isinstance(conv.aggr_module, SumAggregation)
        neigh = _aggregate(x, rowptr, col, nodes, mean=not is_sum)  # [n, F]
        terms = [(neigh, conv.lin_l.weight.detach().float().cpu())]
        if conv.root_weight:
            terms.append((x[nodes], conv.lin_r.weight.detach().float().cpu()))
        return terms
    if isinstance(conv, GINConv):
        eps = float(conv.eps)
        h = (1.0 + eps) * x[nodes] + _aggregate(x, rowptr, col, nodes, mean=False)  # [n, F]
        weight = _first_linear_weight(conv.nn)
        return [(h, weight.detach().float().cpu())]
    raise TypeError(
        f"first_layer_terms supports SAGEConv and GINConv first layers (got {type(conv).__name__})"
    )


def rank_features(
    ranking: Ranking | str,
    model: GNN,
    store: GraphStore,
    *,
    seed: int = 0,
    max_nodes: int = 2048,
    epochs: int = 100,
) -> Tensor:
    """Ranks the input features of ``store`` with a trained 1× ``model``.

    Args:
        ranking (Ranking | str): ``random``, ``greedy`` or ``lasso``.
        model (GNN): the trained 1× model (unused by ``random``).
        store (GraphStore): the dataset; the lasso runs on the inductive training graph
            (``store.induced(store.train_idx)``).
        seed (int, optional): seed of the random permutation and of the lasso's node sample.
            (default: ``0``)
        max_nodes (int, optional): the lasso uses at most this many training nodes, drawn with
            ``seed``. (default: ``2048``)
        epochs (int, optional): lasso epochs. (default: ``100``)

    Returns:
        Tensor: ``[F]`` int64 permutation of all features, most important first.
    """
    ranking = Ranking.parse(ranking)
    if ranking is Ranking.RANDOM:
        return random_ranking(store.num_features, seed=seed)
    weights = model.first_layer_weights()
    if ranking is Ranking.GREEDY:
        return greedy_ranking(weights)
    train = store.induced(store.train_idx)
    nodes = torch.arange(train.num_nodes)
    if train.num_nodes > max_nodes:
        generator = torch.Generator().manual_seed(seed)
        nodes = torch.randperm(train.num_nodes, generator=generator)[:max_nodes].sort().values
    terms = first_layer_terms(model, train.x, train.rowptr, train.col, nodes)
    return lasso_ranking(terms, epochs=epochs, tie_break=greedy_scores(weights))


# ----------------------------------------------------------------------------------------------
# helpers


def _argsort_desc(score: Tensor) -> Tensor:
    # stable sort of -score: equal scores keep ascending feature ids
    return torch.sort(-score.float(), stable=True).indices.to(torch.int64)


def _rank_lexicographic(keys: Sequence[Tensor], tie_break: Tensor | None) -> Tensor:
    """Descending on keys[0], then keys[1], ..., then tie_break, then ascending id."""
    all_keys = list(keys) + ([tie_break.float().cpu()] if tie_break is not None else [])
    order = torch.arange(all_keys[0].numel(), dtype=torch.int64)
    for key in reversed(all_keys):  # least significant first, stable sorts
        idx = torch.sort(-key.float()[order], stable=True).indices
        order = order[idx]
    return order


def _lasso_gram(terms: Sequence[tuple[Tensor, Tensor]]) -> Tensor:
    num_nodes, num_features = terms[0][0].shape
    for h, w in terms:
        if h.dim() != 2 or w.dim() != 2 or h.shape != (num_nodes, num_features):
            raise ValueError(
                f"lasso_ranking expects H [n, F] = {(num_nodes, num_features)} and W [out, F] "
                f"(got H {tuple(h.shape)}, W {tuple(w.shape)})"
            )
        if w.shape[1] != num_features:
            shape = tuple(w.shape)
            raise ValueError(f"lasso_ranking expects W [out, {num_features}] (got {shape})")
    hs = [h.detach().float().cpu() for h, _ in terms]
    ws = [w.detach().float().cpu() for _, w in terms]
    # bag-of-words inputs (Cora: 1-3 % non-zeros) make Hᵀ H several times cheaper as sparse @ dense
    hts = [h.T.to_sparse() if _density(h) < _SPARSE_DENSITY else None for h in hs]
    q = torch.zeros(num_features, num_features)
    for i in range(len(terms)):
        ht = hts[i]
        for j in range(i, len(terms)):
            gram = torch.sparse.mm(ht, hs[j]) if ht is not None else hs[i].T @ hs[j]  # [F, F]
            block = gram.div_(max(num_nodes, 1)).mul_(ws[i].T @ ws[j])  # [F, F]
            q += block if i == j else block + block.T
    return q


def _density(h: Tensor) -> float:
    return float(torch.count_nonzero(h)) / max(h.numel(), 1)


def _top_eigenvalue(q: Tensor, iters: int = 50) -> float:
    """Largest eigenvalue of the symmetric PSD ``q`` by power iteration (an upper-ish bound)."""
    v = torch.ones(q.shape[0], dtype=q.dtype) / math.sqrt(q.shape[0])
    value = 0.0
    for _ in range(iters):
        w = q @ v
        norm = float(w.norm())
        if norm == 0.0:
            return 0.0
        v = w / norm
        value = norm
    # power iteration approaches from below; a small margin keeps ISTA's step size safe
    return 1.05 * value


def _aggregate(x: Tensor, rowptr: Tensor, col: Tensor, nodes: Tensor, *, mean: bool) -> Tensor:
    """Sum (or mean) of the in-neighbors' rows of ``x`` for each of ``nodes``: ``[n, F]``."""
    rowptr = rowptr.cpu()
    col = col.cpu()
    start = rowptr[nodes]
    count = rowptr[nodes + 1] - start  # [n]
    crow = torch.zeros(nodes.numel() + 1, dtype=torch.int64)
    crow[1:] = torch.cumsum(count, 0)
    total = int(crow[-1])
    # position of each selected edge in `col`: its row's start plus its offset within the row
    offset = torch.arange(total, dtype=torch.int64) - torch.repeat_interleave(crow[:-1], count)
    src = col[torch.repeat_interleave(start, count) + offset]  # [E_sel]
    row = torch.repeat_interleave(torch.arange(nodes.numel()), count)  # [E_sel]
    out = torch.zeros(nodes.numel(), x.shape[1], dtype=x.dtype)
    # gather neighbor rows in chunks so a high-degree graph never materializes [E_sel, F] at once
    chunk = max(1, _GATHER_ELEMENTS // max(x.shape[1], 1))
    for lo in range(0, total, chunk):
        out.index_add_(0, row[lo : lo + chunk], x[src[lo : lo + chunk]])
    if mean:
        out /= count.clamp_min(1).unsqueeze(1).to(x.dtype)
    return out  # [n, F]


def _first_linear_weight(module: torch.nn.Module) -> Tensor:
    for sub in module.modules():
        weight = getattr(sub, "weight", None)
        if isinstance(weight, Tensor) and weight.dim() == 2 and "Linear" in type(sub).__name__:
            return weight
    raise TypeError(f"no Linear layer found in the GIN MLP {type(module).__name__}")
