"""Real datasets, read offline from a data root; processed copies go to a writable cache.

PyG's own classes (``Planetoid``, ``Flickr``, ``Reddit``, ``Yelp``) read the raw files; a small
mixin points their ``raw_dir`` at the (possibly read-only) data root, their ``processed_dir`` at a
scratch folder in the cache, and turns any download attempt into a :class:`ConfigError`. The
result is kept in the cache as one safetensors file (CSR already built, never a pickle), keyed by
the raw files' sizes and modification times. ogbn-* raw files are OGB's plain CSVs, read with
pandas in the same way as the ``ogb`` package does.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gnnaas.data.splits import choose_split
from gnnaas.data.store import GraphStore, edge_index_to_csr
from gnnaas.errors import ConfigError
from gnnaas.utils import new_file_mode

__all__ = ["REAL_DATASETS", "RealDataset", "load_real"]

_log = logging.getLogger(__name__)

_FORMAT = 1  # bump when the cached tensors change meaning


@dataclass(frozen=True)
class RealDataset:
    """Static description of a real dataset (what ``gnnaas datasets`` lists without loading).

    Args:
        name (str): canonical name.
        group (str): folder under the data root (PyG class, or ``ogb``).
        folder (str): the dataset's folder inside ``group``.
        source (str): ``"planetoid"``, ``"pyg"`` or ``"ogb"``.
        num_nodes (int): nodes.
        num_edges (int): stored directed edges once loaded.
        num_features (int): feature columns.
        num_classes (int): classes.
        multi_label (bool): multi-label targets.
        raw_files (tuple[str, ...]): files expected in the raw folder.
    """

    name: str
    group: str
    folder: str
    source: str
    num_nodes: int
    num_edges: int
    num_features: int
    num_classes: int
    multi_label: bool
    raw_files: tuple[str, ...]

    def raw_dir_candidates(self, root: Path) -> list[Path]:
        """``<root>/<Class>/<Name>/raw`` first, then PyG's/OGB's own ``<root>/<Name>/raw``."""
        return [root / self.group / self.folder / "raw", root / self.folder / "raw"]


def _planetoid(name: str, nodes: int, edges: int, feats: int, classes: int) -> RealDataset:
    files = tuple(
        f"ind.{name.lower()}.{s}" for s in ("x", "tx", "allx", "y", "ty", "ally", "graph")
    )
    return RealDataset(
        name, "Planetoid", name, "planetoid", nodes, edges, feats, classes, False,
        (*files, f"ind.{name.lower()}.test.index"),
    )  # fmt: skip


_SAINT = ("adj_full.npz", "feats.npy", "class_map.json", "role.json")
_OGB = ("edge.csv.gz", "node-feat.csv.gz", "node-label.csv.gz")

#: lower-case name → description; edge counts are what the loaded store holds (both directions)
REAL_DATASETS: dict[str, RealDataset] = {
    d.name.lower(): d
    for d in (
        _planetoid("Cora", 2_708, 10_556, 1_433, 7),
        _planetoid("CiteSeer", 3_327, 9_104, 3_703, 6),
        _planetoid("PubMed", 19_717, 88_648, 500, 3),
        RealDataset("Flickr", "Flickr", "Flickr", "pyg", 89_250, 899_756, 500, 7, False, _SAINT),
        RealDataset(
            "Reddit", "Reddit", "Reddit", "pyg", 232_965, 114_615_892, 602, 41, False,
            ("reddit_data.npz", "reddit_graph.npz"),
        ),
        RealDataset("Yelp", "Yelp", "Yelp", "pyg", 716_847, 13_954_819, 300, 100, True, _SAINT),
        # ogbn-arxiv is a directed citation graph; it is made symmetric on load.
        RealDataset(
            "ogbn-arxiv", "ogb", "ogbn_arxiv", "ogb", 169_343, 2_315_598, 128, 40, False, _OGB
        ),
        RealDataset(
            "ogbn-products", "ogb", "ogbn_products", "ogb", 2_449_029, 123_718_280, 100, 47, False,
            _OGB,
        ),
    )
}  # fmt: skip


# ----------------------------------------------------------------------------------------------
# locating raw files


def _find_raw_dir(spec: RealDataset, root: Path) -> Path:
    for candidate in spec.raw_dir_candidates(root):
        if all((candidate / f).is_file() for f in spec.raw_files):
            return candidate
    expected = spec.raw_dir_candidates(root)[0]
    missing = [f for f in spec.raw_files if not (expected / f).is_file()]
    hint = ""
    if spec.source == "ogb":
        hint = (
            f" (download once with the ogb package: pip install ogb, then "
            f"PygNodePropPredDataset('{spec.name}', root='{root / spec.group}'))"
        )
    raise ConfigError(
        f"raw files of dataset '{spec.name}' not found: expected {expected}/ holding "
        f"{', '.join(missing)}{hint}; gnnaas never downloads. Point --data-root (or GNNAAS_DATA) "
        f"at the folder that holds {spec.group}/{spec.folder}/raw/"
    )


def _fingerprint(raw_dir: Path) -> str:
    """Names, sizes and modification times of every file under the dataset's folder."""
    base = raw_dir.parent
    parts = []
    for path in sorted(p for p in base.rglob("*") if p.is_file()):
        st = path.stat()
        parts.append(f"{path.relative_to(base)}:{st.st_size}:{st.st_mtime_ns}")
    return "|".join(parts)


