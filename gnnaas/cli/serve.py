"""``gnnaas serve`` and ``gnnaas ray-config``: the HTTP server (uvicorn, workers, Ray Serve)."""

from __future__ import annotations

import argparse
import errno
import json
import logging
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

__all__ = ["add_parsers"]


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
    _say(args, f"starting {args.workers} workers; each loads the variants")
    run_workers(environment, address, family, workers=args.workers)
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
            "GNNAAS_DATA_ROOT or GNNAAS_DATA): the config says data_root: null and the replicas "
            f"cannot load {'it' if one else 'them'}; write it again with --data-root DIR (a "
            "folder every node sees at the same path)",
            file=sys.stderr,
        )


def _cmd_serve(args: argparse.Namespace) -> int:
    sock = _bind(args.host, args.port)
    if args.check_port:
        sock.close()
        return 0
    package_log = logging.getLogger("gnnaas")
    package_level = package_log.level  # restored when serve returns (main() called in-process)
    try:
        if args.threads is not None:  # the server's own threads are its torch_threads
            import torch

            torch.set_num_threads(args.threads)
        import uvicorn
        from pydantic import ValidationError

        from gnnaas.errors import ConfigError
        from gnnaas.serving.core.settings import Settings

        given = {
            "variants_dir": args.variants,
            "profiles_dir": args.profiles,
            "device": args.device,
            "data_root": args.data_root,
            "datasets": args.dataset or None,
            "state_dir": args.state_dir,
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
        if args.backend == "ray":
            sock.close()  # Serve's proxy binds the port itself
            return _serve_ray(args, settings)
        if args.workers > 1:
            return _serve_workers(args, sock, overrides)
        _say(args, f"loading variants from {settings.variants_dir} ({settings.device})")
        # SIGHUP and POST /v1/admin/reload reread the folders above; their outcome is logged.
        # A SIGHUP while the models load is ignored (they are being read fresh anyway).
        import signal

        if hasattr(signal, "SIGHUP"):
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
        logging.getLogger("gnnaas.serving.core.reload").setLevel(logging.INFO)
        if not _quiet(args):  # each start-up phase says so: graphs, replayed logs, warm-up
            package_log.setLevel(logging.INFO)
        from gnnaas.serving.http.app import create_app

        app = create_app(settings, reload_on_sighup=True)
        config = uvicorn.Config(
            app, host=args.host, port=args.port, log_level="info", access_log=False
        )
        server = uvicorn.Server(config)
        try:
            server.run(sockets=[sock])
        except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it drained on: a clean stop
            pass
    finally:
        sock.close()
        package_log.setLevel(package_level)
    return 0 if server.started else 3  # uvicorn's exit code for a failed start-up


def add_parsers(sub: Any) -> None:
    """Adds ``serve`` and ``ray-config`` to the subcommands ``sub``."""
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
        help="only check that --host/--port are free, then exit (make serve does it first)",
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
