"""The compiled depth sampler against the torch path: the same trees on a grid of graphs.

:class:`~gnnaas.sampling.DepthSampler` has two implementations of one sampling, the compiled
kernel (:mod:`gnnaas.sampling.fastpath`) and the torch path, and chooses between them itself.
These tests sample a seeded grid of graphs (random, with isolated nodes, with a hub far above
every fanout, with repeated edges and self-loops, a live graph with writes), fanouts (``-1``
included) and seed sets (empty, one, repeated ids, every node) through both and require the same
rows per depth and the same edges per block; only the order inside a depth may differ.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor

from gnnaas.data.live import LiveGraph
from gnnaas.sampling import DepthSampler, fastpath
from gnnaas.sampling.subgraph import SampledSubgraph

Graph = tuple[Tensor, Tensor]


def _csr(src: Tensor, dst: Tensor, n: int) -> Graph:
    """CSR over incoming edges: the in-neighbors of ``i`` are ``col[rowptr[i]:rowptr[i + 1]]``."""
    order = torch.argsort(dst, stable=True)
    rowptr = torch.zeros(n + 1, dtype=torch.long)
    rowptr[1:] = torch.bincount(dst, minlength=n).cumsum(0)
    return rowptr, src[order].contiguous()


def _random(n: int = 200, m: int = 2500, seed: int = 0) -> Graph:
    g = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n, (2, m), generator=g)
    return _csr(src, dst, n)


def _isolated(n: int = 120) -> Graph:
    # Only even nodes have in-edges, only nodes below 60 send them: the odd nodes have no
    # neighbors, those of 60 and above also reach nobody.
    g = torch.Generator().manual_seed(1)
    dst = 2 * torch.randint(0, n // 2, (400,), generator=g)
    src = torch.randint(0, 60, (400,), generator=g)
    return _csr(src, dst, n)


def _hub(n: int = 300) -> Graph:
    # Node 0 hears from every other node (degree 299, above every fanout); node 1 from 40 of them;
    # the others from three random nodes each.
    g = torch.Generator().manual_seed(2)
    src = [torch.arange(1, n), torch.arange(2, 42)]
    dst = [torch.zeros(n - 1, dtype=torch.long), torch.ones(40, dtype=torch.long)]
    rest = torch.arange(2, n).repeat_interleave(3)
    src.append(torch.randint(0, n, rest.shape, generator=g))
    dst.append(rest)
    return _csr(torch.cat(src), torch.cat(dst), n)


def _multi(n: int = 50) -> Graph:
    # Repeated edges (the same neighbor at several CSR positions) and a self-loop on every node.
    g = torch.Generator().manual_seed(3)
    src, dst = torch.randint(0, n, (2, 150), generator=g)
    loops = torch.arange(n)
    src = torch.cat([src, src, loops])
    dst = torch.cat([dst, dst, loops])
    return _csr(src, dst, n)


GRAPHS: dict[str, Callable[[], Graph]] = {
    "random": _random,
    "isolated": _isolated,
    "hub": _hub,
    "multi": _multi,
}
FANOUTS = [(1,), (4, 2), (25, 10), (-1, 3), (3, -1), (-1, -1), (3, 2, 2)]


def _seed_sets(n: int, seed: int) -> list[Tensor]:
    g = torch.Generator().manual_seed(seed)
    sets = [torch.randperm(n, generator=g)[:size] for size in (0, 1, 2, 7, 64)]
    sets.append(torch.arange(n))
    first = sets[3]
    sets.append(torch.cat([first, first[:3]]))  # repeated ids
    return sets


def _depths(sub: SampledSubgraph) -> Tensor:
    return torch.repeat_interleave(
        torch.arange(len(sub.num_sampled_nodes)), torch.tensor(sub.num_sampled_nodes)
    )


def _rows(sub: SampledSubgraph) -> Counter[tuple[int, int]]:
    """The sample's rows as a multiset of (node, depth)."""
    return Counter(zip(sub.n_id.tolist(), _depths(sub).tolist(), strict=True))


