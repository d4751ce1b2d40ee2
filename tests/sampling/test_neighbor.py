"""NeighborSampler: NeighborLoader semantics, uniformity, reproducibility, consistency, blocks."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import combinations

import pytest
import torch
from torch import Tensor
from torch_geometric.nn import SAGEConv

from gnnaas.sampling import Block, NeighborSampler, SampledSubgraph

MODES = ["random", "consistent"]


def _csr(edge_index: Tensor, num_nodes: int) -> tuple[Tensor, Tensor]:
    """CSR over incoming edges of ``edge_index`` (row 0 source, row 1 target)."""
    src, dst = edge_index
    order = torch.argsort(dst * num_nodes + src)
    rowptr = torch.zeros(num_nodes + 1, dtype=torch.long)
    rowptr[1:] = torch.bincount(dst, minlength=num_nodes).cumsum(0)
    return rowptr, src[order]


def _random_graph(
    num_nodes: int = 300, seed: int = 0, dense: bool = False
) -> tuple[Tensor, Tensor]:
    """A simple (no multi-edge, no self-loop) random graph with in-degrees from 0 to ~60.

    Skewed (many small degrees) by default; ``dense`` gives almost every node 30 to 60
    in-neighbors, so the sampler takes its path for mostly high-degree targets.
    """
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(num_nodes, generator=g)
    deg = (30 + 30 * u if dense else u**3 * 60).long()
    deg[:5] = 0  # isolated targets
    dst = torch.repeat_interleave(torch.arange(num_nodes), deg)
    src = torch.randint(0, num_nodes, (dst.numel(),), generator=g)
    key = torch.unique(dst * num_nodes + src)
    edge_index = torch.stack([key % num_nodes, key // num_nodes])
    edge_index = edge_index[:, edge_index[0] != edge_index[1]]
    return _csr(edge_index, num_nodes)


def _star(num_hubs: int, degree: int) -> tuple[Tensor, Tensor]:
    """Hubs ``0..H-1``, hub ``h`` with in-neighbors ``H + h*degree + (0..degree-1)``."""
    leaves = torch.arange(num_hubs * degree) + num_hubs
    dst = torch.arange(num_hubs).repeat_interleave(degree)
    return _csr(torch.stack([leaves, dst]), num_hubs * (degree + 1))


def _sampler(
    rowptr: Tensor, col: Tensor, fanouts: Sequence[int], mode: str, seed: int = 0
) -> NeighborSampler:
    return NeighborSampler(rowptr, col, fanouts, consistent=mode == "consistent", seed=seed)


def _hop_edges(sub: SampledSubgraph) -> list[Tensor]:
    """The ``[2, E_h]`` edges of each hop, hop 0 first (blocks hold prefixes of one buffer)."""
    ends = [0] + [b.num_edges for b in reversed(sub.blocks)]
    full = sub.blocks[0].edge_index
    return [full[:, a:b] for a, b in zip(ends[:-1], ends[1:], strict=True)]


def _neighbors(rowptr: Tensor, col: Tensor, node: int) -> list[int]:
    return col[rowptr[node] : rowptr[node + 1]].tolist()


def _sampled_sets(sub: SampledSubgraph, hop: int) -> dict[int, set[int]]:
    """Global target id -> set of global neighbor ids sampled for it at ``hop``."""
    src, dst = sub.n_id[_hop_edges(sub)[hop]].tolist()
    out: dict[int, set[int]] = {}
    for s, d in zip(src, dst, strict=True):
        out.setdefault(d, set()).add(s)
    return out


def _check_semantics(sub: SampledSubgraph, rowptr: Tensor, col: Tensor, seeds: Tensor) -> None:
    """The NeighborLoader invariants every sample satisfies, whatever the fanouts."""
    n_id = sub.n_id
    assert n_id.dtype == torch.int64 and n_id.dim() == 1
    assert torch.equal(n_id[: seeds.numel()], seeds), "seeds first, in the order given"
    assert n_id.unique().numel() == n_id.numel(), "every node once"
    assert sub.batch_size == seeds.numel()
    counts = sub.num_sampled_nodes
    assert sum(counts) == n_id.numel() and counts[0] == seeds.numel()
    reached = torch.tensor(counts).cumsum(0).tolist()

    graph = {
        (int(s), int(d)) for d in range(rowptr.numel() - 1) for s in _neighbors(rowptr, col, d)
    }
    seen = set(seeds.tolist())
    for hop, edges in enumerate(_hop_edges(sub)):
        lo = reached[hop - 1] if hop else 0
        src, dst = edges
        if edges.numel():
            # targets of hop h are exactly the nodes first reached at hop h - 1
            assert int(dst.min()) >= lo and int(dst.max()) < reached[hop]
            assert int(src.max()) < reached[hop + 1]
        pairs = list(zip(n_id[src].tolist(), n_id[dst].tolist(), strict=True))
        assert set(pairs) <= graph, "every sampled edge exists"
        assert len(set(pairs)) == len(pairs), "no repeated neighbor per target"
        # new nodes are the unseen sources, appended in order of first appearance
        order = [s for s, _ in pairs if s not in seen]
        first = list(dict.fromkeys(order))
        assert n_id[reached[hop] : reached[hop + 1]].tolist() == first
        seen.update(first)


# -- semantics ------------------------------------------------------------------------------


def test_handmade_graph_exact() -> None:
    # in-neighbors: 0 <- {1, 2}, 1 <- {3}, 2 <- {0, 3}, 3 <- {}, 4 <- {0}
    rowptr = torch.tensor([0, 2, 3, 5, 5, 6])
    col = torch.tensor([1, 2, 3, 0, 3, 0])
    sub = NeighborSampler(rowptr, col, (2, 2)).sample(torch.tensor([4]))
    assert sub.n_id.tolist() == [4, 0, 1, 2]
    assert sub.num_sampled_nodes == [1, 1, 2]
    last, first = sub.blocks[1], sub.blocks[0]
    assert last.size == (2, 1) and last.edge_index.tolist() == [[1], [0]]
    assert first.size == (4, 2)
    assert first.edge_index.tolist() == [[1, 2, 3], [0, 1, 1]]
    assert sub.num_sampled_edges == 3 and sub.num_nodes == 4
    assert repr(last) == "Block(edge_index=[2, 1], size=(2, 1))"
    assert repr(sub).startswith("SampledSubgraph(n_id=[4], batch_size=1, num_sampled_edges=3")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize("fanouts", [(5, 3), (3, -1), (-1,), (2, 2, 2), (1, 25)])
def test_neighbor_loader_invariants(mode: str, dense: bool, fanouts: tuple[int, ...]) -> None:
    rowptr, col = _random_graph(dense=dense)
    sampler = _sampler(rowptr, col, fanouts, mode)
    seeds = torch.randperm(300, generator=torch.Generator().manual_seed(1))[:40]
    seeds[0] = 0  # an isolated seed
    sub = sampler.sample(seeds, torch.Generator().manual_seed(2))
    _check_semantics(sub, rowptr, col, seeds)
    # each target keeps min(degree, fanout) neighbors (all of them for -1)
    reached = torch.tensor(sub.num_sampled_nodes).cumsum(0).tolist()
    for hop, fanout in enumerate(fanouts):
        lo = reached[hop - 1] if hop else 0
        targets = sub.n_id[lo : reached[hop]]
        deg = (rowptr[targets + 1] - rowptr[targets]).tolist()
        got = Counter(_hop_edges(sub)[hop][1].tolist())
        for i, d in enumerate(deg):
            assert got.get(lo + i, 0) == (d if fanout == -1 else min(d, fanout))
        sets = _sampled_sets(sub, hop)
        for t, d in zip(targets.tolist(), deg, strict=True):
            if fanout == -1 or d <= fanout:  # low-degree targets get all their neighbors
                assert sets.get(t, set()) == set(_neighbors(rowptr, col, t))


@pytest.mark.parametrize("mode", MODES)
def test_block_shapes_and_prefixes(mode: str) -> None:
    rowptr, col = _random_graph()
    fanouts = (4, 3, 2)
    seeds = torch.arange(10, 30)
    sub = _sampler(rowptr, col, fanouts, mode).sample(seeds)
    n0, n1, n2, n3 = sub.num_sampled_nodes
    assert [b.size for b in sub.blocks] == [
        (n0 + n1 + n2 + n3, n0 + n1 + n2),
        (n0 + n1 + n2, n0 + n1),
        (n0 + n1, n0),
    ]
    assert sub.blocks[0].size[0] == sub.num_nodes and sub.blocks[-1].size[1] == sub.batch_size
    full = sub.blocks[0].edge_index
    for block in sub.blocks:
        ei = block.edge_index
        assert ei.dtype == torch.int64 and ei.shape == (2, block.num_edges)
        assert torch.equal(ei, full[:, : block.num_edges])  # a layer's edges: hops 0..L-1-l
        if block.num_edges:
            assert int(ei[0].max()) < block.size[0] and int(ei[1].max()) < block.size[1]
    assert [b.num_edges for b in sub.blocks] == sorted(
        (b.num_edges for b in sub.blocks), reverse=True
    )


def test_degree_equal_to_and_one_above_fanout() -> None:
    # node 0 has 4 in-neighbors, node 1 has 5; fanout 4: all of node 0's, 4 of node 1's
    rowptr = torch.tensor([0, 4, 9] + [9] * 9)
    col = torch.tensor([2, 3, 4, 5, 6, 7, 8, 9, 10])
    for mode in MODES:
        for s in range(20):
            sub = _sampler(rowptr, col, (4,), mode, seed=s).sample(
                torch.tensor([0, 1]), torch.Generator().manual_seed(s)
            )
            sets = _sampled_sets(sub, 0)
            assert sets[0] == {2, 3, 4, 5}
            assert len(sets[1]) == 4 and sets[1] <= {6, 7, 8, 9, 10}


def test_empty_batch_and_isolated_seeds() -> None:
    rowptr, col = _random_graph()
    sampler = NeighborSampler(rowptr, col, (5, 3))
    empty = sampler.sample(torch.empty(0, dtype=torch.long))
    assert empty.batch_size == 0 and empty.num_nodes == 0 and empty.num_sampled_edges == 0
    assert [b.size for b in empty.blocks] == [(0, 0), (0, 0)]
    isolated = sampler.sample(torch.tensor([0, 1, 2]))  # degree 0
    assert isolated.n_id.tolist() == [0, 1, 2] and isolated.num_sampled_edges == 0


def test_duplicate_seeds_keep_one_row_each() -> None:
    rowptr, col = _random_graph()
    sub = NeighborSampler(rowptr, col, (3,), consistent=True).sample(torch.tensor([7, 7]))
    assert sub.n_id[:2].tolist() == [7, 7] and sub.batch_size == 2
    src, dst = _hop_edges(sub)[0]
    assert torch.equal(sub.n_id[src[dst == 0]], sub.n_id[src[dst == 1]])


def test_node_map_is_clean_between_calls() -> None:
    # small batches on a larger graph reset the pooled map entry by entry, large ones wholesale
    g = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, 5000, (2, 15000), generator=g)
    rowptr, col = _csr(edge_index, 5000)
    reused = NeighborSampler(rowptr, col, (3, 2), consistent=True)
    for seeds in [
        torch.tensor([1, 2]),
        torch.arange(0, 5000, 2),
        torch.tensor([3]),
        torch.tensor([1, 2]),
    ]:
        fresh = NeighborSampler(rowptr, col, (3, 2), consistent=True).sample(seeds)
        got = reused.sample(seeds)
        assert torch.equal(got.n_id, fresh.n_id)
        assert torch.equal(got.blocks[0].edge_index, fresh.blocks[0].edge_index)
    assert len(reused._pool) == 1 and bool((reused._pool[0] == reused._unseen).all())


def test_int64_node_map_gives_the_same_sample() -> None:
    # graphs with N + E >= 2**30 use an int64 node map; force it on a small one
    from gnnaas.sampling.neighbor import _MAP_SENTINELS

    rowptr, col = _random_graph()
    small = NeighborSampler(rowptr, col, (5, 3), consistent=True)
    wide = NeighborSampler(rowptr, col, (5, 3), consistent=True)
    wide._map_dtype = torch.int64
    wide._unseen, wide._first = _MAP_SENTINELS[torch.int64]
    seeds = torch.arange(40, 100)
    a, b = small.sample(seeds), wide.sample(seeds)
    assert small._map_dtype == torch.int32
    assert torch.equal(a.n_id, b.n_id)
    assert torch.equal(a.blocks[0].edge_index, b.blocks[0].edge_index)
    assert b.blocks[0].edge_index.dtype == torch.int64


# -- reproducibility and consistency --------------------------------------------------------


def test_random_mode_reproducible_with_generator() -> None:
    rowptr, col = _random_graph()
    sampler = NeighborSampler(rowptr, col, (5, 3))
    seeds = torch.arange(50, 90)

    def run(seed: int) -> SampledSubgraph:
        return sampler.sample(seeds, torch.Generator().manual_seed(seed))

    a, b, c = run(0), run(0), run(1)
    assert torch.equal(a.n_id, b.n_id) and torch.equal(
        a.blocks[0].edge_index, b.blocks[0].edge_index
    )
    assert not torch.equal(a.blocks[0].edge_index, c.blocks[0].edge_index) or not torch.equal(
        a.n_id, c.n_id
    )
    torch.manual_seed(3)
    d = sampler.sample(seeds)
    torch.manual_seed(3)
    e = sampler.sample(seeds)
    assert torch.equal(d.n_id, e.n_id)  # the global RNG when no generator is given
    g = torch.Generator().manual_seed(0)
    assert not torch.equal(sampler.sample(seeds, g).n_id, sampler.sample(seeds, g).n_id)


def test_consistent_same_sample_alone_and_in_any_batch() -> None:
    rowptr, col = _random_graph()
    sampler = NeighborSampler(rowptr, col, (4, 3), consistent=True, seed=7)
    batch = torch.randperm(300, generator=torch.Generator().manual_seed(3))[:60]
    together = sampler.sample(batch, torch.Generator().manual_seed(0))  # generator ignored
    hop0 = _sampled_sets(together, 0)
    for s in batch[:20].tolist():
        alone = _sampled_sets(sampler.sample(torch.tensor([s])), 0)
        assert alone.get(s, set()) == hop0.get(s, set())
    # a node expanded at hop 1 gets the same neighbors in whichever batch expands it
    other = sampler.sample(torch.randperm(300, generator=torch.Generator().manual_seed(4))[:60])
    hop1_a, hop1_b = _sampled_sets(together, 1), _sampled_sets(other, 1)
    shared = set(hop1_a) & set(hop1_b)
    assert shared
    assert all(hop1_a[v] == hop1_b[v] for v in shared)
    again = sampler.sample(batch)
    assert torch.equal(again.n_id, together.n_id)
    assert torch.equal(again.blocks[0].edge_index, together.blocks[0].edge_index)
    reseeded = NeighborSampler(rowptr, col, (4, 3), consistent=True, seed=8).sample(batch)
    assert _sampled_sets(reseeded, 0) != hop0


@pytest.mark.parametrize("mode", MODES)
def test_thread_safe(mode: str) -> None:
    rowptr, col = _random_graph()
    sampler = _sampler(rowptr, col, (5, 3), mode)
    batches = [torch.arange(i, i + 30) for i in range(0, 240, 20)]

    def run(i: int) -> SampledSubgraph:
        return sampler.sample(batches[i], torch.Generator().manual_seed(i))

    expected = [run(i) for i in range(len(batches))]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(run, range(len(batches))))
    for e, g in zip(expected, got, strict=True):
        assert torch.equal(e.n_id, g.n_id)
        assert torch.equal(e.blocks[0].edge_index, g.blocks[0].edge_index)


# -- uniformity -----------------------------------------------------------------------------


def _chi_square_uniform(observed: list[int]) -> bool:
    """Pearson's test against equal frequencies at level 1e-3.

    The critical value is the Wilson-Hilferty approximation of the chi-square 0.999 quantile
    (within 1% of the exact one for these degrees of freedom), so scipy is not needed.
    """
    total, k = sum(observed), len(observed)
    stat = sum((o - total / k) ** 2 for o in observed) / (total / k)
    df, z = k - 1, 3.0902  # z: the standard normal 0.999 quantile
    critical = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat < critical


def _draws(mode: str, degree: int, fanout: int, num_hubs: int, rounds: int) -> list[list[int]]:
    """Sampled neighbor positions (0..degree-1) of every hub in every round."""
    rowptr, col = _star(num_hubs, degree)
    hubs = torch.arange(num_hubs)
    random = NeighborSampler(rowptr, col, (fanout,))
    g = torch.Generator().manual_seed(0)
    out = []
    for r in range(rounds):
        # consistent mode: a new sampler seed each round (hubs also differ by node id)
        sampler = random if mode == "random" else _sampler(rowptr, col, (fanout,), mode, seed=r)
        sub = sampler.sample(hubs, g)
        src, dst = sub.n_id[sub.blocks[0].edge_index].tolist()
        per_hub: dict[int, list[int]] = {}
        for s, d in zip(src, dst, strict=True):
            per_hub.setdefault(d, []).append((s - num_hubs) % degree)
        out.extend(per_hub.values())
    return out


@pytest.mark.parametrize("mode", MODES)
def test_uniform_marginals_degree_50_fanout_10(mode: str) -> None:
    draws = _draws(mode, degree=50, fanout=10, num_hubs=50, rounds=60)  # 3000 draws
    assert all(len(d) == 10 == len(set(d)) for d in draws)
    counts = Counter(p for d in draws for p in d)
    assert _chi_square_uniform([counts[p] for p in range(50)])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("degree", "fanout"), [(5, 2), (7, 6), (6, 3)])
def test_uniform_subsets(mode: str, degree: int, fanout: int) -> None:
    # joint uniformity: every fanout-subset of the neighbors is equally likely (Floyd's claim)
    draws = _draws(mode, degree=degree, fanout=fanout, num_hubs=200, rounds=20)  # 4000 draws
    counts = Counter(tuple(sorted(d)) for d in draws)
    subsets = list(combinations(range(degree), fanout))
    assert set(counts) == set(subsets)
    assert _chi_square_uniform([counts[s] for s in subsets])


# -- blocks through a real PyG convolution ---------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_blocks_run_through_sage_conv(mode: str) -> None:
    rowptr, col = _random_graph()
    torch.manual_seed(0)
    convs = [SAGEConv(8, 16), SAGEConv(16, 4)]
    x_all = torch.randn(300, 8)
    seeds = torch.arange(100, 164)
    sub = _sampler(rowptr, col, (5, 3), mode).sample(seeds)
    x = x_all[sub.n_id]
    for conv, block in zip(convs, sub.blocks, strict=True):
        x = conv((x, x[: block.size[1]]), block.edge_index, size=block.size)
    assert x.shape == (sub.batch_size, 4)


def test_full_fanouts_match_full_graph_sage() -> None:
    # with fanouts (-1, -1) the sampled computation is the exact full-graph one at the seeds
    rowptr, col = _random_graph()
    torch.manual_seed(0)
    convs = [SAGEConv(8, 16), SAGEConv(16, 4)]
    x_all = torch.randn(300, 8)
    dst = torch.repeat_interleave(torch.arange(300), rowptr.diff())
    edge_index = torch.stack([col, dst])
    full = convs[1](convs[0](x_all, edge_index).relu(), edge_index)
    seeds = torch.randperm(300, generator=torch.Generator().manual_seed(5))[:50]
    sub = NeighborSampler(rowptr, col, (-1, -1)).sample(seeds)
    x = x_all[sub.n_id]
    for i, (conv, block) in enumerate(zip(convs, sub.blocks, strict=True)):
        x = conv((x, x[: block.size[1]]), block.edge_index, size=block.size)
        x = x.relu() if i == 0 else x
    torch.testing.assert_close(x, full[seeds])


def test_to_device_keeps_layout() -> None:
    rowptr, col = _random_graph()
    sub = NeighborSampler(rowptr, col, (3, 2)).sample(torch.arange(10))
    moved = sub.to("cpu")
    assert torch.equal(moved.n_id, sub.n_id) and moved.num_sampled_nodes == sub.num_sampled_nodes
    assert [b.size for b in moved.blocks] == [b.size for b in sub.blocks]
    assert isinstance(moved.blocks[0], Block)


# -- invalid input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fanouts", "error", "match"),
    [
        ((), ValueError, r"NeighborSampler: fanouts must hold one int per hop \(got \[\]\)"),
        ((0,), ValueError, r"NeighborSampler: fanouts must be ints >= 1 or -1 \(got \[0\]\)"),
        ((5, -2), ValueError, r"fanouts must be ints >= 1 or -1 \(got \[-2\]\)"),
        ((2.5,), TypeError, r"fanouts must be ints >= 1 or -1 \(got \[2.5\]\)"),
        ((True,), TypeError, r"fanouts must be ints >= 1 or -1"),
        (10, TypeError, r"fanouts must be a sequence of ints \(got 10\)"),
    ],
)
def test_invalid_fanouts(fanouts: object, error: type[Exception], match: str) -> None:
    rowptr, col = _random_graph()
    with pytest.raises(error, match=match):
        NeighborSampler(rowptr, col, fanouts)


def test_invalid_graph() -> None:
    rowptr, col = _random_graph()
    with pytest.raises(
        TypeError, match=r"NeighborSampler: rowptr must be int64 \(got torch.int32\)"
    ):
        NeighborSampler(rowptr.int(), col, (2,))
    with pytest.raises(TypeError, match=r"col must be a torch.Tensor \(got list\)"):
        NeighborSampler(rowptr, col.tolist(), (2,))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"rowptr must start at 0 and end at col.numel\(\)"):
        NeighborSampler(rowptr, col[:-1], (2,))
    with pytest.raises(ValueError, match=r"col must hold node ids in \[0, 300\)"):
        NeighborSampler(rowptr, col + 1, (2,))
    with pytest.raises(TypeError, match=r"consistent must be a bool"):
        NeighborSampler(rowptr, col, (2,), consistent=1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("seeds", "error", "match"),
    [
        (torch.tensor([1, 300]), ValueError, r"seeds must be node ids in \[0, 300\) \(got 300\)"),
        (torch.tensor([-1, 3]), ValueError, r"seeds must be node ids in \[0, 300\) \(got -1\)"),
        (
            torch.tensor([1, 2], dtype=torch.int32),
            TypeError,
            r"seeds must be int64 \(got torch.int32\)",
        ),
        (torch.tensor([1.0]), TypeError, r"seeds must be int64 \(got torch.float32\)"),
        ([1, 2], TypeError, r"seeds must be an int64 torch.Tensor \(got list\)"),
        (torch.tensor([[1, 2]]), ValueError, r"seeds must be 1-D \(got shape \(1, 2\)\)"),
    ],
)
def test_invalid_seeds(seeds: object, error: type[Exception], match: str) -> None:
    rowptr, col = _random_graph()
    sampler = NeighborSampler(rowptr, col, (2,))
    with pytest.raises(error, match=r"NeighborSampler.sample: " + match):
        sampler.sample(seeds)
    assert sampler.sample(torch.tensor([1])).n_id.tolist()[0] == 1  # still usable


def test_repr_and_properties() -> None:
    rowptr, col = _random_graph()
    sampler = NeighborSampler(rowptr, col, [25, 10], consistent=True, seed=3)
    assert sampler.fanouts == (25, 10) and sampler.num_nodes == 300
    assert sampler.num_edges == col.numel() and sampler.device == torch.device("cpu")
    assert repr(sampler) == (
        f"NeighborSampler(num_nodes=300, num_edges={col.numel()}, fanouts=(25, 10), "
        "consistent=True)"
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", MODES)
def test_cuda_matches_cpu(mode: str) -> None:
    rowptr, col = _random_graph()
    seeds = torch.arange(20, 80)
    cpu = _sampler(rowptr, col, (5, 3), mode).sample(seeds, torch.Generator().manual_seed(0))
    gpu_sampler = _sampler(rowptr.cuda(), col.cuda(), (5, 3), mode)
    gen = torch.Generator(device="cuda").manual_seed(0)
    gpu = gpu_sampler.sample(seeds, gen if mode == "random" else None)
    assert gpu.n_id.is_cuda and gpu.blocks[0].edge_index.is_cuda
    _check_semantics(gpu.to("cpu"), rowptr, col, seeds)
    if mode == "consistent":  # hashed draws are bit-identical across devices
        assert torch.equal(gpu.n_id.cpu(), cpu.n_id)
        assert torch.equal(gpu.blocks[0].edge_index.cpu(), cpu.blocks[0].edge_index)
