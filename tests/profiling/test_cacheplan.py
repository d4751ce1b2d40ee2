"""Cache planning on hand-made graphs whose reads and hit ratios are computed by hand."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
import torch

from gnnaas.data.store import GraphStore
from gnnaas.profiling.cacheplan import (
    CACHE_PLAN_COLUMNS,
    CACHE_PLAN_FILE,
    PlannedVariant,
    count_reads,
    plan_cache,
    write_cache_plan,
)
from gnnaas.runtime.caches import (
    NodeRanking,
    assign_cache_nodes,
    degree_ranking,
    read_cache_ranking,
    split_budget,
)
from gnnaas.sampling import DepthSampler


def _graph(name: str, edges: list[tuple[int, int]], num_nodes: int, val: list[int]) -> GraphStore:
    """An undirected graph (each edge both ways) with ``val`` as its validation nodes."""
    pairs = edges + [(b, a) for a, b in edges]
    edge_index = torch.tensor(pairs, dtype=torch.long).t()
    x = torch.zeros(num_nodes, 8)
    y = torch.zeros(num_nodes, dtype=torch.long)
    return GraphStore.from_edge_index(
        name, edge_index, x, y, 2, val_idx=torch.tensor(val, dtype=torch.long)
    )


def star() -> GraphStore:
    """Node 0 linked to leaves 1..4; the leaves are the validation nodes."""
    return _graph("star", [(0, i) for i in range(1, 5)], 5, [1, 2, 3, 4])


def path5() -> GraphStore:
    """0 - 1 - 2 - 3 - 4; every node is a validation node."""
    return _graph("path", [(i, i + 1) for i in range(4)], 5, [0, 1, 2, 3, 4])


def _ratio(plan_row: object) -> Fraction:
    return Fraction(plan_row.hit_ratio).limit_denominator(1000)  # type: ignore[attr-defined]


def test_star_one_hop_one_seed_per_batch() -> None:
    # Each leaf's batch reads [leaf, 0]: node 0 four times, each leaf once; 8 reads in all.
    store = star()
    sampler = DepthSampler(store.rowptr, store.col, (10,))
    reads = count_reads(sampler, store.val_idx, 5, batch_size=1)
    assert reads.tolist() == [4, 1, 1, 1, 1]
    variants = [PlannedVariant("wide", 2, (10,)), PlannedVariant("narrow", 1, (10,))]
    plan = plan_cache(store, variants, 8, batch_size=1)  # rows of 8 and 4 bytes
    wide, narrow = plan.rows
    assert (wide.cached_nodes, _ratio(wide)) == (1, Fraction(4, 8))  # node 0
    # two nodes: 0 and leaf 1 (leaves tie; the lower id first)
    assert (narrow.cached_nodes, _ratio(narrow)) == (2, Fraction(5, 8))
    assert plan.rankings[(10,)].order.tolist() == [0, 1, 2, 3, 4]


def test_star_one_batch_reads_each_row_once_per_depth() -> None:
    # One batch of the four leaves: depth 0 the leaves, depth 1 node 0 once: 5 reads.
    store = star()
    plan = plan_cache(store, [PlannedVariant("v", 2, (10,))], 8, batch_size=1024)
    assert plan.rankings[(10,)].total_reads == 5
    assert _ratio(plan.rows[0]) == Fraction(1, 5)


def test_star_two_hops_favours_the_leaves_and_beats_degree() -> None:
    # Leaf l's batch: [l], [0], [1, 2, 3, 4]. Over 4 batches node 0 is read 4 times and each
    # leaf 1 + 4 = 5 times: 24 reads. Degree ranking caches node 0 first (4 of 24).
    store = star()
    by_access = plan_cache(store, [PlannedVariant("v", 1, (10, 10))], 4, batch_size=1)
    ranking = by_access.rankings[(10, 10)]
    assert ranking.order.tolist() == [1, 2, 3, 4, 0]
    assert ranking.reads.tolist() == [5, 5, 5, 5, 4]
    for k, expected in ((1, Fraction(5, 24)), (2, Fraction(10, 24)), (5, Fraction(1))):
        plan = plan_cache(store, [PlannedVariant("v", 1, (10, 10))], 4 * k, batch_size=1)
        assert plan.rows[0].cached_nodes == k and _ratio(plan.rows[0]) == expected
    by_degree = plan_cache(store, [PlannedVariant("v", 1, (10, 10))], 4, by="degree", batch_size=1)
    assert by_degree.rankings[(10, 10)].order.tolist()[0] == 0
    assert _ratio(by_degree.rows[0]) == Fraction(4, 24)


def test_path_graph() -> None:
    # Seeds 0..4 one at a time, one hop: the ends are read 2 times, the middle nodes 3: 13.
    store = path5()
    plan = plan_cache(store, [PlannedVariant("v", 3, (-1,))], 2 * 12, batch_size=1)
    ranking = plan.rankings[(-1,)]
    assert ranking.reads.tolist() == [3, 3, 3, 2, 2]
    assert ranking.order.tolist() == [1, 2, 3, 0, 4]
    assert plan.rows[0].cached_nodes == 2 and _ratio(plan.rows[0]) == Fraction(6, 13)
    assert plan.rows[0].row_bytes == 12


def test_recorded_seeds_and_the_degree_fallback() -> None:
    # A star plus the pair 5 - 6; traffic only ever asks for node 5: reads [5, 6].
    store = _graph("star+pair", [(0, i) for i in range(1, 5)] + [(5, 6)], 7, [1])
    seeds = torch.tensor([5, 5, 5])  # repeats in one batch are served once
    access = plan_cache(
        store, [PlannedVariant("v", 1, (3,))], 4, seeds=seeds, seeds_name="traffic.npy"
    )
    assert _ratio(access.rows[0]) == Fraction(1, 2) and access.num_seeds == 3
    degree = plan_cache(store, [PlannedVariant("v", 1, (3,))], 4, seeds=seeds, by="degree")
    assert _ratio(degree.rows[0]) == 0  # node 0 has the most neighbors; nobody reads it
    fallback = degree_ranking(store.col, 7)
    assert fallback.order.tolist()[:1] == [0] and fallback.reads.tolist()[0] == 4


def test_a_budget_larger_than_the_graph_caches_every_node() -> None:
    plan = plan_cache(star(), [PlannedVariant("v", 2, (10,))], 10**9)
    assert plan.rows[0].cached_nodes == 5 and plan.rows[0].hit_ratio == 1.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"variants": []}, "variants must name at least one variant"),
        ({"budget_bytes": 0}, r"budget_bytes must be >= 1 \(got 0\)"),
        ({"by": "random"}, r"by must be 'access' or 'degree' \(got 'random'\)"),
        ({"seeds": torch.tensor([], dtype=torch.long)}, "no planning seeds"),
    ],
)
def test_plan_rejects_bad_input(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"variants": [PlannedVariant("v", 1, (2,))], "budget_bytes": 8}
    args.update(kwargs)
    with pytest.raises(ValueError, match=f"plan_cache: {match}"):
        plan_cache(star(), **args)  # type: ignore[arg-type]


def test_plan_files_round_trip(tmp_path: Path) -> None:
    store = star()
    variants = [PlannedVariant("a", 2, (10, 10)), PlannedVariant("b", 1, (10,))]
    plan = plan_cache(store, variants, 8, batch_size=1, sampler_seed=3)
    table, ranking_file = write_cache_plan(plan, tmp_path / "star")
    assert table.name == CACHE_PLAN_FILE and not list(tmp_path.glob("star/.*"))
    lines = table.read_text().splitlines()
    assert lines[0] == ",".join(CACHE_PLAN_COLUMNS) and len(lines) == 3
    assert lines[1].startswith("star,a,10-10,2,8,7.62939e-06,1,0.2,")
    shape = {"num_nodes": 5, "num_edges": 8}
    ranking, source = read_cache_ranking(tmp_path / "star", (10, 10), sampler_seed=3, **shape)
    assert ranking is not None and str(ranking_file) in source and "by access" in source
    assert torch.equal(ranking.order, plan.rankings[(10, 10)].order)
    assert torch.equal(ranking.reads, plan.rankings[(10, 10)].reads)
    for fanouts, kwargs, why in (
        ((10, 10), {"sampler_seed": 0, **shape}, "another graph or sampler (sampler_seed)"),
        ((10, 10), {"sampler_seed": 3, "num_nodes": 6, "num_edges": 8}, "(num_nodes)"),
        ((25, 10), {"sampler_seed": 3, **shape}, "no plan for fanouts 25-10"),
    ):
        none, reason = read_cache_ranking(tmp_path / "star", fanouts, **kwargs)  # type: ignore[arg-type]
        assert none is None and why in reason, reason
    none, reason = read_cache_ranking(tmp_path / "nowhere", (10,), **shape)
    assert none is None and "no cache_ranking.safetensors" in reason


# -- one budget over several variants ------------------------------------------------------------


def _ranking(reads: list[int]) -> NodeRanking:
    return NodeRanking(torch.arange(len(reads)), torch.tensor(reads))


A = (_ranking([8, 4, 0, 0]), 4)  # 12 reads, rows of 4 bytes
B = (_ranking([5, 3, 2, 0]), 2)  # 10 reads, rows of 2 bytes


def test_split_follows_the_marginal_hit_gain() -> None:
    # Per 2-byte step, equal shares (hit-ratio gain x 0.5): B's first row 0.25 beats A's half
    # row 1/6; then A, A (1/6 each) over B's 0.15; then B, B (0.15, 0.1) over A's 1/12; then A.
    assert split_budget(12, {"A": A, "B": B}, step_bytes=2) == {"A": 6, "B": 6}
    # A's traffic share 0.9: its half rows gain 0.3 against B's 0.05.
    assert split_budget(4, {"A": A, "B": B}, {"A": 9, "B": 1}, step_bytes=2) == {"A": 4, "B": 0}
    # Past 8 + 6 useful bytes the rest is spread by share (13 each).
    assert split_budget(40, {"A": A, "B": B}, step_bytes=2) == {"A": 21, "B": 19}


@pytest.mark.parametrize("budget", [0, 1, 7, 2**20 - 1, 2**20, 5 * 2**20 + 3, 10**10])
@pytest.mark.parametrize("shares", [None, {"A": 1.0, "B": 3.0, "C": 0.5}, {"C": 1.0}])
def test_split_adds_up_to_the_budget(budget: int, shares: dict[str, float] | None) -> None:
    g = torch.Generator().manual_seed(budget % 97)
    variants = {
        key: (_ranking(sorted(torch.randint(0, 50, (1000,), generator=g).tolist())[::-1]), width)
        for key, width in (("A", 5732), ("B", 716), ("C", 2864))
    }
    split = split_budget(budget, variants, shares)
    assert list(split) == ["A", "B", "C"] and sum(split.values()) == budget
    assert all(v >= 0 for v in split.values())
    nodes = assign_cache_nodes(budget, variants, shares)
    for key, ids in nodes.items():
        assert ids.numel() == min(split[key] // variants[key][1], 1000)
        assert torch.equal(ids, variants[key][0].order[: ids.numel()])


def test_split_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match=r"split_budget: budget_bytes must be >= 0 \(got -1\)"):
        split_budget(-1, {"A": A})
    with pytest.raises(ValueError, match=r"shares name unknown variants \['Z'\]"):
        split_budget(8, {"A": A}, {"Z": 1.0})
    with pytest.raises(ValueError, match="shares must be finite, >= 0 and not all 0"):
        split_budget(8, {"A": A}, {"A": 0.0})
    with pytest.raises(ValueError, match=r"row bytes of 'A' must be >= 1 \(got 0\)"):
        split_budget(8, {"A": (A[0], 0)})
    assert split_budget(8, {}) == {}
