"""Feature rankings on plain tensors and tiny models: permutations, greedy, lasso math."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from gnnaas.errors import ConfigError
from gnnaas.models import build_model
from gnnaas.variants.ranking import (
    Ranking,
    first_layer_terms,
    greedy_ranking,
    greedy_scores,
    lasso_ranking,
    random_ranking,
)


def _is_permutation(order: Tensor, n: int) -> bool:
    return order.dtype == torch.int64 and torch.equal(order.sort().values, torch.arange(n))


def _csr(edge_index: Tensor, num_nodes: int) -> tuple[Tensor, Tensor]:
    """CSR over incoming edges: in-neighbors of i are col[rowptr[i]:rowptr[i + 1]]."""
    src, dst = edge_index
    perm = torch.argsort(dst * num_nodes + src)
    rowptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
    rowptr[1:] = torch.cumsum(torch.bincount(dst, minlength=num_nodes), 0)
    return rowptr, src[perm]


def _planted(num_nodes: int = 500, num_features: int = 60, informative: int = 6, out: int = 16):
    """(H, W) where only the first ``informative`` columns carry large weights."""
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(num_nodes, num_features, generator=gen)
    w = 0.02 * torch.randn(out, num_features, generator=gen)
    w[:, :informative] += torch.randn(out, informative, generator=gen)
    return h, w


def test_ranking_enum_accepts_strings() -> None:
    assert Ranking("LASSO") is Ranking.LASSO
    assert Ranking.parse(" greedy ") is Ranking.GREEDY
    assert Ranking.parse(Ranking.RANDOM) is Ranking.RANDOM
    assert isinstance(Ranking.LASSO, str) and Ranking.LASSO == "lasso"
    with pytest.raises(ConfigError, match="unknown ranking 'magic'; choose one of: random, greedy"):
        Ranking.parse("magic")


@pytest.mark.parametrize("num_features", [1, 7, 1433])
@pytest.mark.parametrize("seed", [0, 3])
def test_random_is_a_seeded_permutation(num_features: int, seed: int) -> None:
    order = random_ranking(num_features, seed=seed)
    assert _is_permutation(order, num_features)
    assert torch.equal(order, random_ranking(num_features, seed=seed))
    if num_features > 10:
        assert not torch.equal(order, random_ranking(num_features, seed=seed + 1))
    with pytest.raises(ValueError, match="num_features >= 1"):
        random_ranking(0)


def test_greedy_sums_l1_norms_over_weights() -> None:
    w_neigh = torch.tensor([[1.0, -2.0, 0.0, 0.5], [0.0, 1.0, 0.0, -0.5]])
    w_root = torch.tensor([[4.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert greedy_scores([w_neigh, w_root]).tolist() == [5.0, 3.0, 0.0, 1.0]
    assert greedy_ranking([w_neigh, w_root]).tolist() == [0, 1, 3, 2]
    assert greedy_ranking([torch.zeros(2, 3)]).tolist() == [0, 1, 2]  # ties: lower id first
    with pytest.raises(ValueError, match="expects"):
        greedy_scores([w_neigh, torch.zeros(2, 3)])


def test_lasso_recovers_planted_features() -> None:
    h, w = _planted()
    order = lasso_ranking([(h, w), (0.5 * h, w)], epochs=50)
    assert _is_permutation(order, 60)
    assert sorted(order[:6].tolist()) == list(range(6))


def test_lasso_prefers_features_that_move_the_output() -> None:
    """Equal weights: the feature whose aggregated input is larger (or non-zero) matters more."""
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(300, 5, generator=gen) * torch.tensor([1.0, 3.0, 0.0, 2.0, 0.5])
    w = torch.ones(4, 5)
    # greedy sees equal weights and falls back to ids; the lasso sees the input scale
    assert greedy_ranking([w]).tolist() == [0, 1, 2, 3, 4]
    assert lasso_ranking([(h, w)], epochs=40).tolist() == [1, 3, 0, 4, 2]


def test_lasso_is_deterministic_and_breaks_ties() -> None:
    h, w = _planted()
    terms = [(h, w)]
    assert torch.equal(lasso_ranking(terms), lasso_ranking(terms))
    # all-zero inputs: no feature moves the output, so the tie-break decides
    zero = [(torch.zeros(10, 4), torch.ones(3, 4))]
    assert lasso_ranking(zero).tolist() == [0, 1, 2, 3]
    assert lasso_ranking(zero, tie_break=torch.tensor([0.0, 2.0, 1.0, 3.0])).tolist() == [
        3,
        1,
        2,
        0,
    ]


def test_lasso_rejects_bad_arguments() -> None:
    h, w = _planted()
    with pytest.raises(ValueError, match="at least one"):
        lasso_ranking([])
    with pytest.raises(ValueError, match="epochs >= 1"):
        lasso_ranking([(h, w)], epochs=0)
    with pytest.raises(ValueError, match="W \\[out, 60\\]"):
        lasso_ranking([(h, w[:, :10])])


@pytest.mark.parametrize("arch", ["sage", "gin"])
def test_first_layer_terms_reproduce_the_first_layer(arch: str) -> None:
    torch.manual_seed(0)
    num_nodes, num_features = 40, 9
    model = build_model(arch, num_features, 8, 3).eval()
    x = torch.randn(num_nodes, num_features)
    edge_index = torch.randint(0, num_nodes, (2, 160))
    rowptr, col = _csr(edge_index, num_nodes)
    nodes = torch.tensor([0, 5, 7, 39])

    terms = first_layer_terms(model, x, rowptr, col, nodes)
    pre_bias = sum(h @ w.T for h, w in terms)  # [n, hidden]
    conv = model.convs[0]
    with torch.inference_mode():
        if arch == "sage":
            expected = conv(x, edge_index)[nodes] - conv.lin_l.bias
        else:  # the first Linear of the MLP on (1 + eps) x + sum of neighbors
            linear = conv.nn[0]
            captured: list[Tensor] = []
            handle = linear.register_forward_hook(lambda _m, _i, out: captured.append(out))
            conv(x, edge_index)
            handle.remove()
            expected = captured[0][nodes] - linear.bias
    torch.testing.assert_close(pre_bias, expected, atol=1e-5, rtol=1e-5)
    # the weights the lasso uses are the ones greedy ranks by
    weights = model.first_layer_weights()
    assert all(torch.equal(w, ref) for (_, w), ref in zip(terms, weights, strict=True))
