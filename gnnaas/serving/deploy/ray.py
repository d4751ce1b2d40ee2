"""gnnaas on Ray Serve: one ingress deployment, one replica deployment per dataset.

Only this module imports Ray (the ``[ray]`` extra); ``import gnnaas`` and the default server never
load it. The application (:func:`build_app`) is:

- ``ingress``: the FastAPI app of :func:`~gnnaas.serving.http.app.create_app` (same routes, headers,
  error bodies, ``/metrics``, ``/readyz``) around a :class:`~gnnaas.serving.deploy.remote.RemoteRouter`:
  the policy chooses the variant here from the profiles and the load the replicas reported, then
  calls the dataset's deployment with the variant pinned. A call whose replica dies (Ray's actor
  errors) or does not answer within ``call_timeout_s`` is answered 503 with ``Retry-After``.
- ``dataset-<name>`` (one per dataset, ``replicas`` or ``autoscale`` replicas): a
  :class:`~gnnaas.serving.deploy.remote.DatasetServer` holding the graph store and every variant,
  batching concurrent requests per variant with the project's batcher and returning its load
  with every answer. Ray restarts a replica that dies; health checks run every 2 s.

Settings travel as plain values (``Settings.model_dump``, every field) and are rebuilt in every
replica, so all replicas serve with the same settings; the admin token never travels: the
ingress reads ``GNNAAS_ADMIN_TOKEN`` from its own environment. :func:`run_ray` starts a local
(or joins a running) Ray cluster and serves; :func:`serve_config` writes the config file of
``serve deploy`` (``gnnaas ray-config``).

Example:
    >>> url = run_ray(Settings(variants_dir="variants"), replicas=2, port=8000)  # doctest: +SKIP
    >>> shutdown_ray()  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray
from ray import serve
from ray.serve.handle import DeploymentHandle

from gnnaas.errors import ConfigError
from gnnaas.inference.executor import Output
from gnnaas.serving.core.registry import VariantRegistry
from gnnaas.serving.core.settings import Settings
from gnnaas.serving.deploy.remote import (
    DatasetDescription,
    DatasetServer,
    RemoteRouter,
    ReplicaAnswer,
    ReplicaRefusal,
)

__all__ = [
    "APP_NAME",
    "LOST_ERRORS",
    "DatasetReplica",
    "Ingress",
    "RegistryFactory",
    "build_app",
    "build_from_args",
    "dataset_deployment_name",
    "load_dataset_registry",
    "parse_autoscale",
    "replica_pids",
    "run_asgi_app",
    "run_ray",
    "servable_datasets",
    "serve_config",
    "shutdown_ray",
    "start_ray",
]

_log = logging.getLogger(__name__)

APP_NAME = "gnnaas"
"""The Serve application's default name."""

RegistryFactory = Callable[[Settings, str], VariantRegistry]
"""Builds one dataset's registry in a replica: ``(settings, dataset) -> VariantRegistry``."""

LOST_ERRORS: tuple[type[BaseException], ...] = (
    ray.exceptions.RayActorError,  # ActorDiedError, ActorUnavailableError
    serve.exceptions.ReplicaUnavailableError,
    serve.exceptions.DeploymentUnavailableError,
)
"""Errors of a call whose replica was lost: the ingress answers them 503 with ``Retry-After``."""

_HEALTH_CHECK_PERIOD_S = 2.0
_HEALTH_CHECK_TIMEOUT_S = 10.0


def load_dataset_registry(settings: Settings, dataset: str) -> VariantRegistry:
    """One dataset's registry read from the repository (the replicas' default factory)."""
    return VariantRegistry.load(settings.model_copy(update={"datasets": [dataset]}))


def dataset_deployment_name(dataset: str) -> str:
    """The deployment serving ``dataset``: ``dataset-<name>`` with only ``[A-Za-z0-9_.-]``."""
    return "dataset-" + re.sub(r"[^A-Za-z0-9_.-]", "_", dataset)


def _settings_values(settings: Settings) -> dict[str, Any]:
    """Settings as plain values for the replicas; the admin token stays out (secrets come from
    the environment of the process that uses them)."""
    return settings.model_dump(mode="json", exclude={"admin_token"})


