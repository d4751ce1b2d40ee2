"""What gnnaas adds to Ray Serve's HTTP proxy: a 503 for a request whose replica was lost.

A request travels in one hop, from Serve's proxy to a replica that runs the whole app. When that
replica dies while it holds the request (killed, out of memory, its node gone), the proxy's call
raises one of Ray's actor errors and Serve writes no response for it: uvicorn, under the proxy,
then answers a bare ``500 Internal Server Error`` in plain text. :class:`LostReplicaMiddleware`
sits in the proxy around Serve's own app and answers such a request, the only kind the proxy
leaves unanswered, as gnnaas answers an overload: **503** with ``Retry-After`` and a
``{"detail": ...}`` body (Serve's router sends the client's retry to a live replica). It also keeps
one ``X-Request-Id`` in each response: the proxy adds its own next to the app's (the same id, the
app echoes the proxy's).

Ray builds the proxy's middlewares from the function named by the environment variable
``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`` (:data:`PROXY_CALLBACK`), read where the proxy
starts: :func:`gnnaas.serving.deploy.ray.start_ray` sets it before it starts a local Ray; on a
cluster, set it in the environment of ``ray start`` on every node. ``Retry-After`` is
``GNNAAS_RETRY_AFTER_S`` of the proxy's environment (default: 1 s, as the server's).

This module imports neither Ray nor torch: the proxy's process stays as small as Serve makes it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from typing import Any

import orjson

__all__ = [
    "LOST_DETAIL",
    "PROXY_CALLBACK",
    "PROXY_CALLBACK_ENV",
    "LostReplicaMiddleware",
    "middlewares",
]

_log = logging.getLogger(__name__)

PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
"""Ray's environment variable naming the function that returns the proxy's middlewares."""

PROXY_CALLBACK = f"{__name__}:middlewares"
"""Its value for gnnaas: :func:`middlewares`."""

LOST_DETAIL = (
    "the replica serving this request was lost while answering; Ray Serve is replacing it "
    "and sends new requests to the live replicas; retry"
)
"""The ``detail`` of the 503 answered for a request whose replica died."""

_REQUEST_ID = b"x-request-id"


def _retry_after() -> bytes:
    try:
        seconds = float(os.environ.get("GNNAAS_RETRY_AFTER_S", "1"))
    except ValueError:
        seconds = 1.0
    return str(max(1, math.ceil(seconds))).encode()


class LostReplicaMiddleware:
    """Answers 503 with ``Retry-After`` for an HTTP request the proxy left unanswered, and keeps
    one ``X-Request-Id`` per response.

    Args:
        app (ASGIApp): the proxy's app (Serve's, with its request-id middleware).
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self._body = orjson.dumps({"detail": LOST_DETAIL})
        self._headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(self._body)).encode()),
            (b"retry-after", _retry_after()),
        ]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_once(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = message.get("headers")
                if headers and sum(1 for k, _ in headers if k.lower() == _REQUEST_ID) > 1:
                    seen = False
                    kept = []
                    for key, value in headers:
                        if key.lower() == _REQUEST_ID:
                            if seen:
                                continue
                            seen = True
                        kept.append((key, value))
                    message["headers"] = kept
            await send(message)

        try:
            await self.app(scope, receive, send_once)
        except Exception:  # Serve answers its own errors; this is a lost call all the same
            if started:
                raise
            _log.warning("request %s lost by the proxy", scope.get("path"), exc_info=True)
        if not started:
            # The replica died with the request (or the client left: then this goes nowhere).
            with contextlib.suppress(Exception):
                await send({"type": "http.response.start", "status": 503, "headers": self._headers})
                await send({"type": "http.response.body", "body": self._body})


def middlewares() -> list[Any]:
    """The proxy's middlewares (Ray calls this where ``PROXY_CALLBACK`` names it)."""
    from starlette.middleware import Middleware

    return [Middleware(LostReplicaMiddleware)]
