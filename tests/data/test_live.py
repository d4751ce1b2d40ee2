"""The live graph: validated writes, the overlay the sampler reads, the log and compaction."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnaas.data.live import (
    LiveGraph,
    Staleness,
    WriteError,
    WriteLog,
    compact,
    open_live,
    read_live,
    state_folder,
    writes_since,
)
from gnnaas.data.store import GraphStore
from gnnaas.inference.lookup import PrecomputedAnswers
from gnnaas.sampling import DepthSampler


def _store(n: int = 30, f: int = 4) -> GraphStore:
    g = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, n, (2, 120), generator=g)
    keep = src != dst
    edge_index = torch.unique(torch.stack([src[keep], dst[keep]]), dim=1)
    x = torch.randn(n, f, generator=g)
    return GraphStore.from_edge_index(
        "live-toy", edge_index, x, torch.zeros(n, dtype=torch.long), 2
    )


def _graph(store: GraphStore, capacity: int = 40) -> LiveGraph:
    return LiveGraph(store.rowptr, store.col, store.x, capacity=capacity)


def _state(graph: LiveGraph) -> tuple[int, int, list[list[int]], torch.Tensor]:
    lists = [graph.neighbors(i).tolist() for i in range(graph.num_nodes)]
    return graph.version, graph.num_nodes, lists, graph.features()[: graph.num_nodes].clone()


def test_new_nodes_edges_and_features_apply_in_place() -> None:
    store = _store()
    graph = _graph(store)
    keep = torch.tensor([3, 1])
    subset = graph.features(keep)  # registered before the write: updated in place
    assert subset.shape == (40, 2) and torch.equal(subset[:30], store.x[:, [3, 1]])
    write = graph.stage().add_nodes([[1, 2, 3, 4], [5, 6, 7, 8]], [[-1, -2], [0, -1], [-2, 5]])
    assert write.first_id == 30
    graph.apply(write)
    assert graph.num_nodes == 32 and graph.version == 1
    assert graph.neighbors(31).tolist() == [30] and graph.neighbors(30).tolist() == [0]
    assert 31 in graph.neighbors(5).tolist() and graph.has_edge(31, 5)
    assert subset[31].tolist() == [8.0, 6.0]
    assert graph.features(torch.tensor([0]))[30].tolist() == [1.0]  # registered after
    assert graph.features()[31].tolist() == [5, 6, 7, 8]

    s, t = int(store.col[0]), 0  # an existing edge s -> 0
    graph.apply(graph.stage().change_edges(add=[[7, 31]], remove=[[s, t]]))
    assert not graph.has_edge(s, t) and graph.has_edge(7, 31) and graph.version == 2
    graph.apply(graph.stage().set_features(3, [0, 0, 0, 9]))
    assert graph.features()[3].tolist() == [0, 0, 0, 9] and subset[3].tolist() == [9.0, 0.0]
    rowptr, col = graph.merged_csr()
    merged = [col[rowptr[i] : rowptr[i + 1]].tolist() for i in range(graph.num_nodes)]
    assert merged == [graph.neighbors(i).tolist() for i in range(graph.num_nodes)]
    assert graph.stats()["overlay_nodes"] >= 4


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda s: s.add_nodes([[1, 2, 3]]), "must have 4 values per node"),
        (lambda s: s.add_nodes([[1, 2, 3, float("nan")]]), "row 0 holds NaN"),
        (lambda s: s.add_nodes([[1, 2, 3, 4]], [[0, 99]]), r"edges\[0\] = \[0, 99\]"),
        (lambda s: s.add_nodes([[1, 2, 3, 4]], [[0, -2]]), r"edges\[0\] = \[0, -2\]"),
        (lambda s: s.add_nodes([[0.0] * 4] * 11), "holds at most 40 nodes"),
        (lambda s: s.add_nodes([]), "must have 4 values"),
        (lambda s: s.change_edges(remove=[[0, 0]]), r"remove\[0\] = \[0, 0\] is not in the graph"),
        (lambda s: s.change_edges(add=[[1, 2], [1, 2]]), r"add\[1\] = \[1, 2\] is already"),
        (lambda s: s.change_edges(add=[[0, 30]]), r"add\[0\] = \[0, 30\]: node ids must lie"),
        (lambda s: s.change_edges(add=[[0.5, 1]]), "must be integers"),
        (lambda s: s.change_edges(add="x"), "pairs"),
        (lambda s: s.change_edges(), "at least one edge"),
        (lambda s: s.set_features(30, [1, 2, 3, 4]), "node 30 is not in the graph"),
        (lambda s: s.set_features(0, [1, 2]), "4 values per node"),
    ],
)
def test_a_bad_write_names_the_offender_and_changes_nothing(call, message) -> None:  # type: ignore[no-untyped-def]
    graph = _graph(_store())
    graph.features(torch.tensor([0, 2]))
    before = _state(graph)
    with pytest.raises(WriteError, match=message):
        call(graph.stage())
    after = _state(graph)
    assert before[:3] == after[:3] and torch.equal(before[3], after[3])


def test_size_limits_and_group_validation() -> None:
    graph = _graph(_store())
    graph.max_write_edges = 2
    with pytest.raises(WriteError, match="at most 2 edges"):
        graph.stage().change_edges(add=[[1, 2], [2, 3], [3, 4]])
    staging = graph.stage()  # a group: later writes see the earlier ones
    first = staging.add_nodes([[0, 0, 0, 0]])
    second = staging.change_edges(add=[[30, 1]])  # node 30 exists once the first applies
    third = staging.change_edges(remove=[[30, 1]])
    with pytest.raises(WriteError, match="not in the graph"):
        staging.change_edges(remove=[[30, 1]])
    for w in (first, second, third):
        graph.apply(w)
    assert graph.num_nodes == 31 and not graph.has_edge(30, 1) and graph.version == 3


def test_the_log_replays_and_a_torn_tail_is_cut(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = _store()
    graph, log, lock = open_live(store, tmp_path)
    writes = [
        graph.stage().add_nodes([[1, 1, 1, 1]], [[0, -1], [-1, 2]]),
    ]
    graph.apply(writes[0])
    w2 = graph.stage().change_edges(add=[[30, 9]], remove=[[0, 30]])
    graph.apply(w2)
    log.append([(1, writes[0].payload()), (2, w2.payload())])
    with pytest.raises(Exception, match="in use by another gnnaas process"):
        open_live(store, tmp_path)
    log.close()
    lock.__exit__(None, None, None)
    expected = _state(graph)

    path = state_folder(tmp_path, store.name) / "log.wal"
    whole = path.stat().st_size
    with path.open("ab") as f:
        f.write(b"\x10\x00\x00\x00garbage")  # a record whose write a crash cut short
    caplog.clear()  # only what the replay says
    with caplog.at_level(logging.INFO, logger="gnnaas.data.live"):
        again, log2, lock2 = open_live(store, tmp_path)
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [
        (
            "WARNING",
            f"{store.name}: cut a torn last record (11 bytes) off {path}: a crash while it was "
            "written, so it was never acknowledged",
        ),
        ("INFO", f"{store.name}: replayed 2 log records (graph version 2)"),
    ]
    caplog.clear()
    got = _state(again)
    assert got[:3] == expected[:3] and torch.equal(got[3], expected[3])
    assert path.stat().st_size == whole  # the torn tail is gone
    log2.close()
    lock2.__exit__(None, None, None)

    summary = compact(store, tmp_path)
    assert summary["version"] == 2 and summary["num_nodes"] == 31 and summary["records"] == 2
    assert path.stat().st_size == 0
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gnnaas.data.live"):
        folded, log3, lock3 = open_live(store, tmp_path)
    assert caplog.messages == [f"{store.name}: replayed 0 log records (graph version 2)"]
    got = _state(folded)
    assert got[:3] == expected[:3] and torch.equal(got[3], expected[3])
    assert folded.overlay_arrays() is None  # everything is in the new base
    log3.close()
    lock3.__exit__(None, None, None)


@pytest.mark.usefixtures("umask_022")
def test_compacted_snapshot_reads_like_any_file(tmp_path: Path) -> None:
    store = _store()
    graph, log, lock = open_live(store, tmp_path)
    w = graph.stage().add_nodes([[2, 2, 2, 2]], [[0, -1]])
    graph.apply(w)
    log.append([(1, w.payload())])
    log.close()
    lock.__exit__(None, None, None)
    compact(store, tmp_path)
    folder = state_folder(tmp_path, store.name)
    for name in ("snapshot.safetensors", "log.wal"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o644, name  # not 0600


def test_a_crash_between_snapshot_and_log_reset_replays_nothing_twice(tmp_path: Path) -> None:
    store = _store()
    graph, log, lock = open_live(store, tmp_path)
    w = graph.stage().add_nodes([[2, 2, 2, 2]], [[0, -1]])
    graph.apply(w)
    log.append([(1, w.payload())])
    log.close()
    lock.__exit__(None, None, None)
    path = state_folder(tmp_path, store.name) / "log.wal"
    kept = path.read_bytes()
    compact(store, tmp_path)
    path.write_bytes(kept)  # as if the crash came before the empty log replaced this one
    again, log2, lock2 = open_live(store, tmp_path)
    assert again.num_nodes == 31 and again.version == 1  # the record was skipped by version
    log2.close()
    lock2.__exit__(None, None, None)


def test_write_log_records_carry_version_and_checksum(tmp_path: Path) -> None:
    log = WriteLog(tmp_path / "x.wal")
    log.append([(1, b'{"a":1}'), (2, b'{"b":2}')])
    log.close()
    assert [(v, p) for v, p, _ in WriteLog.read(tmp_path / "x.wal")] == [
        (1, b'{"a":1}'),
        (2, b'{"b":2}'),
    ]
    data = bytearray((tmp_path / "x.wal").read_bytes())
    data[-1] ^= 0xFF  # a flipped bit in the last payload: that record is not trusted
    (tmp_path / "x.wal").write_bytes(bytes(data))
    assert [v for v, _, _ in WriteLog.read(tmp_path / "x.wal")] == [1]


@pytest.mark.parametrize("fast_path", [True, False])
def test_the_sampler_reads_the_live_graph(fast_path: bool) -> None:
    store = _store()
    graph = _graph(store)
    sampler = DepthSampler(store.rowptr, store.col, (-1, -1), fast_path=fast_path, live=graph)
    target = 0
    before = sampler.sample(torch.tensor([target]))
    graph.apply(graph.stage().add_nodes([[1, 1, 1, 1]], [[-1, target]]))
    new = 30
    after = sampler.sample(torch.tensor([target]))
    assert new in after.n_id.tolist() and new not in before.n_id.tolist()
    alone = sampler.sample(torch.tensor([new]))  # a new node can be a seed
    assert alone.n_id[0].item() == new and alone.num_sampled_nodes[1] == 0  # no in-edges yet
    first = int(graph.neighbors(target)[0])
    graph.apply(graph.stage().change_edges(remove=[[first, target]]))
    hop1 = sampler.sample(torch.tensor([target]))
    level1 = hop1.n_id[1 : 1 + hop1.num_sampled_nodes[1]].tolist()
    assert first not in level1 and new in level1
    with pytest.raises(ValueError, match=r"node ids in \[0, 31\)"):
        sampler.sample(torch.tensor([31]))


def test_compiled_and_torch_paths_sample_the_same_live_tree() -> None:
    from gnnaas.sampling import fastpath

    if not fastpath.available():
        pytest.skip("the compiled sampler did not compile here")
    store = _store()
    graph = _graph(store)
    graph.apply(graph.stage().add_nodes([[1, 1, 1, 1]] * 2, [[-1, 3], [-2, -1], [4, -2]]))
    graph.apply(graph.stage().change_edges(add=[[31, 7]], remove=[[int(graph.neighbors(5)[0]), 5]]))
    fast = DepthSampler(store.rowptr, store.col, (3, 2), live=graph)
    slow = DepthSampler(store.rowptr, store.col, (3, 2), live=graph, fast_path=False)
    for seeds in (torch.tensor([3, 5, 7]), torch.tensor([30, 31]), torch.arange(32)):
        a, b = fast.sample(seeds), slow.sample(seeds)
        assert a.num_sampled_nodes == b.num_sampled_nodes
        rows_a = sorted(zip(a.n_id.tolist(), _depths(a), strict=True))
        rows_b = sorted(zip(b.n_id.tolist(), _depths(b), strict=True))
        assert rows_a == rows_b
    assert np.array_equal(graph.neighbors(30), np.array([31]))


def _depths(sub) -> list[int]:  # type: ignore[no-untyped-def]
    return torch.repeat_interleave(
        torch.arange(len(sub.num_sampled_nodes)), torch.tensor(sub.num_sampled_nodes)
    ).tolist()


def test_a_group_committed_at_once_equals_its_writes_one_by_one() -> None:
    store = _store()
    one, group = _graph(store), _graph(store)
    for g in (one, group):
        g.features(torch.tensor([1, 3]))
    staging = group.stage()
    writes = [
        staging.add_nodes([[1, 2, 3, 4], [5, 6, 7, 8]], [[-1, 0], [-2, -1]]),
        staging.change_edges(add=[[30, 4], [31, 4]], remove=[[int(group.neighbors(4)[0]), 4]]),
        staging.change_edges(remove=[[30, 4]], add=[[4, 30]]),
        staging.set_features(31, [0, 0, 0, 1]),
        staging.add_nodes([[9, 9, 9, 9]], [[-1, 31], [0, -1]]),
    ]
    group.commit(group.prepare(writes))
    for w in writes:
        one.apply(w)
    a, b = _state(one), _state(group)
    assert a[:3] == b[:3] and torch.equal(a[3], b[3])
    assert torch.equal(
        one.features(torch.tensor([1, 3]))[:33], group.features(torch.tensor([1, 3]))[:33]
    )
    assert group.version == 5 and group.stats()["edge_updates"] == one.stats()["edge_updates"]


def test_the_overlay_repack_keeps_every_current_list() -> None:
    store = _store()
    graph = _graph(store)
    graph.apply(graph.stage().add_nodes([[1, 1, 1, 1]], [[-1, 2], [2, -1]]))
    for i in range(40):  # the same targets again and again: superseded lists pile up
        s, t = (i % 29) + 1, 0
        staging = graph.stage()
        w = (
            staging.change_edges(remove=[[s, t]])
            if graph.has_edge(s, t)
            else staging.change_edges(add=[[s, t]])
        )
        graph.apply(w)
    before = _state(graph)
    garbage = graph._over_col.size
    graph._repack()
    assert (
        graph._over_col.size < garbage and graph._over_col.size == graph.stats()["overlay_entries"]
    )
    after = _state(graph)
    assert before[:3] == after[:3]
    graph.apply(graph.stage().change_edges(add=[[5, 30]]))  # still writable after the repack
    assert graph.has_edge(5, 30) and graph.has_edge(2, 30)


def test_a_damaged_record_before_others_is_an_error_not_a_torn_tail(tmp_path: Path) -> None:
    from gnnaas.errors import ArtifactError

    path = tmp_path / "x.wal"
    log = WriteLog(path)
    log.append([(1, b'{"a":1}'), (2, b'{"b":2}')])
    log.close()
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF  # inside the first payload: the second record (acknowledged) follows
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="damaged at byte 0"):
        list(WriteLog.read(path))
    assert path.read_bytes() == bytes(data)  # nothing cut off


def _chain() -> LiveGraph:
    """A directed chain 0 → 1 → 2 → 3 → 4 → 5 (each node's in-neighbor is its predecessor)."""
    edge_index = torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]])
    store = GraphStore.from_edge_index("chain", edge_index, torch.zeros(6, 2), torch.zeros(6), 2)
    return LiveGraph(store.rowptr, store.col, store.x, capacity=8)


