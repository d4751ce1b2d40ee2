"""The edge in front of FastAPI: request ids, the 500 guard, the body limit, shedding, fast lane.

Every HTTP request passes :class:`Edge` first, in one pass: it gives the request an id (the
client's ``X-Request-Id`` when it is a short, log-safe token, else a generated one) returned as
``X-Request-Id``; it refuses bodies over ``settings.max_body_bytes`` with 413 before they are
parsed, checking ``Content-Length`` and counting the streamed bytes; it refuses a predict request
that admission is shedding (its priority and deadline are covered by a refusal admission made:
:mod:`gnnaas.serving.core.shedding`) before its body is read, with admission's own 503,
``Retry-After`` and detail; it turns an unhandled exception into a 500 that never carries the
exception's text; and it hands a well-formed predict request to the fast lane
(:mod:`gnnaas.serving.http.fastlane`) before FastAPI's own layers run. :class:`App` is the
FastAPI app with the edge in front.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gnnaas.policy import effective_tolerance
from gnnaas.serving.core.clock import MONOTONIC, Clock
from gnnaas.serving.core.metrics import ServingMetrics
from gnnaas.serving.core.shedding import Asked, shed_outcome
from gnnaas.serving.http.fastlane import header_pairs, predict_dataset, try_predict
from gnnaas.serving.http.requests import (
    REQUEST_ID_KEY,
    START_KEY,
    RequestError,
    error_response,
    read_headers,
)

__all__ = ["App", "Edge", "internal_error_detail"]

_log = logging.getLogger(__name__)


def internal_error_detail(request_id: str) -> str:
    """The ``detail`` of every 500: no exception text, a pointer to the log line."""
    return f"internal error, see server log (request id {request_id})"


# A client's own request id is echoed when it is a short, log-safe token.
_CLIENT_ID = re.compile(rb"[A-Za-z0-9._:-]{1,64}")


class Edge:
    """Request ids, the 500 guard, the body limit and the predict fast lane, in one pass over
    each HTTP request.

    Args:
        app (ASGIApp): the wrapped app.
        max_bytes (int): largest request body; larger ones get 413 before the app parses them.
        metrics (ServingMetrics): counts the refusals.
        state (Any): the app's state, whose ``router`` serves well-formed predict requests in
            the fast lane (:mod:`gnnaas.serving.http.fastlane`); the others go on to ``app``.
        clock (Clock, optional): the router's, which the arrival time (``START_KEY``) is read
            on. (default: :data:`~gnnaas.serving.core.clock.MONOTONIC`)
    """

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        metrics: ServingMetrics,
        state: Any,
        clock: Clock = MONOTONIC,
    ) -> None:
        self.app = app
        self.clock = clock
        self.max_bytes = max_bytes
        self.metrics = metrics
        self.state = state
        # Generated ids: a per-process prefix and a counter, cheaper than a uuid per request.
        self._prefix = os.urandom(4).hex()
        self._counter = itertools.count(1)

    def request_id(self, scope: Scope) -> str:
        """The request's id: its valid ``X-Request-Id``, else a new one."""
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
        scope[START_KEY] = self.clock.now()
        request_id = scope[REQUEST_ID_KEY] = self.request_id(scope)
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
        if self._declared_too_large(scope):
            await self._refuse(send)
            return
        if await self._shed(scope, send):
            return
        body = await self._read_body(receive, send)
        if body is None:  # refused, or the client went away
            return
        if await try_predict(self.state.router, scope, body, send):
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _shed(self, scope: Scope, send: Send) -> bool:
        """Refuses a predict request that a refusal of admission covers, from its path and
        headers alone (its body is never read); ``False`` leaves it to the rest of the edge."""
        answer = self.shed_answer(scope)
        if answer is None:
            return False
        status, headers, body = answer
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return True

    def shed_answer(self, scope: Scope) -> tuple[int, list[tuple[bytes, bytes]], bytes] | None:
        """The answer to a predict request that a refusal of admission still covers, read from
        its method, path and headers alone (:mod:`gnnaas.serving.core.shedding`): status,
        headers (without the request id) and JSON body, the refusal counted; ``None`` when no
        refusal covers it (or a header is not a valid value: the request's 400 words it). The
        edge sends it before reading the body; the HTTP protocol
        (:mod:`gnnaas.serving.http.protocol`) before the request reaches the app at all."""
        core = self.state.router
        if not core.shed:
            return None
        name = predict_dataset(scope)
        served = None if name is None else core.registry.get(name)
        if served is None:
            return None
        asked = _asked(scope)
        if asked is None:
            return None
        refused = core.refusal(served.name, asked)
        if refused is None:
            return None
        status, content, headers, reason = error_response(refused)
        self.metrics.rejected(reason)
        self.metrics.admitted(served.name, asked.priority, shed_outcome(refused))
        pairs = [
            (b"content-length", str(len(content)).encode()),
            (b"content-type", b"application/json"),
            *header_pairs(headers),
        ]
        return status, pairs, content

    def _declared_too_large(self, scope: Scope) -> bool:
        """Whether the request's ``Content-Length`` declares more than the limit."""
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    return int(value) > self.max_bytes
                except ValueError:
                    return False
        return False

    async def _read_body(self, receive: Receive, send: Send) -> bytes | None:
        """The whole body, counted as it arrives (chunked uploads are bounded too); ``None``
        once it went over the limit (413 sent) or the client went away."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # client went away
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(send)
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


class App(FastAPI):
    """The FastAPI app with :class:`Edge` in front of FastAPI's own per-request layers.

    Every HTTP request passes the edge first, so a well-formed predict request is answered by the
    fast lane before FastAPI's telemetry, error and body-limit middleware run (on the loaded
    single-node path those layers held a noticeable share of the event loop's GIL time). Lifespan
    events go straight to FastAPI. An exception a route raises reaches Starlette's error
    middleware first, whose handler (the app's ``Exception`` handler) logs it and answers the 500.
    """

    edge: Edge | None = None

    async def inner(self, scope: Scope, receive: Receive, send: Send) -> None:
        """FastAPI's own entry point: what the edge passes a request on to."""
        await super().__call__(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        edge = self.edge
        if edge is not None and scope["type"] == "http":
            await edge(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def _asked(scope: Scope) -> Asked | None:
    """What a predict request asks for as its headers say (:func:`.requests.read_headers`, the
    predict route's own reading), or ``None`` when a header is not a valid value."""
    headers = {
        k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k[:2] == b"x-"
    }
    try:
        read = read_headers(headers.get)
    except RequestError:
        return None
    tolerance = effective_tolerance(read.tolerance, read.slo_ms, read.deadline_ms)
    return Asked(read.priority, read.deadline_ms, tolerance, read.pinned)
