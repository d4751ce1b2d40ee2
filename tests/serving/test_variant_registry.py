"""Loading the registry from a variant repository and profile tables on disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from serving_fakes import tiny_store, write_tiny_repository

import gnnaas.data
from gnnaas.errors import ConfigError
from gnnaas.serving import Settings, VariantRegistry


@pytest.fixture
def stores(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """``load_dataset`` returns these in-memory stores (the data layer is tested elsewhere)."""
    made: dict[str, Any] = {}

    def load_dataset(name: str, data_root: Any = None, **kwargs: Any) -> Any:
        if name not in made:
            raise ConfigError(f"unknown dataset {name!r}")
        return made[name]

    monkeypatch.setattr(gnnaas.data, "load_dataset", load_dataset, raising=False)
    return made


def _settings(root: Path, **kwargs: Any) -> Settings:
    return Settings(variants_dir=root / "variants", profiles_dir=root / "profiles", **kwargs)


def test_loads_variants_with_profiles(tmp_path: Path, stores: dict[str, Any]) -> None:
    stores["tiny"] = tiny_store()
    write_tiny_repository(tmp_path, stores["tiny"])
    registry = VariantRegistry.load(_settings(tmp_path, device="cpu"))
    assert registry.get("TINY") is registry.datasets["tiny"]
    ds = registry.datasets["tiny"]
    assert [c.variant_id for c in ds.candidates] == ["sage-full-1x", "sage-random-4x"]
    v = ds.variants["sage-random-4x"]
    assert (v.prune, v.features_kept, v.fanouts, v.accuracy) == (4, 4, (5, 3), 70.0)
    assert v.profile is not None and v.profile.test_accuracy == 69.0
    assert v.profile.service.predict(32) == 4.0
    assert [p["batch_size"] for p in v.profile.summary["service_times"]] == [1, 32, 256, 1024]
    assert not v.model.training
    assert registry.notes == [] and registry.not_ready_reasons() == []


def test_corrupt_variant_is_skipped_with_a_reason(tmp_path: Path, stores: dict[str, Any]) -> None:
    stores["tiny"] = tiny_store()
    variants_dir, _ = write_tiny_repository(tmp_path, stores["tiny"])
    weights = variants_dir / "tiny" / "sage-random-4x" / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    registry = VariantRegistry.load(_settings(tmp_path))
    assert list(registry.datasets["tiny"].variants) == ["sage-full-1x"]
    (note,) = registry.notes
    assert note.startswith("variant tiny/sage-random-4x skipped: ")
    assert "is corrupt or was edited" in note


def test_variant_without_profile_is_loaded_but_not_routed(
    tmp_path: Path, stores: dict[str, Any]
) -> None:
    stores["tiny"] = tiny_store()
    write_tiny_repository(tmp_path, stores["tiny"], profiled=("sage-full-1x",))
    registry = VariantRegistry.load(_settings(tmp_path))
    ds = registry.datasets["tiny"]
    assert [c.variant_id for c in ds.candidates] == ["sage-full-1x"]
    assert registry.not_routed() == {
        "tiny/sage-random-4x": "no 'val' row in profiles.csv; run `gnnaas profile --dataset "
        "tiny --only sage-random-4x` (or profile them all)"
    }


def test_datasets_without_profiles_are_skipped_unless_asked_for(
    tmp_path: Path, stores: dict[str, Any]
) -> None:
    stores["tiny"], stores["other"] = tiny_store(), tiny_store("other")
    write_tiny_repository(tmp_path, stores["tiny"])
    write_tiny_repository(tmp_path / "b", stores["other"])
    (tmp_path / "b" / "variants" / "other").rename(tmp_path / "variants" / "other")
    registry = VariantRegistry.load(_settings(tmp_path))
    assert list(registry.datasets) == ["tiny"]
    assert registry.notes == [
        f"dataset other skipped: no profiles.csv in {tmp_path / 'profiles' / 'other'}; "
        "run `gnnaas profile --dataset other`"
    ]
    with pytest.raises(ConfigError, match="cannot serve dataset 'other': no profiles.csv"):
        VariantRegistry.load(_settings(tmp_path, datasets=["other"]))


def test_a_prepared_dataset_whose_graph_fails_stops_the_start_up(
    tmp_path: Path, stores: dict[str, Any]
) -> None:
    """Without names, a server is asked for every dataset with variants and profiles: one whose
    graph cannot be loaded is not left out with a note (the server would report ready while
    refusing all its requests) but stops the start-up with the reason."""
    stores["tiny"] = tiny_store()
    write_tiny_repository(tmp_path, stores["tiny"])
    write_tiny_repository(tmp_path / "b", tiny_store("other"))  # its graph is not in `stores`
    for folder in ("variants", "profiles"):
        (tmp_path / "b" / folder / "other").rename(tmp_path / folder / "other")
    with pytest.raises(ConfigError) as refused:
        VariantRegistry.load(_settings(tmp_path))
    assert str(refused.value) == (
        "cannot serve dataset 'other', which has variants and profiles: its graph could not be "
        "loaded (unknown dataset 'other'); fix that, or name the datasets to serve with "
        "--dataset (GNNAAS_DATASETS)"
    )
    with pytest.raises(ConfigError, match="^unknown dataset 'other'$"):  # named: as it was
        VariantRegistry.load(_settings(tmp_path, datasets=["tiny", "other"]))
    served = VariantRegistry.load(_settings(tmp_path, datasets=["tiny"]))
    assert list(served.datasets) == ["tiny"] and served.not_ready_reasons() == []


def test_nothing_to_serve_is_a_config_error(tmp_path: Path, stores: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="variants folder .* does not exist; pass --variants"):
        VariantRegistry.load(_settings(tmp_path))
    (tmp_path / "variants").mkdir()
    with pytest.raises(ConfigError, match="nothing to serve"):
        VariantRegistry.load(_settings(tmp_path))


def test_a_profile_older_than_its_variant_is_not_routed(
    tmp_path: Path, stores: dict[str, Any]
) -> None:
    stores["tiny"] = tiny_store()
    _, profiles_dir = write_tiny_repository(tmp_path, stores["tiny"])
    table = profiles_dir / "tiny" / "profiles.csv"
    fresh = VariantRegistry.load(_settings(tmp_path))
    assert len(fresh.datasets["tiny"].candidates) == 2 and not fresh.notes
    # Profiled before the variants were (re)created: the accuracies are another model's.
    table.write_text(table.read_text().replace("2099-01-01", "2001-01-01"))
    with pytest.raises(ConfigError, match="nothing to serve") as refused:
        VariantRegistry.load(_settings(tmp_path))
    message = str(refused.value)
    assert "2 variants (sage-full-1x, sage-random-4x): its profile predates the variant" in message
    assert message.count("predates") == 1  # one sentence, not one per variant
    assert "run `gnnaas profile --dataset tiny`" in message


def _stamped(**changes: Any) -> dict[str, Any]:
    from gnnaas.inference.settings import execution_settings

    inline = Settings().inline_max_nodes  # as the environment of the tests sets it
    return {**execution_settings("cpu", inline_max_nodes=inline), "threads": 1, **changes}


def test_a_curve_measured_under_other_settings_is_marked_for_retiming(
    tmp_path: Path, stores: dict[str, Any]
) -> None:
    stores["tiny"] = tiny_store()
    stamped = _stamped(threads=2, torch_version="2.0.0")
    write_tiny_repository(tmp_path, stores["tiny"], settings=stamped)
    registry = VariantRegistry.load(_settings(tmp_path, device="cpu"))
    profile = registry.datasets["tiny"].variants["sage-full-1x"].profile
    assert profile is not None
    here = _stamped()["torch_version"]
    assert profile.settings_mismatch == ("threads 2 (here 1)", f"torch_version 2.0.0 (here {here})")
    assert registry.not_routed() == {}  # routed once the router has re-timed it


def test_columns_of_removed_switches_in_an_older_file_are_ignored(
    tmp_path: Path, stores: dict[str, Any]
) -> None:
    import pandas as pd

    stores["tiny"] = tiny_store()
    _, profiles = write_tiny_repository(tmp_path, stores["tiny"], settings=_stamped())
    table = profiles / "tiny" / "service_times.csv"
    older = pd.read_csv(table)
    # Written when the fused forward and the compiled sampler were switches: off, here.
    older.insert(older.columns.get_loc("inline_max_nodes"), "fused_forward", 0)
    older.insert(older.columns.get_loc("inline_max_nodes"), "fast_sampler", 0)
    older.to_csv(table, index=False)
    assert "fused_forward,fast_sampler" in table.read_text().splitlines()[0]
    registry = VariantRegistry.load(_settings(tmp_path, device="cpu", retime_curves=False))
    for variant in registry.datasets["tiny"].variants.values():
        assert variant.profile is not None and variant.profile.settings_mismatch == ()
    assert registry.not_routed() == {}


def test_without_retiming_such_a_variant_is_not_routed_and_says_why(
    tmp_path: Path, stores: dict[str, Any]
) -> None:
    stores["tiny"] = tiny_store()
    write_tiny_repository(tmp_path, stores["tiny"], settings=_stamped(threads=2))
    reason = (
        "its service curve was measured under other settings (threads 2 (here 1)); run `gnnaas "
        "profile --dataset tiny` with the server's settings, or let the server re-time it "
        "(GNNAAS_RETIME_CURVES=1, the default)"
    )
    with pytest.raises(ConfigError) as raised:
        VariantRegistry.load(_settings(tmp_path, device="cpu", retime_curves=False))
    # one sentence for the variants that share the reason
    assert f"2 variants (sage-full-1x, sage-random-4x): {reason}" in str(raised.value)
    assert str(raised.value).count("measured under other settings") == 1
    write_tiny_repository(tmp_path / "same", stores["tiny"])
    same = VariantRegistry.load(
        Settings(
            variants_dir=tmp_path / "same" / "variants",
            profiles_dir=tmp_path / "same" / "profiles",
            device="cpu",
            retime_curves=False,
        )
    )
    assert same.not_routed() == {}


def test_feature_caches_are_planned_on_cuda_only_within_the_budget(
    tmp_path: Path, stores: dict[str, Any]
) -> None:
    import torch
    from pydantic import ValidationError

    from gnnaas.inference.executor import ExecRequest
    from gnnaas.profiling.cacheplan import PlannedVariant, plan_cache, write_cache_plan
    from gnnaas.serving.core.generation import default_executor_factory
    from gnnaas.serving.core.registry import plan_caches

    stores["tiny"] = store = tiny_store()
    write_tiny_repository(tmp_path, store)
    budget_mb = 0.01
    settings = _settings(tmp_path, device="cpu", feature_cache_mb=budget_mb)
    ds = VariantRegistry.load(settings).datasets["tiny"]
    variants = list(ds.variants.values())
    assert all(v.cache_nodes is None for v in variants)  # the CPU's features are already local
    # What load does on a GPU, run here: one budget over the variants, nodes in planned order.
    planned = [PlannedVariant(v.variant_id, v.features_kept, v.fanouts) for v in variants]
    plan = plan_cache(store, planned, 1, seeds=torch.arange(0, 300, 2), seeds_name="traffic")
    write_cache_plan(plan, tmp_path / "profiles" / "tiny")
    plan_caches([ds], settings)
    used = 0
    for v in variants:
        assert v.cache_nodes is not None and 0 < v.cache_nodes.numel() < store.num_nodes
        order = plan.rankings[v.fanouts].order
        assert torch.equal(v.cache_nodes, order[: v.cache_nodes.numel()])
        used += v.cache_nodes.numel() * v.features_kept * 4
    assert used <= budget_mb * 2**20
    # The server's executors hold those rows and answer as without them.
    build = default_executor_factory("cpu")
    v = variants[0]
    cached = build(ds, v)
    assert cached.path.cache is not None  # type: ignore[attr-defined]
    assert cached.path.cache.num_cached == v.cache_nodes.numel()  # type: ignore[attr-defined, union-attr]
    v.cache_nodes = None
    plain = build(ds, v)
    requests = [ExecRequest(list(range(0, 300, 7)), output="proba")]
    assert cached(requests)[0].predictions == plain(requests)[0].predictions
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        _settings(tmp_path, feature_cache_mb=-1)


def test_a_dataset_it_does_not_serve_leaves_its_live_state_unheld(
    tmp_path: Path, stores: dict[str, Any]
) -> None:
    # Two datasets with a state folder; "other" has no routable variant: the load that skips it
    # lets go of the live state it opened, so another process may serve it.
    from gnnaas.serving.core.live import LiveState

    stores["tiny"], stores["other"] = tiny_store(), tiny_store("other")
    write_tiny_repository(tmp_path, stores["tiny"])
    write_tiny_repository(tmp_path / "b", stores["other"], profiled=())
    (tmp_path / "b" / "variants" / "other").rename(tmp_path / "variants" / "other")
    (tmp_path / "b" / "profiles" / "other").rename(tmp_path / "profiles" / "other")
    state = tmp_path / "state"
    registry = VariantRegistry.load(_settings(tmp_path, state_dir=state))
    try:
        assert list(registry.datasets) == ["tiny"]
        assert registry.notes[-1].startswith("dataset other skipped: no variant could be loaded")
        assert LiveState.is_open("tiny", state) and not LiveState.is_open("other", state)
        # A reload of the served dataset keeps its state open (writes and lock are kept).
        again = VariantRegistry.load(_settings(tmp_path, state_dir=state, datasets=["tiny"]))
        assert again.datasets["tiny"].live is registry.datasets["tiny"].live
        assert LiveState.is_open("tiny", state)
    finally:
        live = registry.datasets["tiny"].live
        assert live is not None
        live.close()
