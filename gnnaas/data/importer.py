"""``gnnaas import``: a user's graph files → a checked graph store under gnnaas's data home.

:func:`import_graph` reads the features first (they fix ``N``), then the labels, the edges and the
optional split (:mod:`gnnaas.data.readers` checks each file and names the offending row), builds
the CSR over incoming edges with one in-place sort, and only then writes anything
(:func:`gnnaas.data.imported.write_imported`, atomic). Afterwards the name works wherever a
dataset name does (source ``imported``).

Memory: features are converted into their final float32 array once; edge ids are read one column
at a time and folded into one int64 key per edge (``target * N + source``) that is sorted in place
and becomes ``col``, so the peak stays near twice the final store.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from gnnaas.data.imported import (
    check_import_name,
    check_not_imported,
    resolve_home_dir,
    write_imported,
)
from gnnaas.data.pyg_file import read_pyg
from gnnaas.data.readers import (
    SourceFile,
    read_edges,
    read_features,
    read_labels,
    read_splits,
    release_unused_memory,
)
from gnnaas.data.splits import MIN_TRAIN_FRACTION, choose_split
from gnnaas.errors import ConfigError
from gnnaas.typing import PathType

__all__ = ["ImportResult", "edges_to_csr", "import_graph"]


@dataclass(frozen=True)
class ImportResult:
    """What :func:`import_graph` stored.

    Args:
        name (str): the dataset's name, as given.
        path (Path): the folder of its store.
        num_nodes (int): nodes ``N``.
        num_edges (int): stored directed edges (with ``undirected``, both directions).
        num_features (int): feature columns ``F``.
        num_classes (int): classes ``C``.
        multi_label (bool): labels are an ``[N, C]`` 0/1 matrix.
        num_isolated (int): nodes without any incoming or outgoing edge.
        split (str): ``"given"`` (the file's split is used) or ``"default"`` (the seeded,
            stratified 60/20/20 split, drawn again for every ``--seed``).
        split_sizes (tuple[int, int, int]): train, validation and test nodes (seed 0).
        split_replaced (bool): a split was given but trains on fewer than 10% of nodes, so the
            default one is used instead (docs/architecture.md §3).
        import_time_s (float): wall time of the import, writing included.
    """

    name: str
    path: Path
    num_nodes: int
    num_edges: int
    num_features: int
    num_classes: int
    multi_label: bool
    num_isolated: int
    split: str
    split_sizes: tuple[int, int, int]
    split_replaced: bool
    import_time_s: float


def edges_to_csr(
    src: np.ndarray, dst: np.ndarray, num_nodes: int, *, undirected: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """CSR over incoming edges, sorted by target then source (as :class:`GraphStore` keeps it).

    Directed edges are kept as given, duplicates and self loops included; with ``undirected``
    every edge is added in both directions and duplicates are dropped.

    Args:
        src (np.ndarray): ``[E]`` int64 sources in ``[0, N)``.
        dst (np.ndarray): ``[E]`` int64 targets in ``[0, N)``.
        num_nodes (int): ``N``.
        undirected (bool, optional): symmetrize and deduplicate. (default: :obj:`False`)

    Returns:
        tuple[np.ndarray, np.ndarray]: ``rowptr`` ``[N + 1]`` and ``col`` ``[E']``, int64.

    Example:
        >>> rowptr, col = edges_to_csr(np.array([0, 1]), np.array([1, 2]), 3, undirected=True)
        >>> rowptr.tolist(), col.tolist()
        ([0, 1, 3, 4], [1, 0, 2, 1])
    """
    key = _edge_keys(src, dst, num_nodes, undirected)
    return _keys_to_csr(key, num_nodes, dedupe=undirected)


def _edge_keys(src: np.ndarray, dst: np.ndarray, n: int, undirected: bool) -> np.ndarray:
    """One int64 key ``target * N + source`` per stored edge (both directions if undirected)."""
    e = src.size
    key = np.empty(2 * e if undirected else e, dtype=np.int64)  # [E] or [2E]
    np.multiply(dst, n, out=key[:e], dtype=np.int64)
    key[:e] += src
    if undirected:
        np.multiply(src, n, out=key[e:], dtype=np.int64)
        key[e:] += dst
    return key


def _keys_to_csr(key: np.ndarray, n: int, *, dedupe: bool) -> tuple[np.ndarray, np.ndarray]:
    """Sorts ``key`` in place (no index array next to it) and turns it into ``col``."""
    key.sort()
    if dedupe and key.size > 1:
        keep = np.empty(key.size, dtype=bool)
        keep[0] = True
        np.not_equal(key[1:], key[:-1], out=keep[1:])
        key = key[keep]
    # Target i's edges are the keys in [i * N, (i + 1) * N); the source is the remainder.
    rowptr = np.searchsorted(key, np.arange(n + 1, dtype=np.int64) * n)
    np.remainder(key, n, out=key)
    return rowptr.astype(np.int64, copy=False), key


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor sharing ``array``'s memory (copied only if read-only or not contiguous)."""
    return torch.from_numpy(np.require(array, requirements=["C", "W"]))


def _files(
    edges: PathType | None,
    features: PathType | None,
    labels: PathType | None,
    splits: PathType | None,
    from_pyg: PathType | None,
) -> dict[str, SourceFile]:
    if from_pyg is not None:
        if any(p is not None for p in (edges, features, labels, splits)):
            raise ConfigError(
                "import: --from-pyg holds the whole graph; leave out --edges, --features, "
                "--labels and --splits"
            )
        return {"pyg": SourceFile("from-pyg", from_pyg, ("safetensors",))}
    if edges is None or features is None or labels is None:
        raise ConfigError(
            "import: give --edges FILE, --features FILE and --labels FILE (or --from-pyg FILE)"
        )
    files = {
        "edges": SourceFile("edges", edges, ("csv", "parquet")),
        "features": SourceFile("features", features, ("npy", "parquet")),
        "labels": SourceFile("labels", labels, ("npy", "csv", "parquet")),
    }
    if splits is not None:
        files["splits"] = SourceFile("splits", splits, ("json", "csv", "parquet"))
    return files


def import_graph(
    name: str,
    *,
    edges: PathType | None = None,
    features: PathType | None = None,
    labels: PathType | None = None,
    splits: PathType | None = None,
    from_pyg: PathType | None = None,
    undirected: bool = False,
    multi_label: bool = False,
    force: bool = False,
    home: PathType | None = None,
    on_phase: Callable[[str], None] | None = None,
) -> ImportResult:
    """Checks a user's graph files and stores them as dataset ``name`` under the data home.

    Nothing is written unless every check passes; the store appears atomically.

    Args:
        name (str): the new dataset's name (case-insensitive afterwards; no built-in name).
        edges (str or PathLike, optional): CSV or Parquet edge table with integer columns
            ``src,dst`` (header required). (default: :obj:`None`)
        features (str or PathLike, optional): ``.npy`` ``[N, F]`` or Parquet, one row per node.
            (default: :obj:`None`)
        labels (str or PathLike, optional): ``.npy`` ``[N]`` class ids or ``[N, C]`` 0/1, or
            CSV/Parquet with a ``label`` column. (default: :obj:`None`)
        splits (str or PathLike, optional): JSON ``{"train": [...], "val": [...], "test":
            [...]}`` or CSV/Parquet with a ``split`` column (``train``/``val``/``test``); without
            it the seeded, stratified 60/20/20 split applies. (default: :obj:`None`)
        from_pyg (str or PathLike, optional): instead of the four files: a PyG ``Data`` saved
            as safetensors (``x``, ``edge_index``, ``y``, optional ``*_mask``).
            (default: :obj:`None`)
        undirected (bool, optional): add every edge in both directions, deduplicated.
            (default: :obj:`False`)
        multi_label (bool, optional): labels are an ``[N, C]`` 0/1 matrix. (default: :obj:`False`)
        force (bool, optional): replace a dataset imported under the same name.
            (default: :obj:`False`)
        home (str or PathLike, optional): the data home; else ``$GNNAAS_HOME``, else
            ``~/.local/share/gnnaas``. (default: :obj:`None`)
        on_phase (Callable[[str], None], optional): called with a short line as each phase
            starts (reading, building, writing). (default: :obj:`None`)

    Returns:
        ImportResult: what was stored and where.

    Raises:
        ConfigError: a bad name, an existing dataset without ``force``, or a file that is
            missing, unreadable or malformed (the message names the file and row).

    Example:
        >>> result = import_graph("mygraph", edges="edges.csv", features="x.npy",
        ...                       labels="y.npy", undirected=True)  # doctest: +SKIP
    """
    start = time.perf_counter()
    say = on_phase or (lambda message: None)
    name = check_import_name(name)
    root = resolve_home_dir(home)
    if not force:
        check_not_imported(name, root)  # fail before reading gigabytes
    files = _files(edges, features, labels, splits, from_pyg)

    read = _read_pyg_graph if "pyg" in files else _read_graph_files
    graph = read(files, multi_label=multi_label, undirected=undirected, say=say)
    say(f"writing the store into {root}")
    result = _stored(name, graph, root, multi_label=multi_label, force=force)
    return replace(result, import_time_s=time.perf_counter() - start)


def _stored(
    name: str, graph: _Graph, root: Path, *, multi_label: bool, force: bool
) -> ImportResult:
    """Splits the checked ``graph`` (its own split, or the default one when it gives none or
    too small a training set) and writes it as dataset ``name`` under ``root``; what was stored
    (``import_time_s`` left at 0)."""
    x, y, own, rowptr, col = graph.x, graph.y, graph.own, graph.rowptr, graph.col
    n = x.shape[0]
    y_t = _tensor(y)
    own_t = None if own is None else tuple(_tensor(ids.astype(np.int64)) for ids in own)
    train, val, test = choose_split(y_t, own_t, seed=0)  # type: ignore[arg-type]
    replaced = own is not None and own[0].size < MIN_TRAIN_FRACTION * n
    if own is None or replaced:
        _check_default_split(n, train, val, test)
    isolated = np.count_nonzero((np.diff(rowptr) == 0) & (np.bincount(col, minlength=n) == 0))
    empty = torch.empty(0, dtype=torch.long)
    tensors = {
        "rowptr": _tensor(rowptr),
        "col": _tensor(col),
        "x": _tensor(x),
        "y": y_t,
        "own_train": empty if own_t is None else own_t[0],
        "own_val": empty.clone() if own_t is None else own_t[1],
        "own_test": empty.clone() if own_t is None else own_t[2],
    }
    path = write_imported(
        name,
        tensors,
        num_classes=graph.num_classes,
        multi_label=multi_label,
        force=force,
        home=root,
    )
    return ImportResult(
        name=name,
        path=path,
        num_nodes=n,
        num_edges=int(col.size),
        num_features=int(x.shape[1]),
        num_classes=graph.num_classes,
        multi_label=multi_label,
        num_isolated=int(isolated),
        split="given" if own is not None and not replaced else "default",
        split_sizes=(int(train.numel()), int(val.numel()), int(test.numel())),
        split_replaced=replaced,
        import_time_s=0.0,
    )


@dataclass(frozen=True)
class _Graph:
    """A user's graph as read and checked, before it is stored."""

    x: np.ndarray  # [N, F] float32
    y: np.ndarray  # [N] class ids or [N, C] 0/1
    num_classes: int
    own: tuple[np.ndarray, np.ndarray, np.ndarray] | None  # the given split's node ids, if any
    rowptr: np.ndarray  # [N + 1] int64
    col: np.ndarray  # [E'] int64


def _read_pyg_graph(
    files: dict[str, SourceFile], *, multi_label: bool, undirected: bool, say: Callable[[str], None]
) -> _Graph:
    """``--from-pyg``: one safetensors file holds every tensor."""
    say(f"reading {files['pyg'].shown}")
    graph = read_pyg(files["pyg"], multi_label)
    x = graph["x"]
    n = x.shape[0]
    say(f"building the CSR of {graph['src'].size} edges")
    key = _edge_keys(graph.pop("src"), graph.pop("dst"), n, undirected)
    rowptr, col = _keys_to_csr(key, n, dedupe=undirected)
    del key  # col, or the deduplicated copy of it
    return _Graph(x, graph["y"], graph["num_classes"], graph["split"], rowptr, col)


def _read_graph_files(
    files: dict[str, SourceFile], *, multi_label: bool, undirected: bool, say: Callable[[str], None]
) -> _Graph:
    """The features first (they fix ``N``), then the labels, the optional split and the edges."""
    say(f"reading features from {files['features'].shown}")
    x = read_features(files["features"])
    n = x.shape[0]
    say(f"reading labels from {files['labels'].shown}")
    y, num_classes = read_labels(files["labels"], n, multi_label)
    own = None
    if "splits" in files:
        say(f"reading splits from {files['splits'].shown}")
        own = read_splits(files["splits"], n)
    say(f"reading edges from {files['edges'].shown}")
    src, dst = read_edges(files["edges"], n)
    say(f"building the CSR of {src.size} edges")
    key = _edge_keys(src, dst, n, undirected)
    del src, dst  # only the keys from here on: they become col
    release_unused_memory()
    rowptr, col = _keys_to_csr(key, n, dedupe=undirected)
    del key
    return _Graph(x, y, num_classes, own, rowptr, col)


def _check_default_split(n: int, *parts: torch.Tensor) -> None:
    """The default split leaves no part empty (else the user must give one)."""
    for part, ids in zip(("train", "val", "test"), parts, strict=True):
        if ids.numel() == 0:
            raise ConfigError(
                f"import: the default stratified 60/20/20 split of {n} nodes leaves '{part}' "
                "empty (too few nodes per class); pass --splits FILE"
            )
