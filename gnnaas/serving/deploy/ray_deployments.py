"""gnnaas's two Serve deployments: what runs inside a replica on Ray Serve.

- :class:`DatasetApp`: each replica runs the whole app of
  :func:`~gnnaas.serving.http.app.create_app` for its application's datasets, with its local
  router (policy, batchers, executors, measured load), as one process or one of ``--workers``
  does, mounted under its Serve route prefix. It keeps one poll open on the catalog with its
  report (its metrics when the catalog asks), tells Ray's health check when it is stopping, and
  says goodbye to the catalog when Serve removes it.
- :class:`CatalogApp`: one replica of :mod:`gnnaas.serving.deploy.catalog` answering
  ``GET /v1/datasets``, ``/healthz``, ``/readyz`` and ``/metrics`` for the whole deployment from
  its replicas' reports.

This module is the replicas' side; :mod:`gnnaas.serving.deploy.ray_apps` is the driver's: it plans
the applications, binds these deployments with their options into them, and writes the config of
``serve deploy``. The two change for different reasons (a replica's lifecycle, a deployment's
shape), and only this one runs in Ray's worker processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any

from ray import serve

from gnnaas.errors import ConfigError
from gnnaas.serving.core.registry import VariantRegistry
from gnnaas.serving.core.settings import Settings
from gnnaas.serving.deploy.catalog import Catalog, create_catalog_app, replica_report

__all__ = [
    "CATALOG_DEPLOYMENT",
    "DATASET_DEPLOYMENT",
    "DEFAULT_MAX_ONGOING_REQUESTS",
    "CatalogApp",
    "DatasetApp",
    "RegistryFactory",
]

_log = logging.getLogger(__name__)

DEFAULT_MAX_ONGOING_REQUESTS = 64
"""Requests a dataset replica takes at once before Serve's proxy holds more back: enough for its
batchers to merge concurrent requests, while the policy still sees the load it is given."""

RegistryFactory = Callable[[Settings], VariantRegistry]
"""Builds a dataset application's registry in its replicas from settings whose ``datasets`` are
the application's (tests pass in-memory fakes); the default is ``VariantRegistry.load``."""

CATALOG_DEPLOYMENT = "CatalogApp"
"""The catalog's deployment, in the catalog application."""

DATASET_DEPLOYMENT = "DatasetApp"
"""The deployment of each dataset application."""

_HEALTH_CHECK_PERIOD_S = 2.0
_HEALTH_CHECK_TIMEOUT_S = 10.0
_CATALOG_MAX_ONGOING = 1000  # every replica keeps one poll open on it
_REPORT_RETRY_S = 1.0


class _Mounted:
    """A replica's app under its Serve route prefix.

    Serve's proxy passes the route prefix as ``root_path`` (the path keeps it); the app's routes
    are written from the deployment's root (``/v1/datasets/{dataset}/...``), so the prefix's own
    part (``mount``) goes back into the path the app routes on.
    """

    def __init__(self, app: Any, mount: str) -> None:
        self.app = app
        self.mount = mount

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            root = scope.get("root_path", "")
            if root.endswith(self.mount):
                scope["root_path"] = root[: len(root) - len(self.mount)]
        await self.app(scope, receive, send)


def _refuse_reload() -> VariantRegistry:
    raise ConfigError(
        "on Ray Serve the variants are reloaded by redeploying the applications "
        "(`serve deploy` with the config of `gnnaas ray-config`)"
    )


