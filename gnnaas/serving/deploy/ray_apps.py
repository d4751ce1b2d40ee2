"""gnnaas's Serve applications: one per dataset, each replica the whole app, and a catalog.

A deployment named ``name`` (default ``gnnaas``) under a base path (default ``/``) is:

- ``<name>-<dataset>`` at route prefix ``<base>/v1/datasets/<dataset>``, one per dataset (or one
  ``<name>-datasets`` at ``<base>/v1/datasets`` serving every dataset, ``one_app``): deployment
  :class:`~gnnaas.serving.deploy.ray_deployments.DatasetApp`, whose replicas each run the whole
  app for their datasets. A request makes one hop, from Serve's proxy to a replica, and the
  policy decides on that replica's exact load. Serve spreads requests over the replicas
  (``replicas``, or ``autoscale`` on requests in flight) and restarts a replica that dies (health
  checks every 2 s).
- ``<name>`` at ``<base>``: deployment :class:`~gnnaas.serving.deploy.ray_deployments.CatalogApp`,
  one replica answering ``GET /v1/datasets``, ``/healthz``, ``/readyz`` and ``/metrics`` for the
  whole deployment, 404 for unknown datasets and 409 for reloads. The dataset replicas report to
  it; no request to a dataset passes through it.

This module is the driver's side of a deployment: it plans the applications, binds the two
deployments of :mod:`gnnaas.serving.deploy.ray_deployments` (what runs inside a replica, apart
because it changes with a replica's lifecycle, not with a deployment's shape) with their options,
and writes the config file; the deployments' names are importable from here too.

:func:`build_apps` returns them for ``serve.run_many`` (:func:`gnnaas.serving.deploy.ray.run_ray`
runs them); :func:`serve_config` writes them as the config of ``serve deploy`` (``gnnaas
ray-config``), whose ``import_path`` entries are :func:`catalog_from_args` and
:func:`datasets_from_args`. Settings travel as plain values (``Settings.model_dump``) and are
rebuilt in every replica; the admin token never travels: the catalog reads
``GNNAAS_ADMIN_TOKEN`` from its node's environment.

Example:
    >>> [p.route_prefix for p in plan_apps(["Cora", "PubMed"])]
    ['/v1/datasets/Cora', '/v1/datasets/PubMed']
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import yaml  # a dependency of Ray's
from ray import serve

from gnnaas.errors import ConfigError
from gnnaas.serving.core.settings import Settings
from gnnaas.serving.deploy.proxy import PROXY_CALLBACK, PROXY_CALLBACK_ENV
from gnnaas.serving.deploy.ray_deployments import (
    CATALOG_DEPLOYMENT,
    DATASET_DEPLOYMENT,
    DEFAULT_MAX_ONGOING_REQUESTS,
    CatalogApp,
    DatasetApp,
    RegistryFactory,
)

__all__ = [
    "APP_NAME",
    "CATALOG_DEPLOYMENT",
    "DATASET_DEPLOYMENT",
    "DEFAULT_MAX_ONGOING_REQUESTS",
    "AppPlan",
    "CatalogApp",
    "DatasetApp",
    "RegistryFactory",
    "app_suffix",
    "build_apps",
    "by_value",
    "catalog_from_args",
    "datasets_from_args",
    "parse_autoscale",
    "plan_apps",
    "servable_datasets",
    "serve_config",
]

APP_NAME = "gnnaas"
"""The deployment's default name: its catalog application's, and its dataset applications'
prefix."""

# -- planning ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AppPlan:
    """One dataset application of a deployment.

    Args:
        name (str): the Serve application's name.
        route_prefix (str): where the proxy mounts it.
        mount (str): that prefix under the deployment's base (``/v1/datasets/<dataset>``).
        datasets (tuple[str, ...]): the datasets its replicas serve.
    """

    name: str
    route_prefix: str
    mount: str
    datasets: tuple[str, ...]


def app_suffix(dataset: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.@-]", "_", dataset)


def plan_apps(
    datasets: Sequence[str], *, name: str = APP_NAME, base: str = "/", one_app: bool = False
) -> list[AppPlan]:
    """The dataset applications of a deployment: one per dataset, or one for all.

    Serve routes by path prefix, one prefix per application, so an application serving several
    datasets is mounted at ``<base>/v1/datasets`` and must serve them all.

    Raises:
        ValueError: no dataset, a dataset name Serve cannot route (``/``, ``{``, ``}``), or a
            base that is not ``/`` or a path without a trailing ``/``.
    """
    if not datasets:
        raise ValueError("plan_apps: datasets must name at least one dataset")
    if not base.startswith("/") or (base != "/" and base.endswith("/")):
        raise ValueError(f"plan_apps: base must be '/' or a path without a final '/' ({base!r})")
    root = "" if base == "/" else base
    if one_app:
        mount = "/v1/datasets"
        return [AppPlan(f"{name}-datasets", root + mount, mount, tuple(datasets))]
    plans = []
    for dataset in datasets:
        if not dataset or any(c in dataset for c in "/{}"):
            raise ValueError(f"plan_apps: dataset {dataset!r} cannot be a route prefix")
        mount = f"/v1/datasets/{dataset}"
        plans.append(AppPlan(f"{name}-{app_suffix(dataset)}", root + mount, mount, (dataset,)))
    return plans


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


def _settings_values(settings: Settings) -> dict[str, Any]:
    """Settings as plain values for the replicas; the admin token stays out (secrets come from
    the environment of the process that uses them)."""
    return settings.model_dump(mode="json", exclude={"admin_token"})


def by_value(fn: Callable[..., Any] | None) -> None:
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


def _replica_options(
    replicas: int, autoscale: tuple[int, int] | None, replica_cpus: float, max_ongoing: int
) -> dict[str, Any]:
    if replicas < 1:
        raise ValueError(f"build_apps: replicas must be >= 1 (got {replicas})")
    if replica_cpus < 0:
        raise ValueError(f"build_apps: replica_cpus must be >= 0 (got {replica_cpus})")
    if max_ongoing < 1:
        raise ValueError(f"build_apps: max_ongoing_requests must be >= 1 (got {max_ongoing})")
    options: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": replica_cpus},
        "max_ongoing_requests": max_ongoing,
    }
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


def _catalog_app(values: dict[str, Any], plans: Sequence[AppPlan]) -> serve.Application:
    apps = {p.name: list(p.datasets) for p in plans}
    return CatalogApp.options(ray_actor_options={"num_cpus": 0.0}).bind(  # type: ignore[attr-defined]
        values, apps
    )


def _dataset_app(
    values: dict[str, Any],
    plan: AppPlan,
    catalog: str | None,
    options: dict[str, Any],
    registry_factory: RegistryFactory | None,
) -> serve.Application:
    deployment = DatasetApp.options(**options)  # type: ignore[attr-defined]
    return deployment.bind(values, list(plan.datasets), plan.mount, catalog, registry_factory)


def build_apps(
    settings: Settings,
    *,
    replicas: int = 1,
    autoscale: tuple[int, int] | None = None,
    datasets: Sequence[str] | None = None,
    registry_factory: RegistryFactory | None = None,
    replica_cpus: float = 1.0,
    max_ongoing_requests: int = DEFAULT_MAX_ONGOING_REQUESTS,
    one_app: bool = False,
    name: str = APP_NAME,
    route_prefix: str = "/",
) -> list[serve.RunTarget]:
    """The Serve applications of a deployment: its catalog, then one per dataset (or one).

    Args:
        settings (Settings): the server's settings (folders, limits).
        replicas (int, optional): replicas per dataset application. (default: ``1``)
        autoscale (tuple[int, int], optional): ``(min, max)`` replicas per application, scaled
            by Serve on requests in flight; overrides ``replicas``. (default: ``None``)
        datasets (Sequence[str], optional): the datasets. (default: ``None``:
            :func:`servable_datasets`)
        registry_factory (RegistryFactory, optional): builds the registry in the replicas.
            (default: ``None``: the repository)
        replica_cpus (float, optional): CPUs Ray reserves per replica. (default: ``1``)
        max_ongoing_requests (int, optional): requests a replica takes at once.
            (default: :data:`DEFAULT_MAX_ONGOING_REQUESTS`)
        one_app (bool, optional): one application for every dataset, at ``/v1/datasets``.
            (default: ``False``: one per dataset)
        name (str, optional): the deployment's name. (default: ``gnnaas``)
        route_prefix (str, optional): the deployment's base path. (default: ``/``)

    Returns:
        list[serve.RunTarget]: for :func:`ray.serve.run_many`.
    """
    names = list(datasets) if datasets is not None else servable_datasets(settings)
    plans = plan_apps(names, name=name, base=route_prefix, one_app=one_app)
    values = _settings_values(settings)
    by_value(registry_factory)
    options = _replica_options(replicas, autoscale, replica_cpus, max_ongoing_requests)
    targets = [serve.RunTarget(_catalog_app(values, plans), name=name, route_prefix=route_prefix)]
    for plan in plans:
        app = _dataset_app(values, plan, name, options, registry_factory)
        targets.append(serve.RunTarget(app, name=plan.name, route_prefix=plan.route_prefix))
    return targets


def catalog_from_args(args: dict[str, Any]) -> serve.Application:
    """The catalog's builder in a Serve config (``import_path``); ``args`` as
    :func:`serve_config` writes them: ``settings``, ``apps``."""
    values = _settings_values(Settings(**args.get("settings", {})))
    plans = [AppPlan(app, "", "", tuple(names)) for app, names in args["apps"].items()]
    return _catalog_app(values, plans)


def datasets_from_args(args: dict[str, Any]) -> serve.Application:
    """A dataset application's builder in a Serve config; ``args`` as :func:`serve_config`
    writes them: ``settings``, ``datasets``, ``mount``, ``catalog``, ``replicas``,
    ``autoscale``, ``replica_cpus``, ``max_ongoing_requests``."""
    autoscale = args.get("autoscale")
    options = _replica_options(
        int(args.get("replicas", 1)),
        parse_autoscale(autoscale) if autoscale else None,
        float(args.get("replica_cpus", 1.0)),
        int(args.get("max_ongoing_requests", DEFAULT_MAX_ONGOING_REQUESTS)),
    )
    plan = AppPlan("", "", args["mount"], tuple(args["datasets"]))
    values = _settings_values(Settings(**args.get("settings", {})))
    return _dataset_app(values, plan, args.get("catalog"), options, None)


# -- the Serve config file -----------------------------------------------------------------------


def _catalog_config(name: str, values: dict[str, Any], plans: list[AppPlan]) -> dict[str, Any]:
    """The config's catalog application: the one route to every dataset application."""
    return {
        "name": name,
        "route_prefix": "/",
        "import_path": f"{__name__}:catalog_from_args",
        "args": {"settings": values, "apps": {p.name: list(p.datasets) for p in plans}},
        "deployments": [
            {"name": CATALOG_DEPLOYMENT, "num_replicas": 1, "ray_actor_options": {"num_cpus": 0}}
        ],
    }