def _by_value(fn: Callable[..., Any] | None) -> None:
    """Ships ``fn``'s module with it when the replicas could not import it (tests, scripts)."""
    while isinstance(fn, functools.partial):  # the module is the wrapped function's
        fn = fn.func
    if fn is None:
        return
    name = getattr(fn, "__module__", "") or ""
    if name == "__main__" or name.split(".")[0] == "gnnaas":
        return
    module = sys.modules.get(name)
    if module is not None:
        ray.cloudpickle.register_pickle_by_value(module)


class _HandleCaller:
    """A dataset deployment's handle as a :class:`~gnnaas.serving.deploy.remote.DatasetCaller`.

    Calls travel over Serve's gRPC transport (``_by_reference=False``) rather than as Ray actor
    calls: less CPU in the ingress and the replica per request, the same answers, and the same
    503 when a replica dies (a gRPC ``UNAVAILABLE`` reaches the ingress as Ray's
    ``ActorUnavailableError``). ``docs/scaling.md`` has the measurement.
    """

    def __init__(self, handle: DeploymentHandle) -> None:
        self.handle = handle.options(_by_reference=False)

    async def describe(self) -> DatasetDescription:
        result: DatasetDescription = await self.handle.describe.remote()
        return result

    async def predict(
        self, variant_id: str, nodes: list[int], output: Output
    ) -> ReplicaAnswer | ReplicaRefusal:
        result: ReplicaAnswer | ReplicaRefusal = await self.handle.predict.remote(
            variant_id, nodes, output
        )
        return result


@serve.deployment(
    health_check_period_s=_HEALTH_CHECK_PERIOD_S, health_check_timeout_s=_HEALTH_CHECK_TIMEOUT_S
)
class DatasetReplica:
    """One replica of a dataset's deployment: its graph store and variants, batched execution.

    Args:
        settings (dict): :class:`Settings` values.
        dataset (str): the dataset served.
        registry_factory (RegistryFactory, optional): builds the registry in the replica.
            (default: ``None``: :func:`load_dataset_registry`)
    """

    async def __init__(  # type: ignore[misc]  # Serve awaits an async constructor
        self,
        settings: dict[str, Any],
        dataset: str,
        registry_factory: RegistryFactory | None = None,
    ) -> None:
        config = Settings(**settings)
        factory = registry_factory or load_dataset_registry
        registry = await asyncio.to_thread(factory, config, dataset)
        replica = serve.get_replica_context().replica_tag
        self.server = DatasetServer(registry, config, replica=replica)
        await self.server.start()

    async def describe(self) -> DatasetDescription:
        """The dataset as this replica serves it."""
        return self.server.describe()

    async def predict(
        self, variant_id: str, nodes: list[int], output: Output
    ) -> ReplicaAnswer | ReplicaRefusal:
        """Serves ``nodes`` with the variant the ingress chose (``output``: class, proba or
        embedding)."""
        return await self.server.predict(variant_id, nodes, output)

    async def pid(self) -> tuple[str, int]:
        """``(replica id, process id)`` of this replica."""
        return self.server.replica, self.server.pid

    async def check_health(self) -> None:
        """Ray's health check: failing while the router is stopping."""
        if self.server.router.stopping:
            raise RuntimeError(f"{self.server!r} is stopping")

    async def __del__(self) -> None:
        await self.server.stop()


def _refuse_reload() -> VariantRegistry:
    raise ConfigError(
        "on Ray Serve the variants are reloaded by redeploying the application "
        "(`serve deploy` with the config from `gnnaas ray-config`)"
    )


@serve.deployment(name="ingress")
@serve.ingress()
class Ingress:
    """The HTTP ingress: gnnaas's FastAPI app with the policy, calling the dataset replicas.

    Args:
        settings (dict): :class:`Settings` values; ``GNNAAS_ADMIN_TOKEN`` is read here.
        handles (dict[str, DeploymentHandle]): each dataset's deployment, by dataset name.
        call_timeout_s (float, optional): the longest wait for a replica's answer (then 503).
            (default: ``30.0``)
    """

    def __init__(
        self,
        settings: dict[str, Any],
        handles: dict[str, DeploymentHandle],
        call_timeout_s: float = 30.0,
    ) -> None:
        self.settings = Settings(**settings)
        self.handles = handles
        self.call_timeout_s = call_timeout_s

    def __serve_build_asgi_app__(self) -> Any:
        from gnnaas.serving.http.app import create_app

        callers = {name: _HandleCaller(h) for name, h in self.handles.items()}
        router = RemoteRouter(
            self.settings, callers, lost_errors=LOST_ERRORS, call_timeout_s=self.call_timeout_s
        )
        return _ProxyRequestId(create_app(self.settings, router=router, loader=_refuse_reload))