# ----------------------------------------------------------------------------------------------
# reading with PyG's classes, without downloads and without writing under the data root


class _Offline:
    """Mixin for PyG datasets: raw files from ``raw_dir``, processed files to ``processed_dir``."""

    def __init__(self, *args: Any, raw_dir: Path, processed_dir: Path, **kwargs: Any) -> None:
        self._gnnaas_raw_dir = str(raw_dir)
        self._gnnaas_processed_dir = str(processed_dir)
        super().__init__(*args, **kwargs)

    @property
    def raw_dir(self) -> str:
        return self._gnnaas_raw_dir

    @property
    def processed_dir(self) -> str:
        return self._gnnaas_processed_dir

    # PyG prints "Processing..." to stderr when log is on; library code stays quiet.
    @property
    def log(self) -> bool:
        return False

    @log.setter
    def log(self, value: bool) -> None:
        pass

    def download(self) -> None:
        raise ConfigError(f"raw files missing under {self.raw_dir}; gnnaas never downloads")


def _pyg_data(spec: RealDataset, raw_dir: Path, scratch: Path) -> Any:
    with warnings.catch_warnings():
        # torch_geometric's import trips torch's own deprecations (torch.jit.script); not ours.
        warnings.simplefilter("ignore", DeprecationWarning)
        from torch_geometric import datasets

    base = getattr(datasets, spec.group)
    cls = type(f"_Offline{spec.group}", (_Offline, base), {})
    kwargs: dict[str, Any] = {"raw_dir": raw_dir, "processed_dir": scratch / "processed"}
    if spec.group == "Planetoid":
        return cls(str(scratch), spec.name, **kwargs)[0]
    return cls(str(scratch), **kwargs)[0]


def _mask_ids(data: Any, key: str) -> Tensor:
    mask = getattr(data, key, None)
    return torch.empty(0, dtype=torch.long) if mask is None else mask.nonzero().view(-1)


def _read_pyg(spec: RealDataset, raw_dir: Path, scratch: Path) -> dict[str, Tensor]:
    data = _pyg_data(spec, raw_dir, scratch)
    n = int(data.num_nodes)
    rowptr, col = edge_index_to_csr(data.edge_index, n)
    y = data.y.float() if spec.multi_label else data.y.long().view(-1)
    return {
        "rowptr": rowptr,
        "col": col,
        "x": data.x.float().contiguous(),
        "y": y,
        "own_train": _mask_ids(data, "train_mask"),
        "own_val": _mask_ids(data, "val_mask"),
        "own_test": _mask_ids(data, "test_mask"),
    }


def _read_csv(path: Path, dtype: Any) -> Tensor:
    import numpy as np
    import pandas as pd

    array = pd.read_csv(path, header=None, dtype=dtype).to_numpy()
    return torch.from_numpy(np.require(array, requirements=["C", "W"]))


def _symmetric_csr(edges: Tensor, num_nodes: int) -> tuple[Tensor, Tensor]:
    """CSR of ``edges`` ([E, 2] source, target) plus their reverses, deduplicated."""
    src, dst = edges[:, 0], edges[:, 1]
    key = torch.unique(torch.cat([dst * num_nodes + src, src * num_nodes + dst]))  # sorted
    rowptr = torch.searchsorted(key, torch.arange(num_nodes + 1) * num_nodes)
    return rowptr, key.remainder_(num_nodes)


