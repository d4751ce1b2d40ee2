"""``gnnaas import``: every accepted format, one clear error per malformed input, atomic stores."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from gnnaas.data import (
    GraphStore,
    dataset_info,
    import_graph,
    list_datasets,
    load_dataset,
    resolve_home_dir,
)
from gnnaas.data.importer import edges_to_csr
from gnnaas.errors import ConfigError

N = 10
# Two directed cycles (0 → 1 → 2 → 3 → 4 → 0, 5 → 6 → 7 → 8 → 5); node 9 has no edge at all.
EDGES = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 0), (5, 6), (6, 7), (7, 8), (8, 5)]
X = (np.arange(N * 3, dtype=np.float32) / 10).reshape(N, 3)
Y = np.array([0, 1] * 5)
SPLIT = {"train": [0, 1, 2, 3, 4, 5], "val": [6, 7], "test": [8, 9]}


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """gnnaas's data home for this test; it does not exist until an import succeeds."""
    path = tmp_path / "home"
    monkeypatch.setenv("GNNAAS_HOME", str(path))
    return path


def _write(path: Path, content: Any) -> Path:
    """Writes text, bytes, an array (``.npy``), columns (``.parquet``) or JSON, by suffix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        path.write_text(content)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif path.suffix == ".npy":
        np.save(path, content)
    elif path.suffix == ".parquet":
        pq.write_table(pa.table(content), path)
    else:
        path.write_text(json.dumps(content))
    return path


def _edges_csv(edges: list[tuple[int, int]] = EDGES) -> str:
    return "src,dst\n" + "".join(f"{s},{d}\n" for s, d in edges)


def _files(tmp_path: Path) -> dict[str, Path]:
    """The tiny graph as CSV edges, ``.npy`` features and ``.npy`` labels."""
    return {
        "edges": _write(tmp_path / "in" / "edges.csv", _edges_csv()),
        "features": _write(tmp_path / "in" / "x.npy", X),
        "labels": _write(tmp_path / "in" / "y.npy", Y),
    }


def _edge_set(store: GraphStore) -> set[tuple[int, int]]:
    return set(map(tuple, store.edge_index.t().tolist()))


def _assert_tiny(store: GraphStore) -> None:
    assert store.source == "imported" and store.informative is None
    assert (store.num_nodes, store.num_edges, store.num_features) == (N, len(EDGES), 3)
    assert _edge_set(store) == set(EDGES)
    assert torch.equal(store.x, torch.from_numpy(X))
    assert torch.equal(store.y, torch.from_numpy(Y)) and store.num_classes == 2


# ----------------------------------------------------------------------------------------------
# accepted formats


@pytest.mark.parametrize("edges_format", ["csv", "parquet"])
@pytest.mark.parametrize("features_format", ["npy", "parquet"])
def test_edges_and_features_formats(
    edges_format: str, features_format: str, tmp_path: Path, home: Path
) -> None:
    files = _files(tmp_path)
    if edges_format == "parquet":
        src, dst = np.array(EDGES).T
        files["edges"] = _write(tmp_path / "in" / "e.parquet", {"src": src, "dst": dst})
    if features_format == "parquet":
        columns = {f"f{j}": X[:, j].astype(np.float64) for j in range(3)}
        files["features"] = _write(tmp_path / "in" / "x.parquet", columns)
    result = import_graph("toy", **files)  # type: ignore[arg-type]
    assert result.path == home / "datasets" / "toy"
    assert (result.num_nodes, result.num_edges, result.num_features) == (N, 9, 3)
    assert (result.num_classes, result.num_isolated, result.multi_label) == (2, 1, False)
    assert result.split == "default" and sum(result.split_sizes) == N
    _assert_tiny(load_dataset("toy"))


@pytest.mark.parametrize(
    "array",
    [X.astype(np.float64), np.asfortranarray(X), X.astype(">f4"), X.astype(np.float16)],
    ids=["float64", "fortran", "big-endian", "float16"],
)
def test_feature_npy_layouts(array: np.ndarray, tmp_path: Path) -> None:
    files = _files(tmp_path)
    files["features"] = _write(tmp_path / "in" / "x2.npy", array)
    import_graph("toy", **files)  # type: ignore[arg-type]
    store = load_dataset("toy")
    assert store.x.dtype == torch.float32
    assert torch.equal(store.x, torch.from_numpy(array.astype(np.float32)))


def test_features_are_read_in_chunks_of_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gnnaas.data.readers

    monkeypatch.setattr(gnnaas.data.readers, "_CHUNK", 7)  # 2 rows of 3 per step, last one short
    x = X.copy()
    x[9, 1] = np.inf
    files = _files(tmp_path)
    import_graph("toy", **files)  # type: ignore[arg-type]
    assert torch.equal(load_dataset("toy").x, torch.from_numpy(X))
    files["features"] = _write(tmp_path / "in" / "x2.npy", x)
    with pytest.raises(ConfigError, match=r"row 9: column 1 is inf"):
        import_graph("toy2", **files)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("filename", "content"),
    [
        ("y.npy", Y),
        ("y64.npy", Y.reshape(N, 1).astype(np.int32)),
        ("y.csv", "label\n" + "".join(f"{v}\n" for v in Y)),
        ("y.parquet", {"label": Y}),
    ],
)
def test_label_formats(filename: str, content: Any, tmp_path: Path) -> None:
    files = _files(tmp_path)
    files["labels"] = _write(tmp_path / "in" / filename, content)
    import_graph("toy", **files)  # type: ignore[arg-type]
    _assert_tiny(load_dataset("toy"))


def test_multi_label_npy(tmp_path: Path) -> None:
    y = np.zeros((N, 4), dtype=np.uint8)
    y[np.arange(N), np.arange(N) % 4] = 1
    y[0, 3] = 1
    files = _files(tmp_path)
    files["labels"] = _write(tmp_path / "in" / "ml.npy", y)
    result = import_graph("toy", multi_label=True, **files)  # type: ignore[arg-type]
    assert result.multi_label and result.num_classes == 4
    store = load_dataset("toy")
    assert store.multi_label and store.num_classes == 4 and dataset_info("toy").multi_label
    assert store.y.dtype == torch.float32 and torch.equal(store.y, torch.from_numpy(y).float())


@pytest.mark.parametrize(
    ("filename", "content"),
    [
        ("s.json", SPLIT),
        ("s.csv", "split\n" + "train\n" * 6 + "val\nval\ntest\ntest\n"),
        ("s.parquet", {"split": ["train"] * 6 + ["val"] * 2 + ["test"] * 2}),
    ],
)
def test_split_formats(filename: str, content: Any, tmp_path: Path) -> None:
    files = _files(tmp_path)
    files["splits"] = _write(tmp_path / "in" / filename, content)
    result = import_graph("toy", **files)  # type: ignore[arg-type]
    assert result.split == "given" and result.split_sizes == (6, 2, 2)
    for seed in (0, 1):  # the given split does not follow the seed
        store = load_dataset("toy", seed=seed)
        assert [store.train_idx.tolist(), store.val_idx.tolist(), store.test_idx.tolist()] == [
            SPLIT["train"], SPLIT["val"], SPLIT["test"]
        ]  # fmt: skip


def test_split_column_may_leave_nodes_out(tmp_path: Path) -> None:
    files = _files(tmp_path)
    rows = ["train"] * 6 + ["val", "", "test", " test "]
    files["splits"] = _write(tmp_path / "in" / "s.csv", "split\n" + "\n".join(rows) + "\n")
    import_graph("toy", **files)  # type: ignore[arg-type]
    store = load_dataset("toy")
    assert store.val_idx.tolist() == [6] and store.test_idx.tolist() == [8, 9]


def test_default_split_is_stratified_and_follows_the_seed(tmp_path: Path) -> None:
    import_graph("toy", **_files(tmp_path))  # type: ignore[arg-type]
    a, b = load_dataset("toy", seed=0), load_dataset("toy", seed=1)
    assert (a.train_idx.numel(), a.val_idx.numel(), a.test_idx.numel()) == (6, 2, 2)
    for store in (a, b):
        parts = torch.cat([store.train_idx, store.val_idx, store.test_idx])
        assert torch.equal(parts.sort().values, torch.arange(N))
        assert torch.bincount(store.y[store.train_idx]).tolist() == [3, 3]  # stratified
    assert not torch.equal(a.train_idx, b.train_idx)


def test_undirected_adds_reverse_edges_once(tmp_path: Path) -> None:
    files = _files(tmp_path)
    # (0, 1) twice and its reverse (1, 0) given too: one edge each way after --undirected.
    edges = [*EDGES, (0, 1), (1, 0)]
    files["edges"] = _write(tmp_path / "in" / "e2.csv", _edges_csv(edges))
    result = import_graph("toy", undirected=True, **files)  # type: ignore[arg-type]
    expected = set(EDGES) | {(d, s) for s, d in EDGES}
    assert result.num_edges == len(expected) == 18
    store = load_dataset("toy")
    assert _edge_set(store) == expected and store.num_edges == 18


def test_directed_edges_are_kept_as_given(tmp_path: Path) -> None:
    files = _files(tmp_path)
    files["edges"] = _write(tmp_path / "in" / "e2.csv", _edges_csv([*EDGES, (0, 1), (9, 9)]))
    result = import_graph("toy", **files)  # type: ignore[arg-type]
    assert result.num_edges == 11 and result.num_isolated == 0  # 9 has a self loop
    store = load_dataset("toy")
    assert store.col[store.rowptr[1] : store.rowptr[2]].tolist() == [0, 0]  # duplicate kept


def test_edges_to_csr_matches_the_store() -> None:
    src, dst = np.array(EDGES).T
    rowptr, col = edges_to_csr(src, dst, N)
    store = GraphStore.from_edge_index(
        "t", torch.tensor(EDGES).t(), torch.zeros(N, 1), torch.zeros(N), 2
    )
    assert rowptr.tolist() == store.rowptr.tolist() and col.tolist() == store.col.tolist()


def _save_pyg(path: Path, masks: bool = True, **override: torch.Tensor) -> Path:
    from safetensors.torch import save_file

    tensors = {
        "x": torch.from_numpy(X),
        "edge_index": torch.tensor(EDGES).t().contiguous(),
        "y": torch.from_numpy(Y),
        "edge_attr": torch.ones(len(EDGES), 2),  # other tensors are ignored
    }
    if masks:
        for key, ids in SPLIT.items():
            mask = torch.zeros(N, dtype=torch.bool)
            mask[ids] = True
            tensors[f"{key}_mask"] = mask
    tensors.update(override)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path))
    return path


@pytest.mark.parametrize("masks", [True, False])
def test_from_pyg_safetensors(masks: bool, tmp_path: Path) -> None:
    path = _save_pyg(tmp_path / "in" / "data.safetensors", masks=masks)
    result = import_graph("toy", from_pyg=path)
    assert result.split == ("given" if masks else "default")
    store = load_dataset("toy")
    _assert_tiny(store)
    if masks:
        assert store.val_idx.tolist() == SPLIT["val"]


def test_names_are_case_insensitive_and_listed(tmp_path: Path) -> None:
    import_graph("My.Toy_1", **_files(tmp_path))  # type: ignore[arg-type]
    info = dataset_info("my.toy_1")
    assert (info.name, info.source, info.num_nodes) == ("My.Toy_1", "imported", N)
    assert (info.num_edges, info.num_features, info.num_classes) == (9, 3, 2)
    assert load_dataset("MY.TOY_1").name == "My.Toy_1"
    listed = [d for d in list_datasets() if d.source == "imported"]
    assert listed == [info]
    assert list_datasets()[0].name == "Cora"  # built-in ones first


def test_unknown_name_lists_imported_ones(tmp_path: Path) -> None:
    import_graph("toy", **_files(tmp_path))  # type: ignore[arg-type]
    known = r"unknown dataset 'toyy'; known datasets: .*synth-products, toy "
    with pytest.raises(ConfigError, match=known):
        load_dataset("toyy")


def test_existing_name_needs_force(tmp_path: Path, home: Path) -> None:
    files = _files(tmp_path)
    import_graph("toy", **files)  # type: ignore[arg-type]
    files["features"] = _write(tmp_path / "in" / "x2.npy", X * 2)
    with pytest.raises(ConfigError, match=r"dataset 'Toy' is already imported .*pass --force"):
        import_graph("Toy", **files)  # type: ignore[arg-type]
    assert torch.equal(load_dataset("toy").x, torch.from_numpy(X))
    import_graph("Toy", force=True, **files)  # type: ignore[arg-type]
    store = load_dataset("toy")
    assert store.name == "Toy" and torch.equal(store.x, torch.from_numpy(X * 2))
    assert sorted(p.name for p in (home / "datasets").iterdir()) == ["toy"]  # no leftovers


def test_a_failed_write_leaves_the_old_store(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import safetensors.torch

    files = _files(tmp_path)
    import_graph("toy", **files)  # type: ignore[arg-type]

    def full_disk(tensors: Any, filename: str, metadata: Any = None) -> None:
        Path(filename).write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    with pytest.raises(OSError, match="No space"):
        import_graph("toy", force=True, **files)  # type: ignore[arg-type]
    with pytest.raises(OSError, match="No space"):
        import_graph("other", **files)  # type: ignore[arg-type]
    assert sorted(p.name for p in (home / "datasets").iterdir()) == ["toy"]
    _assert_tiny(load_dataset("toy"))


def test_home_defaults_to_local_share(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GNNAAS_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_home_dir() == tmp_path / ".local" / "share" / "gnnaas"
    monkeypatch.setenv("GNNAAS_HOME", str(tmp_path / "elsewhere"))
    assert resolve_home_dir() == tmp_path / "elsewhere"
    assert resolve_home_dir(tmp_path / "arg") == tmp_path / "arg"


# ----------------------------------------------------------------------------------------------
# malformed inputs: one message naming the file (and row), nothing written

_Y_FLOAT = np.array([0.0, 1.0, 0.5] + [0.0] * 7)
_ML_BAD = np.eye(N, 3, dtype=np.int64) * 2


def _npy_bytes(array: np.ndarray) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


_TRUNCATED = _npy_bytes(X)[:-5]  # the last row is cut short

BAD_INPUTS = [
    # (option, file name, content, expected message)
    ("edges", "e.csv", "src,dst\n0,1\n1,12\n",
     r"^edges file \S+e\.csv, row 1 \(line 3\): dst 12 is outside \[0, 10\); the features have 10"),
    ("edges", "e.csv", "src,dst\n0,1\n-1,2\n",
     r"^edges file \S+, row 1 \(line 3\): src -1 is outside \[0, 10\)"),
    ("edges", "e.parquet", {"src": [0, 1, 2], "dst": [1, 2, 10]},
     r"^edges file \S+e\.parquet, row 2: dst 10 is outside \[0, 10\)"),
    ("edges", "e.csv", "0,1\n1,2\n",
     r"no column 'src' \(found '0', '1'\) \(the file seems to have no header line\); the first "
     r"line must be the header src,dst"),
    ("edges", "e.csv", "src,target\n0,1\n", r"no column 'dst' \(found 'src', 'target'\)"),
    ("edges", "e.csv", "src,dst\n0,1\n1,2.5\n", r"row 1 \(line 3\): dst 2\.5 is not an integer"),
    ("edges", "e.csv", "src,dst\n0,1\nx,2\n", r"row 1 \(line 3\): src 'x' is not an integer"),
    ("edges", "e.csv", "src,dst\n0,1\n,2\n", r"row 1 \(line 3\): 'src' is empty"),
    ("edges", "e.parquet", {"src": [0.0, 1.0], "dst": [1, 2]},
     r"column 'src' holds double numbers; it must hold integers"),
    ("edges", "e.txt", _edges_csv(), r"^edges file \S+e\.txt: unknown format '\.txt'; expected "
     r"\.csv or \.parquet"),
    ("edges", "e.parquet", b"not parquet at all", r"^edges file \S+: cannot read it as parquet"),
    ("features", "x.npy", np.where(np.arange(30).reshape(10, 3) == 7, np.nan, 1.0),
     r"^features file \S+x\.npy, row 2: column 1 is NaN; features must be finite"),
    ("features", "x.npy", np.where(np.arange(30).reshape(10, 3) == 29, np.inf, 1.0),
     r"row 9: column 2 is inf"),
    ("features", "x.parquet", {"a": [1.0] * 10, "b": [1.0] * 9 + [float("nan")]},
     r"^features file \S+x\.parquet, row 9: column 'b' is NaN"),
    ("features", "x.parquet", {"a": [1.0] * 10, "name": ["n"] * 10},
     r"column 'name' has type string; feature columns must be numeric"),
    ("features", "x.npy", np.array(["a", "b"]), r"dtype <U1 is not numeric"),
    ("features", "x.npy", np.ones(10), r"shape \[10\]; features must be \[N, F\]"),
    ("features", "x.npy", b"\x93NUMPY garbage", r"^features file \S+: cannot read it as npy"),
    ("features", "x.npy", _TRUNCATED, r"^features file \S+: the file ends early, in row 9"),
    ("labels", "y.npy", Y[:9], r"^labels file \S+y\.npy: 9 rows but the features have 10"),
    ("labels", "y.npy", np.array([0, 1, 0, -2, 1, 0, 1, 0, 1, 0]),
     r"^labels file \S+, row 3: label -2 is negative"),
    ("labels", "y.csv", "label\n" + "0\n1\n" * 4 + "1\n-1\n",
     r"row 9 \(line 11\): label -1 is negative"),
    ("labels", "y.csv", "class\n" + "0\n" * 10, r"no column 'label' \(found 'class'\)"),
    ("labels", "y.npy", _Y_FLOAT, r"row 2: label 0\.5 is not an integer class id"),
    ("labels", "y.npy", Y.astype(np.float64), r"dtype float64; labels must be integer class ids"),
    ("labels", "y.npy", np.eye(N, 3), r"shape \[10, 3\] is a label matrix; pass --multi-label"),
    ("splits", "s.json", {**SPLIT, "val": [6, 2]},
     r"^splits file \S+s\.json: node 2 is in both 'train' and 'val' \(val\[1\]\)"),
    ("splits", "s.json", {**SPLIT, "test": [8, 9, 8]},
     r"node 8 is listed twice in 'test' \(test\[0\], test\[2\]\)"),
    ("splits", "s.json", {**SPLIT, "val": []}, r"'val' is empty; train, val and test each need"),
    ("splits", "s.json", {**SPLIT, "test": [8, 10]}, r"test\[1\]: node 10 is outside \[0, 10\)"),
    ("splits", "s.json", {**SPLIT, "test": [8, "9"]}, r"test\[1\] is \"9\", not an integer"),
    ("splits", "s.json", {"train": [0], "valid": [1], "test": [2]}, r"unknown key 'valid'"),
    ("splits", "s.json", "{not json", r"^splits file \S+: cannot read it as json"),
    ("splits", "s.csv", "split\n" + "train\n" * 8 + "tset\ntest\n",
     r"row 8 \(line 10\): split 'tset' is not train, val or test"),
    ("splits", "s.parquet", {"split": ["train"] * 8 + ["test"] * 2}, r"'val' is empty"),
    ("splits", "s.csv", "split\ntrain\n", r"1 rows but the features have 10"),
]  # fmt: skip


@pytest.mark.parametrize(("option", "filename", "content", "match"), BAD_INPUTS)
def test_malformed_input_is_one_clear_error(
    option: str, filename: str, content: Any, match: str, tmp_path: Path, home: Path
) -> None:
    files = _files(tmp_path)
    files[option] = _write(tmp_path / "bad" / filename, content)
    with pytest.raises(ConfigError, match=match) as exc:
        import_graph("toy", **files)  # type: ignore[arg-type]
    assert "\n" not in str(exc.value)
    assert not home.exists()  # nothing written, not even the home folder


def test_malformed_multi_label(tmp_path: Path, home: Path) -> None:
    files = _files(tmp_path)
    files["labels"] = _write(tmp_path / "bad" / "y.npy", _ML_BAD)
    with pytest.raises(ConfigError, match=r"row 0: column 0 is 2; multi-label labels are 0 or 1"):
        import_graph("toy", multi_label=True, **files)  # type: ignore[arg-type]
    files["labels"] = _write(tmp_path / "bad" / "y.csv", "label\n" + "0\n" * 10)
    with pytest.raises(ConfigError, match=r"multi-label labels must be an \[N, C\] 0/1 \.npy"):
        import_graph("toy", multi_label=True, **files)  # type: ignore[arg-type]
    assert not home.exists()


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ({"edge_index": torch.tensor([[0, 1], [1, 10]])},
         r"edge_index\[1, 1\]: target 10 is outside \[0, 10\)"),
        ({"edge_index": torch.zeros(3, 2, dtype=torch.long)}, r"edge_index: shape \[3, 2\]"),
        ({"x": torch.full((N, 2), float("nan"))}, r"row 0: x: column 0 is NaN"),
        ({"y": torch.ones(N - 1, dtype=torch.long)}, r"y: 9 rows but the features have 10"),
        ({"train_mask": torch.ones(N, dtype=torch.bool)}, r"node 6 is in both 'train' and 'val'"),
    ],
)  # fmt: skip
def test_malformed_pyg(
    override: dict[str, torch.Tensor], match: str, tmp_path: Path, home: Path
) -> None:
    path = _save_pyg(tmp_path / "in" / "data.safetensors", **override)
    with pytest.raises(ConfigError, match=r"^from-pyg file \S+data\.safetensors.*" + match):
        import_graph("toy", from_pyg=path)
    assert not home.exists()


def test_pyg_file_needs_its_tensors_and_no_pickle(tmp_path: Path, home: Path) -> None:
    from safetensors.torch import save_file

    path = tmp_path / "in" / "data.safetensors"
    path.parent.mkdir()
    save_file({"x": torch.from_numpy(X)}, str(path))
    with pytest.raises(ConfigError, match=r"no tensor 'edge_index' \(found: x\); save the Data"):
        import_graph("toy", from_pyg=path)
    pickled = tmp_path / "in" / "data.pt"
    torch.save({"x": torch.from_numpy(X)}, pickled)
    with pytest.raises(ConfigError, match=r"unknown format '\.pt'; expected \.safetensors"):
        import_graph("toy", from_pyg=pickled)
    fake = _write(tmp_path / "in" / "fake.safetensors", b"\x80\x04 a pickle")
    with pytest.raises(ConfigError, match=r"cannot read it as safetensors .*save_file"):
        import_graph("toy", from_pyg=fake)
    with pytest.raises(ConfigError, match=r"--from-pyg holds the whole graph; leave out --edges"):
        import_graph("toy", from_pyg=path, edges=path)
    assert not home.exists()


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("cora", r"'cora' is the built-in dataset Cora; pick another name"),
        ("OGBN-Arxiv", r"built-in dataset ogbn-arxiv"),
        ("synth-mine", r"'synth-mine' clashes with the built-in synthetic datasets"),
        ("a/b", r"dataset name 'a/b' is not allowed"),
        ("", r"dataset name '' is not allowed"),
        ("x@0.1", r"not allowed"),
    ],
)
def test_bad_names(name: str, match: str, tmp_path: Path, home: Path) -> None:
    with pytest.raises(ConfigError, match=match):
        import_graph(name, **_files(tmp_path))  # type: ignore[arg-type]
    assert not home.exists()


def test_missing_files_and_options(tmp_path: Path, home: Path) -> None:
    files = _files(tmp_path)
    files["labels"] = tmp_path / "nowhere.npy"
    with pytest.raises(ConfigError, match=r"^labels file \S+nowhere\.npy: does not exist"):
        import_graph("toy", **files)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"give --edges FILE, --features FILE and --labels"):
        import_graph("toy", edges=files["edges"])
    assert not home.exists()


def test_default_split_needs_enough_nodes_per_class(tmp_path: Path, home: Path) -> None:
    files = _files(tmp_path)
    files["labels"] = _write(tmp_path / "in" / "y2.npy", np.arange(N) % 5)  # 2 nodes per class
    with pytest.raises(ConfigError, match=r"default stratified 60/20/20 split .* pass --splits"):
        import_graph("toy", **files)  # type: ignore[arg-type]
    assert not home.exists()
    files["splits"] = _write(tmp_path / "in" / "s.json", SPLIT)
    assert import_graph("toy", **files).split == "given"  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------
# round trip: a built-in graph exported to files and imported trains to the same accuracy


def test_round_trip_of_synth_small(small_store: GraphStore, tmp_path: Path) -> None:
    from gnnaas.variants.training import TrainConfig, train_model

    src, dst = small_store.edge_index.numpy()
    out = tmp_path / "export"
    files = {
        "edges": _write(out / "edges.parquet", {"src": src, "dst": dst}),
        "features": _write(out / "x.npy", small_store.x.numpy()),
        "labels": _write(out / "y.npy", small_store.y.numpy()),
        "splits": _write(
            out / "splits.json",
            {
                "train": small_store.train_idx.tolist(),
                "val": small_store.val_idx.tolist(),
                "test": small_store.test_idx.tolist(),
            },
        ),
    }
    result = import_graph("small-copy", **files)  # type: ignore[arg-type]
    assert result.num_edges == small_store.num_edges and result.split == "given"
    store = load_dataset("Small-Copy")
    assert (store.num_nodes, store.num_edges) == (small_store.num_nodes, small_store.num_edges)
    assert torch.equal(store.rowptr, small_store.rowptr) and torch.equal(store.col, small_store.col)
    assert torch.equal(store.x, small_store.x) and torch.equal(store.y, small_store.y)
    assert torch.equal(store.val_idx, small_store.val_idx)

    config = TrainConfig(seed=0, max_epochs=3)
    built_in = train_model(small_store, "sage", config)
    imported = train_model(store, "sage", config)
    assert imported.val_acc == pytest.approx(built_in.val_acc, abs=0.02)
    assert imported.test_acc == pytest.approx(built_in.test_acc, abs=0.02)
