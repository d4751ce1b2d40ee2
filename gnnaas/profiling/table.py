"""Profile tables on disk: ``profiles.csv`` and ``service_times.csv`` (docs/internals.md).

This module imports neither matplotlib nor the training code, so the server can read profiles
with it. Writes go through :func:`gnnaas.utils.atomic_write_text`: a reader never sees half a file.

``profiles/<dataset>/profiles.csv`` has one row per variant and split (``val``, ``test``), columns
:data:`PROFILE_COLUMNS` (times are p50 over runs, in ms; accuracies in percent).
``profiles/<dataset>/service_times.csv`` has one row per variant and batch size, columns
:data:`SERVICE_TIME_COLUMNS` (p50, ms).

Example:
    >>> from gnnaas.profiling.table import read_profiles
    >>> df = read_profiles("profiles/Cora")  # doctest: +SKIP
    >>> df[df.split == "val"].set_index("variant").latency_ms  # doctest: +SKIP
"""

from __future__ import annotations

import datetime as _dt
import io
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from gnnaas.errors import ArtifactError
from gnnaas.inference.settings import SETTING_COLUMNS
from gnnaas.profiling.uncertainty import INTERVAL_COLUMNS
from gnnaas.typing import PathType
from gnnaas.utils import atomic_write_text

if TYPE_CHECKING:
    from gnnaas.variants.manifest import Manifest

__all__ = [
    "AXIS_COLUMNS",
    "CACHE_COLUMNS",
    "PROFILES_FILE",
    "PROFILE_COLUMNS",
    "PROFILE_INTERVAL_COLUMNS",
    "SERVICE_CACHE_COLUMNS",
    "SERVICE_TIMES_FILE",
    "SERVICE_TIME_BATCH_SIZES",
    "SERVICE_TIME_COLUMNS",
    "SPLITS",
    "has_profiles",
    "read_profiles",
    "read_service_times",
    "write_profiles",
    "write_service_times",
]

PROFILES_FILE = "profiles.csv"
SERVICE_TIMES_FILE = "service_times.csv"
SPLITS = ("val", "test")
SERVICE_TIME_BATCH_SIZES = (1, 4, 16, 64, 256, 1024)
"""Batch sizes (target nodes) of each variant's service curve in ``service_times.csv``."""

AXIS_COLUMNS: tuple[str, ...] = ("fanouts", "hidden_channels", "precision", "base")
"""The variant's axes in ``profiles.csv`` (the last columns)."""

CACHE_COLUMNS: tuple[str, ...] = ("cache_nodes", "hit_ratio", "copied_kb")
"""The device feature cache a profile was measured with (:mod:`gnnaas.inference.cache`):
``cache_nodes`` nodes whose rows were resident (0: no cache); ``hit_ratio`` feature rows read from
the cache / all rows read, over the split's batches (0 without a cache); ``copied_kb`` feature kB
a full batch gathers on the host for the host→device copy (mean; counted on the CPU too, where the
copy is a no-op). Optional: files written before they existed read NaN there."""

SERVICE_CACHE_COLUMNS: tuple[str, ...] = ("hit_ratio", "copied_kb")
"""``hit_ratio`` and ``copied_kb`` of a service-curve point (means over its timed batches), as in
:data:`CACHE_COLUMNS`. Optional, like them."""

PROFILE_COLUMNS: tuple[str, ...] = (
    "dataset",
    "variant",
    "arch",
    "ranking",
    "prune",
    "features_kept",
    "split",
    "batch_size",
    "num_batches",
    "accuracy",
    "accuracy_std",
    *INTERVAL_COLUMNS,
    "sample_ms",
    "comm_ms",
    "comp_ms",
    "latency_ms",
    "latency_p95_ms",
    "latency_p99_ms",
    "latency_std_ms",
    "e2e_ms",
    "comm_comp",
    "size_kb",
    "mem_mb",
    "unique_frac",
    *CACHE_COLUMNS,
    "pred_comm_ms",
    "pred_comp_ms",
    "device",
    "threads",
    "torch_version",
    "date",
    "fanouts",
    "hidden_channels",
    "precision",
    "base",
)
"""Columns of ``profiles.csv``, in file order. The variant's axes (:data:`AXIS_COLUMNS`:
``fanouts`` dotted per layer, e.g. ``25.10``, ``hidden_channels``, ``precision`` and ``base``,
the variant it derives from, empty for a trained one) are optional: older files read them as
empty."""

PROFILE_INTERVAL_COLUMNS: tuple[str, ...] = INTERVAL_COLUMNS
"""Accuracy intervals and paired differences to the split's most accurate variant
(:mod:`gnnaas.profiling.uncertainty`). Optional: rows and files without them (profiles written
before they existed) read and write with NaN there."""

