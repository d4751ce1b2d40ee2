"""The serving sampler: depth-separated layout, builder, and use inside and outside inference."""

from __future__ import annotations

import types

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
