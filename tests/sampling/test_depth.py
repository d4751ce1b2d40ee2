"""The serving sampler: depth-separated layout, builder, and use inside and outside inference."""

from __future__ import annotations

import types

import pytest
import torch

from gnnaas.sampling import DepthSampler


def _graph() -> tuple[torch.Tensor, torch.Tensor, int]:
    g = torch.Generator().manual_seed(0)
    n = 200
    src, dst = torch.randint(0, n, (2, 2500), generator=g)
    order = torch.argsort(dst, stable=True)
    rowptr = torch.zeros(n + 1, dtype=torch.long)
    rowptr[1:] = torch.bincount(dst, minlength=n).cumsum(0)
    return rowptr, src[order], n


def test_depth_sampler_layout() -> None:
    rowptr, col, _ = _graph()
    sampler = DepthSampler(rowptr, col, (4, 2), seed=3)
    seeds = torch.tensor([0, 7, 9])
    sub = sampler.sample(seeds)
    n0, n1, n2 = sub.num_sampled_nodes
    assert n0 == 3 and sub.n_id[:3].tolist() == [0, 7, 9]
    assert [b.size for b in sub.blocks] == [(n0 + n1 + n2, n0 + n1), (n0 + n1, n0)]
    first, last = sub.blocks
    assert int(last.edge_index[1].max()) < n0  # the last layer only feeds the seeds
    assert int(first.edge_index[0].min()) >= n0  # every source is one depth below its target
    assert repr(sampler) == "DepthSampler(fanouts=(4, 2), seed=3)"
    again = sampler.sample(seeds)
    assert torch.equal(again.n_id, sub.n_id)  # a pure function of the seeds


def test_sampling_inside_then_outside_inference_mode() -> None:
    # The server samples outside inference_mode, evaluation may sample inside: a sampler's
    # pooled buffers must accept both, in any order.
    rowptr, col, _ = _graph()
    sampler = DepthSampler(rowptr, col, (3, 2), seed=1)
    seeds = torch.tensor([4, 8, 15])
    with torch.inference_mode():
        inside = sampler.sample(seeds)
    outside = sampler.sample(seeds)
    assert torch.equal(inside.n_id, outside.n_id)


def test_the_runtime_builds_the_depth_sampler() -> None:
    from gnnaas.runtime import RuntimeGraph

    rowptr, col, _ = _graph()
    store = types.SimpleNamespace(name="g", rowptr=rowptr, col=col)
    graph = RuntimeGraph(store, seed=2)  # type: ignore[arg-type]
    depth = graph.sampler([5, 3])
    assert isinstance(depth, DepthSampler) and depth.fanouts == (5, 3) and depth.seed == 2
    assert graph.sampler((5, 3)) is depth  # one per fanouts


def test_serving_module_reexports_the_sampler() -> None:
    from gnnaas.sampling.depth import DepthSampler as Reexported

    assert Reexported is DepthSampler


def _tree(sub) -> tuple[set[tuple[int, int]], set[tuple[int, int, int, int]]]:  # type: ignore[no-untyped-def]
    """A sample as sets: rows (node, depth) and edges (src node, src depth, dst node, dst depth)."""
    depth = torch.repeat_interleave(
        torch.arange(len(sub.num_sampled_nodes)), torch.tensor(sub.num_sampled_nodes)
    )
    nodes = sub.n_id.tolist()
    rows = set(zip(nodes, depth.tolist(), strict=True))
    src, dst = sub.blocks[0].edge_index.tolist()
    pairs = zip(src, dst, strict=True)
    edges = {(nodes[s], int(depth[s]), nodes[d], int(depth[d])) for s, d in pairs}
    return rows, edges


@pytest.mark.parametrize("fanouts", [(4, 2), (25, 10), (-1, 3), (3, 2, 2)])
def test_the_compiled_path_samples_the_same_trees(fanouts: tuple[int, ...]) -> None:
    from gnnaas.sampling import fastpath

    if not fastpath.available():
        pytest.skip("numba is not installed")
    rowptr, col, n = _graph()
    fast = DepthSampler(rowptr, col, fanouts, seed=5)
    slow = DepthSampler(rowptr, col, fanouts, seed=5, fast_path=False)
    g = torch.Generator().manual_seed(1)
    for size in (0, 1, 2, 7, 64, 150):
        seeds = torch.randperm(n, generator=g)[:size]
        a, b = fast.sample(seeds), slow.sample(seeds)
        assert a.n_id[:size].tolist() == seeds.tolist()
        assert a.num_sampled_nodes == b.num_sampled_nodes
        assert _tree(a) == _tree(b)
        assert [blk.size for blk in a.blocks] == [blk.size for blk in b.blocks]
        for blk_a, blk_b in zip(a.blocks, b.blocks, strict=True):  # same edges per layer
            assert blk_a.edge_index.size(1) == blk_b.edge_index.size(1)
    # A seed's tree is the same alone and in a batch.
    many = torch.randperm(n, generator=g)[:100]
    alone = _tree(fast.sample(many[:1]))
    rows, edges = _tree(fast.sample(many))
    assert alone[0] <= rows and alone[1] <= edges


def test_the_compiled_path_grows_its_room_and_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    from gnnaas.sampling import fastpath

    if not fastpath.available():
        pytest.skip("numba is not installed")
    rowptr, col, n = _graph()  # mean in-degree 12.5: a guess of 1 neighbor per target is short
    seeds = torch.arange(0, n, 3)
    slow = DepthSampler(rowptr, col, (-1, -1), fast_path=False).sample(seeds)
    caps: list[int] = []
    kernel = fastpath._kernel

    def counted(*args):  # type: ignore[no-untyped-def]
        caps.append(args[-1])
        return kernel(*args)

    monkeypatch.setattr(fastpath, "_kernel", counted)
    monkeypatch.setattr(fastpath, "_FULL_GUESS", 1)
    sampler = DepthSampler(rowptr, col, (-1, -1))
    assert _tree(sampler.sample(seeds)) == _tree(slow)
    assert len(caps) > 1 and caps[1] == 4 * caps[0]  # retried with more room
    monkeypatch.setattr(fastpath, "MAX_ENTRIES", 500)  # the tree has more rows than that
    caps.clear()
    fallback = sampler.sample(seeds)
    assert caps[-1] == 500 and torch.equal(fallback.n_id, slow.n_id)  # torch path's row order
    monkeypatch.setattr(fastpath, "MAX_ENTRIES", 1 << 26)
    assert _tree(sampler.sample(seeds)) == _tree(slow)  # the failed calls left the map clean


def test_a_model_answers_alike_on_both_paths() -> None:
    from gnnaas.models import build_model
    from gnnaas.sampling import fastpath

    if not fastpath.available():
        pytest.skip("numba is not installed")
    rowptr, col, n = _graph()
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(2))
    model = build_model("sage", 8, 16, 3).eval()
    seeds = torch.tensor([3, 50, 120, 199])
    outs = []
    for fast_path in (True, False):
        sub = DepthSampler(rowptr, col, (5, 3), fast_path=fast_path).sample(seeds)
        with torch.inference_mode():
            outs.append(model(x[sub.n_id], sub.blocks))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