SERVICE_TIME_COLUMNS: tuple[str, ...] = (
    "variant",
    "batch_size",
    "sample_ms",
    "gather_ms",
    "compute_ms",
    "e2e_ms",
    *SERVICE_CACHE_COLUMNS,
    "sampling",
    "sampler_seed",
    *SETTING_COLUMNS,
)
"""Columns of ``service_times.csv``, in file order. ``sampling`` and ``sampler_seed`` name the
serving sampler the curve was measured with (:data:`gnnaas.runtime.SAMPLER` and the server's
``GNNAAS_SEED``): a curve measured on another pipeline does not count as current. The execution
settings (:data:`gnnaas.inference.settings.SETTING_COLUMNS`: threads, inline threshold, device,
versions) are optional (older files read them as empty; columns of settings that no longer exist,
such as ``fused_forward`` and ``fast_sampler``, are dropped when read); a server whose settings
differ re-times the curve or does not route the variant."""

_PROFILE_TEXT = {
    "fanouts",
    "precision",
    "base",
    "dataset",
    "variant",
    "arch",
    "ranking",
    "split",
    "device",
    "torch_version",
    "date",
    "best_variant",
}
_PROFILE_BOOL = {"tie_best"}
_BOOL_TEXT = {"true": 1.0, "false": 0.0, "1": 1.0, "0": 0.0, "1.0": 1.0, "0.0": 0.0}
_PROFILE_INT = {"prune", "features_kept", "batch_size", "num_batches", "threads"}
_SERVICE_INT = {"batch_size", "sampler_seed"}
_SERVICE_TEXT = {"variant", "sampling", "device", "torch_version", "gnnaas_version"}

_DATE_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def _frame(
    rows: Iterable[Mapping[str, Any]],
    columns: Sequence[str],
    what: str,
    optional: Sequence[str] = (),
) -> pd.DataFrame:
    records = [dict(r) for r in rows]
    for i, record in enumerate(records):
        for column in optional:
            record.setdefault(column, float("nan"))
        missing = [c for c in columns if c not in record]
        if missing:
            raise ValueError(f"{what}: row {i} lacks columns {missing}")
    return pd.DataFrame.from_records(records, columns=list(columns))


def _write(df: pd.DataFrame, path: Path) -> Path:
    buf = io.StringIO()
    df.to_csv(buf, index=False, float_format="%.6g", lineterminator="\n")
    atomic_write_text(path, buf.getvalue())
    return path


def _resolve(path_or_dir: PathType, filename: str) -> Path:
    path = Path(path_or_dir)
    return path / filename if path.is_dir() or path.suffix != ".csv" else path


def _read(
    path_or_dir: PathType,
    filename: str,
    columns: Sequence[str],
    text: set[str],
    ints: set[str],
    optional: Sequence[str] = (),
    bools: set[str] | None = None,
) -> pd.DataFrame:
    path = _resolve(path_or_dir, filename)
    # profiles/<dataset>/<file>: the folder names the dataset
    hint = f"run `gnnaas profile --dataset {path.parent.name}` to (re)create it"
    if not path.is_file():
        raise ArtifactError(f"{path} not found; {hint}")
    try:
        df = pd.read_csv(path, dtype={c: str for c in text}, keep_default_na=False, na_values=[""])
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise ArtifactError(f"{path} is unreadable ({exc}); {hint}") from None
    for column in optional:  # older files: the column reads as NaN
        if column not in df.columns:
            df[column] = float("nan")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ArtifactError(f"{path} lacks columns {missing}; {hint}")
    try:
        for column in columns:
            if bools and column in bools:
                df[column] = _bool_column(df[column])
            elif column in ints:
                df[column] = df[column].astype("int64")
            elif column not in text:
                df[column] = pd.to_numeric(df[column], errors="raise").astype("float64")
    except (TypeError, ValueError) as exc:
        raise ArtifactError(f"{path} has a malformed value ({exc}); {hint}") from None
    return df[list(columns)]


def _bool_column(values: pd.Series) -> pd.Series:
    """``True``/``False`` text as bool; a column with blanks keeps NaN there (float 1/0/NaN)."""
    if values.isna().all():
        return values.astype("float64")
    text = values.astype(str).str.strip().str.lower()
    mapped = text.map(_BOOL_TEXT)
    bad = values.notna() & mapped.isna()
    if bad.any():
        raise ValueError(f"not a boolean: {values[bad].iloc[0]!r}")
    mapped = mapped.where(values.notna())
    return mapped.astype(bool) if mapped.notna().all() else mapped.astype("float64")


def write_profiles(rows: Iterable[Mapping[str, Any]], path: PathType) -> Path:
    """Writes ``profiles.csv`` atomically.

    Args:
        rows (Iterable[Mapping[str, Any]]): one mapping per variant and split with every column
            of :data:`PROFILE_COLUMNS` (extra keys are dropped; missing
            :data:`PROFILE_INTERVAL_COLUMNS` and :data:`CACHE_COLUMNS` are written empty).
        path (str or PathLike): the file (or its folder).

    Returns:
        Path: the file written.
    """
    optional = (*PROFILE_INTERVAL_COLUMNS, *AXIS_COLUMNS, *CACHE_COLUMNS)
    frame = _frame(rows, PROFILE_COLUMNS, "write_profiles", optional)
    return _write(frame, _resolve(path, PROFILES_FILE))


