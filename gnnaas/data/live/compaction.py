"""Compaction: a dataset's write log folded into a new snapshot, atomically (``gnnaas compact``).

It runs with the server stopped, as the only writer of the state folder: a step apart from the log
and its replay (:mod:`gnnaas.data.live.wal`), which it uses to open the graph, and the only code
that replaces the snapshot.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gnnaas.data.live.wal import WriteLog, open_live, state_folder
from gnnaas.utils import new_file_mode

__all__ = ["compact"]


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def compact(store: Any, state_dir: Path | str) -> dict[str, Any]:
    """Folds a dataset's log into a new snapshot, atomically (the server must be stopped).

    The snapshot is written to a temporary file, fsynced and renamed over the old one; then the
    log is replaced by an empty one. A crash between the two leaves records the snapshot already
    holds, which replay skips by version.

    Returns:
        dict: ``version``, ``num_nodes``, ``num_edges``, ``records`` folded.
    """
    from safetensors.torch import save_file

    graph, log, lock = open_live(store, state_dir)
    try:
        folder = state_folder(state_dir, store.name)
        records = sum(1 for _ in WriteLog.read(log.path))
        rowptr, col = graph.merged_csr()
        n = graph.num_nodes
        tmp = folder / "snapshot.safetensors.tmp"
        save_file(
            {
                "rowptr": rowptr.contiguous(),
                "col": col.contiguous(),
                "x": graph.features()[:n].clone(),
            },
            str(tmp),
            metadata={"version": str(graph.version), "dataset": store.name},
        )
        os.chmod(tmp, new_file_mode())  # safetensors writes 0600
        with tmp.open("rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, folder / "snapshot.safetensors")
        _fsync_dir(folder)  # the new snapshot is durable before the log it replaces goes
        log.close()
        empty = folder / "log.wal.tmp"
        empty.write_bytes(b"")
        os.replace(empty, folder / "log.wal")
        _fsync_dir(folder)
        return {
            "version": graph.version,
            "num_nodes": n,
            "num_edges": int(col.numel()),
            "records": records,
        }
    finally:
        log.close()
        lock.__exit__(None, None, None)
