"""Dataset registry: names, listing, offline Cora from the data root, clear errors."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import pytest
import torch

from gnnaas.data import DatasetInfo, GraphStore, dataset_info, list_datasets, load_dataset
from gnnaas.data.registry import resolve_cache_dir
from gnnaas.errors import ConfigError


def _snapshot(root: Path) -> set[tuple[str, int, int]]:
    return {
        (str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")
    }


def test_list_datasets_lists_real_and_synthetic_presets() -> None:
    infos = {d.name: d for d in list_datasets()}
    assert list(infos)[:3] == ["Cora", "CiteSeer", "PubMed"]
    for name in ("Flickr", "Reddit", "Yelp", "ogbn-arxiv", "ogbn-products"):
        assert name in infos
    assert infos["Cora"] == DatasetInfo("Cora", 2708, 10556, 1433, 7, False, "planetoid")
    assert infos["Yelp"].multi_label and infos["Yelp"].source == "pyg"
    assert infos["ogbn-arxiv"].source == "ogb"
    presets = {  # docs/architecture.md §3
        "synth-flickr": (89_250, 899_756, 500, 7, False),
        "synth-arxiv": (169_343, 1_166_243, 128, 40, False),
        "synth-reddit": (232_965, 11_606_919, 602, 41, False),
        "synth-yelp": (716_847, 6_977_410, 300, 100, True),
        "synth-products": (2_449_029, 61_859_140, 100, 47, False),
    }
    for name, stats in presets.items():
        d = infos[name]
        assert (d.num_nodes, d.num_edges, d.num_features, d.num_classes, d.multi_label) == stats
        assert d.source == "synthetic"
    assert "synth-small" in infos


def test_dataset_info_normalizes_names() -> None:
    assert dataset_info("cora").name == "Cora"
    assert dataset_info("OGBN-ARXIV").name == "ogbn-arxiv"
    info = dataset_info("Synth-Reddit@0.10")
    assert info.name == "synth-reddit@0.1" and info.num_nodes == 23_296
    assert info.num_features == 602


def test_cora_loads_offline(cora: GraphStore) -> None:
    s = cora
    assert s.name == "Cora" and s.source == "planetoid"
    assert (s.num_nodes, s.num_features, s.num_classes) == (2708, 1433, 7)
    assert s.num_edges == 10556 and not s.multi_label and s.informative is None
    assert s.x.dtype == torch.float32 and s.x.is_contiguous()
    train, val, test = s.train_idx, s.val_idx, s.test_idx
    assert train.numel() == pytest.approx(0.6 * 2708, abs=7)  # public split has 140: not used
    assert val.numel() == pytest.approx(0.2 * 2708, abs=7)
    assert test.numel() == pytest.approx(0.2 * 2708, abs=7)
    parts = torch.cat([train, val, test])
    assert torch.equal(parts.sort().values, torch.arange(2708))  # disjoint and complete
    src, dst = s.edge_index
    assert torch.equal((src * 2708 + dst).sort().values, dst * 2708 + src)  # symmetric


def test_nothing_is_written_under_the_data_root(data_root: Path, tmp_path: Path) -> None:
    before = _snapshot(data_root)
    cache = tmp_path / "cache"
    s = load_dataset("cora", data_root, cache_dir=cache)
    assert s.name == "Cora"
    assert _snapshot(data_root) == before
    cached = list(cache.rglob("*.safetensors"))
    assert len(cached) == 1 and "Planetoid" in cached[0].parts
    assert not [p for p in cache.rglob("*") if p.suffix == ".pt"]  # PyG's scratch files are gone
    again = load_dataset("Cora", data_root, cache_dir=cache, seed=1)
    assert torch.equal(again.x, s.x) and torch.equal(again.col, s.col)
    assert not torch.equal(again.train_idx, s.train_idx)  # split follows the seed


def test_pyg_native_layout_and_env_fallback(
    data_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    shutil.copytree(data_root / "Planetoid" / "Cora" / "raw", root / "Cora" / "raw")
    monkeypatch.setenv("GNNAAS_DATA", str(root))
    s = load_dataset("CORA", cache_dir=tmp_path / "cache")
    assert (s.name, s.num_nodes) == ("Cora", 2708)


def test_unknown_name_lists_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown dataset 'Coraa'; known datasets: Cora, Cite"):
        load_dataset("Coraa")


@pytest.mark.parametrize("root", [None, "", "  "])
def test_missing_data_root_says_how_to_fix(
    root: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GNNAAS_DATA", "")
    with pytest.raises(ConfigError, match=r"'Cora' needs a data root.*--data-root.*GNNAAS_DATA"):
        load_dataset("Cora", root)


def test_nonexistent_data_root(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data root '.*nowhere' .*not a folder.*--data-root"):
        load_dataset("Cora", tmp_path / "nowhere")


def test_raw_files_missing_names_the_folder(tmp_path: Path) -> None:
    match = r"raw files of dataset 'CiteSeer' not found: expected .*Planetoid/CiteSeer/raw/"
    with pytest.raises(ConfigError, match=match) as exc:
        load_dataset("citeseer", tmp_path, cache_dir=tmp_path / "cache")
    assert "ind.citeseer.x" in str(exc.value) and "never downloads" in str(exc.value)
    assert not any(tmp_path.iterdir())  # no folder created under the data root


def _write_csv_gz(path: Path, rows: list[list[float]] | list[list[int]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.writelines(",".join(str(v) for v in row) + "\n" for row in rows)


def test_ogb_csv_layout_is_read_and_made_symmetric(tmp_path: Path) -> None:
    base = tmp_path / "root" / "ogb" / "ogbn_arxiv"
    raw = base / "raw"
    _write_csv_gz(raw / "edge.csv.gz", [[0, 1], [1, 2], [3, 2], [4, 0], [5, 4]])
    _write_csv_gz(raw / "node-feat.csv.gz", [[float(i), 1.0, -1.0] for i in range(6)])
    _write_csv_gz(raw / "node-label.csv.gz", [[i % 3] for i in range(6)])
    for part, ids in (("train", [0, 1, 2]), ("valid", [3]), ("test", [4, 5])):
        _write_csv_gz(base / "split" / "time" / f"{part}.csv.gz", [[i] for i in ids])
    s = load_dataset("ogbn-arxiv", tmp_path / "root", cache_dir=tmp_path / "cache")
    assert (s.name, s.source, s.num_nodes, s.num_features) == ("ogbn-arxiv", "ogb", 6, 3)
    assert s.num_edges == 10  # both directions
    assert s.col[s.rowptr[2] : s.rowptr[3]].tolist() == [1, 3]
    assert s.train_idx.tolist() == [0, 1, 2] and s.test_idx.tolist() == [4, 5]
    assert torch.equal(s.x[:, 0], torch.arange(6.0))


def test_resolve_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert resolve_cache_dir(tmp_path) == tmp_path
    monkeypatch.setenv("GNNAAS_CACHE", str(tmp_path / "env"))
    assert resolve_cache_dir() == tmp_path / "env"
    monkeypatch.delenv("GNNAAS_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_cache_dir() == Path(os.path.expanduser("~")) / ".cache" / "gnnaas"
