"""Readers of a user's graph files for ``gnnaas import``, each checked with row-numbered errors.

Edges come as CSV or Parquet with integer columns ``src,dst``; features as ``.npy`` ``[N, F]`` or
Parquet (one row per node, numeric columns); labels as ``.npy`` (``[N]`` class ids or ``[N, C]``
0/1) or CSV/Parquet with a ``label`` column; splits as JSON ``{"train": [...], "val": [...],
"test": [...]}`` or CSV/Parquet with a ``split`` column. (A whole PyG ``Data`` in one safetensors
file is read by :mod:`gnnaas.data.pyg_file` with the same checks.)

Everything is vectorized (pyarrow and numpy; no Python loop over rows). A problem is a
:class:`ConfigError` naming the file, the row where it can (rows count from 0 like node ids; a
CSV row also gives its line in the file, the header being line 1) and what is expected.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gnnaas.errors import ConfigError
from gnnaas.typing import PathType

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "SPLIT_NAMES",
    "SourceFile",
    "check_node_ids",
    "check_split_parts",
    "features_from_array",
    "labels_from_array",
    "read_edges",
    "read_features",
    "read_labels",
    "read_splits",
    "release_unused_memory",
]

#: the three parts of a split, in the order gnnaas uses them
SPLIT_NAMES = ("train", "val", "test")

_KINDS = {".csv": "csv", ".csv.gz": "csv", ".parquet": "parquet", ".pq": "parquet", ".npy": "npy"}
_KINDS |= {".json": "json", ".safetensors": "safetensors"}
_CHUNK = 1 << 24  # feature entries converted and checked per step (64 MB of float32)


class SourceFile:
    """One input file: its role (``edges``, ``features``, ...), kind and row-aware errors.

    Args:
        role (str): what the file holds, as the option names it (``edges``, ``features``).
        path (str or PathLike): the file as the user gave it (messages show it unchanged).
        kinds (tuple[str, ...]): accepted kinds among ``csv``, ``parquet``, ``npy``, ``json``,
            ``safetensors``.

    Raises:
        ConfigError: the file does not exist or its suffix is not an accepted kind.
    """

    def __init__(self, role: str, path: PathType, kinds: tuple[str, ...]) -> None:
        self.role = role
        self.shown = str(path)
        self.path = Path(path).expanduser()
        suffix = self.path.suffix.lower()
        if self.path.name.lower().endswith(".csv.gz"):
            suffix = ".csv.gz"
        kind = _KINDS.get(suffix)
        if kind not in kinds:
            raise self.fail(
                f"unknown format '{suffix or self.path.name}'; expected "
                + " or ".join(f".{k}" for k in kinds)
            )
        self.kind: str = kind  # type: ignore[assignment]
        if not self.path.is_file():
            what = "is a folder" if self.path.is_dir() else "does not exist"
            raise self.fail(f"{what}; expected a {self.kind} file")

    def where(self, row: int) -> str:
        """``row 3``, or ``row 3 (line 5)`` for a CSV file whose line 1 is the header."""
        return f"row {row} (line {row + 2})" if self.kind == "csv" else f"row {row}"

    def fail(self, message: str, row: int | None = None) -> ConfigError:
        """The error to raise: ``<role> file <path>[, row r]: <message>`` on one line."""
        where = "" if row is None else f", {self.where(int(row))}"
        text = " ".join(message.split())  # one line, whatever the underlying library said
        return ConfigError(f"{self.role} file {self.shown}{where}: {text}")

    def unreadable(self, exc: BaseException) -> ConfigError:
        """The error for a file that cannot be parsed as its kind."""
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return self.fail(f"cannot read it as {self.kind} ({reason})")


# ----------------------------------------------------------------------------------------------
# tables (CSV, Parquet)


def release_unused_memory() -> None:
    """Hands Arrow's freed buffers back to the system (its allocator keeps them otherwise).

    Call it once arrays read from a table (they may share Arrow's buffers) are dropped.
    """
    import pyarrow as pa

    pa.default_memory_pool().release_unused()


def _read_columns(
    file: SourceFile, columns: list[str], hint: str, required: list[str] | None = None
) -> pa.Table:
    """The named columns of a CSV (header required) or Parquet file.

    ``required`` (default: ``columns``) must all exist, even when only ``columns`` are read.
    """
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    try:
        if file.kind == "csv":
            names = pacsv.open_csv(str(file.path)).schema.names  # reads the first block only
        else:
            parquet = pq.ParquetFile(str(file.path))
            names = parquet.schema_arrow.names
    except (pa.ArrowException, OSError) as exc:
        raise file.unreadable(exc) from None
    missing = [c for c in (required or columns) if c not in names]
    if missing:
        found = ", ".join(f"'{n}'" for n in names[:8]) + (", ..." if len(names) > 8 else "")
        headerless = file.kind == "csv" and all(n.strip().lstrip("-").isdigit() for n in names)
        why = " (the file seems to have no header line)" if headerless else ""
        raise file.fail(f"no column '{missing[0]}' (found {found}){why}; {hint}")
    try:
        if file.kind == "csv":
            # Streamed block by block: a fraction of read_csv's peak memory, and no slower.
            # Blank lines stay rows (an empty cell of a one-column file), so line numbers hold.
            reader = pacsv.open_csv(
                str(file.path),
                parse_options=pacsv.ParseOptions(ignore_empty_lines=False),
                convert_options=pacsv.ConvertOptions(include_columns=columns),
            )
            return reader.read_all()
        return parquet.read(columns=columns)
    except (pa.ArrowException, OSError) as exc:
        raise file.unreadable(exc) from None


def _first(mask: Any) -> int:
    """Index of the first ``True`` of a numpy or pyarrow boolean array."""
    array = mask if isinstance(mask, np.ndarray) else mask.to_numpy(zero_copy_only=False)
    return int(np.flatnonzero(array)[0])


def _int_column(file: SourceFile, table: pa.Table, name: str) -> np.ndarray:
    """A column of integer ids as ``[rows]`` int64; nulls, fractions and text are row errors."""
    import pyarrow as pa
    import pyarrow.compute as pc

    col = table.column(name)
    if col.null_count:
        raise file.fail(f"'{name}' is empty", _first(pc.is_null(col)))
    kind = col.type
    if pa.types.is_integer(kind):
        return col.to_numpy().astype(np.int64, copy=False)
    if pa.types.is_floating(kind):
        values = col.to_numpy()
        bad = values != np.trunc(values)  # NaN compares unequal too
        if bad.any():
            row = _first(bad)
            raise file.fail(f"{name} {values[row]:g} is not an integer", row)
        raise file.fail(
            f"column '{name}' holds {kind} numbers; it must hold integers (write it as int64)"
        )
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        ok = pc.match_substring_regex(col, r"^\s*[+-]?\d+\s*$")
        if not pc.all(ok).as_py():
            row = _first(pc.invert(ok))
            raise file.fail(f"{name} {col[row].as_py()!r} is not an integer", row)
    raise file.fail(f"column '{name}' has type {kind}; it must hold integers")


def check_node_ids(file: SourceFile, ids: np.ndarray, n: int, what: str) -> None:
    """Raises a row-numbered error for the first id outside ``[0, n)``."""
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= n):
        row = _first((ids < 0) | (ids >= n))
        raise file.fail(
            f"{what} {int(ids[row])} is outside [0, {n}); the features have {n} rows, one per node",
            row,
        )


def read_edges(file: SourceFile, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``src`` and ``dst`` int64 arrays of an edge table, every id checked against ``[0, n)``."""
    hint = "the first line must be the header src,dst"
    names = ["src", "dst"]
    if file.kind == "parquet":  # one column at a time: Parquet reads columns independently
        src = _int_column(file, _read_columns(file, ["src"], hint, names), "src")
        release_unused_memory()
        dst = _int_column(file, _read_columns(file, ["dst"], hint, names), "dst")
    else:  # a CSV is parsed once; each column's Arrow buffers go once it is converted
        table = _read_columns(file, names, hint)
        src = _int_column(file, table, "src")
        table = table.drop_columns(["src"])
        dst = _int_column(file, table, "dst")
        del table
    release_unused_memory()
    check_node_ids(file, src, n, "src")
    check_node_ids(file, dst, n, "dst")
    return src, dst


# ----------------------------------------------------------------------------------------------
# features


def _load_npy(file: SourceFile, mmap: bool) -> np.ndarray:
    try:
        return np.load(file.path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise file.unreadable(exc) from None


def _check_finite(file: SourceFile, x: np.ndarray, names: list[str] | None, what: str) -> None:
    step = max(1, _CHUNK // max(1, x.shape[1]))
    for start in range(0, x.shape[0], step):  # a loop over chunks of rows, not rows
        finite = np.isfinite(x[start : start + step])
        if not finite.all():
            r, c = np.argwhere(~finite)[0]
            column = f"column '{names[c]}'" if names else f"column {c}"
            value = "NaN" if np.isnan(x[start + r, c]) else "inf"
            raise file.fail(f"{what}{column} is {value}; features must be finite", start + r)


def _numeric(dtype: np.dtype) -> bool:
    return dtype.kind in "biuf"


def _check_feature_layout(
    file: SourceFile, dtype: np.dtype, shape: tuple[int, ...], what: str
) -> None:
    if not _numeric(dtype):
        raise file.fail(f"{what}dtype {dtype} is not numeric; features must be floats")
    if len(shape) != 2 or 0 in shape:
        raise file.fail(f"{what}shape {list(shape)}; features must be [N, F], one row per node")


def features_from_array(file: SourceFile, array: np.ndarray, what: str = "") -> np.ndarray:
    """``array`` checked (numeric, ``[N, F]``, finite) and converted to float32 chunk by chunk.

    ``what`` prefixes messages (e.g. ``"x: "`` for a tensor inside the file).
    """
    _check_feature_layout(file, array.dtype, array.shape, what)
    x = np.empty(array.shape, dtype=np.float32)
    step = max(1, _CHUNK // array.shape[1])
    for start in range(0, array.shape[0], step):  # converts a memory-mapped file chunk by chunk
        x[start : start + step] = array[start : start + step]
    _check_finite(file, x, None, what)
    return x


def _read_npy_features(file: SourceFile) -> np.ndarray:
    """An ``.npy`` matrix read in chunks of rows straight into float32 (no whole-file copy)."""
    fmt = np.lib.format
    headers = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}
    try:
        with open(file.path, "rb") as f:
            header = headers.get(fmt.read_magic(f))
            layout = header(f) if header is not None else None
            if layout is None or layout[1] or layout[2].hasobject:  # rare: numpy's reader
                return features_from_array(file, _load_npy(file, mmap=True))
            shape, _, dtype = layout
            _check_feature_layout(file, dtype, shape, "")
            x = np.empty(shape, dtype=np.float32)
            step = max(1, _CHUNK // shape[1])
            for start in range(0, shape[0], step):
                count = min(step, shape[0] - start) * shape[1]
                chunk = np.fromfile(f, dtype=dtype, count=count)
                if chunk.size < count:
                    raise file.fail(f"the file ends early, in row {start + chunk.size // shape[1]}")
                x[start : start + step] = chunk.reshape(-1, shape[1])
    except ConfigError:
        raise
    except (ValueError, OSError) as exc:
        raise file.unreadable(exc) from None
    _check_finite(file, x, None, "")
    return x


def read_features(file: SourceFile) -> np.ndarray:
    """``[N, F]`` float32 features, checked finite, from ``.npy`` or Parquet."""
    if file.kind == "npy":
        return _read_npy_features(file)
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(str(file.path))
    except (pa.ArrowException, OSError) as exc:
        raise file.unreadable(exc) from None
    schema = parquet.schema_arrow
    names = [f.name for f in schema if not f.name.startswith("__index_level_")]
    n = parquet.metadata.num_rows
    if not names or n == 0:
        raise file.fail(f"{n} rows and {len(names)} columns; features need one row per node")
    for name in names:
        kind = schema.field(name).type
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
            raise file.fail(f"column '{name}' has type {kind}; feature columns must be numeric")
    x = np.empty((n, len(names)), dtype=np.float32)
    group = 32  # columns read at once: bounded extra memory, few passes over the file
    for j0 in range(0, len(names), group):
        try:
            table = parquet.read(columns=names[j0 : j0 + group])
        except (pa.ArrowException, OSError) as exc:
            raise file.unreadable(exc) from None
        for j, name in enumerate(names[j0 : j0 + group]):
            col = table.column(name)
            if col.null_count:
                raise file.fail(f"column '{name}' is empty", _first(pc.is_null(col)))
            x[:, j0 + j] = col.to_numpy()
        del table
    _check_finite(file, x, names, "")
    return x


# ----------------------------------------------------------------------------------------------
# labels


def labels_from_array(
    file: SourceFile, array: np.ndarray, n: int, multi_label: bool, what: str = ""
) -> tuple[np.ndarray, int]:
    """``array`` checked as ``N`` labels; returns them with ``C`` as :func:`read_labels` does."""
    shape = list(array.shape)
    if not _numeric(array.dtype):
        raise file.fail(f"{what}dtype {array.dtype} is not numeric; labels must be class ids")
    if not multi_label and array.ndim == 2 and shape[1] == 1:
        array = array[:, 0]
    if multi_label and array.ndim != 2:
        raise file.fail(f"{what}shape {shape}; --multi-label labels must be an [N, C] 0/1 matrix")
    if not multi_label and array.ndim == 2:
        raise file.fail(
            f"{what}shape {shape} is a label matrix; pass --multi-label for [N, C] 0/1 labels, "
            "or give [N] class ids"
        )
    if array.ndim not in (1, 2):
        raise file.fail(f"{what}shape {shape}; labels must be [N] class ids")
    if array.shape[0] != n:
        raise file.fail(f"{what}{array.shape[0]} rows but the features have {n}, one per node")
    if multi_label:
        bad = (array != 0) & (array != 1)
        if bad.any():
            r, c = np.argwhere(bad)[0]
            raise file.fail(f"{what}column {c} is {array[r, c]}; multi-label labels are 0 or 1", r)
        return np.ascontiguousarray(array, dtype=np.float32), int(array.shape[1])
    if array.dtype.kind == "f":
        bad = array != np.trunc(array)
        if bad.any():
            row = _first(bad)
            raise file.fail(f"{what}label {array[row]:g} is not an integer class id", row)
        raise file.fail(f"{what}dtype {array.dtype}; labels must be integer class ids")
    return _class_ids(file, array.astype(np.int64), what)


def _class_ids(file: SourceFile, y: np.ndarray, what: str = "") -> tuple[np.ndarray, int]:
    if y.size and int(y.min()) < 0:
        row = _first(y < 0)
        raise file.fail(f"{what}label {int(y[row])} is negative; labels are class ids 0..C-1", row)
    return np.ascontiguousarray(y), int(y.max()) + 1 if y.size else 0


def read_labels(file: SourceFile, n: int, multi_label: bool) -> tuple[np.ndarray, int]:
    """Labels and the number of classes ``C``.

    Returns:
        tuple[np.ndarray, int]: ``[N]`` int64 class ids (``C`` = largest + 1), or with
        ``multi_label`` an ``[N, C]`` float32 0/1 matrix.
    """
    if file.kind == "npy":
        return labels_from_array(file, _load_npy(file, mmap=False), n, multi_label)
    if multi_label:
        raise file.fail("multi-label labels must be an [N, C] 0/1 .npy file")
    table = _read_columns(file, ["label"], "labels need a 'label' column, one row per node")
    y = _int_column(file, table, "label")
    if y.shape[0] != n:
        raise file.fail(f"{y.shape[0]} rows but the features have {n}, one per node")
    return _class_ids(file, y)


# ----------------------------------------------------------------------------------------------
# splits


def check_split_parts(
    file: SourceFile, parts: dict[str, np.ndarray], n: int, positions: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Checks that the three parts are non-empty and disjoint, with unique in-range node ids.

    ``positions`` names offenders as ``train[3]`` (the entry's position in its list); otherwise
    only the node id is named (masks, a split column).
    """
    owner = np.full(n, -1, dtype=np.int8)
    for p, key in enumerate(SPLIT_NAMES):
        ids = parts[key]
        if ids.size == 0:
            raise file.fail(f"'{key}' is empty; train, val and test each need a node")
        if int(ids.min()) < 0 or int(ids.max()) >= n:
            i = _first((ids < 0) | (ids >= n))
            raise file.fail(f"{key}[{i}]: node {int(ids[i])} is outside [0, {n})")
        order = np.argsort(ids, kind="stable")
        twice = np.flatnonzero(ids[order][1:] == ids[order][:-1])
        if twice.size:
            a, b = order[twice[0]], order[twice[0] + 1]
            raise file.fail(
                f"node {int(ids[a])} is listed twice in '{key}' ({key}[{a}], {key}[{b}])"
            )
        taken = owner[ids] >= 0
        if taken.any():
            i = _first(taken)
            node = int(ids[i])
            at = f" ({key}[{i}])" if positions else ""
            raise file.fail(
                f"node {node} is in both '{SPLIT_NAMES[owner[node]]}' and '{key}'{at}; "
                "a node belongs to one split at most"
            )
        owner[ids] = p
    return parts["train"], parts["val"], parts["test"]


def _json_ids(file: SourceFile, key: str, values: Any) -> np.ndarray:
    if not isinstance(values, list):
        raise file.fail(f"'{key}' must be a list of node ids")
    ids = np.asarray(values) if values else np.empty(0, dtype=np.int64)
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        bad = ((i, v) for i, v in enumerate(values) if type(v) is not int)
        i, value = next(bad, (0, values[0]))  # else: ints too large for int64
        raise file.fail(f"{key}[{i}] is {json.dumps(value)}, not an integer node id")
    return ids.astype(np.int64)


def read_splits(file: SourceFile, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``train``, ``val``, ``test`` int64 node ids from JSON or a ``split`` column."""
    if file.kind == "json":
        return _json_splits(file, n)
    return _column_splits(file, n)


def _json_splits(file: SourceFile, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``{"train": [...], "val": [...], "test": [...]}``: node ids per split."""
    try:
        data = json.loads(file.path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as exc:
        raise file.unreadable(exc) from None
    if not isinstance(data, dict):
        raise file.fail('expected a JSON object {"train": [...], "val": [...], "test": [...]}')
    for key in data:
        if key not in SPLIT_NAMES:
            raise file.fail(f"unknown key '{key}'; expected train, val and test")
    for key in SPLIT_NAMES:
        if key not in data:
            raise file.fail(f"no key '{key}'; expected train, val and test")
    parts = {key: _json_ids(file, key, data[key]) for key in SPLIT_NAMES}
    return check_split_parts(file, parts, n, positions=True)


def _column_splits(file: SourceFile, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A ``split`` column, one row per node: ``train``, ``val``, ``test`` or empty (none)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    col = _read_columns(file, ["split"], "splits need a 'split' column, one row per node")
    split = col.column("split")
    if pa.types.is_dictionary(split.type):
        split = split.cast(split.type.value_type)
    if not (pa.types.is_string(split.type) or pa.types.is_large_string(split.type)):
        raise file.fail(f"column 'split' has type {split.type}; expected train, val or test")
    if len(split) != n:
        raise file.fail(f"{len(split)} rows but the features have {n}, one per node")
    split = pc.utf8_trim_whitespace(split)
    masks = {key: pc.equal(split, key).fill_null(False) for key in SPLIT_NAMES}
    known = pc.or_(pc.is_null(split), pc.equal(split, ""))
    for mask in masks.values():
        known = pc.or_(known, mask)
    if not pc.all(known).as_py():
        row = _first(pc.invert(known))
        raise file.fail(
            f"split {split[row].as_py()!r} is not train, val or test (leave it empty for a node "
            "in no split)",
            row,
        )
    parts = {
        key: np.flatnonzero(mask.to_numpy(zero_copy_only=False)) for key, mask in masks.items()
    }
    return check_split_parts(file, parts, n, positions=False)