def _read_ogb(spec: RealDataset, raw_dir: Path) -> dict[str, Tensor]:
    import numpy as np

    x = _read_csv(raw_dir / "node-feat.csv.gz", np.float32)
    y = _read_csv(raw_dir / "node-label.csv.gz", np.int64).view(-1)
    edges = _read_csv(raw_dir / "edge.csv.gz", np.int64)
    if edges.numel() and (int(edges.min()) < 0 or int(edges.max()) >= x.size(0)):
        raise ConfigError(f"{raw_dir / 'edge.csv.gz'}: node ids outside [0, {x.size(0)})")
    rowptr, col = _symmetric_csr(edges, x.size(0))
    del edges
    out = {"rowptr": rowptr, "col": col, "x": x.contiguous(), "y": y}
    split_root = raw_dir.parent / "split"
    split_dirs = sorted(p for p in split_root.glob("*") if (p / "train.csv.gz").is_file())
    for key, file in (("own_train", "train"), ("own_val", "valid"), ("own_test", "test")):
        out[key] = (
            _read_csv(split_dirs[0] / f"{file}.csv.gz", np.int64).view(-1)
            if split_dirs
            else torch.empty(0, dtype=torch.long)
        )
    return out


# ----------------------------------------------------------------------------------------------
# cache


def _cache_path(spec: RealDataset, cache_dir: Path) -> Path:
    return cache_dir / "datasets" / spec.group / spec.folder / f"graph-v{_FORMAT}.safetensors"


def _read_cache(path: Path, fingerprint: str) -> dict[str, Tensor] | None:
    from safetensors import safe_open
    from safetensors.torch import load_file

    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            if (f.metadata() or {}).get("fingerprint") != fingerprint:
                return None
        return load_file(str(path))
    except Exception as exc:  # a corrupt cache file is rebuilt, never trusted
        _log.warning("ignoring unreadable cache file %s: %s", path, exc)
        return None


def _write_cache(path: Path, tensors: dict[str, Tensor], fingerprint: str) -> None:
    from safetensors.torch import save_file

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(tmp), metadata={"fingerprint": fingerprint})
        os.chmod(tmp, new_file_mode())  # safetensors writes 0600
        os.replace(tmp, path)
    except OSError as exc:  # a full or read-only cache only costs a re-read next time
        _log.warning("could not cache %s: %s", path, exc)
        tmp.unlink(missing_ok=True)


def load_real(spec: RealDataset, data_root: Path, *, seed: int, cache_dir: Path) -> GraphStore:
    """Reads a real dataset from ``data_root`` (offline), through the cache in ``cache_dir``.

    Args:
        spec (RealDataset): which dataset.
        data_root (Path): folder holding ``<Class>/<Name>/raw/``; only read.
        seed (int): seed of the stratified fallback split.
        cache_dir (Path): writable folder for processed files.

    Returns:
        GraphStore: the graph with splits chosen by :func:`gnnaas.data.splits.choose_split`.
    """
    if not data_root.is_dir():
        raise ConfigError(
            f"data root '{data_root}' for dataset '{spec.name}' is not a folder; point "
            f"--data-root (or GNNAAS_DATA) at the folder that holds {spec.group}/{spec.folder}/raw/"
        )
    raw_dir = _find_raw_dir(spec, data_root)
    fingerprint = f"{raw_dir.resolve()}|{_fingerprint(raw_dir)}"
    path = _cache_path(spec, cache_dir)
    tensors = _read_cache(path, fingerprint)
    if tensors is None:
        _log.info("processing %s from %s into %s", spec.name, raw_dir, path.parent)
        if spec.source == "ogb":
            tensors = _read_ogb(spec, raw_dir)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            scratch = Path(tempfile.mkdtemp(prefix=".pyg-", dir=path.parent))
            try:
                tensors = _read_pyg(spec, raw_dir, scratch)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        _write_cache(path, tensors, fingerprint)
    y = tensors["y"]
    own = (tensors["own_train"], tensors["own_val"], tensors["own_test"])
    train, val, test = choose_split(y, own if own[0].numel() else None, seed=seed)
    return GraphStore(
        name=spec.name,
        rowptr=tensors["rowptr"],
        col=tensors["col"],
        x=tensors["x"],
        y=y,
        num_classes=spec.num_classes,
        multi_label=spec.multi_label,
        train_idx=train,
        val_idx=val,
        test_idx=test,
        informative=None,
        source=spec.source,
    )
