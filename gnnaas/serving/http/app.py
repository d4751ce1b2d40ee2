"""The FastAPI app factory of the router.

``create_app(settings)`` loads the :class:`VariantRegistry` (or takes one built in memory),
wraps it in a :class:`Router` and returns the app; the router's batchers start in the app's
lifespan and drain in its ``finally``. One exception handler per error family maps to a status
code and a ``detail`` string:

=====================================  ======  ==========================================
error                                  status  when
=====================================  ======  ==========================================
``NotFoundError`` (a ``ConfigError``)  404     unknown dataset or pinned variant
``ConfigError``                        400     any other bad value
``RequestError``                       its own  a bad header (400), too many nodes (413), node
                                               ids out of range (422)
``RequestValidationError``             422     malformed JSON, non-integer or missing ids
``UnmeetableDeadline`` (a ``ConfigError``)  422  ``X-Deadline-Ms`` below the fastest admissible
                                               variant's profiled time alone; no ``Retry-After``
``OverloadedError``                    503     queue full, shed, deadline not met under the
                                               current load, or shutting down; ``Retry-After``
``DeadlineExceeded``                   504     ``X-Deadline-Ms`` passed while queued
``ArtifactError``, any other exception  500     ``internal error, see server log (request
                                               id <id>)``; the log has the traceback
=====================================  ======  ==========================================

The admin routes (:mod:`gnnaas.serving.http.routes.admin`) add 401/403 for the bearer token and
their own reload errors (409 for files that cannot be served, 500 naming the stage). The app's
:class:`~gnnaas.serving.core.reload.Reloader` (``app.state.reloader``) serves
``POST /v1/admin/reload`` and, with ``reload_on_sighup``, ``SIGHUP``: its handler is installed on
the running loop in the lifespan (``loop.add_signal_handler``) and removed at shutdown, so
``gnnaas serve`` under uvicorn reloads on ``kill -HUP`` while SIGINT/SIGTERM keep their graceful
shutdown.

The edge (:mod:`gnnaas.serving.http.edge`) sits in front of FastAPI's own layers: request ids, the
500 guard, the body limit and the predict fast lane. ``POST /v1/datasets/{d}/predict`` has two
implementations behind that one path: the fast lane answers every well-formed request it takes,
and the FastAPI route (which the OpenAPI schema documents) the rest, such as embeddings and
malformed bodies. Both parse with the same functions, answer with the same
:func:`~gnnaas.serving.http.routes.predict.answer` and refuse through one mapping
(:func:`gnnaas.serving.http.requests.error_response`); ``tests/serving/test_fastlane.py`` sends the
same requests through both and requires the same answers.

``/docs`` (Swagger UI) and ``/redoc`` load their scripts and styles from this server (the assets
ship with ``fastapi-offline``), so they work with no network.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi_offline import FastAPIOffline

import gnnaas
from gnnaas.errors import ConfigError, DeadlineExceeded, OverloadedError
from gnnaas.serving.core.clock import MONOTONIC, Clock
from gnnaas.serving.core.generation import ExecutorFactory
from gnnaas.serving.core.metrics import PUBLISH_INTERVAL_S, ServingMetrics
from gnnaas.serving.core.registry import VariantRegistry
from gnnaas.serving.core.reload import RegistryLoader, Reloader
from gnnaas.serving.core.router import Router
from gnnaas.serving.core.settings import Settings
from gnnaas.serving.http.edge import App, Edge, internal_error_detail
from gnnaas.serving.http.requests import REQUEST_ID_KEY, RequestError, error_response
from gnnaas.serving.http.routes import admin, datasets, graph, health, predict

__all__ = ["create_app"]

_log = logging.getLogger(__name__)

_EXAMPLE = '{"nodes": [0, 1, 2]}'
_MAX_OFFENDERS = 5

_DESCRIPTION = """\
Model-less GNN inference: ask for node predictions and say how many accuracy points you accept to
lose (`X-Accuracy-Tolerance`); the router picks the fastest variant within that tolerance under the
current load and batches concurrent requests. Errors are `{"detail": "..."}`.
"""


def _describe_validation(errors: Sequence[Any]) -> str:
    """One sentence a person can act on, from pydantic/FastAPI validation errors."""
    bad_nodes: list[str] = []
    messages: list[str] = []
    for e in errors:
        loc = tuple(e.get("loc", ()))
        kind = e.get("type", "")
        given = e.get("input")
        if kind == "json_invalid":
            error = (e.get("ctx") or {}).get("error", "invalid JSON")
            position = f" at character {loc[-1]}" if len(loc) > 1 else ""
            return f"malformed JSON body: {error}{position}; send an object like {_EXAMPLE}"
        if loc[:2] == ("body", "nodes") and len(loc) == 3:
            if len(bad_nodes) < _MAX_OFFENDERS:
                bad_nodes.append(f"nodes[{loc[2]}]={json.dumps(given, default=str)}")
            continue
        messages.append(_field_message(loc, kind, given, e))
    if bad_nodes:
        messages.insert(0, f"node ids must be integers; first offenders: {', '.join(bad_nodes)}")
    return "; ".join(messages) or "invalid request"


def _field_message(loc: tuple[Any, ...], kind: str, given: Any, error: Any) -> str:
    """What one validation error of the body (not a bad node id) says to the client."""
    if loc == ("body",):
        if kind == "missing":
            return f"the request body is missing; send {_EXAMPLE}"
        return f"the body must be a JSON object like {_EXAMPLE}"
    if loc == ("body", "nodes"):
        if kind == "missing":
            return f"'nodes' is missing; send {_EXAMPLE}"
        if kind == "too_short":
            return "'nodes' is empty; send at least one node id"
        return f"'nodes' must be a list of integer node ids (got {given!r:.60})"
    if loc == ("body", "return"):
        return f"'return' must be 'class', 'proba' or 'embedding' (got {given!r:.60})"
    if kind == "extra_forbidden":
        return f"unknown field {loc[-1]!r}; the body takes 'nodes' and 'return'"
    where = ".".join(str(p) for p in loc[1:] or loc)
    return f"{where}: {error.get('msg', kind)}"


def _register_handlers(app: FastAPI, metrics: ServingMetrics) -> None:
    @app.exception_handler(Exception)  # an ArtifactError included: a bad file is ours, not theirs
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        request_id = str(request.scope.get(REQUEST_ID_KEY, "-"))
        _log.error(
            "internal error (request id %s) on %s %s",
            request_id,
            request.method,
            request.url.path,
            exc_info=exc,
        )
        return JSONResponse({"detail": internal_error_detail(request_id)}, status_code=500)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        metrics.rejected("invalid_body")
        content_type = request.headers.get("content-type", "")
        if content_type and "json" not in content_type.lower():
            detail = (
                f"the body must be JSON sent with 'Content-Type: application/json' "
                f"(got {content_type!r}); e.g. {_EXAMPLE}"
            )
        else:
            detail = _describe_validation(exc.errors())
        return JSONResponse({"detail": detail}, status_code=422)

    @app.exception_handler(RequestError)
    @app.exception_handler(DeadlineExceeded)
    @app.exception_handler(ConfigError)
    @app.exception_handler(OverloadedError)
    async def _refused(request: Request, exc: Exception) -> Response:
        # one mapping for the route and the fast lane (gnnaas.serving.http.requests)
        status, content, headers, reason = error_response(exc)
        metrics.rejected(reason)
        return Response(content, status_code=status, media_type="application/json", headers=headers)


def _refreeze() -> None:
    """Frees a replaced generation: one full collection, then everything left is frozen again.

    The lifespan froze the first generation (short full collections); reference cycles among a
    replaced generation's objects (lanes and their batchers' callbacks, modules) would stay
    frozen, never collected, so every reload would keep its predecessor's models and graphs.
    This costs one collection pause on the event loop per reload.
    """
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def _install_sighup(reloader: Reloader) -> bool:
    """Reloads on ``SIGHUP`` from now on; ``False`` (and a warning) where signals cannot be set."""
    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reloader.on_signal)
    except (AttributeError, NotImplementedError, RuntimeError, ValueError) as exc:
        # no SIGHUP (Windows), or not the main thread
        _log.warning("SIGHUP will not reload: %s", exc)
        return False
    _log.info("SIGHUP reloads variants, profiles and datasets (pid %d)", os.getpid())
    return True


async def _publish(metrics: ServingMetrics) -> None:
    """Multiprocess mode: publishes this worker's scrape-time gauges until cancelled."""
    while True:
        metrics.publish()
        await asyncio.sleep(PUBLISH_INTERVAL_S)


