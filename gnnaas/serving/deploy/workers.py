"""Several server processes on one machine: ``gnnaas serve --workers N``.

The parent validates the settings and hands them to N uvicorn worker processes, each listening on
its own ``SO_REUSEPORT`` socket of the same address (:func:`reuse_port_socket`; uvicorn's own
supervisor: it restarts a worker that dies and restarts them all on ``SIGHUP``, which
is how a multi-worker server reloads). Each worker builds the app with :func:`worker_app`, from the
same ``GNNAAS_*`` environment, and shares two folders the parent creates for the server's lifetime:

- ``GNNAAS_SHARED_STORE_DIR``: the graph stores and the variants' pruned feature copies as ``.npy``
  files, memory-mapped by every worker (:func:`gnnaas.data.shared.share_store`), so N workers keep
  one copy of the features in the page cache instead of N private ones.
- ``PROMETHEUS_MULTIPROC_DIR``: prometheus-client's multiprocess mode. Counters and histograms are
  summed over the workers at scrape time; the load gauges (queue depth, nodes in flight) are summed
  over live workers and each worker's drift gauges carry its ``pid`` (see
  :mod:`gnnaas.serving.core.metrics`).

Both folders are removed when the parent exits.

A SIGHUP replaces every worker with a fresh process, whose router would start at generation 1 with
no reload counted. The supervisor counts the SIGHUPs that replaced workers and starts the new ones
with ``GNNAAS_GENERATION`` (:attr:`Settings.generation
<gnnaas.serving.core.settings.Settings.generation>`) = 1 + that count; the first new worker of a
generation counts the reload in ``gnnaas_reloads_total{outcome="ok"}`` (a marker file in the
shared folder makes it one per SIGHUP, not one per worker), so ``/metrics`` shows the server's
reloads and generation. A restart uvicorn aborts (a new worker not ready in time) counts nothing.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from uvicorn.supervisors import multiprocess

if TYPE_CHECKING:  # torch is imported where a store is shared: the supervisor never loads it
    pass

__all__ = [
    "GENERATION_ENV",
    "SHARED_STORE_ENV",
    "SUPERVISOR_ENV",
    "reuse_port_socket",
    "run_workers",
    "worker_app",
]

_log = logging.getLogger(__name__)

SHARED_STORE_ENV = "GNNAAS_SHARED_STORE_DIR"
GENERATION_ENV = "GNNAAS_GENERATION"
"""Set in the workers to the generation they start at (:attr:`Settings.generation
<gnnaas.serving.core.settings.Settings.generation>`): 1 + the SIGHUPs that replaced workers."""
SUPERVISOR_ENV = "GNNAAS_SUPERVISOR_PID"
"""Set in the workers to the supervisor's pid (:attr:`Settings.supervisor_pid
<gnnaas.serving.core.settings.Settings.supervisor_pid>`): ``POST /v1/admin/reload`` points at
its SIGHUP."""
# How long the supervisor waits for a (re)started worker to load its variants and answer.
_WORKER_START_S = 120


def worker_app() -> Any:
    """The app of one worker process, from the ``GNNAAS_*`` environment the parent set."""
    from gnnaas.serving.core.settings import Settings
    from gnnaas.serving.http.app import create_app

    logging.getLogger("gnnaas.serving.core.reload").setLevel(logging.INFO)
    settings = Settings()
    app = create_app(settings)
    if settings.generation > 1 and _first_of_generation(settings):
        app.state.metrics.reloaded("ok")  # the SIGHUP that started this generation
    return app


def _first_of_generation(settings: Any) -> bool:
    """Whether this is the first worker of its generation to start (so exactly one counts the
    reload): it creates the generation's marker in the shared folder; a process outside a
    supervisor (no shared folder) is the only one."""
    if settings.shared_store_dir is None:
        return True
    marker = Path(settings.shared_store_dir) / f".reloaded-{settings.generation}"
    try:
        marker.open("x").close()
    except FileExistsError:
        return False
    return True


def reuse_port_socket(address: tuple[Any, ...], family: int) -> socket.socket:
    """A socket bound to ``address`` with ``SO_REUSEPORT`` (not listening yet).

    Every worker listens on its own such socket and the kernel spreads new connections over
    them. One socket shared by the workers would not: the worker that wakes first accepts every
    pending connection in one go, so a client opening its keep-alive connections at once sends
    nearly all its requests to one worker.

    Raises:
        OSError: the address is in use by a socket without ``SO_REUSEPORT``.
    """
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


class _Supervisor(multiprocess.Multiprocess):
    """uvicorn's supervisor, counting the SIGHUPs that replaced workers: the workers it starts
    from then on read ``GNNAAS_GENERATION`` (one more per such SIGHUP) from its environment."""

    generation = 1

    def handle_hup(self) -> None:
        self.generation += 1
        os.environ[GENERATION_ENV] = str(self.generation)
        before = list(self.processes)
        super().handle_hup()
        if all(process in before for process in self.processes):  # aborted: none replaced
            self.generation -= 1
            os.environ[GENERATION_ENV] = str(self.generation)


class _ReusePortWorker(multiprocess.Process):
    """uvicorn's worker process on a fresh ``SO_REUSEPORT`` socket of the address the supervisor's
    config carries (``gnnaas_listen``); the supervisor closes its copy once the child has one, so
    a dead worker's socket leaves the group instead of queueing connections nobody accepts."""

    def __init__(self, config: Any, sockets: list[socket.socket]) -> None:
        self._own = [reuse_port_socket(*config.gnnaas_listen)]
        super().__init__(config, self._own)

    def start(self) -> None:
        super().start()
        for own in self._own:
            own.close()

    def join(self) -> None:
        super().join()
        # A worker that was killed (or crashed) never ran its own clean-up: its live gauges
        # would stay in /metrics' sums. Every exit path of the supervisor joins the process.
        from prometheus_client import multiprocess as prometheus_multiprocess

        if self.pid is not None and os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            prometheus_multiprocess.mark_process_dead(self.pid)


def run_workers(
    environment: Mapping[str, str],
    address: tuple[Any, ...],
    family: int,
    *,
    workers: int,
    log_level: str = "info",
    access_log: bool = False,
    app: str = "gnnaas.serving.deploy.workers:worker_app",
) -> bool:
    """Serves ``address`` with ``workers`` uvicorn processes until SIGINT/SIGTERM.

    Args:
        environment (Mapping[str, str]): ``GNNAAS_*`` settings the workers read (what the
            command line gave; the parent's environment is inherited too).
        address (tuple): the socket address to listen on (each worker binds it with
            ``SO_REUSEPORT``, see :func:`reuse_port_socket`).
        family (int): its address family.
        workers (int): worker processes (at least 2).
        log_level (str, optional): uvicorn's log level. (default: ``"info"``)
        access_log (bool, optional): uvicorn's access log, a line per request. (default:
            ``False``)
        app (str, optional): ``module:function`` building each worker's app (tests serve
            in-memory fakes). (default: :func:`worker_app`)

    Returns:
        bool: whether the supervisor ran (workers that fail to start are logged by uvicorn).
    """
    import uvicorn

    from gnnaas.serving.http.protocol import protocol_class

    scratch = Path(tempfile.mkdtemp(prefix="gnnaas-workers-"))
    shared, metrics = scratch / "store", scratch / "metrics"
    shared.mkdir()
    metrics.mkdir()
    names = (
        *environment,
        SHARED_STORE_ENV,
        SUPERVISOR_ENV,
        GENERATION_ENV,
        "PROMETHEUS_MULTIPROC_DIR",
    )
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update(environment)
    os.environ[SUPERVISOR_ENV] = str(os.getpid())
    os.environ[GENERATION_ENV] = "1"
    os.environ[SHARED_STORE_ENV] = str(shared)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics)
    try:
        config = uvicorn.Config(
            app,
            factory=True,
            workers=workers,
            log_level=log_level,
            access_log=access_log,
            http=protocol_class(),  # a shed request is refused before it reaches the app
            # SIGHUP brings each new worker into service before retiring the old one; it must
            # have time to load the variants (uvicorn's default of 5 s aborts the restart).
            timeout_worker_healthcheck=_WORKER_START_S,
        )
        config.gnnaas_listen = (address, family)  # read by each _ReusePortWorker
        # uvicorn's supervisor builds its workers from its module's ``Process``: ours binds each
        # one its own socket (restored below; the supervisor is this process's only user).
        default_process = multiprocess.Process
        multiprocess.Process = _ReusePortWorker  # type: ignore[misc]
        try:
            _Supervisor(config, sockets=[]).run()
        finally:
            multiprocess.Process = default_process  # type: ignore[misc]
        return True
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(scratch, ignore_errors=True)
