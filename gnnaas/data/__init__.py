"""Datasets and the graph store: real graphs read offline, synthetic block models, splits.

``load_dataset(name)`` returns a :class:`GraphStore` (CSR over incoming edges, float32 features,
labels, train/val/test split); ``list_datasets()`` describes every known dataset without loading it.
``import_graph(name, ...)`` (``gnnaas import``) stores a user's graph under the data home
(``resolve_home_dir()``), after which ``name`` loads like any other dataset.
"""

from gnnaas.data.imported import resolve_home_dir
from gnnaas.data.importer import ImportResult, import_graph
from gnnaas.data.registry import (
    DatasetInfo,
    dataset_info,
    list_datasets,
    load_dataset,
    resolve_cache_dir,
)
from gnnaas.data.splits import choose_split, stratified_split
from gnnaas.data.store import GraphStore, edge_index_to_csr
from gnnaas.data.synthetic import PRESETS, SyntheticConfig, make_synthetic

__all__ = [
    "DatasetInfo",
    "GraphStore",
    "ImportResult",
    "PRESETS",
    "SyntheticConfig",
    "choose_split",
    "dataset_info",
    "edge_index_to_csr",
    "import_graph",
    "list_datasets",
    "load_dataset",
    "make_synthetic",
    "resolve_cache_dir",
    "resolve_home_dir",
    "stratified_split",
]
