"""Variant axes: ids, manifests, fanout choice, and derived variants (fanouts, width, int8)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from gnnaas.data import GraphStore
from gnnaas.errors import ArtifactError, ConfigError
from gnnaas.inference import InferencePath
from gnnaas.sampling import DepthSampler
from gnnaas.variants.axes import (
    binding_fanouts,
    derive_variants,
    fanout_candidates,
    parse_axes,
)
from gnnaas.variants.pipeline import generate_variants
from gnnaas.variants.repository import VariantRepository, VariantSpec
from gnnaas.variants.training import TrainConfig

CONFIG = TrainConfig(hidden_channels=32, fanouts=(10, 5), batch_size=512, max_epochs=6, patience=3)


def test_ids_name_every_axis() -> None:
    base = VariantSpec("Cora", "gin", "lasso", 2)
    assert base.variant_id == "gin-lasso-2x" and not base.derived
    assert base.with_axes(fanouts=(10, 5)).variant_id == "gin-lasso-2x-f10.5"
    assert base.with_axes(hidden=128).variant_id == "gin-lasso-2x-h128"
    spec = base.with_axes(fanouts=(5, 5), hidden=64, precision="int8")
    assert spec.variant_id == "gin-lasso-2x-f5.5-h64-int8" and spec.derived
    assert spec.base_id == "gin-lasso-2x"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"fanouts": (10, 0)}, "fanouts must be integers >= 1"),
        ({"hidden": 0}, "hidden width must be an integer >= 1"),
        ({"precision": "fp16"}, "precision must be one of fp32, int8"),
    ],
)
def test_bad_axes_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        VariantSpec("Cora", "sage", "full", 1, **kwargs)


def test_parse_axes() -> None:
    assert parse_axes(["fanouts,FEATURES", "width"]) == ("features", "width", "fanouts")
    with pytest.raises(ConfigError, match="unknown axis 'depth'"):
        parse_axes(["features", "depth"])
    with pytest.raises(ConfigError, match="must include features"):
        parse_axes(["width"])


def test_fanout_candidates_cut_the_outer_hop_first() -> None:
    assert fanout_candidates((25, 10)) == [(15, 10), (10, 10), (10, 5), (5, 5)]
    assert fanout_candidates((15, 10, 5), limit=2) == [(10, 10, 5), (10, 5, 5)]
    assert fanout_candidates((-1, 10)) == []


def _star(num_leaves: int) -> GraphStore:
    """Node 0 with ``num_leaves`` in-neighbors, each leaf with node 0 as its one in-neighbor."""
    n = num_leaves + 1
    src = torch.cat([torch.arange(1, n), torch.zeros(num_leaves, dtype=torch.long)])
    dst = torch.cat([torch.zeros(num_leaves, dtype=torch.long), torch.arange(1, n)])
    order = torch.argsort(dst * n + src)
    src, dst = src[order], dst[order]
    rowptr = torch.zeros(n + 1, dtype=torch.long)
    rowptr[1:] = torch.bincount(dst, minlength=n).cumsum(0)
    empty = torch.empty(0, dtype=torch.long)
    return GraphStore(
        "star", rowptr, src, torch.zeros(n, 2), torch.zeros(n, dtype=torch.long), 2, False,
        torch.arange(n), empty, empty,
    )  # fmt: skip


def test_binding_fanouts_only_where_they_cut_sampled_rows() -> None:
    # Leaves have one in-neighbor: any fanout >= 1 samples the same rows from them, and the
    # hub is 1 of 301 nodes, so no smaller fanout cuts the rows by 15%.
    assert binding_fanouts(_star(300), (25, 10)) == []
    # 30 random in-neighbors per node among many nodes: fanouts below 30 bind at every hop.
    n, degree = 50_000, 30
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(0, n, (n * degree,), generator=gen)
    rowptr = torch.arange(0, n * degree + 1, degree)
    empty = torch.empty(0, dtype=torch.long)
    full = GraphStore(
        "random", rowptr, src, torch.zeros(n, 2), torch.zeros(n, dtype=torch.long), 2, False,
        torch.arange(n), empty, empty,
    )  # fmt: skip
    assert binding_fanouts(full, (25, 10)) == [(15, 10), (10, 10)]


@pytest.fixture(scope="module")
def derived(small_store: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """synth-small's GIN 1× and 2× (greedy), then every axis derived from them."""
    repo = VariantRepository(tmp_path_factory.mktemp("variants"))
    rows = generate_variants(
        small_store,
        repo,
        archs=["gin"],
        rankings=["greedy"],
        prunes=[1, 2],
        config=CONFIG,
        axes=("features", "width", "fanouts", "precision"),
        width_divisors=[2],
        fanout_sets=[(5, 3)],
    )
    return repo, rows