@serve.deployment(
    name=DATASET_DEPLOYMENT,
    health_check_period_s=_HEALTH_CHECK_PERIOD_S,
    health_check_timeout_s=_HEALTH_CHECK_TIMEOUT_S,
    max_ongoing_requests=DEFAULT_MAX_ONGOING_REQUESTS,
)
@serve.ingress()
class DatasetApp:
    """One replica of a dataset application: the whole app for its datasets.

    Args:
        settings (dict): :class:`Settings` values.
        datasets (list[str]): the datasets this application serves.
        mount (str): its path under the deployment's root (``/v1/datasets/<dataset>``).
        catalog (str, optional): the catalog application the replica reports to.
            (default: ``None``: none)
        registry_factory (RegistryFactory, optional): builds the registry in the replica.
            (default: ``None``: ``VariantRegistry.load``)
    """

    def __init__(
        self,
        settings: dict[str, Any],
        datasets: list[str],
        mount: str,
        catalog: str | None = None,
        registry_factory: RegistryFactory | None = None,
    ) -> None:
        self.settings = Settings(**settings).model_copy(update={"datasets": list(datasets)})
        self.mount = mount
        self.catalog = catalog
        self.registry_factory = registry_factory
        self.core: Any = None
        self.replica = ""
        self.app_name = ""
        self._reporter: asyncio.Task[None] | None = None

    async def __serve_build_asgi_app__(self) -> Any:
        from gnnaas.serving.http.app import create_app

        factory = self.registry_factory or VariantRegistry.load
        registry = await asyncio.to_thread(factory, self.settings)
        app = create_app(self.settings, registry=registry, loader=_refuse_reload)
        self.core = app.state.router
        context = serve.get_replica_context()
        self.replica, self.app_name = str(context.replica_id.unique_id), context.app_name
        if self.catalog is not None:
            self._reporter = asyncio.create_task(self._report())
        return _Mounted(app, self.mount)

    async def _report(self) -> None:
        """Keeps one poll open on the catalog, with this replica's report (its metrics when the
        last poll asked for them)."""
        core = self.core
        while not core.started:  # Serve runs the app's lifespan after the build
            await asyncio.sleep(0.05)
        metrics = False
        handle = None
        while True:
            try:
                if handle is None:
                    handle = serve.get_deployment_handle(CATALOG_DEPLOYMENT, app_name=self.catalog)
                report = replica_report(
                    core, replica=self.replica, pid=os.getpid(), app=self.app_name, metrics=metrics
                )
                command = await handle.poll.remote(report)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the catalog restarting or not deployed yet: try again
                _log.debug("catalog %s not reached: %r", self.catalog, exc)
                await asyncio.sleep(_REPORT_RETRY_S)
                continue
            metrics = command == "metrics"

    async def pid(self) -> tuple[str, int]:
        """``(replica id, process id)`` of this replica."""
        return self.replica, os.getpid()

    async def check_health(self) -> None:
        """Ray's health check: failing while the router is stopping."""
        if self.core is not None and self.core.stopping:
            raise RuntimeError(f"replica {self.replica} is stopping")

    async def __del__(self) -> None:
        if self._reporter is None:
            return
        self._reporter.cancel()
        with contextlib.suppress(Exception):
            handle = serve.get_deployment_handle(CATALOG_DEPLOYMENT, app_name=self.catalog)
            report = replica_report(
                self.core,
                replica=self.replica,
                pid=os.getpid(),
                app=self.app_name,
                metrics=True,
                stopping=True,
            )
            async with asyncio.timeout(2.0):
                await handle.poll.remote(report)


@serve.deployment(
    name=CATALOG_DEPLOYMENT,
    max_ongoing_requests=_CATALOG_MAX_ONGOING,
    # Its open calls are the replicas' polls, which never end on their own: do not wait for them.
    graceful_shutdown_wait_loop_s=0.2,
    graceful_shutdown_timeout_s=1.0,
)
@serve.ingress()
class CatalogApp:
    """The catalog: listing, readiness and metrics of the deployment, from its replicas' reports.

    Args:
        settings (dict): :class:`Settings` values; ``GNNAAS_ADMIN_TOKEN`` is read here.
        apps (dict[str, list[str]]): each dataset application and its datasets.
    """

    def __init__(self, settings: dict[str, Any], apps: dict[str, list[str]]) -> None:
        self.settings = Settings(**settings)
        self.catalog = Catalog(apps)

    def __serve_build_asgi_app__(self) -> Any:
        return create_catalog_app(self.settings, self.catalog)

    async def poll(self, report: Any) -> str:
        """A replica's report; returns when the catalog needs its metrics, or after a while."""
        return await self.catalog.poll(report)

    async def replicas(self, app: str | None = None) -> dict[str, int]:
        """``{replica id: pid}`` of the live replicas (of ``app``, or all)."""
        return self.catalog.replicas(app)

    async def reporting(self) -> dict[str, int]:
        """Live replicas per dataset application."""
        return self.catalog.reporting()
