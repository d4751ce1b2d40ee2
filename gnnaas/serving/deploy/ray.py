"""gnnaas on Ray Serve: start, deploy with bounded waits, stop everything that was started.

:func:`run_ray` starts a local Ray (or joins a cluster), checks that the cluster has the CPUs the
replicas reserve (:func:`check_fits`), deploys the applications of
:func:`~gnnaas.serving.deploy.ray_apps.build_apps`, and returns once every replica is up, or
raises :class:`~gnnaas.errors.ConfigError` saying which application could not be placed on a
node or started, and why, within a bounded time. A local Ray starts without a dashboard and with
gnnaas's proxy middleware (:mod:`gnnaas.serving.deploy.proxy`: 503 with ``Retry-After`` for a
request whose replica died). :func:`shutdown_ray` removes the applications and stops a local Ray
with every process of its session (Ray's agents ignore SIGTERM: they get SIGKILL); on a cluster
joined with ``address`` it removes only gnnaas's applications.

Only ``gnnaas.serving.deploy.ray``, ``ray_apps`` and ``ray_deployments`` import Ray (the ``[ray]``
extra); ``import gnnaas`` and the default server never load it.

Example:
    >>> url = run_ray(Settings(variants_dir="variants"), replicas=2, port=8000)  # doctest: +SKIP
    >>> shutdown_ray()  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray import serve

from gnnaas.errors import ConfigError
from gnnaas.serving.core.settings import Settings
from gnnaas.serving.deploy.proxy import PROXY_CALLBACK, PROXY_CALLBACK_ENV
from gnnaas.serving.deploy.ray_apps import APP_NAME, app_suffix, build_apps, by_value
from gnnaas.serving.deploy.ray_deployments import (
    CATALOG_DEPLOYMENT,
    DATASET_DEPLOYMENT,
    DEFAULT_MAX_ONGOING_REQUESTS,
    RegistryFactory,
)

__all__ = [
    "check_fits",
    "delete_apps",
    "replica_pids",
    "run_asgi_app",
    "run_ray",
    "shutdown_ray",
    "start_ray",
]

_log = logging.getLogger(__name__)

# -- starting, checking, stopping ----------------------------------------------------------------


@dataclass
class _LocalRay:
    """The local Ray this process started: its session folder, for the stop."""

    session_dir: str | None


_LOCAL: _LocalRay | None = None


def start_ray(
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
) -> None:
    """Starts a local Ray (or joins ``address``) and Serve's HTTP proxy on ``host:port``.

    A local Ray runs without a dashboard, and its proxy with gnnaas's middleware
    (:mod:`gnnaas.serving.deploy.proxy`: 503 for a request whose replica died). A Ray already
    initialized in this process is kept, and a Serve already running keeps its proxy's address.

    Args:
        address (str, optional): a running cluster. (default: ``None``: ``$RAY_ADDRESS``, else
            a new local Ray)
        num_cpus (int, optional): CPUs of a local Ray. (default: ``None``: all)
        host (str, optional): the proxy's address. (default: ``127.0.0.1``)
        port (int, optional): the proxy's port. (default: ``8000``)
    """
    global _LOCAL
    address = address or os.environ.get("RAY_ADDRESS") or None  # Ray's own variable wins
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            # Ray's processes take the environment they start with: the proxy reads its
            # middlewares from it.
            before = os.environ.get(PROXY_CALLBACK_ENV)
            os.environ[PROXY_CALLBACK_ENV] = before or PROXY_CALLBACK
            try:
                ray.init(  # "local": a new cluster, never one `ray start` left running
                    address="local",
                    num_cpus=num_cpus,
                    include_dashboard=False,
                    log_to_driver=False,
                )
            finally:
                if before is None:
                    os.environ.pop(PROXY_CALLBACK_ENV, None)
            _LOCAL = _LocalRay(_session_dir())
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    serve.start(http_options={"host": host, "port": port})


def _session_dir() -> str | None:
    # Not a public attribute; only used to find the session's processes at the stop.
    node = getattr(ray._private.worker, "_global_node", None)
    getter = getattr(node, "get_session_dir_path", None)
    return str(getter()) if getter is not None else None


def check_fits(apps: int, replicas: int, replica_cpus: float) -> None:
    """Refuses a deployment whose replicas reserve more CPUs than the cluster has in all.

    Args:
        apps (int): dataset applications.
        replicas (int): replicas of each (the minimum when autoscaled).
        replica_cpus (float): CPUs each replica reserves.

    Raises:
        ConfigError: ``Ray needs N CPUs for ... but the cluster has M; ...``.
    """
    needed = apps * replicas * replica_cpus
    total = float(ray.cluster_resources().get("CPU", 0.0))
    if needed > total + 1e-9:
        raise ConfigError(
            f"Ray needs {needed:g} CPUs for {apps} dataset application(s) × {replicas} "
            f"replica(s) × {replica_cpus:g} CPU but the cluster has {total:g}; ask for fewer "
            "replicas (--replicas, --autoscale) or datasets (--dataset), reserve less per "
            "replica (--replica-cpus 0.5: a reservation, not a limit), or add nodes"
        )


def _unplaced(app: str, deployment: str) -> int:
    """Replicas of ``deployment`` still waiting for a node (no process yet)."""
    try:  # the controller's detailed view (what `serve status` shows)
        from ray.serve.context import _get_global_client

        client = _get_global_client()
        details = client.get_serve_details() if client is not None else {}
        replicas = details["applications"][app]["deployments"][deployment]["replicas"]
    except Exception:
        return 0
    return sum(1 for r in replicas if r.get("pid") is None and r.get("node_id") is None)


def _last_line(message: str) -> str:
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "no message")[:400]


def _wait_running(
    targets: Sequence[serve.RunTarget],
    replica_cpus: float,
    *,
    place_timeout_s: float,
    start_timeout_s: float,
    stop: Callable[[], bool] | None,
) -> None:
    """Waits until every application of ``targets`` (as :func:`build_apps` orders them: the
    catalog, which reserves no CPU, first) runs, within bounds.

    Raises:
        ConfigError: an application failed, a replica found no node within ``place_timeout_s``,
            or the applications did not start within ``start_timeout_s``.
        KeyboardInterrupt: ``stop()`` said to stop.
    """
    names = [t.name for t in targets]
    # The catalog reserves no CPU: a replica of it still without a process is starting, not
    # waiting for room.
    reserving = set(names[1:]) if replica_cpus > 0 else set()
    started = time.monotonic()
    pause = 0.2
    while True:
        if stop is not None and stop():
            raise KeyboardInterrupt
        waiting = _not_running(names)
        if not waiting:
            return
        elapsed = time.monotonic() - started
        if elapsed > place_timeout_s:
            _check_placed([w for w in waiting if w[0] in reserving], replica_cpus, place_timeout_s)
        if elapsed > start_timeout_s:
            raise ConfigError(
                f"the applications {', '.join(a for a, _ in waiting)} did not start within "
                f"{start_timeout_s:g} s (their replicas are still loading); see `serve status`"
            )
        time.sleep(pause)
        pause = min(pause * 1.5, 1.0)


def _not_running(names: Sequence[str]) -> list[tuple[str, Any]]:
    """The applications of ``names`` not running yet, with their status (``None``: not known
    to Serve yet).

    Raises:
        ConfigError: Serve gave up on one.
    """
    apps = serve.status().applications
    waiting = []
    for app in names:
        status = apps.get(app)
        if status is not None and status.status == "RUNNING":
            continue
        if status is not None and status.status == "DEPLOY_FAILED":  # Serve gave up
            messages = [d.message for d in status.deployments.values() if d.message]
            raise ConfigError(
                f"Ray Serve could not start application '{app}': "
                f"{_last_line(messages[0] if messages else status.message)}"
            )
        waiting.append((app, status))
    return waiting


def _check_placed(
    waiting: Sequence[tuple[str, Any]], replica_cpus: float, place_timeout_s: float
) -> None:
    """Raises :class:`ConfigError` when a replica of ``waiting`` found no node, with the CPUs it
    needs and the cluster's free ones."""
    for app, status in waiting:
        for deployment in status.deployments if status is not None else ():
            missing = _unplaced(app, deployment)
            if missing:
                free = float(ray.available_resources().get("CPU", 0.0))
                total = float(ray.cluster_resources().get("CPU", 0.0))
                raise ConfigError(
                    f"Ray could not place {missing} replica(s) of application '{app}' "
                    f"within {place_timeout_s:g} s: each needs {replica_cpus:g} CPU and "
                    f"the cluster has {free:g} of its {total:g} CPUs free; ask for "
                    "fewer replicas, reserve less per replica (--replica-cpus), or add "
                    "nodes"
                )