def test_staleness_marks_the_changed_nodes_and_k_hops_downstream() -> None:
    graph = _chain()
    staleness = Staleness(graph, hops=2, num_nodes=6)
    assert staleness.stale[:6].sum() == 0 and staleness.stale[6:].all()  # beyond: no answer yet
    write = graph.stage().set_features(1, [1.0, 1.0])
    graph.apply(write)
    assert staleness.mark([write]) == 3
    assert staleness.stale[:6].nonzero()[0].tolist() == [1, 2, 3]  # downstream only
    assert staleness.stale_fraction == pytest.approx(3 / 6)
    # an added edge 5 -> 0 changes 0's aggregation: 0 and two hops downstream of it (1, 2
    # already), and then 3's change reaches 4 and 5 through a later write at 3
    edges = graph.stage().change_edges(add=[[5, 0]])
    graph.apply(edges)
    staleness.mark([edges])
    assert staleness.stale[:6].nonzero()[0].tolist() == [0, 1, 2, 3]
    again = graph.stage().set_features(3, [2.0, 2.0])
    graph.apply(again)
    staleness.mark([again])  # 3 was stale already: its downstream is marked all the same
    assert staleness.stale[:6].all()


def test_staleness_follows_edges_added_since_the_base() -> None:
    graph = _chain()
    staleness = Staleness(graph, hops=1, num_nodes=6)
    added = graph.stage().change_edges(add=[[5, 2]])  # 5 -> 2: 5's changes now reach 2
    graph.apply(added)
    staleness.mark([added])
    assert staleness.stale[:6].nonzero()[0].tolist() == [2, 3]
    feature = graph.stage().set_features(5, [1.0, 1.0])
    graph.apply(feature)
    staleness.mark([feature])
    assert staleness.stale[:6].nonzero()[0].tolist() == [2, 3, 5]


