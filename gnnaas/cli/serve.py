"""``gnnaas serve``, ``gnnaas stop`` and ``gnnaas ray-config``: the HTTP server (uvicorn, workers,
Ray Serve), and stopping it however it was started (its pid file,
:mod:`gnnaas.serving.deploy.pidfile`)."""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

from gnnaas.cli.common import (
    _add_quiet,
    _add_served_folders,
    _positive_float,
    _positive_int,
    _quiet,
    _say,
)
from gnnaas.errors import ConfigError

__all__ = ["SERVE_OPTIONS", "add_parsers"]

SERVE_OPTIONS = {
    "variants_dir": "--variants",
    "profiles_dir": "--profiles",
    "data_root": "--data-root",
    "device": "--device",
    "datasets": "--dataset",
    "state_dir": "--state-dir",
}
"""The server settings ``gnnaas serve`` sets from an option (field -> option); every other one
is read from its ``GNNAAS_*`` variable (the README's table of knobs says which)."""


def _bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (not yet listening), or a one-line error if taken.

    Binding first makes a busy port fail in a moment instead of after loading every model, and
    holds the port while they load; uvicorn starts listening on this very socket.
    """
    from gnnaas.errors import ConfigError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"serve: --host {host!r} cannot be resolved ({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"serve: port {port} is in use on {host}; pick another with --port "
                f"(or PORT=... with make serve)"
            ) from None
        raise ConfigError(f"serve: cannot bind {host}:{port} ({exc.strerror})") from None
    return sock


def _serve_workers(args: argparse.Namespace, sock: socket.socket, given: dict[str, Any]) -> int:
    """``serve --workers N``: N uvicorn processes on ``sock``
    (:mod:`gnnaas.serving.deploy.workers`)."""
    from gnnaas.serving.deploy.workers import reuse_port_socket, run_workers

    environment = {f"GNNAAS_{key.upper()}": _env_value(value) for key, value in given.items()}
    address, family = sock.getsockname(), sock.family
    sock.close()  # the workers bind their own SO_REUSEPORT sockets to this address
    try:
        reuse_port_socket(address, family).close()
    except OSError as exc:
        raise ConfigError(f"serve: cannot share {args.host}:{args.port} ({exc.strerror})") from None
    _say(
        args,
        f"starting {args.workers} workers on {_url(args.host, args.port)} (supervisor pid "
        f"{os.getpid()}); each loads the variants",
    )
    run_workers(environment, address, family, workers=args.workers, access_log=args.access_log)
    return 0


def _env_value(value: Any) -> str:
    """A setting as its ``GNNAAS_*`` variable spells it (lists as JSON)."""
    if isinstance(value, list | tuple):
        return json.dumps([str(v) for v in value])
    return str(value)


def _serve_ray(args: argparse.Namespace, settings: Any) -> int:
    """``serve --backend ray``: gnnaas on Ray Serve until SIGINT or SIGTERM
    (:mod:`gnnaas.serving.deploy.ray`); the stop takes down every process it started."""
    try:
        from gnnaas.serving.deploy import ray as ray_backend
        from gnnaas.serving.deploy.ray_apps import parse_autoscale
    except ImportError as exc:
        raise ConfigError(
            f"serve: --backend ray needs Ray Serve ({exc}); "
            "install it with pip install 'gnnaas[ray]'"
        ) from None
    if args.workers > 1:
        raise ConfigError("serve: --workers is for --backend uvicorn; use --replicas with ray")
    autoscale = None
    if args.autoscale is not None:
        try:
            autoscale = parse_autoscale(args.autoscale)
        except ValueError as exc:
            raise ConfigError(f"serve: --{exc}") from None
    import signal
    import threading

    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    # Both signals stop the same way: Serve, Ray and every process of a local Ray's session.
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    where = f"the cluster at {args.address}" if args.address else "a local Ray"
    _say(args, f"starting gnnaas on {where}; each dataset replica loads its variants")
    try:
        ray_backend.start_ray(address=args.address, host=args.host, port=args.port)
        # Ray's core installs its own SIGTERM handler in this process (a stack dump, then an
        # abort): ours again, so that SIGTERM stops cleanly.
        for sig in previous:
            signal.signal(sig, on_signal)
        url = ray_backend.run_ray(
            settings,
            replicas=args.replicas,
            autoscale=autoscale,
            host=args.host,
            port=args.port,
            address=args.address,
            replica_cpus=args.replica_cpus,
            one_app=args.one_app,
            stop=stop.is_set,
        )
        _say(args, f"serving on {url} (Ctrl-C or SIGTERM stops it)")
        while not stop.wait(1.0):
            pass
    except ConfigError as exc:
        raise ConfigError(f"serve: {exc}") from None
    except KeyboardInterrupt:  # a signal while deploying
        pass
    finally:
        _say(args, "stopping")
        ray_backend.shutdown_ray()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def _cmd_ray_config(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    try:
        from gnnaas.serving.deploy import ray_apps
    except ImportError as exc:
        raise ConfigError(
            f"ray-config: needs Ray Serve ({exc}); install it with pip install 'gnnaas[ray]'"
        ) from None
    from gnnaas.serving.core.settings import Settings

    given = {
        "variants_dir": args.variants,
        "profiles_dir": args.profiles,
        "data_root": args.data_root,
        "datasets": args.dataset or None,
    }
    try:
        settings = Settings(**{k: v for k, v in given.items() if v is not None})
        autoscale = ray_apps.parse_autoscale(args.autoscale) if args.autoscale else None
    except ValidationError as exc:
        raise ConfigError(f"ray-config: {exc.errors()[0]['msg']}") from None
    except ValueError as exc:
        raise ConfigError(f"ray-config: --{exc}") from None
    text = ray_apps.serve_config(
        settings,
        replicas=args.replicas,
        autoscale=autoscale,
        host=args.host,
        port=args.port,
        replica_cpus=args.replica_cpus,
        one_app=args.one_app,
    )
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
        _say(args, f"wrote {args.output}; deploy it with `serve deploy {args.output}`")
    _warn_without_data_root(settings, ray_apps.servable_datasets(settings))
    return 0


def _warn_without_data_root(settings: Any, datasets: list[str]) -> None:
    """Warns (on stderr, even with ``-q``) about real datasets in a Ray config without a data
    root: it says ``data_root: null`` and the replicas could not read their raw files."""
    if settings.data_root is not None:
        return
    from gnnaas.data import dataset_info
    from gnnaas.errors import GnnaasError

    real = []
    for name in datasets:
        try:
            if dataset_info(name).source not in ("synthetic", "imported"):
                real.append(name)
        except GnnaasError:  # a folder that is no dataset name: the replicas will say so
            continue
    if real:
        one = len(real) == 1
        print(
            f"ray-config: warning: {', '.join(real)} {'is a' if one else 'are'} real "
            f"dataset{'' if one else 's'} read from a data root, and none is set (--data-root, "
            "GNNAAS_DATA): the config says data_root: null and the replicas "
            f"cannot load {'it' if one else 'them'}; write it again with --data-root DIR (a "
            "folder every node sees at the same path)",
            file=sys.stderr,
        )


def _pid_file(args: argparse.Namespace) -> Path:
    """The pid file of the server on ``--port``: ``--pid-file``, else the default one under the
    cache (``GNNAAS_CACHE``) that ``gnnaas stop`` looks for."""
    from gnnaas.config import from_environment
    from gnnaas.serving.deploy.pidfile import default_pid_file

    if args.pid_file is not None:
        return Path(args.pid_file)
    return default_pid_file(args.port, from_environment().cache_dir)


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _cmd_serve(args: argparse.Namespace) -> int:
    from gnnaas.serving.deploy.pidfile import claim, read_pid_file, release

    pid_file = _pid_file(args)
    sock = _bind(args.host, args.port)
    if args.check_port:
        sock.close()
        holder = read_pid_file(pid_file)
        if holder is not None and holder.alive:
            raise ConfigError(
                f"serve: a server (pid {holder.pid}) already runs with the pid file {pid_file} "
                f"(still starting?); stop it with `gnnaas stop --port {args.port}`, or pick "
                "another port (PORT=... with make serve)"
            )
        return 0
    try:
        claim(pid_file)
    except BaseException:
        sock.close()
        raise
    try:
        return _serve(args, sock, pid_file)
    finally:
        release(pid_file)


def _serve(args: argparse.Namespace, sock: socket.socket, pid_file: Path) -> int:
    """``gnnaas serve`` once its port is bound and its pid file written."""
    package_log = logging.getLogger("gnnaas")
    package_level = package_log.level  # restored when serve returns (main() called in-process)
    try:
        if args.threads is not None:  # the server's own threads are its torch_threads
            import torch

            torch.set_num_threads(args.threads)
        settings, overrides = _server_settings(args)
        if args.backend == "ray":
            sock.close()  # Serve's proxy binds the port itself
            return _serve_ray(args, settings)
        if args.workers > 1:
            return _serve_workers(args, sock, overrides)
        return _serve_uvicorn(args, settings, sock, pid_file)
    finally:
        sock.close()
        package_log.setLevel(package_level)


def _server_settings(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The server's settings (the options given, then ``GNNAAS_*``, then the defaults) and the
    options given."""
    from pydantic import ValidationError

    from gnnaas.serving.core.settings import Settings

    given = {
        field: getattr(args, option.lstrip("-").replace("-", "_")) or None
        for field, option in SERVE_OPTIONS.items()
    }
    # Options left out stay out, so GNNAAS_* variables and the settings' defaults apply.
    overrides = {key: value for key, value in given.items() if value is not None}
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "settings"
        raise ConfigError(
            f"serve: {where}: {first['msg']} (check --options and GNNAAS_* variables)"
        ) from None
    if settings.state_dir is not None and (args.backend == "ray" or args.workers > 1):
        raise ConfigError(
            "serve: a live graph (--state-dir) is served by one process; drop --workers / "
            "--backend ray, or the state folder"
        )
    return settings, overrides


