"""Variant generation end to end on the small synthetic graph, and rankings vs ground truth."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import gnnaas.variants.pipeline as pipeline
import gnnaas.variants.training as training
from gnnaas.data.synthetic import PRESETS, column_signal
from gnnaas.errors import ConfigError
from gnnaas.variants.pipeline import generate_variants
from gnnaas.variants.ranking import rank_features
from gnnaas.variants.repository import VariantRepository
from gnnaas.variants.training import TrainConfig, train_model

# small and fast: a few seconds per variant on 2 CPU cores
CONFIG = TrainConfig(hidden_channels=32, fanouts=(10, 5), batch_size=512, max_epochs=8, patience=4)


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Any:
    """One intra-op thread: these tiny models gain nothing from two, and on a shared 2-core box
    two OpenMP threads competing with other processes run 10× slower (measured)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained(small_store: Any) -> dict[str, Any]:
    """1× models of both architectures on synth-small, trained once for the module."""
    config = TrainConfig(hidden_channels=64, fanouts=(10, 5), batch_size=512, max_epochs=30)
    return {arch: train_model(small_store, arch, config).model for arch in ("sage", "gin")}


def _no_training(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("generate_variants trained a variant that already exists")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rankings": ["lasso", "magic"]}, "unknown ranking 'magic'"),
        ({"archs": ["sage", "gat"]}, "'gat'"),
        ({"prunes": [1, 0]}, "prune factors must be integers >= 1"),
        ({"prunes": [2, 65]}, "prune factor 65 exceeds the dataset's 64 features"),
        ({"archs": []}, "no architecture"),
    ],
)
def test_bad_requests_fail_before_training(
    small_store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kwargs: Any, match: str
) -> None:
    monkeypatch.setattr(training, "train_model", _no_training)
    args: dict[str, Any] = {"archs": ["sage"], "rankings": ["random"], "prunes": [1, 2]}
    repo = VariantRepository(tmp_path)
    with pytest.raises(ConfigError, match=match):
        generate_variants(small_store, repo, **{**args, **kwargs}, config=CONFIG)
    assert not any(tmp_path.iterdir())


