"""The one execution path on a small random graph: shapes, batch independence, timings."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from gnnaas.data.store import GraphStore
from gnnaas.inference import ExecRequest, Executor, InferencePath, StageTimes, metric, score_parts
from gnnaas.models import build_model
from gnnaas.runtime import RuntimeGraph
from gnnaas.sampling import DepthSampler

NUM_CLASSES = 4


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def store() -> GraphStore:
    g = torch.Generator().manual_seed(0)
    n = 300
    edge_index = torch.randint(0, n, (2, 4000), generator=g)  # dense: batch-mates are neighbors
    x = torch.randn(n, 10, generator=g)
    y = torch.randint(0, NUM_CLASSES, (n,), generator=g)
    return GraphStore.from_edge_index("rand", edge_index, x, y, NUM_CLASSES)


def _path(store: GraphStore, fanouts: tuple[int, ...] = (5, 3)) -> InferencePath:
    torch.manual_seed(0)
    model = build_model("sage", 5, 16, NUM_CLASSES, num_layers=len(fanouts))
    keep = torch.arange(0, 10, 2)
    return InferencePath(
        model, store.feature_subset(keep), DepthSampler(store.rowptr, store.col, fanouts)
    )


def test_run_shapes_and_times(store: GraphStore) -> None:
    path = _path(store)
    seeds = torch.tensor([3, 17, 42, 99])
    logits, times, num_sampled, embeddings = path.run(seeds)
    assert embeddings is None  # only when asked for
    assert logits.shape == (4, NUM_CLASSES) and logits.device.type == "cpu"
    assert isinstance(times, StageTimes)
    assert min(times.sample_ms, times.gather_ms, times.compute_ms, times.copy_ms) >= 0
    assert times.total_ms == pytest.approx(
        times.sample_ms + times.gather_ms + times.compute_ms + times.copy_ms
    )
    assert times.comm_ms == pytest.approx(times.gather_ms + times.copy_ms)
    assert num_sampled == int(path.sampler.sample(seeds).n_id.numel()) > 4
    assert not path.model.training  # put in eval mode: no dropout at inference


def test_node_logits_do_not_depend_on_the_batch(store: GraphStore) -> None:
    path = _path(store)
    nodes = torch.randperm(store.num_nodes, generator=torch.Generator().manual_seed(1))[:48]
    alone = torch.cat([path.run(nodes[i : i + 1]).logits for i in range(48)])
    together = path.run(nodes).logits
    assert torch.allclose(together, alone, atol=1e-5)
    halves = torch.cat([path.run(nodes[:20]).logits, path.run(nodes[20:]).logits])
    assert torch.allclose(halves, alone, atol=1e-5)


def test_predict_dedupes_and_scatters_back(store: GraphStore) -> None:
    path = _path(store)
    nodes = torch.tensor([7, 3, 7, 250, 3])
    out = path.predict(nodes)
    logits, num_sampled = out.logits, out.num_sampled
    assert logits.shape == (5, NUM_CLASSES)
    assert torch.equal(logits[0], logits[2]) and torch.equal(logits[1], logits[4])
    unique = torch.tensor([3, 7, 250])
    assert num_sampled == path.run(unique).num_sampled
    assert torch.allclose(logits[[1, 0, 3]], path.run(unique).logits, atol=1e-5)


def test_embeddings_are_the_last_hidden_layer_whatever_the_batch(store: GraphStore) -> None:
    path = _path(store)
    nodes = torch.randperm(store.num_nodes, generator=torch.Generator().manual_seed(2))[:40]
    out = path.run(nodes, embed=True)
    assert out.embeddings is not None and out.embeddings.shape == (40, 16)  # hidden_channels
    assert out.embeddings.device.type == "cpu" and (out.embeddings >= 0).all()
    torch.testing.assert_close(out.logits, path.run(nodes).logits)  # the same logits
    # a node's embedding may differ between batches only by floating-point summation order
    alone = torch.cat([path.run(nodes[i : i + 1], embed=True).embeddings for i in range(40)])
    torch.testing.assert_close(out.embeddings, alone, rtol=0, atol=1e-5)
    halves = [path.run(part, embed=True).embeddings for part in (nodes[:15], nodes[15:])]
    torch.testing.assert_close(torch.cat(halves), alone, rtol=0, atol=1e-5)
    repeated = path.predict(torch.tensor([9, 4, 9]), embed=True).embeddings
    assert repeated is not None and repeated.shape == (3, 16)
    assert torch.equal(repeated[0], repeated[2])  # one row, scattered twice
    torch.testing.assert_close(repeated[:2], path.run(torch.tensor([9, 4]), embed=True).embeddings)
    emb, logits = path.forward(path.sampler.sample(nodes), embed=True)
    torch.testing.assert_close(emb, out.embeddings, rtol=0, atol=1e-5)
    torch.testing.assert_close(logits, out.logits, rtol=0, atol=1e-5)


def test_full_fanout_embeddings_are_the_full_graph_ones(store: GraphStore) -> None:
    path = _path(store, fanouts=(-1, -1))
    target = torch.repeat_interleave(torch.arange(store.num_nodes), store.rowptr.diff())
    edge_index = torch.stack([store.col, target])  # messages col -> target, as the sampler reads
    with torch.inference_mode():
        full, _ = path.model(path.features, edge_index, embed=True)  # [N, 16]
    seeds = torch.tensor([0, 42, 7, 299])
    sampled = path.run(seeds, embed=True).embeddings
    assert sampled is not None
    torch.testing.assert_close(sampled, full[seeds], rtol=1e-5, atol=1e-5)


def test_one_layer_embeddings_are_copies_of_the_input_features(store: GraphStore) -> None:
    path = _path(store, fanouts=(4,))
    first = path.run(torch.tensor([5, 8]), embed=True).embeddings
    assert first is not None
    assert torch.equal(first, path.features[[5, 8]])  # the rows themselves, copied
    path.run(torch.arange(100, 140), embed=True)  # refills the gather buffer
    assert torch.equal(first, path.features[[5, 8]])


def test_executor_gives_the_paths_logits(store: GraphStore) -> None:
    # The server's executor and the profiler's path give the same answers for the same seeds.
    path = _path(store)
    sampler = RuntimeGraph(store).sampler((5, 3))  # how the server builds it
    assert isinstance(sampler, DepthSampler) and repr(sampler) == repr(path.sampler)
    executor = Executor(path.model, path.features, sampler, name="rand/sage")
    seeds = torch.arange(0, 120, 3)
    proba = executor(
        [ExecRequest(seeds[:25], output="proba"), ExecRequest(seeds[10:], output="proba")]
    )
    served = torch.tensor(proba[0].predictions + proba[1].predictions[15:])
    profiled = torch.softmax(path.run(seeds).logits, dim=-1)
    assert torch.allclose(served, profiled, atol=1e-5)
    classes = executor([ExecRequest(seeds)])[0].predictions
    assert classes == profiled.argmax(dim=-1).tolist()
    (embedded,) = executor([ExecRequest(seeds, output="embedding")])
    torch.testing.assert_close(
        torch.tensor(embedded.predictions),
        path.run(seeds, embed=True).embeddings,
        atol=1e-5,
        rtol=0,
    )


def test_rejects_features_of_the_wrong_shape(store: GraphStore) -> None:
    model = build_model("sage", 10, 8, NUM_CLASSES)
    sampler = DepthSampler(store.rowptr, store.col, (2, 2))
    with pytest.raises(ValueError, match=r"InferencePath: features must be a 2-D"):
        InferencePath(model, store.x[:, 0], sampler)


def test_score_parts_single_label() -> None:
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
    num, den = score_parts(logits, torch.tensor([0, 2, 2]))
    assert num.tolist() == [1.0, 0.0, 1.0] and den.tolist() == [1.0, 1.0, 1.0]
    assert metric(num, den) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="one class id per row"):
        score_parts(logits, torch.tensor([0, 1]))


def test_score_parts_multi_label_sum_to_f1_micro() -> None:
    logits = torch.tensor([[1.0, -1.0, 1.0], [-1.0, -1.0, -1.0], [1.0, 1.0, -1.0]])
    y = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    num, den = score_parts(logits, y)
    # node 0: tp 1, fp 1; node 1: nothing; node 2: tp 2, fn 1
    assert num.tolist() == [2.0, 0.0, 4.0] and den.tolist() == [3.0, 0.0, 5.0]
    tp, fp, fn = 3, 1, 1
    assert metric(num, den) == pytest.approx(2 * tp / (2 * tp + fp + fn))
    assert metric(num[1:2], den[1:2]) == 1.0  # nothing to get wrong


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_path_matches_cpu(store: GraphStore) -> None:
    cpu = _path(store)
    model = build_model("sage", 5, 16, NUM_CLASSES, num_layers=2)
    model.load_state_dict(cpu.model.state_dict())
    gpu = InferencePath(model.cuda(), cpu.features, cpu.sampler, "cuda")
    for seeds in (torch.arange(1), torch.arange(0, 300, 7), torch.arange(5)):  # buffer regrows
        out = gpu.run(seeds)
        logits, times = out.logits, out.times
        assert logits.device.type == "cpu"
        assert torch.allclose(logits, cpu.run(seeds).logits, atol=1e-4)
        assert min(times.gather_ms, times.compute_ms, times.copy_ms) >= 0
        embedded = gpu.run(seeds, embed=True)
        assert embedded.embeddings is not None and embedded.embeddings.device.type == "cpu"
        expected = cpu.run(seeds, embed=True).embeddings
        torch.testing.assert_close(embedded.embeddings, expected, rtol=0, atol=1e-4)
        torch.testing.assert_close(embedded.logits, logits, rtol=0, atol=1e-4)


def test_gathers_reuse_one_buffer_up_to_its_limit(
    store: GraphStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gnnaas.inference.path as path_module

    path = _path(store)
    big, small = torch.arange(0, 200), torch.tensor([7, 3, 250])
    first = path._gather(big)
    storage = first.untyped_storage().data_ptr()
    assert torch.equal(first, path.features[big])
    again = path._gather(small)  # a smaller batch: the same buffer, no new allocation
    assert again.untyped_storage().data_ptr() == storage
    assert torch.equal(again, path.features[small])
    # The answers do not depend on what the buffer held before.
    fresh = _path(store).run(torch.tensor([5, 9])).logits
    torch.testing.assert_close(path.run(torch.tensor([5, 9])).logits, fresh)
    # Past the limit a gather gets its own tensor and the kept buffer stays as it was.
    monkeypatch.setattr(path_module, "GATHER_BUFFER_LIMIT_BYTES", 4 * path.features.size(1) * 10)
    own = path._gather(big)
    assert own.untyped_storage().data_ptr() != storage and torch.equal(own, path.features[big])
    assert path._gather(small).untyped_storage().data_ptr() == storage
