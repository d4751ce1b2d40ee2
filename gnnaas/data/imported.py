"""Imported datasets: where ``gnnaas import`` keeps a user's graph, and how it is loaded again.

Each imported dataset is one folder ``<home>/datasets/<name, lower-case>/`` holding
``graph.safetensors``: the tensors of a processed real dataset's cache (``rowptr``, ``col``, ``x``,
``y``, and the dataset's own split ``own_train``/``own_val``/``own_test``, empty when it has none)
plus text metadata (canonical name, classes, counts). The home is ``$GNNAAS_HOME``, else
``~/.local/share/gnnaas``. A folder is written under a hidden temporary name in the same parent
and renamed into place, so a reader sees a whole store or none. Loading never unpickles, and the
split follows :func:`gnnaas.data.splits.choose_split` like every other dataset.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import uuid
from pathlib import Path

from torch import Tensor

from gnnaas.config import from_environment
from gnnaas.data.real import REAL_DATASETS
from gnnaas.data.splits import choose_split
from gnnaas.data.store import GraphStore
from gnnaas.errors import ConfigError
from gnnaas.typing import PathType
from gnnaas.utils import new_file_mode

__all__ = [
    "IMPORTED_SOURCE",
    "STORE_FILE",
    "check_import_name",
    "check_not_imported",
    "list_imported",
    "load_imported",
    "resolve_home_dir",
    "write_imported",
]

_log = logging.getLogger(__name__)

#: the ``source`` of an imported dataset in ``gnnaas datasets`` and ``GraphStore.source``
IMPORTED_SOURCE = "imported"
#: the file that holds an imported dataset inside its folder
STORE_FILE = "graph.safetensors"

_FORMAT = "gnnaas-imported-v1"  # bump when the stored tensors change meaning
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_TENSORS = ("rowptr", "col", "x", "y", "own_train", "own_val", "own_test")


def resolve_home_dir(home: PathType | None = None) -> Path:
    """gnnaas's data home: ``home``, else ``$GNNAAS_HOME`` (the settings' ``home_dir``,
    :func:`gnnaas.config.from_environment`), else ``~/.local/share/gnnaas``.

    Example:
        >>> resolve_home_dir("/srv/gnnaas")
        PosixPath('/srv/gnnaas')
    """
    if home is None:
        home = from_environment().home_dir  # GNNAAS_HOME
    if home is not None:
        return Path(home).expanduser()
    return Path.home() / ".local" / "share" / "gnnaas"


def _datasets_dir(home: Path) -> Path:
    return home / "datasets"


def check_import_name(name: str) -> str:
    """Checks a name for ``gnnaas import`` and returns it stripped.

    A name is 1-64 letters, digits, ``.``, ``_`` or ``-`` (it becomes a folder and a URL part),
    and must not clash with a built-in dataset (``Cora``, ..., ``synth-*``), whatever its case.

    Raises:
        ConfigError: the name is malformed or taken by a built-in dataset.
    """
    stripped = name.strip()
    if not _NAME.fullmatch(stripped):
        raise ConfigError(
            f"import: dataset name '{name}' is not allowed; use 1-64 letters, digits, '.', '_' "
            "or '-', starting with a letter or digit"
        )
    key = stripped.lower()
    if key in REAL_DATASETS:
        raise ConfigError(
            f"import: '{stripped}' is the built-in dataset {REAL_DATASETS[key].name}; "
            "pick another name"
        )
    if key.startswith("synth-"):
        raise ConfigError(
            f"import: '{stripped}' clashes with the built-in synthetic datasets (synth-*); "
            "pick a name that does not start with 'synth-'"
        )
    return stripped


def _read_meta(path: Path) -> dict[str, str] | None:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
    except Exception as exc:  # one broken folder must not hide the other datasets
        _log.warning("ignoring unreadable imported dataset %s: %s", path, exc)
        return None
    if meta.get("format") != _FORMAT:
        _log.warning("ignoring %s: not a gnnaas imported dataset (%s)", path, _FORMAT)
        return None
    return meta


def list_imported(home: PathType | None = None) -> dict[str, dict[str, str]]:
    """Every imported dataset under the home, by lower-case name, with its stored metadata.

    The metadata holds ``name``, ``num_nodes``, ``num_edges``, ``num_features``,
    ``num_classes`` and ``multi_label`` (as text). Only file headers are read.
    """
    root = _datasets_dir(resolve_home_dir(home))
    if not root.is_dir():
        return {}
    found: dict[str, dict[str, str]] = {}
    for folder in sorted(root.iterdir()):
        path = folder / STORE_FILE
        if folder.name.startswith(".") or not path.is_file():
            continue  # a temporary folder of an import in progress, or a stray file
        meta = _read_meta(path)
        if meta is not None and meta.get("name", "").lower() == folder.name:
            found[folder.name] = meta
    return found


def load_imported(name: str, *, seed: int = 0, home: PathType | None = None) -> GraphStore:
    """Loads an imported dataset as a :class:`GraphStore` (source ``"imported"``).

    Args:
        name (str): the dataset's name, case-insensitive.
        seed (int, optional): seed of the stratified split used when the dataset has no split of
            its own (or one that trains on fewer than 10% of nodes). (default: ``0``)
        home (str or PathLike, optional): the data home (see :func:`resolve_home_dir`).
            (default: :obj:`None`)

    Raises:
        ConfigError: no imported dataset of that name, or its store is unreadable.
    """
    from safetensors.torch import load_file

    root = resolve_home_dir(home)
    path = _datasets_dir(root) / name.strip().lower() / STORE_FILE
    meta = _read_meta(path) if path.is_file() else None
    if meta is None:
        raise ConfigError(f"no imported dataset '{name}' under {root}; import it again")
    try:
        t = load_file(str(path))
    except Exception as exc:
        raise ConfigError(
            f"imported dataset '{name}' is unreadable ({exc}); import it again"
        ) from None
    own = (t["own_train"], t["own_val"], t["own_test"])
    train, val, test = choose_split(t["y"], own if own[0].numel() else None, seed=seed)
    return GraphStore(
        name=meta["name"],
        rowptr=t["rowptr"],
        col=t["col"],
        x=t["x"],
        y=t["y"],
        num_classes=int(meta["num_classes"]),
        multi_label=meta["multi_label"] == "true",
        train_idx=train,
        val_idx=val,
        test_idx=test,
        informative=None,
        source=IMPORTED_SOURCE,
    )


def _exists_error(name: str, home: Path) -> ConfigError:
    return ConfigError(
        f"import: dataset '{name}' is already imported (in {_datasets_dir(home)}); "
        "pass --force to replace it"
    )


def check_not_imported(name: str, home: PathType | None = None) -> None:
    """Raises :class:`ConfigError` when ``name`` is already imported (case-insensitive)."""
    root = resolve_home_dir(home)
    if (_datasets_dir(root) / name.lower()).exists():
        raise _exists_error(name, root)


def write_imported(
    name: str,
    tensors: dict[str, Tensor],
    *,
    num_classes: int,
    multi_label: bool,
    force: bool = False,
    home: PathType | None = None,
) -> Path:
    """Writes an imported dataset's store atomically and returns its folder.

    The store is written into a hidden folder next to its final place, then renamed into place;
    with ``force`` an existing store of the same name is swapped out and removed afterwards.

    Args:
        name (str): the canonical name (checked by :func:`check_import_name`).
        tensors (dict[str, Tensor]): ``rowptr``, ``col``, ``x``, ``y``, ``own_train``,
            ``own_val``, ``own_test``, contiguous.
        num_classes (int): classes ``C``.
        multi_label (bool): whether ``y`` is an ``[N, C]`` 0/1 matrix.
        force (bool, optional): replace an existing dataset of that name. (default: :obj:`False`)
        home (str or PathLike, optional): the data home. (default: :obj:`None`)

    Raises:
        ConfigError: the name is already imported and ``force`` is off.
    """
    from safetensors.torch import save_file

    if sorted(tensors) != sorted(_TENSORS):
        raise ValueError(f"write_imported: tensors must be {_TENSORS} (got {sorted(tensors)})")
    root = resolve_home_dir(home)
    key = name.lower()
    final = _datasets_dir(root) / key
    if final.exists() and not force:
        raise _exists_error(name, root)
    x, col = tensors["x"], tensors["col"]
    meta = {
        "format": _FORMAT,
        "name": name,
        "source": IMPORTED_SOURCE,
        "num_nodes": str(x.size(0)),
        "num_edges": str(col.numel()),
        "num_features": str(x.size(1)),
        "num_classes": str(num_classes),
        "multi_label": "true" if multi_label else "false",
    }
    final.parent.mkdir(parents=True, exist_ok=True)
    # Hidden names: never listed, never mistaken for a dataset. mkdir honours the umask.
    tmp = final.parent / f".import-{key}-{uuid.uuid4().hex}"
    old = final.parent / f".replaced-{key}-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        save_file(tensors, str(tmp / STORE_FILE), metadata=meta)
        os.chmod(tmp / STORE_FILE, new_file_mode())  # safetensors writes 0600
        with open(tmp / STORE_FILE, "rb") as f:
            os.fsync(f.fileno())  # the data is on disk before the rename makes it visible
        if final.exists():
            if not force:  # imported meanwhile by someone else
                raise _exists_error(name, root)
            os.rename(final, old)
        try:
            os.rename(tmp, final)
        except BaseException:
            if old.exists():
                os.rename(old, final)  # put the previous store back
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return final
