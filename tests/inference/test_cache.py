"""The device feature cache in the one execution path: same answers, exact hit counts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from gnnaas.data.store import GraphStore
from gnnaas.inference import ExecRequest, Executor, FeatureCache, InferencePath, Transfer
from gnnaas.models import build_model
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
    edge_index = torch.randint(0, n, (2, 4000), generator=g)
    x = torch.randn(n, 10, generator=g)
    y = torch.randint(0, NUM_CLASSES, (n,), generator=g)
    return GraphStore.from_edge_index("rand", edge_index, x, y, NUM_CLASSES)


def _paths(
    store: GraphStore, nodes: torch.Tensor, fanouts: tuple[int, ...] = (5, 3)
) -> tuple[InferencePath, InferencePath]:
    """The same variant without and with a cache of ``nodes`` (CPU device)."""
    torch.manual_seed(0)
    model = build_model("sage", 5, 16, NUM_CLASSES, num_layers=len(fanouts))
    features = store.feature_subset(torch.arange(0, 10, 2))
    sampler = DepthSampler(store.rowptr, store.col, fanouts)
    cache = FeatureCache(features, nodes)
    return InferencePath(model, features, sampler), InferencePath(
        model, features, sampler, cache=cache
    )


CACHES = {
    "none": torch.tensor([], dtype=torch.long),
    "every third": torch.arange(0, 300, 3),
    "all": torch.randperm(300, generator=torch.Generator().manual_seed(3)),
}


@pytest.mark.parametrize("cached", list(CACHES))
@pytest.mark.parametrize("seeds", [torch.tensor([7]), torch.arange(0, 300, 7), torch.arange(64)])
def test_cached_answers_equal_uncached(store: GraphStore, cached: str, seeds: torch.Tensor) -> None:
    plain, cached_path = _paths(store, CACHES[cached])
    expected, got = plain.run(seeds, embed=True), cached_path.run(seeds, embed=True)
    # the same rows in the same order: bitwise the same answers
    assert torch.equal(got.logits, expected.logits)
    assert got.embeddings is not None and expected.embeddings is not None
    assert torch.equal(got.embeddings, expected.embeddings)
    assert got.num_sampled == expected.num_sampled
    nodes = torch.cat([seeds, seeds[:3]])  # repeats, as a merged batch has
    assert torch.equal(cached_path.predict(nodes).logits, plain.predict(nodes).logits)
    sub = plain.sampler.sample(seeds)
    assert torch.equal(cached_path.forward(sub), plain.forward(sub))


def test_hits_are_the_sampled_rows_of_cached_nodes(store: GraphStore) -> None:
    nodes = torch.arange(0, 300, 3)
    plain, path = _paths(store, nodes)
    seeds = torch.arange(0, 300, 7)
    path.run(seeds)
    n_id = path.sampler.sample(seeds).n_id
    hits = int(torch.isin(n_id, nodes).sum())  # n_id repeats a node once per depth: each a read
    transfer = path.last_transfer
    assert transfer == Transfer(rows=n_id.numel(), hits=hits, row_bytes=5 * 4)
    assert 0 < transfer.hit_ratio < 1
    assert transfer.hit_ratio == pytest.approx(hits / n_id.numel())
    assert transfer.copied_bytes == (n_id.numel() - hits) * 20
    plain.run(seeds)
    assert plain.last_transfer == Transfer(n_id.numel(), 0, 20)  # without a cache: every row
    assert plain.last_transfer.copied_bytes == n_id.numel() * 20
    _, everything = _paths(store, CACHES["all"])
    everything.run(seeds)
    assert everything.last_transfer.hit_ratio == 1.0 and everything.last_transfer.copied_bytes == 0


def test_one_layer_embeddings_survive_the_next_batch(store: GraphStore) -> None:
    _, path = _paths(store, torch.arange(0, 300, 2), fanouts=(4,))
    first = path.run(torch.tensor([5, 8]), embed=True).embeddings
    assert first is not None and torch.equal(first, path.features[[5, 8]])
    path.run(torch.arange(100, 140), embed=True)  # refills the gather buffer
    assert torch.equal(first, path.features[[5, 8]])


def test_executor_with_a_cache_serves_the_same_answers(store: GraphStore) -> None:
    plain, cached = _paths(store, torch.arange(0, 300, 5))
    assert cached.cache is not None
    a = Executor(plain.model, plain.features, plain.sampler, name="plain")
    b = Executor(plain.model, plain.features, plain.sampler, name="cached", cache=cached.cache)
    requests = [ExecRequest([3, 9, 3]), ExecRequest(torch.arange(40, 60), output="proba")]
    assert [r.predictions for r in b(requests)] == [r.predictions for r in a(requests)]
    assert b.path.last_transfer.hits > 0 and a.path.last_transfer.hits == 0
    assert "cache=60" in repr(b.path)


def test_cache_repr_and_slots() -> None:
    x = torch.arange(12.0).view(6, 2)
    cache = FeatureCache(x, torch.tensor([4, 1]))
    assert repr(cache) == "FeatureCache(nodes=2, width=2, device=cpu)"
    assert cache.slot.tolist() == [-1, 1, -1, -1, 0, -1]
    assert torch.equal(cache.rows, x[[4, 1]]) and cache.nbytes == 2 * 2 * 4
    assert cache.num_cached == 2


@pytest.mark.parametrize(
    ("nodes", "error", "match"),
    [
        (torch.tensor([1, 6]), ValueError, r"nodes must be ids in \[0, 6\) \(got 1..6\)"),
        (torch.tensor([2, 2]), ValueError, "nodes must not repeat"),
        (torch.tensor([[1]]), ValueError, r"nodes must be 1-D \(got shape \(1, 1\)\)"),
        (torch.tensor([1.0]), TypeError, r"nodes must be an int64 tensor \(got torch.float32\)"),
        ([1, 2], TypeError, r"nodes must be an int64 tensor \(got list\)"),
    ],
)
def test_cache_rejects_bad_nodes(nodes: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=f"FeatureCache: {match}"):
        FeatureCache(torch.zeros(6, 2), nodes)  # type: ignore[arg-type]


def test_path_rejects_a_cache_of_other_features(store: GraphStore) -> None:
    plain, _ = _paths(store, CACHES["none"])
    other = FeatureCache(store.x, torch.arange(3))  # all 10 columns, not the kept 5
    with pytest.raises(ValueError, match=r"the cache was built from other features"):
        InferencePath(plain.model, plain.features, plain.sampler, cache=other)
    doubles = FeatureCache(plain.features.double(), torch.arange(3))
    with pytest.raises(ValueError, match=r"the cache holds torch.float64 rows"):
        InferencePath(plain.model, plain.features, plain.sampler, cache=doubles)
    elsewhere = FeatureCache(plain.features, torch.arange(3), "meta")
    with pytest.raises(ValueError, match="the cache lives on meta, the model runs on cpu"):
        InferencePath(plain.model, plain.features, plain.sampler, cache=elsewhere)


def test_executor_refuses_a_cache_for_precomputed_answers(store: GraphStore) -> None:
    from gnnaas.inference.lookup import PrecomputedAnswers

    plain, cached = _paths(store, torch.arange(3))
    answers = PrecomputedAnswers(torch.zeros(300, NUM_CLASSES), None, 0)
    with pytest.raises(ValueError, match="a precomputed variant .* takes no feature cache"):
        Executor(plain.model, plain.features, plain.sampler, answers=answers, cache=cached.cache)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_cache_matches_cpu(store: GraphStore) -> None:
    plain, _ = _paths(store, CACHES["none"])
    model = build_model("sage", 5, 16, NUM_CLASSES, num_layers=2)
    model.load_state_dict(plain.model.state_dict())
    model = model.cuda()
    nodes = torch.arange(0, 300, 3)
    cache = FeatureCache(plain.features, nodes, "cuda")
    assert cache.rows.device.type == "cuda"
    gpu = InferencePath(model, plain.features, plain.sampler, "cuda", cache=cache)
    uncached = InferencePath(model, plain.features, plain.sampler, "cuda")
    for seeds in (torch.arange(1), torch.arange(0, 300, 7), torch.arange(5)):
        out = gpu.run(seeds, embed=True)
        torch.testing.assert_close(out.logits, uncached.run(seeds).logits, rtol=0, atol=1e-5)
        torch.testing.assert_close(out.logits, plain.run(seeds).logits, rtol=0, atol=1e-4)
        n_id = plain.sampler.sample(seeds).n_id
        assert gpu.last_transfer.hits == int(torch.isin(n_id, nodes).sum())
        assert out.times.gather_ms >= 0 and out.embeddings is not None
    with pytest.raises(ValueError, match="the cache lives on cpu, the model runs on cuda"):
        InferencePath(
            model, plain.features, plain.sampler, "cuda", cache=FeatureCache(plain.features, nodes)
        )
