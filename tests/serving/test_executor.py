"""The executor (through the shared inference path) on a real graph and model."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from gnnaas.data.store import GraphStore
from gnnaas.inference import ExecRequest, Executor, PathOutput
from gnnaas.inference.executor import embedding_dim
from gnnaas.models import build_model
from gnnaas.sampling import DepthSampler, NeighborSampler


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    # Tiny graphs: intra-op threads only add barrier waits (very slow on a busy machine).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def store() -> GraphStore:
    g = torch.Generator().manual_seed(0)
    n = 400
    edge_index = torch.randint(0, n, (2, 6000), generator=g)  # dense: batch-mates are neighbors
    x = torch.randn(n, 12, generator=g)
    return GraphStore.from_edge_index("rand", edge_index, x, torch.randint(0, 4, (n,)), 4)


def _executor(store: GraphStore, *, multi_label: bool = False) -> Executor:
    torch.manual_seed(0)
    model = build_model("sage", 6, 16, 4, num_layers=2)
    keep = torch.arange(0, 12, 2)
    sampler = DepthSampler(store.rowptr, store.col, (5, 3), seed=0)
    return Executor(
        model, store.feature_subset(keep), sampler, multi_label=multi_label, name="rand/sage"
    )


def test_same_answer_alone_and_in_any_batch(store: GraphStore) -> None:
    ex = _executor(store)
    nodes = torch.randperm(store.num_nodes, generator=torch.Generator().manual_seed(1))[:64]
    alone = [ex([ExecRequest(nodes[i : i + 1], "proba")])[0].predictions[0] for i in range(64)]
    batched = ex([ExecRequest(nodes[:40], "proba"), ExecRequest(nodes[20:].flip(0), "proba")])
    together = batched[0].predictions + list(reversed(batched[1].predictions))
    expected = alone[:40] + alone[20:]
    assert torch.allclose(torch.tensor(together), torch.tensor(expected), atol=1e-5)
    classes = ex([ExecRequest(nodes)])[0].predictions
    assert classes == [max(range(4), key=p.__getitem__) for p in alone]


def test_shared_rows_would_change_answers(store: GraphStore) -> None:
    # Why DepthSampler exists: with one row per node, a node's answer moves with its batch.
    torch.manual_seed(0)
    model = build_model("sage", 12, 16, 4).eval()
    sampler = NeighborSampler(store.rowptr, store.col, (5, 3), consistent=True, seed=0)

    def run(seeds: torch.Tensor) -> torch.Tensor:
        sub = sampler.sample(seeds)
        with torch.inference_mode():
            return model(store.x[sub.n_id], sub.blocks)

    seeds = torch.arange(60)
    alone = torch.cat([run(seeds[i : i + 1]) for i in range(60)])
    assert not torch.allclose(run(seeds), alone, atol=1e-4)


def test_one_result_per_request_in_order_with_duplicates(store: GraphStore) -> None:
    ex = _executor(store)
    requests = [ExecRequest(torch.tensor([5, 3, 5])), ExecRequest(torch.tensor([3]), "proba")]
    out = ex(requests)
    assert len(out) == 2 and ex.calls == 1
    assert len(out[0].predictions) == 3 and out[0].predictions[0] == out[0].predictions[2]
    (proba,) = out[1].predictions
    assert len(proba) == 4 and abs(sum(proba) - 1) < 1e-5
    assert out[0].predictions[1] == max(range(4), key=proba.__getitem__)
    times = out[0].times
    assert times is out[1].times
    assert min(times.sample_ms, times.gather_ms, times.compute_ms, times.copy_ms) >= 0
    assert times.total_ms == pytest.approx(
        times.sample_ms + times.gather_ms + times.compute_ms + times.copy_ms
    )


def test_multi_label(store: GraphStore) -> None:
    ex = _executor(store, multi_label=True)
    labels, proba, embedded = ex(
        [
            ExecRequest(torch.tensor([1, 2])),
            ExecRequest(torch.tensor([1]), "proba"),
            ExecRequest(torch.tensor([2]), "embedding"),
        ]
    )
    assert all(len(row) == 4 and set(row) <= {0, 1} for row in labels.predictions)
    assert [int(p > 0.5) for p in proba.predictions[0]] == labels.predictions[0]
    assert len(embedded.predictions[0]) == 16


def test_executor_runs_the_inference_path(store: GraphStore) -> None:
    ex = _executor(store)
    assert ex.path.sampler is ex.sampler and ex.path.features is ex.features
    nodes = torch.tensor([9, 1, 9])
    (out,) = ex([ExecRequest(nodes, output="proba")])
    logits = ex.path.predict(nodes).logits
    assert torch.allclose(torch.tensor(out.predictions), torch.softmax(logits, -1), atol=1e-6)


def test_last_batch_counts_unique_nodes(store: GraphStore) -> None:
    # The service curve is indexed by unique seeds; requests of one batch may share nodes.
    ex = _executor(store)
    ex([ExecRequest(torch.tensor([1, 2, 3])), ExecRequest(torch.tensor([3, 2, 9]))])
    assert ex.last_batch_seeds == 4


def test_embeddings_alone_and_in_any_batch(store: GraphStore) -> None:
    ex = _executor(store)
    nodes = torch.randperm(store.num_nodes, generator=torch.Generator().manual_seed(3))[:48]
    alone = [ex([ExecRequest(nodes[i : i + 1], "embedding")])[0].predictions[0] for i in range(48)]
    assert all(len(row) == ex.model.hidden_channels == 16 for row in alone)
    batched = ex(
        [
            ExecRequest(nodes[:30], "embedding"),
            ExecRequest(nodes[10:], "proba"),
            ExecRequest(nodes[20:].flip(0), "embedding"),
            ExecRequest(nodes[5:9]),
        ]
    )
    together = batched[0].predictions + list(reversed(batched[2].predictions))
    expected = alone[:30] + alone[20:]
    # equal up to floating-point summation order (never compared bit for bit)
    torch.testing.assert_close(torch.tensor(together), torch.tensor(expected), rtol=0, atol=1e-5)
    assert all(len(row) == 4 for row in batched[1].predictions)  # each request gets its output
    assert all(isinstance(c, int) for c in batched[3].predictions)


def test_embeddings_are_computed_only_when_a_request_asks(
    store: GraphStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    ex = _executor(store)
    asked: list[bool] = []
    predict = ex.path.predict

    def spy(nodes: torch.Tensor, embed: bool = False) -> PathOutput:
        asked.append(embed)
        return predict(nodes, embed)

    monkeypatch.setattr(ex.path, "predict", spy)
    ex([ExecRequest(torch.tensor([1, 2])), ExecRequest(torch.tensor([3]), "proba")])
    ex([ExecRequest(torch.tensor([1, 2])), ExecRequest(torch.tensor([3]), "embedding")])
    assert asked == [False, True]


def test_an_unknown_output_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"output must be 'class', 'proba' or 'embedding' \(got True\)"
    ):
        ExecRequest(torch.tensor([1]), True)  # type: ignore[arg-type]  # the old proba flag


def test_embedding_dim_is_the_hidden_width() -> None:
    assert embedding_dim(build_model("sage", 6, 16, 4, num_layers=2)) == 16
    assert embedding_dim(build_model("gin", 6, 16, 4, num_layers=3)) == 16
    assert embedding_dim(build_model("sage", 6, 16, 4, num_layers=1)) == 6  # its input
    assert embedding_dim(torch.nn.Linear(6, 4)) is None
