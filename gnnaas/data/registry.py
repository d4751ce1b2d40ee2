"""Dataset names → graph stores: ``list_datasets``, ``dataset_info`` and ``load_dataset``.

Names are case-insensitive: ``Cora``, ``CiteSeer``, ``PubMed``, ``Flickr``, ``Reddit``, ``Yelp``,
``ogbn-arxiv``, ``ogbn-products``, ``synth-<preset>[@<scale>]`` and the names of datasets brought in
with ``gnnaas import`` (source ``imported``, kept under ``$GNNAAS_HOME``, else
``~/.local/share/gnnaas``). Real datasets are read from a data root (argument, else
``$GNNAAS_DATA``); processed files go to a cache (argument, else ``$GNNAAS_CACHE``, else
``~/.cache/gnnaas``), never into the data root.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gnnaas.config import from_environment
from gnnaas.data.imported import IMPORTED_SOURCE, list_imported, load_imported
from gnnaas.data.real import REAL_DATASETS, load_real
from gnnaas.data.store import GraphStore
from gnnaas.data.synthetic import PRESETS, load_synthetic, parse_synthetic_name, stored_edges
from gnnaas.errors import ConfigError
from gnnaas.typing import PathType

__all__ = [
    "DatasetInfo",
    "dataset_info",
    "list_datasets",
    "load_dataset",
    "resolve_cache_dir",
]


@dataclass(frozen=True)
class DatasetInfo:
    """What ``gnnaas datasets`` lists, from static metadata (nothing is loaded).

    ``num_edges`` counts stored directed edges (an undirected edge twice), as ``GraphStore``,
    ``gnnaas infer`` and ``gnnaas compact`` do. A synthetic graph's is the stored count when the
    cache knows it (the graph was built with seed 0 once:
    :func:`~gnnaas.data.synthetic.stored_edges`), else the preset's target, which the built graph
    lands within 0.2% of (duplicate pairs and self loops dropped); ``edges_exact`` says which.
    """

    name: str
    num_nodes: int
    num_edges: int
    num_features: int
    num_classes: int
    multi_label: bool
    source: str
    edges_exact: bool = True


def _known_names() -> list[str]:
    imported = [meta["name"] for meta in list_imported().values()]
    return [d.name for d in REAL_DATASETS.values()] + [f"synth-{p}" for p in PRESETS] + imported


def _imported_info(meta: dict[str, str]) -> DatasetInfo:
    return DatasetInfo(
        meta["name"], int(meta["num_nodes"]), int(meta["num_edges"]), int(meta["num_features"]),
        int(meta["num_classes"]), meta["multi_label"] == "true", IMPORTED_SOURCE,
    )  # fmt: skip


def _unknown(name: str) -> ConfigError:
    return ConfigError(
        f"unknown dataset '{name}'; known datasets: {', '.join(_known_names())} "
        "(synthetic ones also as synth-<preset>@<scale>, e.g. synth-reddit@0.1)"
    )


def dataset_info(name: str) -> DatasetInfo:
    """Static description of a dataset, with its canonical name (case and scale normalized).

    Example:
        >>> dataset_info("cora").name
        'Cora'
        >>> dataset_info("synth-reddit@0.1").num_nodes
        23296
    """
    key = name.strip().lower()
    if key in REAL_DATASETS:
        d = REAL_DATASETS[key]
        return DatasetInfo(
            d.name, d.num_nodes, d.num_edges, d.num_features, d.num_classes, d.multi_label,
            d.source,
        )  # fmt: skip
    if not key.startswith("synth-"):
        imported = list_imported().get(key)
        if imported is None:
            raise _unknown(name)
        return _imported_info(imported)
    preset, scale, canonical = parse_synthetic_name(key)
    cfg = PRESETS[preset].scaled(scale)
    stored = stored_edges(canonical, seed=0, cache_dir=resolve_cache_dir())
    return DatasetInfo(
        canonical, cfg.num_nodes, cfg.num_edges if stored is None else stored, cfg.num_features,
        cfg.num_classes, cfg.multi_label, "synthetic", edges_exact=stored is not None,
    )  # fmt: skip


def list_datasets() -> list[DatasetInfo]:
    """Every known dataset (real ones, the synthetic presets, then imported ones), unloaded."""
    builtin = [d.name for d in REAL_DATASETS.values()] + [f"synth-{p}" for p in PRESETS]
    imported = [_imported_info(meta) for meta in list_imported().values()]
    return [dataset_info(name) for name in builtin] + imported


def resolve_cache_dir(cache_dir: PathType | None = None) -> Path:
    """The writable cache: ``cache_dir``, else ``$GNNAAS_CACHE`` (the settings' ``cache_dir``,
    :func:`gnnaas.config.from_environment`), else ``~/.cache/gnnaas``."""
    if cache_dir is None:
        cache_dir = from_environment().cache_dir
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    return Path.home() / ".cache" / "gnnaas"


def load_dataset(
    name: str,
    data_root: PathType | None = None,
    *,
    seed: int = 0,
    cache_dir: PathType | None = None,
) -> GraphStore:
    """Loads a dataset by name as a :class:`GraphStore`.

    Args:
        name (str): dataset name, case-insensitive (see :func:`list_datasets`).
        data_root (str or PathLike, optional): folder holding ``<Class>/<Name>/raw/`` of real
            datasets; falls back to ``$GNNAAS_DATA`` (the settings'
            ``data_root``, :func:`gnnaas.config.from_environment`). Only read, never written.
            Synthetic and imported datasets ignore it. (default: :obj:`None`)
        seed (int, optional): seed of the synthetic generator and of the stratified split.
            (default: ``0``)
        cache_dir (str or PathLike, optional): writable folder for processed files
            (see :func:`resolve_cache_dir`). (default: :obj:`None`)

    Returns:
        GraphStore: the graph, its features, labels and train/val/test split.

    Raises:
        ConfigError: unknown name, no data root, or raw files missing under it.

    Example:
        >>> store = load_dataset("synth-small", seed=0)
        >>> store.name, store.num_nodes
        ('synth-small', 3000)
    """
    info = dataset_info(name)
    if info.source == IMPORTED_SOURCE:
        return load_imported(info.name, seed=seed)
    cache = resolve_cache_dir(cache_dir)
    if info.source == "synthetic":
        return load_synthetic(info.name, seed=seed, cache_dir=cache)
    spec = REAL_DATASETS[info.name.lower()]
    if data_root is None or (isinstance(data_root, str) and not data_root.strip()):
        data_root = from_environment().data_root  # GNNAAS_DATA (or GNNAAS_DATA_ROOT)
        if data_root is None:
            raise ConfigError(
                f"dataset '{info.name}' needs a data root: pass --data-root DIR (or set "
                f"GNNAAS_DATA=DIR) where DIR holds {spec.group}/{spec.folder}/raw/"
            )
    return load_real(spec, Path(data_root).expanduser().absolute(), seed=seed, cache_dir=cache)