def test_generate_derives_every_axis(small_store: Any, derived: Any) -> None:
    repo, rows = derived
    ids = {r.variant_id: r for r in rows}
    teacher = max(("gin-full-1x", "gin-greedy-2x"), key=lambda v: ids[v].val_acc)
    assert ids[f"{teacher}-h16"].status == "distilled" and ids[f"{teacher}-h16"].base == teacher
    assert ids[f"{teacher}-f5.3"].status == "derived"
    manifest = repo.manifest(small_store.name, f"{teacher}-f5.3-h16")
    assert manifest.fanouts == [5, 3] and manifest.train_fanouts == [10, 5]
    assert manifest.hidden_channels == 16 and manifest.axes["hidden"] == 16
    assert manifest.base is not None and manifest.base["variant"] == f"{teacher}-h16"
    # int8 twins exist only where int8 was measured faster on this machine
    assert all(ids[v].status == "derived" for v in ids if v.endswith("-int8"))
    for row in rows:
        assert 0.0 <= row.val_acc <= 1.0


def test_a_fanout_variant_is_its_base_run_with_those_fanouts(
    small_store: Any, derived: Any
) -> None:
    repo, rows = derived
    fanned = next(r for r in rows if r.variant_id.endswith("-f5.3") and "-h" not in r.variant_id)
    base = repo.load(small_store.name, fanned.base)
    variant = repo.load(small_store.name, fanned.variant_id)
    base_state, state = base.model.state_dict(), variant.model.state_dict()
    assert base_state.keys() == state.keys()
    assert all(torch.equal(base_state[k], state[k]) for k in state)  # the same weights
    features = small_store.feature_subset(base.manifest.kept_features)
    nodes = small_store.val_idx[:200]
    sampler = DepthSampler(small_store.rowptr, small_store.col, (5, 3))
    served = InferencePath(variant.model, features, sampler).run(nodes).logits
    expected = InferencePath(base.model, features, sampler).run(nodes).logits
    torch.testing.assert_close(served, expected, rtol=0, atol=0)