def _dataset_config(
    plan: AppPlan,
    catalog: str,
    values: dict[str, Any],
    replica: dict[str, Any],
    options: dict[str, Any],
) -> dict[str, Any]:
    """The config's application of ``plan``'s datasets: its arguments (the settings, the
    ``replica`` arguments) and its deployment's ``options``."""
    return {
        "name": plan.name,
        "route_prefix": plan.route_prefix,
        "import_path": f"{__name__}:datasets_from_args",
        "args": {
            "settings": values,
            "datasets": list(plan.datasets),
            "mount": plan.mount,
            "catalog": catalog,
            **replica,
        },
        "deployments": [{"name": DATASET_DEPLOYMENT, **options}],
    }


def serve_config(
    settings: Settings,
    *,
    replicas: int = 1,
    autoscale: tuple[int, int] | None = None,
    host: str = "0.0.0.0",
    port: int = 8000,
    replica_cpus: float = 1.0,
    max_ongoing_requests: int = DEFAULT_MAX_ONGOING_REQUESTS,
    one_app: bool = False,
    name: str = APP_NAME,
) -> str:
    """The ``serve deploy`` config (YAML) of the repository ``settings`` point at.

    Folders are written as absolute paths: every node must see them at the same place (a shared
    file system). The admin token is not written; set ``GNNAAS_ADMIN_TOKEN`` in the environment
    of the nodes instead.

    Args:
        settings (Settings): the folders and limits to serve with.
        replicas (int, optional): replicas per dataset application. (default: ``1``)
        autoscale (tuple[int, int], optional): ``(min, max)`` replicas. (default: ``None``)
        host (str, optional): where Serve's proxies listen. (default: ``0.0.0.0``)
        port (int, optional): their port. (default: ``8000``)
        replica_cpus (float, optional): CPUs reserved per replica. (default: ``1``)
        max_ongoing_requests (int, optional): requests a replica takes at once.
            (default: :data:`DEFAULT_MAX_ONGOING_REQUESTS`)
        one_app (bool, optional): one application for every dataset. (default: ``False``)
        name (str, optional): the deployment's name. (default: ``gnnaas``)

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
    plans = plan_apps(datasets, name=name, one_app=one_app)
    replica = {
        "replicas": replicas,
        "autoscale": f"{autoscale[0]}:{autoscale[1]}" if autoscale else None,
        "replica_cpus": replica_cpus,
        "max_ongoing_requests": max_ongoing_requests,
    }
    options = _replica_options(replicas, autoscale, replica_cpus, max_ongoing_requests)
    applications = [_catalog_config(name, values, plans)]
    applications += [_dataset_config(plan, name, values, replica, options) for plan in plans]
    config = {
        "proxy_location": "EveryNode",
        "http_options": {"host": host, "port": port},
        "applications": applications,
    }
    header = [
        "# Ray Serve config of gnnaas, written by `gnnaas ray-config`.",
        "# Deploy: start every node with the proxy's 503 for lost replicas,",
        f"#   {PROXY_CALLBACK_ENV}={PROXY_CALLBACK} ray start --head",
        f"#   ({PROXY_CALLBACK_ENV}=... ray start --address=<head>:6379 on the others),",
        "# then: serve deploy <this file>. The folders below must be the same on every node.",
    ]
    body = yaml.safe_dump(config, sort_keys=False, default_flow_style=False)
    return "\n".join(header) + "\n" + body
