"""The live graph's durable state: the write-ahead log, the folder lock, opening and replaying.

Under ``<state-dir>/<dataset>/`` (:func:`state_folder`): ``log.wal``, the append-only
:class:`WriteLog` (records of a ``length, crc32, version`` header and a write's orjson payload,
fsynced once per group); ``snapshot.safetensors``, the base a compaction wrote
(:mod:`gnnaas.data.live.compaction`); and ``lock``, held by the process that owns the graph.
:func:`open_live` takes the lock, loads the newest base and replays the log, cutting a torn last
record; :func:`read_live`, :func:`live_store` and :func:`writes_since` read the same files without
the lock, beside a running server. Kept apart from the in-memory graph, which holds no file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import re
import struct
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gnnaas.data.live.graph import LiveGraph
from gnnaas.data.live.writes import Write
from gnnaas.errors import ArtifactError, ConfigError

__all__ = ["WriteLog", "live_store", "open_live", "read_live", "state_folder", "writes_since"]

_log = logging.getLogger(__name__)

_HEADER = struct.Struct("<IIQ")  # payload length, crc32 of the payload, graph version after it
_UNSAFE = re.compile(r"[^A-Za-z0-9._@-]")


def state_folder(state_dir: Path | str, dataset: str) -> Path:
    """Where a dataset's snapshot, log and lock live under ``state_dir``."""
    return Path(state_dir) / _UNSAFE.sub("_", dataset)