def test_generate_then_rerun_skips(
    small_store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = VariantRepository(tmp_path)
    request: dict[str, Any] = {
        "archs": ["sage"],
        "rankings": ["random", "lasso"],
        "prunes": [1, 4, 8],
        "config": CONFIG,
    }
    rows = generate_variants(small_store, repo, **request)
    assert [(r.variant_id, r.features_kept, r.status) for r in rows] == [
        ("sage-full-1x", 64, "trained"),
        ("sage-random-4x", 16, "trained"),
        ("sage-random-8x", 8, "trained"),
        ("sage-lasso-4x", 16, "trained"),
        ("sage-lasso-8x", 8, "trained"),
    ]
    assert all(0.0 <= r.val_acc <= 1.0 and r.train_time_s > 0 for r in rows)
    manifests = {m.variant_id: m for m in repo.list(small_store.name)}
    assert sorted(manifests) == sorted(r.variant_id for r in rows)
    lasso4, lasso8 = manifests["sage-lasso-4x"], manifests["sage-lasso-8x"]
    assert lasso4.kept_features == sorted(lasso4.kept_features)
    assert set(lasso8.kept_features) <= set(lasso4.kept_features)  # nested: one ranking
    assert manifests["sage-full-1x"].kept_features == list(range(64))
    assert manifests["sage-random-8x"].metrics["val_acc"] == rows[2].val_acc
    loaded = repo.load(small_store.name, "sage-lasso-8x")
    assert loaded.model.in_channels == 8

    # second run: nothing is trained, every row is skipped with the stored figures
    monkeypatch.setattr(training, "train_model", _no_training)
    again = generate_variants(small_store, repo, **request)
    assert [r.status for r in again] == ["skipped"] * 5
    assert [(r.variant_id, r.val_acc, r.train_time_s) for r in again] == [
        (r.variant_id, r.val_acc, r.train_time_s) for r in rows
    ]
    monkeypatch.undo()

    # force retrains what exists
    request = {**request, "rankings": ["random"], "prunes": [8], "force": True}
    rerun = generate_variants(small_store, repo, **request)
    assert [(r.variant_id, r.status) for r in rerun] == [
        ("sage-full-1x", "trained"),
        ("sage-random-8x", "trained"),
    ]


def test_retrained_1x_model_invalidates_its_rankings(
    small_store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = VariantRepository(tmp_path)
    request: dict[str, Any] = {"archs": ["gin"], "prunes": [4], "config": CONFIG}
    generate_variants(small_store, repo, rankings=["random", "greedy"], **request)
    # the 1× model is lost: greedy depends on it, random does not
    (tmp_path / small_store.name / "gin-full-1x" / "manifest.json").unlink()
    rows = generate_variants(small_store, repo, rankings=["random", "greedy"], **request)
    assert [(r.variant_id, r.status) for r in rows] == [
        ("gin-full-1x", "trained"),
        ("gin-random-4x", "skipped"),
        ("gin-greedy-4x", "trained"),
    ]


@pytest.mark.parametrize("arch", ["sage", "gin"])
@pytest.mark.parametrize("ranking", ["greedy", "lasso"])
def test_rankings_recover_the_informative_features(
    small_store: Any, trained: dict[str, Any], arch: str, ranking: str
) -> None:
    """The columns an 8× variant keeps hold the planted strong columns and, beyond them, the
    stronger of the weak ones (``column_signal`` is the ground truth of every column)."""
    informative = set(small_store.informative.tolist())
    m, f = len(informative), small_store.num_features
    order = rank_features(ranking, trained[arch], small_store, seed=0)
    assert torch.equal(order.sort().values, torch.arange(f))
    kept = order[: f // 8]
    recovered = len(informative & set(kept.tolist()))
    assert recovered >= 0.75 * m, f"{arch}/{ranking} kept {recovered} of {m}"
    strength = column_signal(PRESETS["small"], seed=0)
    gain = float(strength[kept].mean() / strength.mean())  # a random ranking gives about 1
    assert gain > 1.4, f"{arch}/{ranking} kept columns of mean strength {gain:.2f}× the average"


def test_random_ranking_stays_near_chance(small_store: Any, trained: dict[str, Any]) -> None:
    informative = set(small_store.informative.tolist())
    m, f = len(informative), small_store.num_features
    chance = m * m / f  # expected overlap of a random top-m with the informative set
    tops = [rank_features("random", trained["sage"], small_store, seed=s)[:m] for s in range(20)]
    overlaps = [len(informative & set(top.tolist())) for top in tops]
    assert sum(overlaps) / len(overlaps) <= 2 * chance + 0.5
    assert max(overlaps) < 0.8 * m


def test_lasso_cost_is_small_next_to_training(small_store: Any, trained: dict[str, Any]) -> None:
    # Work, not wall time (CI machines differ): multiply-adds counted by torch's FLOP counter.
    # Wall-clock figures for the same comparison are in benchmarks/bench_rankings.py.
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as lasso:
        rank_features("lasso", trained["sage"], small_store, seed=0)
    with FlopCounterMode(display=False) as training:
        train_model(small_store, "sage", CONFIG)
    lasso_flops, train_flops = lasso.get_total_flops(), training.get_total_flops()
    assert 0 < lasso_flops < 0.5 * train_flops, f"lasso {lasso_flops} vs training {train_flops}"


def test_progress_bar_is_optional(small_store: Any, tmp_path: Path) -> None:
    assert pipeline.generate_variants is generate_variants
    rows = generate_variants(
        small_store,
        VariantRepository(tmp_path),
        archs=["sage"],
        rankings=["greedy"],
        prunes=[1],
        config=CONFIG,
        progress=True,
    )
    assert [r.variant_id for r in rows] == ["sage-full-1x"]


@pytest.mark.slow
def test_cora_sage_8x_rankings(cora: Any, tmp_path: Path) -> None:
    """Issue 4 on Cora (SAGE, default TrainConfig): lasso and greedy 8× variants lose at most 5
    validation points against the 1× model and beat the random 8× variant by at least 5."""
    rows = generate_variants(
        cora, VariantRepository(tmp_path), archs=["sage"], prunes=[1, 8], config=TrainConfig()
    )
    val = {r.variant_id: 100 * r.val_acc for r in rows}
    assert [r.features_kept for r in rows] == [1433, 179, 179, 179]
    for ranking in ("greedy", "lasso"):
        pruned = val[f"sage-{ranking}-8x"]
        assert val["sage-full-1x"] - pruned <= 5.0, val
        assert pruned - val["sage-random-8x"] >= 5.0, val


def _epoch_lines(err: str) -> list[tuple[str, str, bool]]:
    """``(variant, epoch, last)`` of each epoch line on stderr (bars' redraws set apart)."""
    lines = [part for line in err.splitlines() for part in line.split("\r")]
    return [
        (words[1], words[3], "best_epoch:" in words)
        for words in (line.split() for line in lines if line.startswith("variant: "))
    ]


def test_progress_reports_each_models_epochs_and_the_plans_count(
    small_store: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import gnnaas.variants.progress as progress

    plans: list[int] = []

    class Recorded(progress.PlanProgress):
        def __init__(self, bar: Any, *, models: int, config: TrainConfig) -> None:
            plans.append(models)
            super().__init__(bar, models=models, config=config, terminal=False)

    monkeypatch.setattr(progress, "PlanProgress", Recorded)
    monkeypatch.setattr(progress, "LONG_PLAN_S", 0.0)  # every plan is long: it says so
    repo = VariantRepository(tmp_path)
    config = TrainConfig(hidden_channels=16, fanouts=(5, 5), batch_size=512, max_epochs=3)
    request: dict[str, Any] = {"archs": ["sage"], "rankings": ["greedy"], "prunes": [1, 2]}
    generate_variants(small_store, repo, **request, config=config, progress=True)
    err = capsys.readouterr().err
    lines = _epoch_lines(err)
    for variant in ("sage-full-1x", "sage-greedy-2x"):
        mine = [(epoch, last) for v, epoch, last in lines if v == variant]
        assert mine[0] == ("001/003", False) and mine[-1] == ("003/003", True)
    assert [v for v, _, _ in lines] == sorted(v for v, _, _ in lines)  # one model at a time
    estimates = [line for line in err.splitlines() if line.startswith("estimate: ")]
    assert len(estimates) == 1 and estimates[0].startswith("estimate: 2 model(s) to train at ")
    first = err.index("variant: sage-full-1x  epoch: 001/003")
    assert first < err.index(estimates[0]) < err.index("variant: sage-full-1x  epoch: 003/003")

    # The plan counts only what it trains: one variant lost, one model.
    (tmp_path / small_store.name / "sage-greedy-2x" / "manifest.json").unlink()
    generate_variants(small_store, repo, **request, config=config, progress=True)
    assert plans == [2, 1]
    assert {v for v, _, _ in _epoch_lines(capsys.readouterr().err)} == {"sage-greedy-2x"}
