"""Shared helpers: atomic writes keep the mode a new file gets from the umask."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gnnaas.utils import atomic_write_bytes, atomic_write_json, new_file_mode


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.usefixtures("umask_022")
def test_atomic_writes_are_0644_under_umask_022(tmp_path: Path) -> None:
    assert new_file_mode() == 0o644
    atomic_write_bytes(tmp_path / "a.bin", b"x")
    atomic_write_json(tmp_path / "sub" / "b.json", {"a": 1})
    assert _mode(tmp_path / "a.bin") == 0o644
    assert _mode(tmp_path / "sub" / "b.json") == 0o644
    assert not [p for p in tmp_path.rglob(".*.tmp")]  # no temporary file left behind


def test_atomic_writes_honour_a_private_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        atomic_write_bytes(tmp_path / "a.bin", b"x")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "a.bin") == 0o600
