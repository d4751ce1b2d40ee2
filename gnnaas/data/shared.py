"""Graph stores shared by several processes on one machine through memory-mapped files.

``gnnaas serve --workers N`` gives every worker the same folder; the first worker to load a
dataset writes its graph, its features and the variants' pruned feature copies there as ``.npy``
files under a lock, and every worker maps them copy-on-write (:func:`share_store`), so N workers
keep one copy of the features in the page cache instead of N private ones. Files are keyed by a
digest of the graph, so a reload that changes a dataset writes new ones.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["share_store"]

_log = logging.getLogger(__name__)

_UNSAFE = re.compile(r"[^A-Za-z0-9._@-]")


def _digest(store: Any) -> str:
    """A short digest of the graph and its features: equal stores map the same files."""
    h = hashlib.blake2b(digest_size=8)
    for t in (store.rowptr, store.col, store.x):
        h.update(str(tuple(t.shape)).encode())
        h.update(t.contiguous().numpy().data)
    return h.hexdigest()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _mapped(path: Path, tensor: Tensor) -> Tensor:
    """``tensor`` as a memory-mapped copy-on-write view of ``path``, writing the file first if
    it is not there (atomically: a reader never sees half a file)."""
    if not path.exists():
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.npy")  # np.save keeps a .npy name
        np.save(tmp, tensor.contiguous().numpy(), allow_pickle=False)
        os.replace(tmp, path)
    import torch

    array = np.load(path, mmap_mode="c", allow_pickle=False)
    return torch.from_numpy(array)


def share_store(store: Any, kept: Iterable[Tensor], folder: Path) -> None:
    """Replaces ``store``'s graph, features and the feature subsets ``kept`` by memory-mapped
    copies in ``folder``, shared by every process that maps them.

    Args:
        store (GraphStore): the dataset's store (its ``x``, ``rowptr``, ``col`` and subset cache
            are swapped in place; its private tensors are freed when nothing else holds them).
        kept (Iterable[Tensor]): the kept feature columns of each variant served from it.
        folder (Path): the server's shared folder (``GNNAAS_SHARED_STORE_DIR``).
    """
    folder = Path(folder)
    home = folder / f"{_UNSAFE.sub('_', store.name)}-{_digest(store)}"
    home.mkdir(parents=True, exist_ok=True)
    subsets = {}
    with _locked(folder / ".lock"):
        for index in kept:
            key = tuple(int(i) for i in index.tolist())
            if key in subsets:
                continue
            full = store.feature_subset(index)
            if full is store.x:
                continue
            name = hashlib.blake2b(repr(key).encode(), digest_size=8).hexdigest()
            subsets[key] = _mapped(home / f"x-{name}.npy", full)
        x = _mapped(home / "x.npy", store.x)
        rowptr = _mapped(home / "rowptr.npy", store.rowptr)
        col = _mapped(home / "col.npy", store.col)
    with store._lock:
        store.x, store.rowptr, store.col = x, rowptr, col
        store._subsets.clear()
        store._subsets.update(subsets)
        store._edge_index = None
    _log.info("dataset %s: graph and %d feature subsets memory-mapped", store.name, len(subsets))