class _Terminated(Exception):
    """SIGTERM reached ``gnnaas serve``: stop as after Ctrl-C, cleaning up on the way out."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated


def _serve_uvicorn(
    args: argparse.Namespace, settings: Any, sock: socket.socket, pid_file: Path
) -> int:
    """One process serving under uvicorn until SIGINT or SIGTERM; 0 after a clean stop."""
    import signal

    import uvicorn

    from gnnaas.serving.http.app import create_app
    from gnnaas.serving.http.protocol import protocol_class

    _say(args, f"loading variants from {settings.variants_dir} ({settings.device})")
    # SIGHUP and POST /v1/admin/reload reread the folders above; their outcome is logged.
    # A SIGHUP while the models load is ignored (they are being read fresh anyway).
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # uvicorn drains on SIGTERM, then raises it again once its own handler is gone: by default
    # that kills the process before the pid file is removed. Ours ends `run` as Ctrl-C does
    # (also while the models load).
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    logging.getLogger("gnnaas.serving.core.reload").setLevel(logging.INFO)
    if not _quiet(args):  # each start-up phase says so: graphs, replayed logs, warm-up
        logging.getLogger("gnnaas").setLevel(logging.INFO)
    try:
        app = create_app(settings, reload_on_sighup=True)
        config = uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level="info",
            access_log=args.access_log,
            http=protocol_class(),  # a shed request is refused before it reaches the app
        )
        server = _server_class(uvicorn)(config)
        stop = f"gnnaas stop --port {args.port}"
        if args.pid_file is not None:
            stop += f" --pid-file {pid_file}"
        server.gnnaas_ready = lambda: _say(
            args,
            f"listening on {_url(args.host, args.port)} (host {args.host}, port {args.port}, "
            f"pid {os.getpid()}, pid file {pid_file}); stop it with `{stop}`",
        )
        try:
            server.run(sockets=[sock])
        except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it drained on: a clean stop
            pass
    except _Terminated:  # after uvicorn drained, or while the models loaded: a clean stop
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0 if server.started else 3  # uvicorn's exit code for a failed start-up


def _server_class(uvicorn: Any) -> Any:
    """uvicorn's ``Server`` that says where it listens once it accepts connections (given
    ``sockets``, uvicorn itself says nothing: it assumes a supervisor said it)."""

    class _Server(uvicorn.Server):  # type: ignore[misc,name-defined]
        gnnaas_ready: Any = None

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started and self.gnnaas_ready is not None:
                self.gnnaas_ready()

    return _Server


def _cmd_stop(args: argparse.Namespace) -> int:
    """Stops the server that holds the pid file of ``--port`` (SIGTERM: a graceful shutdown)
    and waits until its process is gone."""
    import signal
    import time

    from gnnaas.serving.deploy.pidfile import read_pid_file, still_running

    pid_file = _pid_file(args)
    holder = read_pid_file(pid_file)
    if holder is None or not holder.alive:
        if holder is not None:  # the server died without removing it (kill -9, a crash)
            pid_file.unlink(missing_ok=True)
            _say(args, f"removed the stale pid file {pid_file} (pid {holder.pid} is gone)")
        try:
            _bind(args.host, args.port).close()
        except ConfigError:
            raise ConfigError(
                f"stop: port {args.port} is in use on {args.host}, but no gnnaas pid file "
                f"({pid_file}) names the process holding it; stop it where it was started"
            ) from None
        print(f"no server to stop on port {args.port}")
        return 0
    os.kill(holder.pid, signal.SIGTERM)
    start = time.monotonic()
    while still_running(holder):
        if time.monotonic() - start > args.timeout_s:
            raise ConfigError(
                f"stop: the server (pid {holder.pid}) still runs {args.timeout_s:g} s after "
                f"SIGTERM; wait longer (--timeout-s) or kill it: kill -9 {holder.pid}"
            )
        time.sleep(0.1)  # another process: nothing to wait on but its exit
    print(f"stopped the server on port {args.port} (pid {holder.pid})")
    return 0


def add_parsers(sub: Any) -> None:
    """Adds ``serve``, ``stop`` and ``ray-config`` to the subcommands ``sub``."""
    _add_serve_parser(sub)
    _add_stop_parser(sub)
    _add_ray_config_parser(sub)


def _add_serve_parser(sub: Any) -> None:
    """``gnnaas serve``."""
    p = sub.add_parser(
        "serve",
        help="serve every profiled dataset over HTTP",
        description="Serve every dataset that has variants and profiles over HTTP. Options "
        "left out fall back to the GNNAAS_* variables (GNNAAS_VARIANTS_DIR, GNNAAS_DEVICE, ...).",
    )
    _add_served_folders(p)
    p.add_argument(
        "--dataset",
        nargs="*",
        help="serve only these datasets (default: $GNNAAS_DATASETS or all with profiles)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="TCP port to listen on (default: 8000)")
    p.add_argument(
        "--check-port",
        action="store_true",
        help="only check that --host/--port are free and no running server holds the port's "
        "pid file, then exit (make serve does it first)",
    )
    _add_pid_file(
        p,
        "written once the port is bound, removed on exit; a server refuses to "
        "start while a live one holds it",
    )
    p.add_argument(
        "--access-log",
        action="store_true",
        help="log every request (client, method, path, status) on stdout, uvicorn's access "
        "log (default: off: a line per request costs the event loop time at high rates)",
    )
    p.add_argument(
        "--device",
        default=None,
        help="auto, cpu or cuda[:n] (default: $GNNAAS_DEVICE or auto)",
    )
    p.add_argument(
        "--state-dir",
        default=None,
        help="make the graphs live: writes (with GNNAAS_WRITE_TOKEN) are logged here and "
        "replayed at start (default: $GNNAAS_STATE_DIR, else frozen graphs)",
    )
    p.add_argument(
        "--workers",
        type=_positive_int,
        default=1,
        help="server processes sharing the port; graphs and features are memory-mapped once, "
        "/metrics sums over them, SIGHUP to this process restarts them with fresh variants "
        "(default: 1)",
    )
    _add_ray_args(p)
    p.add_argument(
        "--backend",
        choices=("uvicorn", "ray"),
        default="uvicorn",
        help="uvicorn: this process serves (default); ray: one Ray Serve application per "
        "dataset, each replica the whole server, and a catalog at / (needs the [ray] extra)",
    )
    p.add_argument(
        "--address",
        default=None,
        help="with --backend ray: a running Ray cluster, e.g. <head>:6379 (default: start a "
        "local Ray)",
    )
    _add_quiet(p)
    p.set_defaults(func=_cmd_serve)


def _add_stop_parser(sub: Any) -> None:
    """``gnnaas stop``."""
    p = sub.add_parser(
        "stop",
        help="stop the server on a port (started any way: make serve, gnnaas serve, ...)",
        description="Stop the gnnaas server whose pid file names --port: SIGTERM (a graceful "
        "shutdown: accepted requests are answered), then wait until its process is gone. A "
        "pid file left by a server that died is removed. Exits 0 when no server runs there.",
    )
    p.add_argument("--port", type=int, default=8000, help="the server's port (default: 8000)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="the server's --host, to tell a port held by another program (default: 127.0.0.1)",
    )
    _add_pid_file(p, "as the server was given")
    p.add_argument(
        "--timeout-s",
        type=_positive_float,
        default=60.0,
        help="how long to wait for the server to exit; it first answers what it accepted "
        "(default: 60)",
    )
    _add_quiet(p)
    p.set_defaults(func=_cmd_stop)


def _add_ray_config_parser(sub: Any) -> None:
    """``gnnaas ray-config``."""
    p = sub.add_parser(
        "ray-config",
        help="write a Ray Serve config for this repository",
        description="Write the Ray Serve config (YAML) that serves this repository's variants "
        "with `serve deploy`: one application per dataset and a catalog at /. Folders are "
        "written as absolute paths, which every node of the cluster must see.",
    )
    _add_served_folders(p)
    p.add_argument(
        "--dataset",
        nargs="*",
        help="deploy only these datasets (default: every dataset with variants and profiles)",
    )
    p.add_argument(
        "--host", default="0.0.0.0", help="address Serve's proxies listen on (default: 0.0.0.0)"
    )
    p.add_argument("--port", type=int, default=8000, help="their TCP port (default: 8000)")
    _add_ray_args(p)
    p.add_argument(
        "--output",
        "-o",
        default="gnnaas-serve.yaml",
        help="file to write, '-' for stdout (default: gnnaas-serve.yaml)",
    )
    _add_quiet(p)
    p.set_defaults(func=_cmd_ray_config)


def _add_pid_file(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--pid-file",
        default=None,
        help=f"the server's pid file, {what} (default: serve-<port>.pid in the run folder of "
        "the cache, $GNNAAS_CACHE or ~/.cache/gnnaas)",
    )


def _add_ray_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--replicas",
        type=_positive_int,
        default=1,
        help="with Ray: replicas of each dataset's application (default: 1)",
    )
    p.add_argument(
        "--autoscale",
        default=None,
        metavar="MIN:MAX",
        help="with Ray: let Serve scale each dataset between MIN and MAX replicas on requests in "
        "flight (overrides --replicas)",
    )
    p.add_argument(
        "--replica-cpus",
        type=_positive_float,
        default=1.0,
        help="with Ray: CPUs Ray reserves for each replica, a reservation for placement, not a "
        "limit (default: 1)",
    )
    p.add_argument(
        "--one-app",
        action="store_true",
        help="with Ray: one application serving every dataset at /v1/datasets (each replica "
        "holds them all) instead of one per dataset",
    )
