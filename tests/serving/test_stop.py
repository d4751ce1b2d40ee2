"""Stopping a server started any way: the pid file ``gnnaas serve`` keeps, ``gnnaas stop`` and
``make stop``.

The README starts the server in the background (``make serve &``) and stops it with ``make stop``.
From a script, where there is no job control, signalling the background job reaches ``make``
only, and the server it started keeps the port; the pid file names the server itself. These tests
run real servers in a non-interactive shell and poll the port and the processes (there is nothing
else to wait on), each wait bounded.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from serving_fakes import tiny_store, write_tiny_repository

from gnnaas.cli import main
from gnnaas.serving.deploy.pidfile import (
    claim,
    default_pid_file,
    read_pid_file,
    release,
    still_running,
)

REPO = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _port_is_free(port: int) -> bool:
    """Whether a server could bind ``port`` now (as gnnaas and uvicorn bind: SO_REUSEADDR, so the
    closed connections a stopped server leaves in TIME_WAIT do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
        return True


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)  # fmt: skip
    return int(done.stdout)


def test_a_pid_file_is_claimed_once_and_a_stale_one_is_replaced(tmp_path: Path) -> None:
    path = default_pid_file(8123, tmp_path)
    assert path == tmp_path / "run" / "serve-8123.pid"
    assert read_pid_file(path) is None
    claim(path)
    mine = read_pid_file(path)
    assert mine is not None and mine.pid == os.getpid() and mine.alive
    assert path.read_text().split()[0] == str(os.getpid())  # `kill $(head -1 FILE)` works
    assert [p.name for p in path.parent.iterdir()] == ["serve-8123.pid"]  # no temporary left
    release(path)
    assert not path.exists()

    path.write_text(f"{_dead_pid()}\n")  # a server killed with -9 left it
    stale = read_pid_file(path)
    assert stale is not None and not stale.alive and not still_running(stale)
    claim(path)
    assert read_pid_file(path) == mine

    # A pid reused by another process is not the server: its start time differs.
    path.write_text(f"{os.getpid()}\n1\n")
    reused = read_pid_file(path)
    assert reused is not None and reused.alive is (mine.started is None)


def test_serve_refuses_a_port_whose_pid_file_a_live_server_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = _free_port()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pid_file = tmp_path / "serve.pid"
        pid_file.write_text(f"{holder.pid}\n")
        args = ["serve", "--port", str(port), "--pid-file", str(pid_file)]
        assert main([*args, "--variants", str(tmp_path / "none")]) == 1
        err = capsys.readouterr().err.strip()
        assert err == (
            f"ConfigError: serve: a server (pid {holder.pid}) already runs with the pid file "
            f"{pid_file}; stop it first (gnnaas stop --pid-file {pid_file}), or serve on "
            "another --port"
        )
        assert main([*args, "--check-port"]) == 1
        assert f"a server (pid {holder.pid}) already runs" in capsys.readouterr().err
        assert pid_file.read_text() == f"{holder.pid}\n"  # left to its owner
    finally:
        holder.kill()
        holder.wait()
    # Its holder gone, the file is stale: the port is free to serve.
    assert main(["serve", "--check-port", "--port", str(port), "--pid-file", str(pid_file)]) == 0