def test_read_live_and_writes_since_read_the_state_without_the_lock(tmp_path: Path) -> None:
    store = _store()
    graph, log, lock = open_live(store, tmp_path)
    try:
        for node in (1, 2):
            write = graph.stage().set_features(node, [float(node)] * store.num_features)
            log.append([(graph.version + 1, write.payload())])
            graph.apply(write)
        seen = read_live(store, tmp_path)  # beside the holder of the lock
        assert seen.version == 2 and seen.features()[2, 0] == 2.0
        since = writes_since(store, tmp_path, 1)
        assert since is not None and [w.node for w in since] == [2]
    finally:
        log.close()
        lock.__exit__(None, None, None)
    compact(store, tmp_path)
    assert writes_since(store, tmp_path, 1) is None  # folded into the snapshot: unknown
    assert writes_since(store, tmp_path, 2) == []


def test_precomputed_answers_cover_a_static_graph_only() -> None:
    """The router skips the per-node check only where no node can be stale: no writes tracked and
    a row for every node."""
    static = PrecomputedAnswers(torch.zeros(6, 2), None, 0)
    assert static.covers(6) and static.covers(5) and not static.covers(7)
    assert not static.any_stale(np.array([0, 5])) and static.any_stale(np.array([6]))
    live = PrecomputedAnswers(torch.zeros(6, 2), None, 0, Staleness(_chain(), hops=2, num_nodes=6))
    assert not live.covers(6)  # a write may make any node stale: checked per request
