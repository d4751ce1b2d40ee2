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
``RequestValidationError``             422     malformed JSON, non-integer or missing ids
``OverloadedError``                    503     queue full or shutting down; ``Retry-After``
``ArtifactError``, any other exception  500     ``internal error, see server log (request
                                               id <id>)``; the log has the traceback
=====================================  ======  ==========================================

The admin routes (:mod:`gnnaas.serving.routes.admin`) add 401/403 for the bearer token and their
own reload errors (409 for files that cannot be served, 500 naming the stage). The app's
:class:`~gnnaas.serving.reload.Reloader` (``app.state.reloader``) serves ``POST /v1/admin/reload``
and, with ``reload_on_sighup``, ``SIGHUP``: its handler is installed on the running loop in the
lifespan (``loop.add_signal_handler``) and removed at shutdown, so ``gnnaas serve`` under
uvicorn reloads on ``kill -HUP`` while SIGINT/SIGTERM keep their graceful shutdown.

One small ASGI middleware sits in front of the app: it gives every request an id (the client's
``X-Request-Id`` when it is a short token, else a generated one) and returns it as
``X-Request-Id``; it turns an unhandled exception into that 500 (never the exception's text); and it
refuses bodies over ``settings.max_body_bytes`` with 413 before they are parsed, checking
``Content-Length`` and counting the streamed bytes.

``/docs`` (Swagger UI) and ``/redoc`` load their scripts and styles from this server (the assets
ship with ``fastapi-offline``), so they work with no network.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import logging
import math
import os
import re
import signal
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import gnnaas
from gnnaas.errors import ConfigError, OverloadedError
from gnnaas.serving.fastlane import try_predict
from gnnaas.serving.metrics import PUBLISH_INTERVAL_S, ServingMetrics
from gnnaas.serving.registry import VariantRegistry
from gnnaas.serving.reload import RegistryLoader, Reloader
from gnnaas.serving.router import ExecutorFactory, Router
from gnnaas.serving.routes import admin, datasets, graph, health, predict
from gnnaas.serving.routes.predict import REQUEST_ID_KEY, START_KEY
from gnnaas.serving.settings import Settings

__all__ = ["create_app", "internal_error_detail"]

_log = logging.getLogger(__name__)

_EXAMPLE = '{"nodes": [0, 1, 2]}'
_MAX_OFFENDERS = 5

_DESCRIPTION = """\
Model-less GNN inference: ask for node predictions and say how many accuracy points you accept to
lose (`X-Accuracy-Tolerance`); the router picks the fastest variant within that tolerance under the
current load and batches concurrent requests. Errors are `{"detail": "..."}`.
"""


# A client's own request id is echoed when it is a short, log-safe token.
_CLIENT_ID = re.compile(rb"[A-Za-z0-9._:-]{1,64}")


def internal_error_detail(request_id: str) -> str:
    """The ``detail`` of every 500: no exception text, a pointer to the log line."""
    return f"internal error, see server log (request id {request_id})"


class _Edge:
    """Request ids, the 500 guard, the body limit and the predict fast lane, in one pass over
    each HTTP request.

    Args:
        app (ASGIApp): the wrapped app.
        max_bytes (int): largest request body; larger ones get 413 before the app parses them.
        metrics (ServingMetrics): counts the refusals.
        state (Any, optional): the app's state, whose ``router`` serves well-formed predict
            requests in the fast lane (:mod:`gnnaas.serving.fastlane`). (default: ``None``:
            every request goes through FastAPI)
    """

    def __init__(
        self, app: ASGIApp, max_bytes: int, metrics: ServingMetrics, state: Any = None
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.metrics = metrics
        self.state = state
        # Generated ids: a per-process prefix and a counter, cheaper than a uuid per request.
        self._prefix = os.urandom(4).hex()
        self._counter = itertools.count(1)

    def _request_id(self, scope: Scope) -> str:
        for name, value in scope["headers"]:
            if name == b"x-request-id" and _CLIENT_ID.fullmatch(value):
                return value.decode()
        return f"{self._prefix}-{next(self._counter)}"

    async def _internal_error(self, scope: Scope, send: Send, request_id: str) -> None:
        _log.exception(
            "internal error (request id %s) on %s %s",
            request_id,
            scope.get("method"),
            scope.get("path"),
        )
        body = json.dumps({"detail": internal_error_detail(request_id)}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 500,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"x-request-id", request_id.encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def _refuse(self, send: Send) -> None:
        self.metrics.rejected("body_too_large")
        detail = (
            f"request body is over the limit of {self.max_bytes} bytes; "
            "send fewer node ids per request"
        )
        body = json.dumps({"detail": detail}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope[START_KEY] = time.perf_counter()
        request_id = scope[REQUEST_ID_KEY] = self._request_id(scope)
        started = finished = False

        async def send_with_id(message: Message) -> None:
            nonlocal started, finished
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [
                    *message.get("headers", ()),
                    (b"x-request-id", request_id.encode()),
                ]
            elif not message.get("more_body", False):
                finished = True
            await send(message)

        try:
            await self._checked(scope, receive, send_with_id)
        except Exception:
            if started:  # answered already by the app's 500 handler, or too late for a clean 500
                if finished:  # the handler logged it: nothing is left to do
                    return
                raise  # mid-body: let the server close the connection
            await self._internal_error(scope, send, request_id)

    async def _checked(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    break
                if declared > self.max_bytes:
                    await self._refuse(send)
                    return
                break
        # Read the whole body here, counting, then replay it: chunked uploads are bounded too.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        if self.state is not None and await try_predict(
            self.state.router, scope, b"".join(chunks), send
        ):
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


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
        if loc == ("body",):
            if kind == "missing":
                messages.append(f"the request body is missing; send {_EXAMPLE}")
            else:
                messages.append(f"the body must be a JSON object like {_EXAMPLE}")
        elif loc == ("body", "nodes") and kind == "missing":
            messages.append(f"'nodes' is missing; send {_EXAMPLE}")
        elif loc == ("body", "nodes") and kind == "too_short":
            messages.append("'nodes' is empty; send at least one node id")
        elif loc == ("body", "nodes"):
            messages.append(f"'nodes' must be a list of integer node ids (got {given!r:.60})")
        elif loc == ("body", "return"):
            messages.append(f"'return' must be 'class', 'proba' or 'embedding' (got {given!r:.60})")
        elif kind == "extra_forbidden":
            messages.append(f"unknown field {loc[-1]!r}; the body takes 'nodes' and 'return'")
        else:
            where = ".".join(str(p) for p in loc[1:] or loc)
            messages.append(f"{where}: {e.get('msg', kind)}")
    if bad_nodes:
        messages.insert(0, f"node ids must be integers; first offenders: {', '.join(bad_nodes)}")
    return "; ".join(messages) or "invalid request"


def _retry_after(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))


class _App(FastAPI):
    """The FastAPI app with :class:`_Edge` in front of FastAPI's own per-request layers.

    Every HTTP request passes the edge first, so a well-formed predict request is answered by the
    fast lane before FastAPI's telemetry, error and body-limit middleware run (measured on the
    loaded single-node path: those layers held ~14 % of the event loop's GIL time). Lifespan
    events go straight to FastAPI. An exception a route raises reaches Starlette's error
    middleware first, whose handler (the app's ``Exception`` handler) logs it and answers the 500.
    """

    edge: _Edge | None = None

    async def inner(self, scope: Scope, receive: Receive, send: Send) -> None:
        """FastAPI's own entry point: what the edge passes a request on to."""
        await super().__call__(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        edge = self.edge
        if edge is not None and scope["type"] == "http":
            await edge(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


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

    @app.exception_handler(ConfigError)
    async def _config(request: Request, exc: ConfigError) -> JSONResponse:
        not_found = isinstance(exc, LookupError)
        metrics.rejected("not_found" if not_found else "bad_value")
        return JSONResponse({"detail": str(exc)}, status_code=404 if not_found else 400)

    @app.exception_handler(OverloadedError)
    async def _overloaded(request: Request, exc: OverloadedError) -> JSONResponse:
        metrics.rejected("overloaded")
        return JSONResponse(
            {"detail": str(exc)},
            status_code=503,
            headers={"Retry-After": _retry_after(exc.retry_after_s)},
        )


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


def create_app(
    settings: Settings,
    registry: VariantRegistry | None = None,
    *,
    executor_factory: ExecutorFactory | None = None,
    loader: RegistryLoader | None = None,
    reload_on_sighup: bool = False,
    router: Router | None = None,
) -> FastAPI:
    """Builds the router app.

    Args:
        settings (Settings): paths, device and batching limits.
        registry (VariantRegistry, optional): what to serve; loaded from ``settings`` when ``None``
            (weights and graphs are read here, so a bad setup fails before the server starts).
            (default: ``None``)
        executor_factory (ExecutorFactory, optional): builds each variant's batch handler
            (tests, benchmarks); an :class:`~gnnaas.serving.executor.Executor` by default.
            (default: ``None``)
        loader (RegistryLoader, optional): builds the registry a reload swaps in; by default
            ``VariantRegistry.load(settings, strict=True)``, the folders the server started with.
            (default: ``None``)
        reload_on_sighup (bool, optional): reload on ``SIGHUP`` while the app runs; needs the
            lifespan to run in the main thread (``gnnaas serve`` sets it). (default: ``False``)
        router (Router, optional): the serving core to put behind the HTTP API instead of a
            :class:`Router` over ``registry`` (the Ray Serve ingress passes its
            :class:`~gnnaas.serving.remote.RemoteRouter`, whose replicas execute); its lifespan
            is the app's. (default: ``None``)

    Returns:
        FastAPI: the app; its lifespan starts the batchers and drains them on shutdown.

    Raises:
        ConfigError: ``registry`` is ``None`` and nothing can be served from ``settings``.

    Example:
        >>> app = create_app(Settings(variants_dir="variants"))  # doctest: +SKIP
        >>> uvicorn.run(app, host="127.0.0.1", port=8000)  # doctest: +SKIP
    """
    if router is not None:
        core, metrics = router, router.metrics
    else:
        if registry is None:
            registry = VariantRegistry.load(settings)
        metrics = ServingMetrics()
        core = Router(registry, settings, metrics=metrics, executor_factory=executor_factory)
    if loader is None:

        def loader() -> VariantRegistry:
            return VariantRegistry.load(settings, strict=True)

    reloader = Reloader(core, loader, after_swap=_refreeze)

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

    app = FastAPIOffline(
        title="gnnaas",
        version=gnnaas.__version__,
        description=_DESCRIPTION,
        lifespan=lifespan,
    )
    # fastapi-offline builds a plain FastAPI; _App only puts the edge in front (no state of its
    # own), so the instance takes its class.
    app.__class__ = _App
    app.state.settings = settings
    app.state.router = core
    app.state.metrics = metrics
    app.state.reloader = reloader
    cast(_App, app).edge = _Edge(
        cast(_App, app).inner,
        max_bytes=settings.max_body_bytes,
        metrics=metrics,
        state=app.state if settings.fast_lane else None,
    )
    _register_handlers(app, metrics)
    app.include_router(predict.router, prefix="/v1")
    app.include_router(datasets.router, prefix="/v1")
    app.include_router(admin.router, prefix="/v1")
    app.include_router(graph.router, prefix="/v1")
    app.include_router(health.router)
    return app