class WriteLog:
    """The append-only log of a live graph's writes (see :mod:`gnnaas.data.live.wal`).

    Args:
        path (Path): the log file (created if missing).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("ab")

    def close(self) -> None:
        self._file.close()

    def append(self, records: Sequence[tuple[int, bytes]]) -> None:
        """Writes ``(version, payload)`` records and fsyncs once (group commit): when this
        returns, every record survives a crash."""
        chunks = []
        for version, payload in records:
            chunks.append(_HEADER.pack(len(payload), zlib.crc32(payload), version))
            chunks.append(payload)
        self._file.write(b"".join(chunks))
        self._file.flush()
        os.fsync(self._file.fileno())

    @staticmethod
    def read(path: Path) -> Iterator[tuple[int, bytes, int]]:
        """``(version, payload, end offset)`` of every whole record; stops at a torn tail (the
        last record, cut short or failing its checksum: a write a crash interrupted, never
        acknowledged).

        Raises:
            ArtifactError: a record fails its checksum and more follow it: acknowledged writes
                lie beyond a damaged one, so nothing is cut off; the message says where.
        """
        if not path.exists():
            return
        data = path.read_bytes()
        pos = 0
        while pos + _HEADER.size <= len(data):
            length, crc, version = _HEADER.unpack_from(data, pos)
            start, end = pos + _HEADER.size, pos + _HEADER.size + length
            if end > len(data):
                return  # torn: the crash came before the whole record reached the disk
            if zlib.crc32(data[start:end]) != crc:
                if end == len(data):
                    return  # torn: the last record's bytes did not all reach the disk
                raise ArtifactError(
                    f"write log {path} is damaged at byte {pos} of {len(data)} (a record fails "
                    f"its checksum and {len(data) - end} bytes of records follow it); restore "
                    f"the file from a backup, or cut it at byte {pos} to drop every write "
                    f"from there on"
                )
            yield version, data[start:end], end
            pos = end

    @staticmethod
    def truncate(path: Path, size: int) -> None:
        """Cuts a torn tail off the log (durably)."""
        with path.open("r+b") as f:
            f.truncate(size)
            f.flush()
            os.fsync(f.fileno())


@contextlib.contextmanager
def _held(folder: Path) -> Iterator[Any]:
    folder.mkdir(parents=True, exist_ok=True)
    handle = (folder / "lock").open("a")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"{folder} is in use by another gnnaas process (a running server, or a "
                f"compaction); stop it first"
            ) from None
        yield handle
    finally:
        handle.close()


def _load_base(folder: Path, store: Any) -> tuple[Tensor, Tensor, Tensor, int]:
    snapshot = folder / "snapshot.safetensors"
    if not snapshot.exists():
        return store.rowptr, store.col, store.x, 0
    from safetensors import safe_open

    try:
        with safe_open(str(snapshot), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in ("rowptr", "col", "x")}
    except Exception as exc:
        raise ArtifactError(f"live graph snapshot {snapshot} cannot be read ({exc})") from exc
    if int(tensors["x"].size(1)) != int(store.num_features):
        raise ArtifactError(
            f"live graph snapshot {snapshot} has {tensors['x'].size(1)} features, the dataset "
            f"{store.num_features}"
        )
    return tensors["rowptr"], tensors["col"], tensors["x"], int(meta.get("version", "0"))


def _last_end(path: Path) -> int:
    """End offset of the last whole record of the log (0 for none)."""
    return max((end for _, _, end in WriteLog.read(path)), default=0)


def open_live(
    store: Any, state_dir: Path | str, *, extra_capacity: int | None = None
) -> tuple[LiveGraph, WriteLog, Any]:
    """The live graph of ``store`` under ``state_dir``: its newest snapshot (else the dataset)
    with the log replayed, the log open for appends, and the held lock (close it to release).

    Args:
        store (GraphStore): the dataset as loaded (its base when no snapshot exists).
        state_dir (Path | str): the server's ``--state-dir``.
        extra_capacity (int, optional): room for new nodes beyond the current count; by default
            a quarter of it, at least 1,024. (default: ``None``)

    Raises:
        ConfigError: another process holds the dataset's state.
        ArtifactError: the snapshot cannot be read or the log does not fit it.
    """
    folder = state_folder(state_dir, store.name)
    lock = _held(folder)
    handle = lock.__enter__()
    try:
        rowptr, col, x, version = _load_base(folder, store)
        path = folder / "log.wal"
        records = [
            (v, Write.from_payload(payload), end)
            for v, payload, end in WriteLog.read(path)
            if v > version  # older ones are in the snapshot (a crash before the log was reset)
        ]
        new_nodes = sum(w.features.shape[0] for _, w, _ in records if w.kind == "nodes")  # type: ignore[union-attr]
        n = rowptr.numel() - 1 + new_nodes
        room = extra_capacity if extra_capacity is not None else max(1024, n // 4)
        graph = LiveGraph(rowptr, col, x, capacity=n + room, version=version)
        for v, write, _ in records:
            graph.apply(write)
            if graph.version != v:
                raise ArtifactError(f"live graph log {path}: record of version {v} out of order")
        valid = max((end for _, _, end in records), default=0)
        valid = max(valid, _last_end(path))
        if path.exists() and path.stat().st_size > valid:
            _log.warning(
                "%s: cut a torn last record (%d bytes) off %s: a crash while it was written, "
                "so it was never acknowledged",
                store.name,
                path.stat().st_size - valid,
                path,
            )
            WriteLog.truncate(path, valid)  # a torn last record: never acknowledged
        name, replayed = store.name, len(records)
        _log.info("%s: replayed %d log records (graph version %d)", name, replayed, graph.version)
        return graph, WriteLog(path), lock
    except BaseException:
        lock.__exit__(None, None, None)
        raise
    finally:
        del handle


def read_live(store: Any, state_dir: Path | str) -> LiveGraph:
    """The live graph of ``store`` as its state folder holds it now, read only: the newest
    snapshot (else the dataset) with the log's whole records replayed, without taking the lock or
    touching a file, so that it can run beside the server that writes it (``gnnaas infer``,
    ``gnnaas precompute``). A record being written meanwhile fails its checksum and is left out.

    Raises:
        ArtifactError: the snapshot cannot be read or the log does not fit it.
    """
    folder = state_folder(state_dir, store.name)
    rowptr, col, x, version = _load_base(folder, store)
    path = folder / "log.wal"
    records = [
        (v, Write.from_payload(payload)) for v, payload, _ in WriteLog.read(path) if v > version
    ]
    new_nodes = sum(w.features.shape[0] for _, w in records if w.kind == "nodes")  # type: ignore[union-attr]
    graph = LiveGraph(rowptr, col, x, capacity=rowptr.numel() - 1 + new_nodes, version=version)
    for v, write in records:
        graph.apply(write)
        if graph.version != v:
            raise ArtifactError(f"live graph log {path}: record of version {v} out of order")
    return graph


def live_store(store: Any, state_dir: Path | str) -> tuple[Any, int]:
    """The dataset as its live graph under ``state_dir`` holds it now, as a ``GraphStore``, and
    the graph's version (read only, as :func:`read_live`): what ``gnnaas profile --state-dir``
    measures, so that a precomputed variant's answers (one row per node of the live graph) and
    the trained variants are profiled on the graph the server serves. New nodes have no label
    (0; no class when multi-label) and are in no split: accuracy stays measured on the dataset's
    validation and test nodes, with the neighborhoods they have now.

    Raises:
        ArtifactError: the snapshot cannot be read or the log does not fit it.
    """

    graph = read_live(store, state_dir)
    rowptr, col = graph.merged_csr()
    n = graph.num_nodes
    y = store.y
    if n > y.size(0):  # [N + new] with zero rows for the new nodes
        y = torch.cat([y, y.new_zeros((n - y.size(0), *y.shape[1:]))])
    # The store with the live graph's edges and rows (its caches start empty: init=False fields).
    current = dataclasses.replace(store, rowptr=rowptr, col=col, x=graph.features()[:n], y=y)
    return current, graph.version


def writes_since(store: Any, state_dir: Path | str, version: int) -> list[Write] | None:
    """The writes of the log after ``version``, in order; ``None`` when they are not all there
    (a compaction since folded some into the snapshot)."""
    folder = state_folder(state_dir, store.name)
    snapshot = folder / "snapshot.safetensors"
    if snapshot.exists() and _load_base(folder, store)[3] > version:
        return None
    return [
        Write.from_payload(payload)
        for v, payload, _ in WriteLog.read(folder / "log.wal")
        if v > version
    ]