class _ProxyRequestId:
    """Leaves ``X-Request-Id`` to Serve's proxy, which adds it to every response.

    The app echoes the id the proxy put in the request (a valid token), so the proxy's header
    carries the same id the ingress logs; two copies of the header would only confuse clients.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_once(message: Any) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [
                    (k, v) for k, v in message.get("headers", ()) if k.lower() != b"x-request-id"
                ]
            await send(message)

        await self.app(scope, receive, send_once)


# -- building and running ------------------------------------------------------------------------


def parse_autoscale(text: str) -> tuple[int, int]:
    """``"MIN:MAX"`` replicas, ``1 <= MIN <= MAX``.

    Raises:
        ValueError: not two integers in that order.
    """
    low, sep, high = text.partition(":")
    try:
        bounds = (int(low), int(high))
    except ValueError:
        bounds = (0, -1)
    if not sep or bounds[0] < 1 or bounds[1] < bounds[0]:
        raise ValueError(f"autoscale must be MIN:MAX replicas with 1 <= MIN <= MAX (got {text!r})")
    return bounds


def servable_datasets(settings: Settings) -> list[str]:
    """The datasets to deploy: ``settings.datasets``, else every variants folder with profiles.

    Raises:
        ConfigError: none (the variants folder is missing or nothing has profiles).
    """
    if settings.datasets:
        return list(settings.datasets)
    variants, profiles = Path(settings.variants_dir), Path(settings.profiles_dir)
    if not variants.is_dir():
        raise ConfigError(
            f"variants folder '{variants}' does not exist; pass --variants or create it with "
            "`gnnaas prepare --dataset <name>`"
        )
    names = sorted(
        p.name
        for p in variants.iterdir()
        if p.is_dir()
        and not p.name.startswith(".")
        and (profiles / p.name / "profiles.csv").is_file()
    )
    if not names:
        raise ConfigError(
            f"no dataset in '{variants}' has profiles in '{profiles}'; run `gnnaas profile`"
        )
    return names


def _replica_options(
    replicas: int, autoscale: tuple[int, int] | None, replica_cpus: float
) -> dict[str, Any]:
    if replicas < 1:
        raise ValueError(f"build_app: replicas must be >= 1 (got {replicas})")
    options: dict[str, Any] = {"ray_actor_options": {"num_cpus": replica_cpus}}
    if autoscale is None:
        options["num_replicas"] = replicas
    else:
        low, high = autoscale
        options["autoscaling_config"] = {
            "min_replicas": low,
            "initial_replicas": low,
            "max_replicas": high,
            # a replica batches: a few requests in flight each keep its batches full
            "target_ongoing_requests": 4,
        }
    return options


def build_app(
    settings: Settings,
    *,
    replicas: int = 1,
    autoscale: tuple[int, int] | None = None,
    datasets: Sequence[str] | None = None,
    registry_factory: RegistryFactory | None = None,
    replica_cpus: float = 1.0,
    ingress_cpus: float = 0.0,
    call_timeout_s: float = 30.0,
) -> serve.Application:
    """The Serve application: the ingress and one deployment per dataset.

    Args:
        settings (Settings): the server's settings (folders, limits).
        replicas (int, optional): replicas per dataset. (default: ``1``)
        autoscale (tuple[int, int], optional): ``(min, max)`` replicas per dataset, scaled by
            Ray Serve on requests in flight; overrides ``replicas``. (default: ``None``)
        datasets (Sequence[str], optional): the datasets. (default: ``None``:
            :func:`servable_datasets`)
        registry_factory (RegistryFactory, optional): builds a dataset's registry in its
            replicas (tests pass in-memory fakes). (default: ``None``: the repository)
        replica_cpus (float, optional): CPUs Ray reserves per dataset replica. (default: ``1``)
        ingress_cpus (float, optional): CPUs Ray reserves for the ingress. (default: ``0``)
        call_timeout_s (float, optional): the ingress's longest wait for a replica.
            (default: ``30``)

    Returns:
        serve.Application: for :func:`ray.serve.run` or a config's ``import_path``.
    """
    names = list(datasets) if datasets is not None else servable_datasets(settings)
    values = _settings_values(settings)
    _by_value(registry_factory)
    options = _replica_options(replicas, autoscale, replica_cpus)
    handles = {
        name: DatasetReplica.options(  # type: ignore[attr-defined]
            name=dataset_deployment_name(name), **options
        ).bind(values, name, registry_factory)
        for name in names
    }
    ingress = Ingress.options(  # type: ignore[attr-defined]
        ray_actor_options={"num_cpus": ingress_cpus}
    )
    return ingress.bind(values, handles, call_timeout_s)


def build_from_args(args: dict[str, Any]) -> serve.Application:
    """The application builder of a Serve config (``import_path``); ``args`` as
    :func:`serve_config` writes them: ``settings``, ``datasets``, ``replicas``, ``autoscale``,
    ``replica_cpus``."""
    autoscale = args.get("autoscale")
    return build_app(
        Settings(**args.get("settings", {})),
        replicas=int(args.get("replicas", 1)),
        autoscale=parse_autoscale(autoscale) if autoscale else None,
        datasets=args.get("datasets"),
        replica_cpus=float(args.get("replica_cpus", 1.0)),
    )


def start_ray(
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
) -> None:
    """Starts a local Ray (or joins ``address``) and Serve's HTTP proxy on ``host:port``.

    A Ray already initialized in this process is kept, and a Serve already running keeps its
    proxy's address.

    Args:
        address (str, optional): a running cluster. (default: ``None``: a local Ray)
        num_cpus (int, optional): CPUs of a local Ray. (default: ``None``: all)
        host (str, optional): the proxy's address. (default: ``127.0.0.1``)
        port (int, optional): the proxy's port. (default: ``8000``)
    """
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": host, "port": port})


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
    call_timeout_s: float = 30.0,
    name: str = APP_NAME,
    route_prefix: str = "/",
) -> str:
    """Serves gnnaas on Ray Serve and returns once every replica is up.

    Starts a local Ray (``num_cpus``, no dashboard) unless one is running or ``address`` names
    a cluster, starts Serve's HTTP proxy on ``host:port`` (a running Serve keeps its own), and
    deploys :func:`build_app`.

    Args:
        settings (Settings): the server's settings.
        replicas (int, optional): replicas per dataset. (default: ``1``)
        autoscale (tuple[int, int], optional): ``(min, max)`` replicas. (default: ``None``)
        host (str, optional): the proxy's address. (default: ``127.0.0.1``)
        port (int, optional): the proxy's port. (default: ``8000``)
        address (str, optional): a running cluster (``ray start --head`` prints it).
            (default: ``None``: a local Ray)
        num_cpus (int, optional): CPUs of a local Ray. (default: ``None``: all)
        datasets (Sequence[str], optional): the datasets. (default: ``None``: all servable)
        registry_factory (RegistryFactory, optional): see :func:`build_app`. (default: ``None``)
        replica_cpus (float, optional): CPUs reserved per replica. (default: ``1``)
        call_timeout_s (float, optional): the ingress's longest wait for a replica.
            (default: ``30``)
        name (str, optional): the application's name. (default: ``gnnaas``)
        route_prefix (str, optional): where the proxy mounts it. (default: ``/``)

    Returns:
        str: the base URL, e.g. ``http://127.0.0.1:8000``.
    """
    app = build_app(
        settings,
        replicas=replicas,
        autoscale=autoscale,
        datasets=datasets,
        registry_factory=registry_factory,
        replica_cpus=replica_cpus,
        call_timeout_s=call_timeout_s,
    )
    start_ray(address=address, num_cpus=num_cpus, host=host, port=port)
    serve.run(app, name=name, route_prefix=route_prefix, blocking=False)
    return f"http://{host}:{port}{route_prefix.rstrip('/')}"


def run_asgi_app(
    builder: Callable[[], Any],
    *,
    name: str,
    route_prefix: str,
    cpus: float = 0.0,
) -> None:
    """Deploys any ASGI app (e.g. a trivial FastAPI app, the floor of a benchmark) as a
    one-replica Serve application next to gnnaas, on the running Serve's proxy.

    Args:
        builder (Callable[[], ASGIApp]): returns the app (called in the replica).
        name (str): the application's name.
        route_prefix (str): where the proxy mounts it, e.g. ``/trivial``.
        cpus (float, optional): CPUs Ray reserves for it. (default: ``0``)

    Raises:
        ConfigError: Serve is not running (call :func:`run_ray` first).
    """
    if not ray.is_initialized():
        raise ConfigError("run_asgi_app: start gnnaas with run_ray() first")
    _by_value(builder)
    deployment = serve.deployment(serve.ingress(builder)(), name=name)
    app = deployment.options(  # type: ignore[attr-defined]
        ray_actor_options={"num_cpus": cpus}
    ).bind()
    serve.run(app, name=name, route_prefix=route_prefix, blocking=False)


def replica_pids(
    dataset: str, name: str = APP_NAME, *, calls: int = 16, timeout_s: float = 120.0
) -> dict[str, int]:
    """``{replica id: pid}`` of a dataset's replicas that answered ``calls`` pid requests
    (Serve spreads them, so every replica answers with high probability; the fault benchmark
    and tests kill one of them). Each answer is awaited at most ``timeout_s`` (then Serve's
    ``TimeoutError``)."""
    handle = serve.get_deployment_handle(dataset_deployment_name(dataset), app_name=name)
    answers = [handle.pid.remote() for _ in range(calls)]
    return dict(answer.result(timeout_s=timeout_s) for answer in answers)


def shutdown_ray() -> None:
    """Removes every Serve application and stops the Ray this process started or joined."""
    if ray.is_initialized():
        serve.shutdown()
        ray.shutdown()


# -- the Serve config file -----------------------------------------------------------------------


def _yaml(value: Any, indent: int = 0) -> list[str]:
    """Block-style YAML lines; scalars as JSON, which YAML reads as is."""
    import json

    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, dict | list) and item:
                lines.append(f"{pad}{key}:")
                lines.extend(_yaml(item, indent + 2))
            else:
                lines.append(f"{pad}{key}: {json.dumps(item)}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict | list) and item:
                block = _yaml(item, indent + 2)
                lines.append(f"{pad}- {block[0].lstrip()}")
                lines.extend(block[1:])
            else:
                lines.append(f"{pad}- {json.dumps(item)}")
    else:
        lines.append(f"{pad}{json.dumps(value)}")
    return lines


def serve_config(
    settings: Settings,
    *,
    replicas: int = 1,
    autoscale: tuple[int, int] | None = None,
    host: str = "0.0.0.0",
    port: int = 8000,
    replica_cpus: float = 1.0,
    name: str = APP_NAME,
) -> str:
    """The ``serve deploy`` config (YAML) of the repository ``settings`` point at.

    Folders are written as absolute paths: every node must see them at the same place (a shared
    file system). The admin token is not written; set ``GNNAAS_ADMIN_TOKEN`` in the environment
    of the nodes instead.

    Args:
        settings (Settings): the folders and limits to serve with.
        replicas (int, optional): replicas per dataset. (default: ``1``)
        autoscale (tuple[int, int], optional): ``(min, max)`` replicas. (default: ``None``)
        host (str, optional): where Serve's proxies listen. (default: ``0.0.0.0``)
        port (int, optional): their port. (default: ``8000``)
        replica_cpus (float, optional): CPUs reserved per replica. (default: ``1``)
        name (str, optional): the application's name. (default: ``gnnaas``)

    Returns:
        str: the YAML text.

    Raises:
        ConfigError: nothing to serve in the repository.
    """
    datasets = servable_datasets(settings)
    values = _settings_values(settings)
    for key in ("variants_dir", "profiles_dir", "data_root"):
        if values.get(key) is not None:
            values[key] = str(Path(values[key]).resolve())
    values["datasets"] = datasets
    options = _replica_options(replicas, autoscale, replica_cpus)
    deployments: list[dict[str, Any]] = [
        {"name": "ingress", "num_replicas": 1, "ray_actor_options": {"num_cpus": 0.0}}
    ]
    for dataset in datasets:
        deployments.append({"name": dataset_deployment_name(dataset), **options})
    config = {
        "proxy_location": "EveryNode",
        "http_options": {"host": host, "port": port},
        "applications": [
            {
                "name": name,
                "route_prefix": "/",
                "import_path": f"{__name__}:build_from_args",
                "args": {
                    "settings": values,
                    "datasets": datasets,
                    "replicas": replicas,
                    "autoscale": f"{autoscale[0]}:{autoscale[1]}" if autoscale else None,
                    "replica_cpus": replica_cpus,
                },
                "deployments": deployments,
            }
        ],
    }
    header = [
        "# Ray Serve config of gnnaas, written by `gnnaas ray-config`.",
        "# Deploy: ray start --head (then ray start --address=<head>:6379 on every other node),",
        "#         serve deploy <this file>. The folders below must be the same on every node.",
    ]
    return "\n".join([*header, *_yaml(config)]) + "\n"