def _wait_reported(name: str, apps: Sequence[str], timeout_s: float) -> None:
    """Waits (bounded) until a replica of every dataset application reported to the catalog."""
    handle = serve.get_deployment_handle(CATALOG_DEPLOYMENT, app_name=name)
    deadline = time.monotonic() + timeout_s
    pause = 0.05
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if set(apps) <= set(handle.reporting.remote().result(timeout_s=5)):
                return
        time.sleep(pause)
        pause = min(pause * 2, 0.5)
    _log.warning("not every application has reported to the catalog yet: %s", ", ".join(apps))


def run_ray(
    settings: Settings,
    *,
    replicas: int = 1,
    autoscale: tuple[int, int] | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    address: str | None = None,
    num_cpus: int | None = None,
    datasets: Sequence[str] | None = None,
    registry_factory: RegistryFactory | None = None,
    replica_cpus: float = 1.0,
    max_ongoing_requests: int = DEFAULT_MAX_ONGOING_REQUESTS,
    one_app: bool = False,
    name: str = APP_NAME,
    route_prefix: str = "/",
    place_timeout_s: float = 90.0,
    start_timeout_s: float = 900.0,
    stop: Callable[[], bool] | None = None,
) -> str:
    """Serves gnnaas on Ray Serve and returns once every replica is up.

    Starts a local Ray (``num_cpus``, no dashboard) unless one is running or ``address`` names
    a cluster, starts Serve's HTTP proxy on ``host:port`` (a running Serve keeps its own),
    checks that the cluster has the CPUs the replicas reserve (:func:`check_fits`), deploys
    :func:`build_apps`, and waits for it.

    Args:
        settings (Settings): the server's settings.
        replicas (int, optional): replicas per dataset application. (default: ``1``)
        autoscale (tuple[int, int], optional): ``(min, max)`` replicas. (default: ``None``)
        host (str, optional): the proxy's address. (default: ``127.0.0.1``)
        port (int, optional): the proxy's port. (default: ``8000``)
        address (str, optional): a running cluster (``ray start --head`` prints it).
            (default: ``None``: a local Ray)
        num_cpus (int, optional): CPUs of a local Ray. (default: ``None``: all)
        datasets (Sequence[str], optional): the datasets. (default: ``None``: all servable)
        registry_factory (RegistryFactory, optional): see :func:`build_apps`.
            (default: ``None``)
        replica_cpus (float, optional): CPUs reserved per replica. (default: ``1``)
        max_ongoing_requests (int, optional): requests a replica takes at once.
            (default: :data:`DEFAULT_MAX_ONGOING_REQUESTS`)
        one_app (bool, optional): one application for every dataset. (default: ``False``)
        name (str, optional): the deployment's name. (default: ``gnnaas``)
        route_prefix (str, optional): the deployment's base path. (default: ``/``)
        place_timeout_s (float, optional): how long a replica may wait for a node that has
            the CPUs it reserves. (default: ``90``)
        start_timeout_s (float, optional): how long the replicas may take to load.
            (default: ``900``)
        stop (Callable[[], bool], optional): polled while waiting; ``True`` interrupts (a
            signal). (default: ``None``)

    Returns:
        str: the base URL, e.g. ``http://127.0.0.1:8000``.

    Raises:
        ConfigError: the cluster is too small, an application failed to start, or it did not
            start in time (the message says which and why).
    """
    targets = build_apps(
        settings,
        replicas=replicas,
        autoscale=autoscale,
        datasets=datasets,
        registry_factory=registry_factory,
        replica_cpus=replica_cpus,
        max_ongoing_requests=max_ongoing_requests,
        one_app=one_app,
        name=name,
        route_prefix=route_prefix,
    )
    start_ray(address=address, num_cpus=num_cpus, host=host, port=port)
    check_fits(len(targets) - 1, autoscale[0] if autoscale else replicas, replica_cpus)
    _deploy(targets, name, replica_cpus, place_timeout_s, start_timeout_s, stop)
    return f"http://{host}:{port}{route_prefix.rstrip('/')}"


