"""Synthetic block model: determinism, symmetric CSR, skew, homophily, informative columns."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

import gnnaas.data.synthetic as synthetic
from gnnaas.data import PRESETS, GraphStore, load_dataset, make_synthetic
from gnnaas.data.synthetic import SyntheticConfig, column_signal
from gnnaas.errors import ConfigError


def _eta2(x: torch.Tensor, y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Per column: between-class variance / total variance (the correlation ratio)."""
    counts = torch.bincount(y, minlength=num_classes).float().unsqueeze(1)
    means = torch.zeros(num_classes, x.size(1)).index_add_(0, y, x) / counts
    between = (counts * (means - x.mean(0)) ** 2).sum(0) / x.size(0)
    return between / x.var(0, unbiased=False)


def test_csr_is_symmetric_sorted_without_loops_or_duplicates(small_store: GraphStore) -> None:
    s = small_store
    src, dst = s.edge_index
    n = s.num_nodes
    key = dst * n + src
    assert bool((key[1:] > key[:-1]).all())  # sorted by target then source, no duplicates
    assert not bool((src == dst).any())
    reverse = (src * n + dst).sort().values
    assert torch.equal(reverse, key)  # every edge has its reverse


def test_small_preset_statistics(small_store: GraphStore) -> None:
    s = small_store
    cfg = PRESETS["small"]
    assert (s.num_nodes, s.num_features, s.num_classes) == (3000, 64, 5)
    assert abs(s.num_edges - cfg.num_edges) <= 0.1 * cfg.num_edges
    assert s.name == "synth-small" and s.source == "synthetic" and not s.multi_label
    assert s.x.dtype == torch.float32 and s.x.is_contiguous() and s.y.dtype == torch.long
    assert s.train_idx.numel() == pytest.approx(0.6 * 3000, abs=5)
    assert s.val_idx.numel() == pytest.approx(0.2 * 3000, abs=5)
    parts = torch.cat([s.train_idx, s.val_idx, s.test_idx])
    assert torch.equal(parts.sort().values, torch.arange(3000))


def test_degrees_are_skewed(small_store: GraphStore) -> None:
    deg = small_store.in_degree.float()
    assert deg.max() > 10 * deg.mean()
    assert deg.median() < deg.mean()


def test_homophily_is_near_the_parameter(small_store: GraphStore) -> None:
    src, dst = small_store.edge_index
    same = (small_store.y[src] == small_store.y[dst]).float().mean()
    assert abs(float(same) - PRESETS["small"].homophily) < 0.04


def test_informative_columns_carry_the_class(small_store: GraphStore) -> None:
    s = small_store
    assert s.informative is not None
    cfg = PRESETS["small"]
    m = cfg.informative_count
    assert s.informative.numel() == m and 4 <= m <= s.num_features // 8
    assert not torch.equal(s.informative, torch.arange(m))  # a random subset, not the first m
    strength = column_signal(cfg, seed=0)
    assert torch.equal((strength == strength.max()).nonzero().flatten(), s.informative)
    # the preset spreads a weak, graded signal over every other column (pruning must cost)
    weak = strength > 0
    weak[s.informative] = False
    assert int(weak.sum()) == cfg.num_weak
    assert m + cfg.num_weak > s.num_features // 8  # more columns carry signal than 8× keeps
    eta2 = _eta2(s.x, s.y, s.num_classes)
    assert eta2[s.informative].min() > 2 * eta2[weak].max()
    graded = torch.corrcoef(torch.stack([eta2[weak], strength[weak]]))[0, 1]
    assert graded > 0.6, f"weak columns' class signal does not follow their strength ({graded})"


def test_strong_weak_and_noise_columns_rank_by_strength() -> None:
    cfg = SyntheticConfig(
        2_000, 10_000, 40, 4, signal=0.5, num_informative=4, num_weak=16, weak_signal=0.25
    )
    s = make_synthetic(cfg, seed=3)
    strength = column_signal(cfg, seed=3)
    assert s.informative is not None
    weak = ((strength > 0) & (strength < cfg.signal)).nonzero().flatten()
    noise = (strength == 0).nonzero().flatten()
    assert (s.informative.numel(), weak.numel(), noise.numel()) == (4, 16, 20)
    assert float(strength[s.informative].min()) == pytest.approx(0.5)
    # the weakest weak column carries half the strongest one's signal, not nothing
    assert float(strength[weak].min()) == pytest.approx(0.125)
    eta2 = _eta2(s.x, s.y, s.num_classes)
    strong_e, weak_e, noise_e = (float(eta2[t].mean()) for t in (s.informative, weak, noise))
    assert strong_e > 2 * weak_e and weak_e > 5 * noise_e


