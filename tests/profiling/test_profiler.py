"""The profiler on a tiny repository of synth-small variants (trained once for the module)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from gnnaas.errors import ArtifactError
from gnnaas.inference.executor import ExecRequest, Executor
from gnnaas.profiling.perfmodel import Calibration
from gnnaas.profiling.profiler import profile_dataset
from gnnaas.profiling.table import (
    PROFILE_COLUMNS,
    SERVICE_TIME_BATCH_SIZES,
    SERVICE_TIME_COLUMNS,
    has_profiles,
    read_profiles,
    read_service_times,
)
from gnnaas.runtime import RuntimeGraph
from gnnaas.variants.pipeline import generate_variants
from gnnaas.variants.repository import VariantRepository
from gnnaas.variants.training import TrainConfig

TINY = TrainConfig(hidden_channels=16, fanouts=(5, 3), batch_size=512, max_epochs=2, patience=1)
VARIANTS = ["gin-full-1x", "sage-full-1x", "sage-random-4x"]
FIXED_RATES = Calibration(bw=5e9, ops=5e10, device="cpu")  # skips the calibration step


@pytest.fixture(scope="module")
def tiny_repo(small_store: Any, tmp_path_factory: pytest.TempPathFactory) -> VariantRepository:
    """Three tiny variants of synth-small: SAGE 1x and random 4x, GIN 1x."""
    repo = VariantRepository(tmp_path_factory.mktemp("variants"))
    generate_variants(
        small_store, repo, archs=["sage"], rankings=["random"], prunes=[1, 4], config=TINY
    )
    generate_variants(
        small_store, repo, archs=["gin"], rankings=["random"], prunes=[1], config=TINY
    )
    assert [m.variant_id for m in repo.list(small_store.name)] == VARIANTS
    return repo


@pytest.fixture(scope="module")
def profiled(
    small_store: Any, tiny_repo: VariantRepository, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Any, pd.DataFrame]:
    out = tmp_path_factory.mktemp("profiles")
    threads_before = torch.get_num_threads()
    result = profile_dataset(
        small_store,
        tiny_repo,
        out,
        batch_size=TINY.batch_size,  # training's: sampled blocks depend on batch composition
        runs=3,
        device="cpu",
        warmup=1,
        service_runs=1,
        calibration=FIXED_RATES,
        threads=1,
        min_time_s=0.0,
    )
    assert torch.get_num_threads() == threads_before  # restored
    return result, read_profiles(result.path)


def test_rows_for_every_variant_and_split(small_store: Any, profiled: Any) -> None:
    result, df = profiled
    assert result.num_profiled == 3 and result.skipped == []
    assert result.path.name == "profiles.csv"
    assert result.path.parent.name == small_store.name
    assert list(df.columns) == list(PROFILE_COLUMNS)
    assert sorted(zip(df["variant"], df["split"], strict=True)) == sorted(
        (v, s) for v in VARIANTS for s in ("val", "test")
    )
    assert not df.drop(columns="base").isna().any().any()
    assert df["base"].isna().all()  # trained variants derive from none
    assert set(df["fanouts"]) == {"5.3"} and set(df["precision"]) == {"fp32"}  # tiny_repo's


def test_values_are_sane(small_store: Any, profiled: Any) -> None:
    _, df = profiled
    assert df["accuracy"].between(0, 100).all()
    assert (df["accuracy_std"] >= 0).all()
    assert (df["latency_ms"] <= df["latency_p95_ms"]).all()
    assert (df["latency_p95_ms"] <= df["latency_p99_ms"]).all()
    for col in (
        "sample_ms",
        "comm_ms",
        "comp_ms",
        "latency_ms",
        "e2e_ms",
        "size_kb",
        "mem_mb",
        "unique_frac",
        "pred_comm_ms",
        "pred_comp_ms",
    ):
        assert (df[col] > 0).all(), col
    assert df["comm_comp"].to_numpy() == pytest.approx(
        (df["comm_ms"] / df["comp_ms"]).to_numpy(), rel=1e-4
    )
    assert (df["e2e_ms"] >= df["sample_ms"]).all()
    assert (df["batch_size"] == TINY.batch_size).all()
    val = df[df["split"] == "val"].set_index("variant")
    assert int(val.loc["sage-random-4x", "features_kept"]) == small_store.num_features // 4
    assert val.loc["sage-random-4x", "size_kb"] < val.loc["sage-full-1x", "size_kb"]
    assert val.loc["sage-random-4x", "pred_comm_ms"] < val.loc["sage-full-1x", "pred_comm_ms"]
    assert set(df["device"]) == {"cpu"} and (df["threads"] == 1).all()
    assert df["num_batches"].iloc[0] == math.ceil(small_store.val_idx.numel() / TINY.batch_size)


def test_accuracy_matches_training_evaluation(
    tiny_repo: VariantRepository, profiled: Any, small_store: Any
) -> None:
    # one execution path: the profile's validation accuracy is the one training measured
    _, df = profiled
    val = df[df["split"] == "val"].set_index("variant")
    for manifest in tiny_repo.list(small_store.name):
        expected = 100 * manifest.metrics["val_acc"]
        assert val.loc[manifest.variant_id, "accuracy"] == pytest.approx(expected, abs=1e-3)


def test_service_times(profiled: Any) -> None:
    result, _ = profiled
    st = read_service_times(result.service_times_path)
    assert list(st.columns) == list(SERVICE_TIME_COLUMNS)
    assert SERVICE_TIME_BATCH_SIZES == (1, 4, 16, 64, 256, 1024)
    assert sorted(zip(st["variant"], st["batch_size"], strict=True)) == sorted(
        (v, b) for v in VARIANTS for b in SERVICE_TIME_BATCH_SIZES
    )
    assert (st[["sample_ms", "gather_ms", "compute_ms", "e2e_ms"]] > 0).all().all()
    # e2e is the wall time of the whole served call, at least its stages
    stages = st["sample_ms"] + st["gather_ms"] + st["compute_ms"]
    assert (st["e2e_ms"] >= 0.5 * stages).all()


def test_per_node_score_parts(small_store: Any, profiled: Any) -> None:
    result, df = profiled
    assert set(result.parts) == {(v, s) for v in VARIANTS for s in ("val", "test")}
    rows = df.set_index(["variant", "split"])
    for (variant, split), (num, den) in result.parts.items():
        nodes = small_store.val_idx if split == "val" else small_store.test_idx
        assert num.shape == den.shape == (nodes.numel(),) and num.dtype == np.float64
        assert set(np.unique(den)) == {1.0} and set(np.unique(num)) <= {0.0, 1.0}
        accuracy = 100 * num.sum() / den.sum()
        assert rows.loc[(variant, split), "accuracy"] == pytest.approx(accuracy, abs=1e-3)


def test_profile_measures_the_served_pipeline(
    small_store: Any, tiny_repo: VariantRepository, profiled: Any
) -> None:
    # The server's executor, built as the router builds it, is right on exactly the validation
    # nodes the profile counted as right (classes may only differ by float summation order).
    result, _ = profiled
    loaded = tiny_repo.load(small_store.name, "sage-random-4x")
    manifest = loaded.manifest
    sampler = RuntimeGraph(small_store).sampler(manifest.fanouts)
    features = small_store.feature_subset(manifest.kept_features)
    executor = Executor(loaded.model, features, sampler, name="served")
    nodes = small_store.val_idx
    requests = [ExecRequest(chunk) for chunk in torch.split(nodes, 97)]  # other batch shapes
    classes = torch.tensor([c for r in executor(requests) for c in r.predictions])
    served_right = (classes == small_store.y[nodes]).numpy().astype(np.float64)
    profiled_right, _ = result.parts[("sage-random-4x", "val")]
    assert np.mean(served_right != profiled_right) <= 0.01


def test_service_sizes_capped_at_max_batch_nodes(
    small_store: Any, tiny_repo: VariantRepository, tmp_path: Path
) -> None:
    result = profile_dataset(
        small_store,
        tiny_repo,
        tmp_path,
        batch_size=512,
        runs=1,
        warmup=0,
        service_runs=1,
        min_time_s=0.0,
        calibration=FIXED_RATES,
        variants=["sage-random-4x"],
        max_batch_nodes=100,
    )
    st = read_service_times(result.service_times_path)
    assert st["batch_size"].tolist() == [1, 4, 16, 64, 100]


def test_has_profiles_after_profiling(
    small_store: Any, tiny_repo: VariantRepository, profiled: Any
) -> None:
    result, _ = profiled
    assert has_profiles(result.path.parent, tiny_repo.list(small_store.name))


def test_corrupt_variant_is_skipped(
    small_store: Any, tiny_repo: VariantRepository, tmp_path: Path
) -> None:
    repo = VariantRepository(tmp_path / "variants")
    shutil.copytree(tiny_repo.root / small_store.name, repo.root / small_store.name)
    weights = repo.path(small_store.name, "sage-random-4x") / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"corrupt!")
    (repo.path(small_store.name, "gin-full-1x") / "manifest.json").write_text("{not json")
    result = profile_dataset(
        small_store,
        repo,
        tmp_path / "profiles",
        batch_size=512,
        runs=1,
        warmup=0,
        service_runs=1,
        min_time_s=0.0,
        calibration=FIXED_RATES,
    )
    reasons = dict(result.skipped)
    assert sorted(reasons) == ["gin-full-1x", "sage-random-4x"]
    assert "sha256" in reasons["sage-random-4x"]
    assert "manifest.json" in reasons["gin-full-1x"]
    assert result.num_profiled == 1
    assert set(read_profiles(result.path)["variant"]) == {"sage-full-1x"}


def test_empty_repository(small_store: Any, tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="gnnaas generate --dataset synth-small"):
        profile_dataset(
            small_store, VariantRepository(tmp_path), tmp_path / "p", calibration=FIXED_RATES
        )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"runs": 0}, "runs"),
        ({"max_batch_nodes": 0}, r"max_batch_nodes must be an integer >= 1 \(got 0\)"),
    ],
)
def test_bad_arguments(small_store: Any, tmp_path: Path, kwargs: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        profile_dataset(small_store, VariantRepository(tmp_path), tmp_path, **kwargs)


def test_only_times_one_variant_and_keeps_the_others(
    small_store: Any, tiny_repo: VariantRepository, profiled: Any, tmp_path: Path
) -> None:

    first, before = profiled
    folder = tmp_path / small_store.name
    shutil.copytree(first.path.parent, folder)
    curves_before = read_service_times(folder)
    result = profile_dataset(
        small_store,
        tiny_repo,
        tmp_path,
        batch_size=TINY.batch_size,
        runs=3,
        warmup=1,
        service_runs=1,
        calibration=FIXED_RATES,
        min_time_s=0.0,
        only=["sage-random-4x"],
    )
    after = read_profiles(result.path)
    assert sorted(after["variant"].unique()) == sorted(before["variant"].unique())
    timing = ["latency_ms", "e2e_ms", "comm_ms", "comp_ms", "date"]
    for vid in ("gin-full-1x", "sage-full-1x"):  # kept as they were, timings and all
        old = before[before["variant"] == vid].sort_values("split")[timing].reset_index(drop=True)
        new = after[after["variant"] == vid].sort_values("split")[timing].reset_index(drop=True)
        assert old.equals(new)
    curves = read_service_times(result.service_times_path)
    for vid in ("gin-full-1x", "sage-full-1x"):
        assert curves[curves["variant"] == vid]["e2e_ms"].tolist() == (
            curves_before[curves_before["variant"] == vid]["e2e_ms"].tolist()
        )
    assert set(curves["variant"]) == set(curves_before["variant"])
    # Accuracies are re-scored for every variant (paired intervals need all of them): same
    # nodes, same pipeline, same numbers; the interval columns are filled for all.
    merged = before.merge(after, on=["variant", "split"], suffixes=("_old", "_new"))
    assert np.allclose(merged["accuracy_old"], merged["accuracy_new"], atol=1e-6)
    assert after["diff_best_lo"].notna().all()


def test_only_changes_nothing_when_a_kept_variant_cannot_be_opened(
    small_store: Any, tiny_repo: VariantRepository, profiled: Any, tmp_path: Path
) -> None:
    # Writing the files without the variant that failed to open would drop its rows.
    first, _ = profiled
    folder = tmp_path / "profiles" / small_store.name
    shutil.copytree(first.path.parent, folder)
    repo = VariantRepository(tmp_path / "variants")
    shutil.copytree(tiny_repo.root, repo.root, dirs_exist_ok=True)
    for weights in repo.path(small_store.name, "gin-full-1x").glob("*.safetensors"):
        weights.write_bytes(b"not a safetensors file")
    before = {f.name: f.read_bytes() for f in folder.iterdir()}
    kwargs: dict[str, Any] = {"runs": 1, "warmup": 0, "min_time_s": 0.0, "service_runs": 1}
    with pytest.raises(ArtifactError) as error:
        profile_dataset(
            small_store,
            repo,
            tmp_path / "profiles",
            batch_size=TINY.batch_size,
            calibration=FIXED_RATES,
            only=["sage-random-4x"],
            **kwargs,
        )
    message = str(error.value)
    assert message.startswith("could not open gin-full-1x: ")
    assert message.endswith("no profile was changed")
    assert {f.name: f.read_bytes() for f in folder.iterdir()} == before


def test_only_needs_existing_profiles_and_known_ids(
    small_store: Any, tiny_repo: VariantRepository, tmp_path: Path
) -> None:
    kwargs: dict[str, Any] = {"runs": 1, "warmup": 0, "min_time_s": 0.0}
    kwargs["calibration"] = FIXED_RATES
    with pytest.raises(ArtifactError, match="--only needs existing profiles"):
        profile_dataset(small_store, tiny_repo, tmp_path, only=["sage-random-4x"], **kwargs)
    with pytest.raises(ArtifactError, match="not in the repository: sage-lasso-2x"):
        profile_dataset(small_store, tiny_repo, tmp_path, only=["sage-lasso-2x"], **kwargs)


def test_profiles_with_the_planned_feature_cache(
    small_store: Any, tiny_repo: VariantRepository, profiled: Any, tmp_path: Path
) -> None:
    # The caches the server would build (passed explicitly: on the CPU device here): the same
    # answers, and each validation hit ratio is the one the plan computes for those nodes.
    from gnnaas.profiling.cacheplan import PlannedVariant, plan_cache, write_cache_plan

    plain_result, plain = profiled
    wanted = ["sage-full-1x", "sage-random-4x"]
    manifests = [m for m in tiny_repo.list(small_store.name) if m.variant_id in wanted]
    planned = [PlannedVariant(m.variant_id, m.in_channels, tuple(m.fanouts)) for m in manifests]
    plan = plan_cache(small_store, planned, 1, batch_size=TINY.batch_size)
    write_cache_plan(plan, tmp_path / small_store.name)
    budget_mb = 0.2 * small_store.num_nodes * small_store.num_features * 4 / 2**20
    result = profile_dataset(
        small_store,
        tiny_repo,
        tmp_path,
        batch_size=TINY.batch_size,
        runs=1,
        warmup=0,
        service_runs=1,
        min_time_s=0.0,
        calibration=FIXED_RATES,
        variants=wanted,
        feature_cache_mb=budget_mb,
    )
    for key in [(v, s) for v in wanted for s in ("val", "test")]:
        assert np.array_equal(result.parts[key][0], plain_result.parts[key][0]), key
    df = read_profiles(result.path).set_index(["variant", "split"])
    before = plain.set_index(["variant", "split"])
    used = 0
    for m in manifests:
        row, old = df.loc[(m.variant_id, "val")], before.loc[(m.variant_id, "val")]
        cached = int(row["cache_nodes"])
        assert 0 < cached < small_store.num_nodes
        expected = plan.rankings[tuple(m.fanouts)].hit_ratio(cached)
        assert 0 < row["hit_ratio"] == pytest.approx(expected, rel=1e-5)
        assert row["accuracy"] == old["accuracy"]
        assert (old["cache_nodes"], old["hit_ratio"]) == (0, 0)
        assert 0 < row["copied_kb"] < old["copied_kb"]
        used += cached * m.in_channels * 4
    assert used <= budget_mb * 2**20
    st = read_service_times(result.service_times_path)
    assert (st["hit_ratio"] > 0).all() and (st["copied_kb"] >= 0).all()
    with pytest.raises(ValueError, match=r"feature_cache_mb must be a finite number >= 0"):
        profile_dataset(small_store, tiny_repo, tmp_path, feature_cache_mb=-1.0)