def _deploy(
    targets: list[serve.RunTarget],
    name: str,
    replica_cpus: float,
    place_timeout_s: float,
    start_timeout_s: float,
    stop: Callable[[], bool] | None,
) -> None:
    """Deploys the applications ``targets`` (of :func:`build_apps`) and waits until each runs
    and the catalog has heard from each; on any failure they are deleted again."""
    serve.run_many(
        targets, wait_for_ingress_deployment_creation=False, wait_for_applications_running=False
    )
    try:
        _wait_running(
            targets,
            replica_cpus,
            place_timeout_s=place_timeout_s,
            start_timeout_s=start_timeout_s,
            stop=stop,
        )
    except BaseException:  # nothing left waiting for a node or loading for ever
        delete_apps(name)
        raise
    _wait_reported(name, [t.name for t in targets[1:]], timeout_s=30.0)


def run_asgi_app(
    builder: Callable[[], Any],
    *,
    name: str,
    route_prefix: str,
    cpus: float = 0.0,
    max_ongoing_requests: int = DEFAULT_MAX_ONGOING_REQUESTS,
    replicas: int = 1,
) -> None:
    """Deploys any ASGI app (e.g. a trivial FastAPI app, the floor of a benchmark) as a
    Serve application next to gnnaas, on the running Serve's proxy; returns once its replicas
    run (``serve.run`` waits for them). Deployed again with another ``replicas``, it is updated
    in place.

    Args:
        builder (Callable[[], ASGIApp]): returns the app (called in the replica).
        name (str): the application's name.
        route_prefix (str): where the proxy mounts it, e.g. ``/trivial``.
        cpus (float, optional): CPUs Ray reserves for it. (default: ``0``)
        max_ongoing_requests (int, optional): requests its replica takes at once.
            (default: :data:`DEFAULT_MAX_ONGOING_REQUESTS`, as gnnaas's replicas)
        replicas (int, optional): its replicas. (default: ``1``)

    Raises:
        ConfigError: Serve is not running (call :func:`run_ray` first).
    """
    if not ray.is_initialized():
        raise ConfigError("run_asgi_app: start gnnaas with run_ray() first")
    by_value(builder)
    deployment = serve.deployment(serve.ingress(builder)(), name=name)
    app = deployment.options(  # type: ignore[attr-defined]
        ray_actor_options={"num_cpus": cpus},
        max_ongoing_requests=max_ongoing_requests,
        num_replicas=replicas,
    ).bind()
    serve.run(app, name=name, route_prefix=route_prefix, blocking=False)


