"""The variant repository: round trip, atomic saves, checksums, mismatched manifests."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from gnnaas.errors import ArtifactError, ConfigError
from gnnaas.models import GNN, build_model
from gnnaas.variants.repository import (
    MANIFEST_FORMAT,
    Manifest,
    VariantRepository,
    VariantSpec,
)
from gnnaas.variants.training import TrainConfig

NUM_FEATURES = 12


def _model(arch: str = "sage", in_channels: int = NUM_FEATURES, seed: int = 0) -> GNN:
    torch.manual_seed(seed)
    return build_model(arch, in_channels, 16, 3, num_layers=2, dropout=0.5)


def _manifest(spec: VariantSpec, *, val_acc: float = 0.5) -> Manifest:
    kept = list(range(0, NUM_FEATURES, spec.prune))[: NUM_FEATURES // spec.prune]
    return Manifest(
        format=MANIFEST_FORMAT,
        dataset=spec.dataset,
        variant_id=spec.variant_id,
        arch=spec.arch,
        ranking=spec.ranking,
        prune=spec.prune,
        num_features=NUM_FEATURES,
        kept_features=kept,
        in_channels=len(kept),
        hidden_channels=16,
        out_channels=3,
        num_layers=2,
        dropout=0.5,
        fanouts=[25, 10],
        multi_label=False,
        metrics={"val_acc": val_acc, "test_acc": 0.4, "train_time_s": 1.5, "epochs": 3},
        seed=0,
    )


def _save(
    repo: VariantRepository, spec: VariantSpec, seed: int = 0, val_acc: float = 0.5
) -> tuple[Manifest, GNN]:
    manifest = _manifest(spec, val_acc=val_acc)
    model = _model(spec.arch, manifest.in_channels, seed=seed)
    return repo.save(manifest, model), model


def _graph(num_nodes: int, in_channels: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(num_nodes, in_channels, generator=gen)
    edge_index = torch.randint(0, num_nodes, (2, 4 * num_nodes), generator=gen)
    return x, edge_index


SAGE_1X = VariantSpec("toy", "sage", "full", 1)
SAGE_LASSO_2X = VariantSpec("toy", "sage", "lasso", 2)


def test_variant_ids() -> None:
    assert VariantSpec("Cora", "SAGE", "Lasso", 4).variant_id == "sage-lasso-4x"
    assert VariantSpec("Cora", "gin", "random", 1).variant_id == "gin-full-1x"
    assert VariantSpec("Cora", "gin", "random", 1) == VariantSpec("Cora", "gin", "lasso", 1)
    with pytest.raises(ConfigError, match="unknown ranking 'magic'"):
        VariantSpec("Cora", "sage", "magic", 2)
    with pytest.raises(ConfigError, match="'gat'"):
        VariantSpec("Cora", "gat", "lasso", 2)
    with pytest.raises(ConfigError, match="prune factor"):
        VariantSpec("Cora", "sage", "lasso", 0)
    with pytest.raises(ConfigError, match="only the 1x model"):
        VariantSpec("Cora", "sage", "full", 2)


@pytest.mark.parametrize("arch", ["sage", "gin"])
def test_round_trip(tmp_path: Path, arch: str) -> None:
    repo = VariantRepository(tmp_path)
    spec = VariantSpec("toy", arch, "greedy", 2)
    manifest, model = _save(repo, spec)
    assert len(manifest.weights_sha256) == 64

    loaded = repo.load("toy", spec.variant_id)
    assert loaded.manifest == manifest
    assert not loaded.model.training
    saved, back = model.state_dict(), loaded.model.state_dict()
    assert saved.keys() == back.keys()
    for key in saved:
        assert torch.equal(saved[key], back[key]), key
    model.eval()
    x, edge_index = _graph(30, manifest.in_channels)
    with torch.inference_mode():
        assert torch.equal(model(x, edge_index), loaded.model(x, edge_index))

    on_disk = json.loads((tmp_path / "toy" / spec.variant_id / "manifest.json").read_text())
    assert list(on_disk) == [
        "format", "dataset", "variant_id", "arch", "ranking", "prune", "num_features",
        "kept_features", "in_channels", "hidden_channels", "out_channels", "num_layers", "dropout",
        "fanouts", "multi_label", "metrics", "seed", "versions", "weights_sha256", "created",
        "family", "origin",
    ]  # fmt: skip
    assert (on_disk["family"], on_disk["origin"]) == ("gnnaas", "trained")
    # A manifest written before family/origin existed reads with their defaults.
    older = {k: v for k, v in on_disk.items() if k not in ("family", "origin")}
    assert Manifest.from_dict(older) == manifest
    umask = os.umask(0)
    os.umask(umask)
    mode = (tmp_path / "toy" / spec.variant_id).stat().st_mode & 0o777
    assert mode == 0o777 & ~umask  # not private to the writer, like a plain mkdir
    assert on_disk["metrics"]["epochs"] == 3 and isinstance(on_disk["metrics"]["epochs"], int)
    assert set(on_disk["versions"]) == {"gnnaas", "torch", "torch_geometric"}


def test_list_is_sorted_and_skips_temporaries(tmp_path: Path) -> None:
    repo = VariantRepository(tmp_path)
    assert repo.list("toy") == []
    assert not tmp_path.joinpath("toy").exists()  # reading creates nothing
    _save(repo, SAGE_LASSO_2X)
    _save(repo, VariantSpec("toy", "gin", "random", 4))
    _save(repo, SAGE_1X)
    (tmp_path / "toy" / ".sage-greedy-2x.tmp-abc").mkdir()  # an interrupted save
    ids = [m.variant_id for m in repo.list("toy")]
    assert ids == ["gin-random-4x", "sage-full-1x", "sage-lasso-2x"]


def test_replacing_a_variant(tmp_path: Path) -> None:
    repo = VariantRepository(tmp_path)
    _save(repo, SAGE_LASSO_2X, seed=0, val_acc=0.5)
    new, model = _save(repo, SAGE_LASSO_2X, seed=1, val_acc=0.7)
    loaded = repo.load("toy", SAGE_LASSO_2X.variant_id)
    assert loaded.manifest.metrics["val_acc"] == 0.7
    assert torch.equal(loaded.model.convs[0].lin_l.weight, model.convs[0].lin_l.weight)
    assert sorted(p.name for p in (tmp_path / "toy").iterdir()) == ["sage-lasso-2x"]


def test_failed_save_keeps_the_previous_variant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = VariantRepository(tmp_path)
    old, _ = _save(repo, SAGE_LASSO_2X, seed=0, val_acc=0.5)

    import gnnaas.variants.repository as repository

    calls = {"n": 0}
    real_write = repository._write_synced

    def crash_on_manifest(path: Path, data: bytes) -> None:
        calls["n"] += 1
        if path.name == "manifest.json":
            # the weights of the new version are already written into the temporary folder
            assert (path.parent / "weights.safetensors").exists()
            raise KeyboardInterrupt("interrupted in the middle of a save")
        real_write(path, data)

    monkeypatch.setattr(repository, "_write_synced", crash_on_manifest)
    with pytest.raises(KeyboardInterrupt):
        _save(repo, SAGE_LASSO_2X, seed=1, val_acc=0.9)
    assert calls["n"] == 2
    monkeypatch.undo()

    assert sorted(p.name for p in (tmp_path / "toy").iterdir()) == ["sage-lasso-2x"]
    loaded = repo.load("toy", SAGE_LASSO_2X.variant_id)
    assert loaded.manifest == old


def test_failed_swap_puts_the_old_variant_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = VariantRepository(tmp_path)
    old, _ = _save(repo, SAGE_LASSO_2X, seed=0)

    import gnnaas.variants.repository as repository

    real_replace = repository.os.replace

    def crash_on_swap(src: str | Path, dst: str | Path) -> None:
        if Path(src).name.startswith(".sage-lasso-2x.tmp-"):
            raise OSError("disk full")
        real_replace(src, dst)

    monkeypatch.setattr(repository.os, "replace", crash_on_swap)
    with pytest.raises(OSError, match="disk full"):
        _save(repo, SAGE_LASSO_2X, seed=1, val_acc=0.9)
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "toy").iterdir()) == ["sage-lasso-2x"]
    assert repo.load("toy", SAGE_LASSO_2X.variant_id).manifest == old


def test_edited_weights_are_refused(tmp_path: Path) -> None:
    repo = VariantRepository(tmp_path)
    _save(repo, SAGE_1X)
    _save(repo, SAGE_LASSO_2X)
    weights = tmp_path / "toy" / SAGE_LASSO_2X.variant_id / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # flip bits in the last tensor's data: still valid safetensors
    weights.write_bytes(bytes(data))

    with pytest.raises(ArtifactError, match=r"corrupt or was edited.*--force") as info:
        repo.load("toy", SAGE_LASSO_2X.variant_id)
    assert "gnnaas generate --dataset toy --force" in str(info.value)
    # the rest of the repository is intact
    assert [m.variant_id for m in repo.list("toy")] == ["sage-full-1x", "sage-lasso-2x"]
    assert repo.load("toy", SAGE_1X.variant_id).manifest.variant_id == "sage-full-1x"
    assert weights.exists()


def test_manifest_of_another_dataset_is_refused(tmp_path: Path) -> None:
    repo = VariantRepository(tmp_path)
    _save(repo, SAGE_1X)
    other = tmp_path / "Cora" / SAGE_1X.variant_id
    other.parent.mkdir()
    (tmp_path / "toy" / SAGE_1X.variant_id).rename(other)  # hand-moved into another dataset
    with pytest.raises(ArtifactError, match="of dataset 'toy', not 'Cora'"):
        repo.load("Cora", SAGE_1X.variant_id)
    assert repo.list("Cora") == []  # skipped with a warning, never half-read


def test_missing_files(tmp_path: Path) -> None:
    repo = VariantRepository(tmp_path)
    with pytest.raises(ArtifactError, match="not found.*gnnaas generate --dataset toy"):
        repo.load("toy", "sage-full-1x")
    _save(repo, SAGE_1X)
    (tmp_path / "toy" / "sage-full-1x" / "weights.safetensors").unlink()
    with pytest.raises(ArtifactError, match="weights.safetensors is missing"):
        repo.load("toy", "sage-full-1x")


def test_names_cannot_leave_the_repository(tmp_path: Path) -> None:
    repo = VariantRepository(tmp_path / "repo")
    for dataset, variant_id in [("toy", "../sage-full-1x"), ("..", "x"), ("toy", ".x.tmp-1")]:
        with pytest.raises(ConfigError, match="invalid"):
            repo.load(dataset, variant_id)
    with pytest.raises(ConfigError, match="invalid dataset name"):
        repo.list("../other")


def test_malformed_manifest(tmp_path: Path) -> None:
    repo = VariantRepository(tmp_path)
    _save(repo, SAGE_1X)
    path = tmp_path / "toy" / "sage-full-1x" / "manifest.json"
    data = json.loads(path.read_text())
    del data["kept_features"]
    path.write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="lacks keys \\['kept_features'\\]"):
        repo.load("toy", "sage-full-1x")
    path.write_text("{not json")
    with pytest.raises(ArtifactError, match="unreadable"):
        repo.load("toy", "sage-full-1x")


def test_weights_are_never_unpickled(tmp_path: Path) -> None:
    repo = VariantRepository(tmp_path)
    _save(repo, SAGE_1X)
    weights = tmp_path / "toy" / "sage-full-1x" / "weights.safetensors"
    torch.save(_model().state_dict(), weights)  # a pickle where safetensors belong
    with pytest.raises(ArtifactError, match="corrupt or was edited"):
        repo.load("toy", "sage-full-1x")


def test_matches(tmp_path: Path) -> None:
    repo = VariantRepository(tmp_path)
    config = TrainConfig(hidden_channels=16, fanouts=(25, 10), seed=0)
    assert not repo.matches(SAGE_LASSO_2X, config, num_features=NUM_FEATURES)
    _save(repo, SAGE_LASSO_2X)
    assert repo.matches(SAGE_LASSO_2X, config, num_features=NUM_FEATURES)
    assert not repo.matches(SAGE_LASSO_2X, config, num_features=NUM_FEATURES + 2)
    for changed in (
        TrainConfig(hidden_channels=32, fanouts=(25, 10), seed=0),
        TrainConfig(hidden_channels=16, fanouts=(5, 5), seed=0),
        TrainConfig(hidden_channels=16, fanouts=(25, 10), seed=1),
    ):
        assert not repo.matches(SAGE_LASSO_2X, changed, num_features=NUM_FEATURES)
    weights = tmp_path / "toy" / SAGE_LASSO_2X.variant_id / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    assert not repo.matches(SAGE_LASSO_2X, config, num_features=NUM_FEATURES)
