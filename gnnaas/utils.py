"""Small helpers used by several layers: device resolution, atomic writes."""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import torch

from gnnaas.errors import ConfigError
from gnnaas.typing import Device, PathType

__all__ = [
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "new_file_mode",
    "resolve_device",
]


def resolve_device(device: Device = "auto") -> torch.device:
    """Turns ``auto``/``cpu``/``cuda[:n]`` into a :class:`torch.device`.

    ``auto`` picks CUDA when it is available, else the CPU. Asking for CUDA on a machine
    without it is a :class:`ConfigError` that says so.
    """
    if isinstance(device, torch.device):
        return device
    name = str(device).strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"device '{device}' requested but CUDA is not available; use --device cpu"
        )
    try:
        return torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(f"unknown device '{device}'; use auto, cpu or cuda") from exc


_UMASK_LOCK = threading.Lock()


def _umask() -> int:
    """The process umask, read without changing it where Linux shows it (``/proc``); elsewhere
    set and restored under a lock (a file another thread creates meanwhile gets umask 022)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def new_file_mode() -> int:
    """The mode ``open()`` gives a new file: ``0o666`` less the process umask (0644 under 022).

    Writers that go through a temporary file made private (:func:`tempfile.mkstemp`, or
    safetensors' ``save_file``, both 0600) give it this mode before renaming it into place, so
    the result reads like any other file the user writes.
    """
    return 0o666 & ~_umask()


def atomic_write_bytes(path: PathType, data: bytes) -> None:
    """Writes ``data`` to ``path`` through a temporary file and a rename: readers never see half.

    The file gets the mode ``open()`` gives a new file (:func:`new_file_mode`), not the owner-only
    0600 of :func:`tempfile.mkstemp`: reports, plots and profile tables are read by other users
    and services.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), new_file_mode())
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: PathType, text: str) -> None:
    """Text version of :func:`atomic_write_bytes` (UTF-8)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: PathType, obj: Any) -> None:
    """Writes ``obj`` as indented JSON, atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")