def _lifespan(
    core: Router, reloader: Reloader, metrics: ServingMetrics, *, reload_on_sighup: bool
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: starts the router (then freezes what it loaded out of the
    collector's reach), the SIGHUP reload and the metrics publisher; on shutdown stops them,
    the reloader first, then the router's drain."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await core.start()
        # Everything loaded so far (models, registry, libraries) lives as long as the server:
        # move it out of the collector's reach so that full collections stay short (tail latency).
        gc.collect()
        gc.freeze()
        _log.info("serving %s", ", ".join(core.registry.datasets))
        on_sighup = reload_on_sighup and _install_sighup(reloader)
        publisher = asyncio.create_task(_publish(metrics)) if metrics.multiprocess else None
        try:
            yield
        finally:
            if on_sighup:
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            gc.unfreeze()
            await reloader.close()
            await core.stop()
            if publisher is not None:
                publisher.cancel()
                metrics.retire()

    return lifespan


def create_app(
    settings: Settings,
    registry: VariantRegistry | None = None,
    *,
    executor_factory: ExecutorFactory | None = None,
    loader: RegistryLoader | None = None,
    reload_on_sighup: bool = False,
    clock: Clock = MONOTONIC,
) -> FastAPI:
    """Builds the router app.

    Args:
        settings (Settings): paths, device and batching limits.
        registry (VariantRegistry, optional): what to serve; loaded from ``settings`` when ``None``
            (weights and graphs are read here, so a bad setup fails before the server starts).
            (default: ``None``)
        executor_factory (ExecutorFactory, optional): builds each variant's batch handler
            (tests, benchmarks); an :class:`~gnnaas.inference.executor.Executor` by default.
            (default: ``None``)
        loader (RegistryLoader, optional): builds the registry a reload swaps in; by default
            ``VariantRegistry.load(settings, strict=True)``, the folders the server started with.
            (default: ``None``)
        reload_on_sighup (bool, optional): reload on ``SIGHUP`` while the app runs; needs the
            lifespan to run in the main thread (``gnnaas serve`` sets it). (default: ``False``)
        clock (Clock, optional): the router's clock (tests: a
            :class:`~gnnaas.serving.core.clock.FakeClock`). (default:
            :data:`~gnnaas.serving.core.clock.MONOTONIC`)

    Returns:
        FastAPI: the app; its lifespan starts the batchers and drains them on shutdown.

    Raises:
        ConfigError: ``registry`` is ``None`` and nothing can be served from ``settings``.

    Example:
        >>> app = create_app(Settings(variants_dir="variants"))  # doctest: +SKIP
        >>> uvicorn.run(app, host="127.0.0.1", port=8000)  # doctest: +SKIP
    """
    if registry is None:
        registry = VariantRegistry.load(settings)
    metrics = ServingMetrics()
    core = Router(
        registry, settings, metrics=metrics, executor_factory=executor_factory, clock=clock
    )
    if loader is None:

        def loader() -> VariantRegistry:
            return VariantRegistry.load(settings, strict=True)

    reloader = Reloader(core, loader, after_swap=_refreeze)

    lifespan = _lifespan(core, reloader, metrics, reload_on_sighup=reload_on_sighup)
    app = FastAPIOffline(
        title="gnnaas",
        version=gnnaas.__version__,
        description=_DESCRIPTION,
        lifespan=lifespan,
    )
    # fastapi-offline builds a plain FastAPI; App only puts the edge in front (no state of its
    # own), so the instance takes its class.
    app.__class__ = App
    app.state.settings = settings
    app.state.router = core
    app.state.metrics = metrics
    app.state.reloader = reloader
    cast(App, app).edge = Edge(
        cast(App, app).inner,
        max_bytes=settings.max_body_bytes,
        metrics=metrics,
        state=app.state,
        clock=clock,
    )
    _register_handlers(app, metrics)
    app.include_router(predict.router, prefix="/v1")
    app.include_router(datasets.router, prefix="/v1")
    app.include_router(admin.router, prefix="/v1")
    app.include_router(graph.router, prefix="/v1")
    app.include_router(health.router)
    return app