def write_service_times(rows: Iterable[Mapping[str, Any]], path: PathType) -> Path:
    """Writes ``service_times.csv`` atomically.

    Args:
        rows (Iterable[Mapping[str, Any]]): one mapping per variant and batch size with every
            column of :data:`SERVICE_TIME_COLUMNS` (missing :data:`SERVICE_CACHE_COLUMNS` are
            written empty).
        path (str or PathLike): the file (or its folder).

    Returns:
        Path: the file written.
    """
    optional = (*SERVICE_CACHE_COLUMNS, *SETTING_COLUMNS)
    frame = _frame(rows, SERVICE_TIME_COLUMNS, "write_service_times", optional)
    return _write(frame, _resolve(path, SERVICE_TIMES_FILE))


def read_profiles(path_or_dir: PathType) -> pd.DataFrame:
    """Reads ``profiles.csv`` (a file, or the dataset's profiles folder holding it).

    Args:
        path_or_dir (str or PathLike): ``profiles/<dataset>`` or the CSV itself.

    Returns:
        pandas.DataFrame: the columns of :data:`PROFILE_COLUMNS` with numeric dtypes
        (``tie_best`` bool; :data:`PROFILE_INTERVAL_COLUMNS` and :data:`CACHE_COLUMNS` absent from
        older files are NaN).

    Raises:
        ArtifactError: the file is missing, unreadable or lacks columns.
    """
    return _read(
        path_or_dir,
        PROFILES_FILE,
        PROFILE_COLUMNS,
        _PROFILE_TEXT,
        _PROFILE_INT,
        (*PROFILE_INTERVAL_COLUMNS, *AXIS_COLUMNS, *CACHE_COLUMNS),
        _PROFILE_BOOL,
    )


def read_service_times(path_or_dir: PathType) -> pd.DataFrame:
    """Reads ``service_times.csv`` (a file, or the dataset's profiles folder holding it).

    Args:
        path_or_dir (str or PathLike): ``profiles/<dataset>`` or the CSV itself.

    Returns:
        pandas.DataFrame: the columns of :data:`SERVICE_TIME_COLUMNS` (:data:`SERVICE_CACHE_COLUMNS`
        absent from older files are NaN).

    Raises:
        ArtifactError: the file is missing, unreadable or lacks columns.
    """
    return _read(
        path_or_dir,
        SERVICE_TIMES_FILE,
        SERVICE_TIME_COLUMNS,
        _SERVICE_TEXT,
        _SERVICE_INT,
        (*SERVICE_CACHE_COLUMNS, *SETTING_COLUMNS),
    )


def _parse_date(text: str) -> _dt.datetime | None:
    try:
        return _dt.datetime.strptime(str(text), _DATE_FORMAT).replace(tzinfo=_dt.UTC)
    except ValueError:
        return None


def has_profiles(
    profiles_dir: PathType,
    manifests: Sequence[Manifest],
    *,
    sampler_seed: int = 0,
) -> bool:
    """Whether ``profiles_dir`` holds current profiles of every variant in ``manifests``.

    True when both tables are readable in the current format (accuracy intervals present,
    service curves stamped with the serving sampler), every variant has a ``val`` and a ``test``
    row and service times measured with the serving sampler (:data:`gnnaas.runtime.SAMPLER`)
    keyed by ``sampler_seed``, and no variant was created
    after it was profiled (a regenerated variant needs a new profile). False for an empty
    ``manifests``.

    Args:
        profiles_dir (str or PathLike): ``profiles/<dataset>``.
        manifests (Sequence[Manifest]): the repository's variants (``repo.list(dataset)``).
        sampler_seed (int, optional): the serving sampler's seed. (default: ``0``)

    Returns:
        bool: whether profiling can be skipped.
    """
    if not manifests:
        return False
    try:
        profiles = read_profiles(profiles_dir)
        service = read_service_times(profiles_dir)
    except ArtifactError:
        return False
    if profiles["diff_best"].isna().all():
        return False  # written before accuracy intervals existed
    from gnnaas.runtime import SAMPLER

    pipeline = (service["sampling"] == SAMPLER) & (service["sampler_seed"] == sampler_seed)
    if not bool(pipeline.all()):
        return False  # curves measured with another serving sampler
    served = set(service["variant"])
    for manifest in manifests:
        rows = profiles[profiles["variant"] == manifest.variant_id]
        if not set(SPLITS) <= set(rows["split"]) or manifest.variant_id not in served:
            return False
        created = _parse_date(manifest.created)
        profiled = [d for d in (_parse_date(t) for t in rows["date"]) if d is not None]
        if created is not None and profiled and min(profiled) < created:
            return False
    return True