def test_derived_variants_are_kept_until_their_base_changes(
    small_store: Any, derived: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, rows = derived
    import gnnaas.variants.training as training

    def no_training(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("derive_variants trained a variant that is current")

    monkeypatch.setattr(training, "train_model", no_training)
    again = derive_variants(
        small_store,
        repo,
        CONFIG,
        archs=["gin"],
        axes=("features", "width", "fanouts"),
        width_divisors=[2],
        fanout_sets=[(5, 3)],
    )
    assert again and {r.status for r in again} == {"skipped"}
    # A base whose weights changed makes its derived variants stale.
    fanned = next(r for r in rows if r.variant_id.endswith("-f5.3") and "-h" not in r.variant_id)
    folder = repo.path(small_store.name, fanned.variant_id)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["base"]["weights_sha256"] = "0" * 64
    (folder / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.undo()
    redone = derive_variants(
        small_store, repo, CONFIG, archs=["gin"], axes=("features", "fanouts"), fanout_sets=[(5, 3)]
    )
    status = {r.variant_id: r.status for r in redone}
    assert status[fanned.variant_id] == "derived"


def test_manifest_axes_must_agree_with_the_model(small_store: Any, derived: Any) -> None:
    repo, rows = derived
    fanned = next(r for r in rows if r.variant_id.endswith("-f5.3"))
    path: Path = repo.path(small_store.name, fanned.variant_id) / "manifest.json"
    data = json.loads(path.read_text())
    data["axes"]["fanouts"] = [4, 3]
    path.write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match=r"serves fanouts \[5, 3\] but names the axis"):
        repo.manifest(small_store.name, fanned.variant_id)


def test_an_int8_twin_stores_its_ranges_and_answers_alike_in_any_batch(
    small_store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gnnaas.variants.axes as axes
    from gnnaas.models import int8_available

    if not int8_available():
        pytest.skip("no int8 kernels in this torch build or on this CPU")
    repo = VariantRepository(tmp_path)
    generate_variants(small_store, repo, archs=["sage"], prunes=[1], config=CONFIG)
    monkeypatch.setattr(axes, "int8_speedup", lambda *args, **kwargs: 2.0)  # as if it won here
    rows = derive_variants(small_store, repo, CONFIG, archs=["sage"], axes=("precision",))
    assert [(r.variant_id, r.status) for r in rows] == [("sage-full-1x-int8", "derived")]
    loaded = repo.load(small_store.name, "sage-full-1x-int8")
    assert loaded.model.precision == "int8" and loaded.manifest.int8_ranges
    assert loaded.manifest.spec.precision == "int8"
    sampler = DepthSampler(small_store.rowptr, small_store.col, (10, 5))
    path = InferencePath(loaded.model, small_store.x, sampler)
    batch = path.run(small_store.val_idx[:64]).logits
    alone = torch.cat([path.run(small_store.val_idx[i : i + 1]).logits for i in range(8)])
    torch.testing.assert_close(alone, batch[:8], rtol=1e-5, atol=1e-5 * float(batch.abs().max()))
    monkeypatch.setattr(axes, "int8_speedup", lambda *args, **kwargs: 1.0)  # no gain: none made
    other = VariantRepository(tmp_path / "other")
    generate_variants(small_store, other, archs=["sage"], prunes=[1], config=CONFIG)
    assert derive_variants(small_store, other, CONFIG, archs=["sage"], axes=("precision",)) == []


def test_a_second_run_makes_the_same_int8_twins_without_timing_again(
    small_store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """int8 twins are decided once per base (recorded beside the variants): a second run with the
    same plan neither measures again nor adds or removes a variant, even where a new measurement
    would say otherwise; ``force`` decides anew."""
    import gnnaas.variants.axes as axes
    import gnnaas.variants.training as training
    from gnnaas.models import int8_available
    from gnnaas.variants.decisions import DECISIONS_FILE

    if not int8_available():
        pytest.skip("no int8 kernels in this torch build or on this CPU")
    repo = VariantRepository(tmp_path)
    plan: dict[str, Any] = {
        "archs": ["sage"],
        "rankings": ["random"],
        "prunes": [1, 2],
        "config": CONFIG,
        "axes": ("features", "fanouts", "precision"),
        "fanout_sets": [(5, 3)],
        "near": 100.0,  # both trained variants are roots: each gets a fanout variant
    }
    first_answers = {"sage-full-1x": 2.0, "sage-random-2x-f5.3": 1.5}  # others: 1.0, slower
    timed: list[str] = []

    def first(model: Any, store: Any, keep: Any, fanouts: Any) -> float:
        base = {store.num_features: "sage-full-1x", store.num_features // 2: "sage-random-2x"}[
            len(keep)
        ]
        base += "" if list(fanouts) == list(CONFIG.fanouts) else "-f5.3"
        timed.append(base)
        return first_answers.get(base, 1.0)

    monkeypatch.setattr(axes, "int8_speedup", first)
    generate_variants(small_store, repo, **plan)
    ids = [m.variant_id for m in repo.list(small_store.name)]
    assert sorted(timed) == sorted(i for i in ids if not i.endswith("-int8")) and len(timed) == 4
    assert [i for i in ids if i.endswith("-int8")] == [
        "sage-full-1x-int8",
        "sage-random-2x-f5.3-int8",
    ]
    record = json.loads((repo.dataset_dir(small_store.name) / DECISIONS_FILE).read_text())
    slower = record["int8"]["sage-random-2x"]  # measured, not kept
    assert slower["kept"] is False and slower["speedup"] == 1.0 and slower["min_speedup"] > 1.0
    assert record["int8"]["sage-full-1x"]["kept"] is True
    before = {m.variant_id: m.weights_sha256 for m in repo.list(small_store.name)}

    def no_training(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a second run trained a variant")

    def no_timing(*args: Any, **kwargs: Any) -> float:
        raise AssertionError("a second run timed int8 again")

    with monkeypatch.context() as patched:
        patched.setattr(training, "train_model", no_training)
        patched.setattr(axes, "int8_speedup", no_timing)
        rows = generate_variants(small_store, repo, **plan)
    assert {r.status for r in rows} == {"skipped"}
    after = {m.variant_id: m.weights_sha256 for m in repo.list(small_store.name)}
    assert after == before  # the same variants, none rewritten

    # Every twin a second timing would now find (all 2x faster, none slower) is still not made:
    monkeypatch.setattr(axes, "int8_speedup", lambda *args, **kwargs: 2.0)
    generate_variants(small_store, repo, **plan)
    assert {m.variant_id for m in repo.list(small_store.name)} == set(before)
    # ... until the decision is made anew (force retrains too: the 1x and its derived variants).
    generate_variants(small_store, repo, **{**plan, "force": True})
    ids = {m.variant_id for m in repo.list(small_store.name)}
    assert ids == set(before) | {"sage-random-2x-int8", "sage-full-1x-f5.3-int8"}