def _edges(sub: SampledSubgraph) -> list[Counter[tuple[int, int, int, int]]]:
    """Each block's edges as a multiset of (source node, its depth, target node, its depth)."""
    nodes, depth = sub.n_id.tolist(), _depths(sub).tolist()
    out = []
    for block in sub.blocks:
        src, dst = block.edge_index.tolist()
        out.append(
            Counter((nodes[s], depth[s], nodes[d], depth[d]) for s, d in zip(src, dst, strict=True))
        )
    return out


def _assert_same_sample(fast: SampledSubgraph, slow: SampledSubgraph, seeds: Tensor) -> None:
    assert (
        fast.n_id[: seeds.numel()].tolist() == seeds.tolist() == slow.n_id[: seeds.numel()].tolist()
    )
    assert fast.batch_size == slow.batch_size == seeds.numel()
    assert fast.num_sampled_nodes == slow.num_sampled_nodes
    assert [b.size for b in fast.blocks] == [b.size for b in slow.blocks]
    assert _rows(fast) == _rows(slow)
    assert _edges(fast) == _edges(slow)


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the calls of the compiled path (one entry per call: its number of seeds)."""
    calls: list[int] = []
    real = fastpath.sample_depth_numba

    def counted(rowptr, col, seeds, *args):  # type: ignore[no-untyped-def]
        calls.append(seeds.numel())
        return real(rowptr, col, seeds, *args)

    monkeypatch.setattr(fastpath, "sample_depth_numba", counted)
    return calls


def test_the_kernel_compiles_here() -> None:
    # numba is a dependency: a CI run where the kernel does not compile fails here rather than
    # testing the torch path against itself.
    assert fastpath.available()


@pytest.mark.parametrize("fanouts", FANOUTS, ids=str)
@pytest.mark.parametrize("graph", list(GRAPHS))
@pytest.mark.parametrize("seed", [0, 7, 1_000_003])
def test_both_paths_sample_the_same_trees(
    graph: str, fanouts: tuple[int, ...], seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rowptr, col = GRAPHS[graph]()
    n = rowptr.numel() - 1
    fast = DepthSampler(rowptr, col, fanouts, seed=seed)
    slow = DepthSampler(rowptr, col, fanouts, seed=seed, fast_path=False)
    calls = _counting(monkeypatch)
    sets = _seed_sets(n, seed)
    for seeds in sets:
        _assert_same_sample(fast.sample(seeds), slow.sample(seeds), seeds)
    assert calls == [s.numel() for s in sets]  # the kernel served every batch of `fast` alone


def test_a_seed_has_the_same_tree_alone_and_in_a_batch() -> None:
    rowptr, col = _random()
    sampler = DepthSampler(rowptr, col, (25, 10), seed=5)
    many = torch.randperm(200, generator=torch.Generator().manual_seed(1))[:100]
    for seed in many[:5].tolist():
        alone = sampler.sample(torch.tensor([seed]))
        batch = sampler.sample(many)
        assert set(_rows(alone)) <= set(_rows(batch))
        assert set(_edges(alone)[0]) <= set(_edges(batch)[0])


def test_both_paths_sample_the_same_live_tree() -> None:
    rowptr, col = _random(n=30, m=120, seed=4)
    x = torch.randn(30, 4, generator=torch.Generator().manual_seed(0))
    graph = LiveGraph(rowptr, col, x, capacity=40)
    fanouts = (3, -1)
    fast = DepthSampler(rowptr, col, fanouts, live=graph)
    slow = DepthSampler(rowptr, col, fanouts, live=graph, fast_path=False)
    writes: list[Callable[[], Any]] = [
        lambda: graph.stage().add_nodes([[1.0] * 4] * 2, [[-1, 3], [-2, -1], [4, -2]]),
        lambda: graph.stage().change_edges(
            add=[[31, 7], [31, 0]], remove=[[int(graph.neighbors(5)[0]), 5]]
        ),
        lambda: graph.stage().add_nodes([[0.5] * 4], [[-1, 31], [0, -1]]),
    ]
    for write in [None, *writes]:
        if write is not None:
            graph.apply(write())
        n = graph.num_nodes
        for seeds in (torch.tensor([3, 5, 7]), torch.arange(n - 3, n), torch.arange(n)):
            _assert_same_sample(fast.sample(seeds), slow.sample(seeds), seeds)
    assert graph.num_nodes == 33 and 32 in fast.sample(torch.tensor([0])).n_id.tolist()


def test_the_sampler_chooses_the_path(monkeypatch: pytest.MonkeyPatch) -> None:
    rowptr, col = _random()
    seeds = torch.tensor([3, 50, 120])
    calls = _counting(monkeypatch)
    DepthSampler(rowptr, col, (4, 2)).sample(seeds)
    DepthSampler(rowptr, col, (4, 2), fast_path=False).sample(seeds)
    assert calls == [3]  # fast_path=False keeps the torch path
    monkeypatch.setattr(fastpath, "available", lambda: False)  # a kernel that did not compile
    reference = DepthSampler(rowptr, col, (4, 2)).sample(seeds)
    assert calls == [3]
    _assert_same_sample(
        reference, DepthSampler(rowptr, col, (4, 2), fast_path=False).sample(seeds), seeds
    )


def test_a_kernel_that_does_not_compile_leaves_the_torch_path(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("no LLVM here")

    monkeypatch.setattr(fastpath, "_kernel", broken)
    with caplog.at_level(logging.WARNING, logger="gnnaas.sampling.fastpath"):
        assert fastpath.available.__wrapped__() is False  # the check itself, not its cached value
    assert "the compiled sampler did not compile (no LLVM here)" in caplog.text


def test_the_kernel_grows_its_room_then_leaves_big_trees_to_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rowptr, col = _random()  # mean in-degree 12.5: a guess of 1 neighbor per target is short
    seeds = torch.arange(0, 200, 3)
    slow = DepthSampler(rowptr, col, (-1, -1), fast_path=False).sample(seeds)
    caps: list[int] = []
    kernel = fastpath._kernel

    def counted(*args):  # type: ignore[no-untyped-def]
        caps.append(args[-1])
        return kernel(*args)

    monkeypatch.setattr(fastpath, "_kernel", counted)
    monkeypatch.setattr(fastpath, "_FULL_GUESS", 1)
    sampler = DepthSampler(rowptr, col, (-1, -1))
    _assert_same_sample(sampler.sample(seeds), slow, seeds)
    assert len(caps) > 1 and caps[1] == 4 * caps[0]  # retried with more room
    monkeypatch.setattr(fastpath, "MAX_ENTRIES", 500)  # the tree has more rows than that
    caps.clear()
    fallback = sampler.sample(seeds)
    assert caps[-1] == 500 and torch.equal(fallback.n_id, slow.n_id)  # torch path's row order
    monkeypatch.setattr(fastpath, "MAX_ENTRIES", 1 << 26)
    _assert_same_sample(sampler.sample(seeds), slow, seeds)  # the failed calls left the map clean


@pytest.mark.parametrize("arch", ["sage", "gin"])
def test_a_model_answers_alike_on_both_paths(arch: str) -> None:
    from gnnaas.models import build_model

    rowptr, col = _hub()
    n = rowptr.numel() - 1
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(2))
    torch.manual_seed(0)
    model = build_model(arch, 8, 16, 3).eval()
    seeds = torch.tensor([0, 1, 50, 120, 299])
    outs = []
    for fast_path in (True, False):
        sub = DepthSampler(rowptr, col, (5, 3), fast_path=fast_path).sample(seeds)
        with torch.inference_mode():
            outs.append(model(x[sub.n_id], sub.blocks))
    # Rows in another order within a depth: the same sums up to floating-point order.
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    assert np.isfinite(outs[0].numpy()).all()