def test_neighbor_mean_is_more_informative_than_own_features(small_store: GraphStore) -> None:
    """With homophily, averaging neighbors sharpens the class signal (what a GNN exploits)."""
    s = small_store
    assert s.informative is not None
    x = s.x[:, s.informative]
    src, dst = s.edge_index
    agg = torch.zeros_like(x).index_add_(0, dst, x[src])
    agg /= s.in_degree.clamp(min=1).unsqueeze(1)

    def nearest_class_mean_accuracy(features: torch.Tensor) -> float:
        train, test = s.train_idx, s.test_idx
        sums = torch.zeros(s.num_classes, features.size(1)).index_add_(
            0, s.y[train], features[train]
        )
        means = sums / torch.bincount(s.y[train], minlength=s.num_classes).unsqueeze(1)
        pred = torch.cdist(features[test], means).argmin(1)
        return float((pred == s.y[test]).float().mean())

    own, neighbors = nearest_class_mean_accuracy(x), nearest_class_mean_accuracy(agg)
    assert 1 / s.num_classes + 0.1 < own < 0.9  # features alone: better than chance, not perfect
    assert neighbors > own + 0.1


def test_same_seed_same_graph_other_seed_other_graph() -> None:
    cfg = PRESETS["small"].scaled(0.2)
    a, b = make_synthetic(cfg, seed=7), make_synthetic(cfg, seed=7)
    for field in ("rowptr", "col", "x", "y", "train_idx", "val_idx", "test_idx", "informative"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    c = make_synthetic(cfg, seed=8)
    assert not torch.equal(a.x, c.x)
    assert not torch.equal(a.y, c.y)
    assert a.num_edges != c.num_edges or not torch.equal(a.col, c.col)


def test_scaled_name_and_size() -> None:
    s = load_dataset("SYNTH-Flickr@0.010", seed=0)
    cfg = PRESETS["flickr"]
    assert s.name == "synth-flickr@0.01"
    assert s.num_nodes == round(0.01 * cfg.num_nodes)
    assert abs(s.num_edges - 0.01 * cfg.num_edges) <= 0.1 * 0.01 * cfg.num_edges
    assert (s.num_features, s.num_classes) == (500, 7)
    assert load_dataset("synth-small@1", seed=0).name == "synth-small"


def test_multi_label_yelp_shapes() -> None:
    s = load_dataset("synth-yelp@0.005", seed=0)
    n = round(0.005 * PRESETS["yelp"].num_nodes)
    assert s.multi_label and s.num_classes == 100
    assert s.y.shape == (n, 100) and s.y.dtype == torch.float32
    assert set(s.y.unique().tolist()) <= {0.0, 1.0}
    per_node = s.y.sum(1)
    assert 2.0 < float(per_node.mean()) < 6.0  # a few labels per node
    assert s.informative is not None and s.informative.numel() == 30
    parts = torch.cat([s.train_idx, s.val_idx, s.test_idx])
    assert torch.equal(parts.sort().values, torch.arange(n))


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"num_weak": -1}, "invalid num_weak"),
        ({"weak_signal": 0.35}, "invalid weak_signal"),
        ({"num_weak": 61}, r"num_informative \+ num_weak must not exceed num_features 64"),
    ],
)
def test_bad_weak_tiers(changes: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        replace(PRESETS["small"], **changes)


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("synth-huge", "unknown synthetic dataset 'synth-huge'.*synth-small"),
        ("synth-flickr@0", r"scale must be a number in \(0, 10\]"),
        ("synth-flickr@abc", "unknown synthetic dataset"),
        ("synth-flickr@1e-9", r"scale must be a number|use a larger scale"),
        ("synth-products@0.00001", "use a larger scale"),
    ],
)
def test_bad_synthetic_names(name: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_dataset(name)


def test_large_graphs_are_cached_as_safetensors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(synthetic, "_CACHE_MIN_SIZE", 0)
    first = load_dataset("synth-small@0.3", seed=2, cache_dir=tmp_path)
    files = list((tmp_path / "synthetic").glob("*.safetensors"))
    assert [f.name for f in files] == [
        f"synth-small_at_0.3-seed2-v{synthetic.GENERATOR_VERSION}.safetensors"
    ]
    monkeypatch.setattr(synthetic, "make_synthetic", None)  # a rebuild would fail
    again = load_dataset("synth-small@0.3", seed=2, cache_dir=tmp_path)
    for field in ("rowptr", "col", "x", "y", "train_idx", "informative"):
        assert torch.equal(getattr(first, field), getattr(again, field)), field
    files[0].write_bytes(b"garbage")  # a corrupt file is ignored and rebuilt
    monkeypatch.undo()
    monkeypatch.setattr(synthetic, "_CACHE_MIN_SIZE", 0)
    assert torch.equal(load_dataset("synth-small@0.3", seed=2, cache_dir=tmp_path).x, first.x)