def test_stop_without_a_server_says_so_and_clears_a_stale_pid_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = _free_port()
    pid_file = tmp_path / "serve.pid"
    pid_file.write_text(f"{_dead_pid()}\n")
    assert main(["stop", "--port", str(port), "--pid-file", str(pid_file)]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"no server to stop on port {port}\n"
    assert "removed the stale pid file" in captured.err and not pid_file.exists()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:  # not a gnnaas server
        other.bind((HOST, port))
        other.listen()
        assert main(["stop", "--port", str(port), "--pid-file", str(pid_file)]) == 1
    assert "no gnnaas pid file" in capsys.readouterr().err


def test_serve_exits_with_the_reason_when_a_dataset_it_serves_cannot_be_loaded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A prepared dataset (variants and profiles) whose graph cannot be loaded is never left
    out quietly: the server does not start (it would report ready while refusing its requests),
    says why, and leaves neither its port bound nor its pid file."""
    variants_dir, profiles_dir = write_tiny_repository(tmp_path, tiny_store("other"))
    port, pid_file = _free_port(), tmp_path / "serve.pid"
    args = ["serve", "--variants", str(variants_dir), "--profiles", str(profiles_dir),
            "--port", str(port), "--pid-file", str(pid_file), "--device", "cpu", "-q"]  # fmt: skip
    assert main(args) == 1
    assert capsys.readouterr().err.startswith(
        "ConfigError: cannot serve dataset 'other', which has variants and profiles: its graph "
        "could not be loaded (unknown dataset 'other'"
    )
    assert not pid_file.exists() and _port_is_free(port)


@pytest.mark.skipif(
    shutil.which("make") is None or shutil.which("curl") is None, reason="needs make and curl"
)
def test_make_stop_frees_the_port_of_a_server_make_started_in_the_background(
    small_store: Any, tmp_path: Path
) -> None:
    """The README's way, from a script: a ``make`` target serving in the background (as ``make
    serve &``), then the repository's ``make stop``. The server make started is stopped, its
    port is free, its pid file gone, and make itself ends without an error. (The server also
    logs each request: ``--access-log``.)"""
    variants_dir, profiles_dir = write_tiny_repository(tmp_path, small_store)
    port = _free_port()
    cache = tmp_path / "cache"  # the default pid file's folder, as `make stop` finds it
    env = {**os.environ, "GNNAAS_CACHE": str(cache), "GNNAAS_TORCH_THREADS": "1"}
    bin_dir = tmp_path / "bin"  # `gnnaas` as the Makefile's $(BIN) holds it, this interpreter's
    bin_dir.mkdir()
    gnnaas = bin_dir / "gnnaas"
    gnnaas.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m gnnaas.cli "$@"\n')
    gnnaas.chmod(0o755)
    # The last line of `make serve`, under make as there: make, its shell, then the server.
    (tmp_path / "Makefile").write_text(
        f"serve:\n\tGNNAAS_TORCH_THREADS=$${{GNNAAS_TORCH_THREADS:-1}} {gnnaas} serve "
        f"--variants {variants_dir} --profiles {profiles_dir} --dataset {small_store.name} "
        f"--device cpu --host {HOST} --port $(PORT) --access-log\n"
    )
    log = tmp_path / "script.log"
    script = (
        f"make -s -C {tmp_path} serve PORT={port} > {tmp_path / 'serve.log'} 2>&1 &\n"
        f"until curl -sf http://{HOST}:{port}/readyz >/dev/null; do sleep 0.2; done\n"
        f"make -s -C {REPO} stop PORT={port} BIN={bin_dir}\n"
        "wait $!\n"
        'echo "make serve exited $?"\n'
    )
    with open(log, "wb") as out:
        shell = subprocess.Popen(["bash", "-c", script], stdout=out, stderr=subprocess.STDOUT,
                                 env=env, start_new_session=True)  # fmt: skip
    try:
        assert shell.wait(timeout=180) == 0, log.read_text()
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, 9)
    text = log.read_text()
    assert f"stopped the server on port {port} (pid " in text
    assert "make serve exited 0" in text, text + (tmp_path / "serve.log").read_text()
    assert _port_is_free(port)
    assert not default_pid_file(port, cache).exists()
    served = (tmp_path / "serve.log").read_text()
    assert f"serve: listening on http://{HOST}:{port} (host {HOST}, port {port}, pid " in served
    assert "Application shutdown complete" in served and "Traceback" not in served
    assert '"GET /readyz HTTP/1.1" 200' in served  # --access-log: a line per request