def _dataset_app_name(dataset: str, name: str) -> str:
    apps = serve.status().applications
    one = f"{name}-datasets"
    return one if one in apps else f"{name}-{app_suffix(dataset)}"


def replica_pids(
    dataset: str, name: str = APP_NAME, *, calls: int = 16, timeout_s: float = 120.0
) -> dict[str, int]:
    """``{replica id: pid}`` of the replicas serving ``dataset`` that answered ``calls`` pid
    requests (Serve spreads them, so every replica answers with high probability; the fault
    benchmark and tests kill one of them). Each answer is awaited at most ``timeout_s``."""
    app = _dataset_app_name(dataset, name)
    handle = serve.get_deployment_handle(DATASET_DEPLOYMENT, app_name=app)
    answers = [handle.pid.remote() for _ in range(calls)]
    return dict(answer.result(timeout_s=timeout_s) for answer in answers)


def delete_apps(name: str = APP_NAME, *, timeout_s: float = 120.0) -> None:
    """Removes the applications of the deployment ``name`` (its catalog and dataset
    applications), waiting at most ``timeout_s`` for them to go."""
    apps = [a for a in serve.status().applications if a == name or a.startswith(f"{name}-")]
    for app in apps:
        serve.delete(app, _blocking=False)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not set(apps) & set(serve.status().applications):
            return
        time.sleep(0.2)
    _log.warning("applications still being deleted after %g s: %s", timeout_s, apps)


def _session_processes(local: _LocalRay) -> list[Any]:
    """This process's descendants (Ray's services, agents and workers of the local session),
    and any process that names the session's folder."""
    import psutil

    me = psutil.Process()
    found = {p.pid: p for p in me.children(recursive=True)}
    if local.session_dir:
        for p in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if p.pid != me.pid and local.session_dir in " ".join(p.info["cmdline"] or ()):
                    found.setdefault(p.pid, p)
    return list(found.values())


def _reap(processes: Sequence[Any], timeout_s: float = 5.0) -> None:
    """Ends what is left of ``processes``: SIGTERM, then SIGKILL after ``timeout_s``."""
    import psutil

    alive = []
    for p in processes:
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
    if not alive:
        return
    _log.info("stopping %d process(es) left by Ray: %s", len(alive), [p.pid for p in alive])
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(alive, timeout=timeout_s)
    for p in alive:  # Ray's agents ignore SIGTERM
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=timeout_s)


def shutdown_ray(name: str = APP_NAME) -> None:
    """Stops what :func:`run_ray` started.

    A local Ray this process started goes entirely: Serve, Ray, then every process of its
    session still running (SIGTERM, then SIGKILL). On a cluster joined with ``address`` only the
    applications of the deployment ``name`` are removed, and this process disconnects.
    """
    global _LOCAL
    local, _LOCAL = _LOCAL, None
    if not ray.is_initialized():
        return
    if local is None:
        with contextlib.suppress(Exception):
            delete_apps(name)
        ray.shutdown()
        return
    processes = _session_processes(local)
    with contextlib.suppress(Exception):
        serve.shutdown()
    ray.shutdown()
    _reap(processes + [p for p in _session_processes(local) if p not in processes])
