"""The pid file of a running ``gnnaas serve``: how ``gnnaas stop`` (and ``make stop``) finds it.

``gnnaas serve`` claims ``<cache>/run/serve-<port>.pid`` (:func:`default_pid_file`; the cache is
``GNNAAS_CACHE``, by default ``~/.cache/gnnaas``; ``serve --pid-file`` puts it elsewhere) once
its port is bound, before it loads anything, and removes it when it exits, however it was started
(``make serve``, a shell, a service manager). The file's first line is the server's pid, so
``kill $(head -1 FILE)`` works too; its second line, where the system tells it, is when that
process started, so that a pid reused by another process after a crash (``kill -9``, a reboot)
is not taken for the server: such a file is *stale*, replaced by the next server and removed by
``gnnaas stop``.

A server refuses to start while a live server holds its pid file: with the port bound but not yet
listening (models still loading), a second server could otherwise bind the same port too.

Example:
    >>> path = default_pid_file(8000, Path("/tmp/cache"))
    >>> path.name
    'serve-8000.pid'
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from gnnaas.errors import ConfigError

__all__ = [
    "ServerPid",
    "claim",
    "default_pid_file",
    "read_pid_file",
    "release",
    "still_running",
]


def default_pid_file(port: int, cache_dir: Path | None) -> Path:
    """Where the server on ``port`` keeps its pid: ``<cache_dir>/run/serve-<port>.pid``, the
    cache being ``~/.cache/gnnaas`` when ``cache_dir`` is ``None`` (as for processed datasets,
    :func:`gnnaas.data.resolve_cache_dir`, without importing the data layer)."""
    cache = Path.home() / ".cache" / "gnnaas" if cache_dir is None else Path(cache_dir)
    return cache.expanduser() / "run" / f"serve-{port}.pid"


def _started(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, from ``/proc``), ``None`` where the
    system does not say; ``""`` for a zombie (exited, not yet reaped: no longer a server)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # after the command name, which may hold spaces
    if len(fields) < 20:
        return None
    return "" if fields[0] == "Z" else fields[19]


def _alive(pid: int, started: str | None) -> bool:
    """Whether ``pid`` is a live process that started at ``started`` (when known)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        pass
    now = _started(pid)
    if now == "":
        return False
    return started is None or now is None or now == started


@dataclass(frozen=True)
class ServerPid:
    """What a pid file says.

    Args:
        pid (int): the server's process id.
        started (str, optional): when that process started (``/proc``), ``None`` if unknown.
        alive (bool): whether that process still runs (the same process: not a reused pid).
    """

    pid: int
    started: str | None
    alive: bool


def read_pid_file(path: Path) -> ServerPid | None:
    """The server a pid file names, ``None`` when there is no such file (or it holds no pid)."""
    try:
        lines = Path(path).read_text().split()
    except FileNotFoundError:
        return None
    if not lines or not lines[0].isdigit():
        return None
    pid = int(lines[0])
    started = lines[1] if len(lines) > 1 else None
    return ServerPid(pid, started, _alive(pid, started))


def still_running(server: ServerPid) -> bool:
    """Whether the process a pid file named still runs (read now, not when the file was)."""
    return _alive(server.pid, server.started)


def claim(path: Path) -> None:
    """Writes this process's pid file at ``path``, atomically: readers see a whole file or none.

    A stale file (its process is gone) is replaced.

    Raises:
        ConfigError: a live server holds ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    started = _started(pid)
    tmp = path.with_name(f".{path.name}.{pid}.tmp")
    tmp.write_text(f"{pid}\n{started}\n" if started else f"{pid}\n")
    try:
        try:
            os.link(tmp, path)  # fails if the file exists: two servers cannot both create it
            return
        except FileExistsError:
            pass
        holder = read_pid_file(path)
        if holder is not None and holder.alive and holder.pid != pid:
            raise _held(path, holder.pid)
        os.replace(tmp, path)  # stale (or unreadable): ours now
        holder = read_pid_file(path)
        if holder is None or holder.pid != pid:  # another server replaced it meanwhile
            raise _held(path, holder.pid if holder else -1)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _held(path: Path, pid: int) -> ConfigError:
    port = path.stem.removeprefix("serve-")
    how = f"gnnaas stop --port {port}" if port.isdigit() else f"gnnaas stop --pid-file {path}"
    return ConfigError(
        f"serve: a server (pid {pid}) already runs with the pid file {path}; stop it first "
        f"({how}), or serve on another --port"
    )


def release(path: Path) -> None:
    """Removes ``path`` if it names this process (another server's file is left alone)."""
    holder = read_pid_file(path)
    if holder is not None and holder.pid == os.getpid():
        with contextlib.suppress(FileNotFoundError):
            Path(path).unlink()
