"""The predict fast lane: well-formed requests answered without FastAPI's per-request machinery.

On a single-node request the event loop spends more time in the ASGI stack (dependency
resolution, pydantic body and header validation, routing, response classes) than in the model's
work (``benchmarks/results/latency.md`` measures the request path with and without it).
:func:`try_predict` takes a request whose body is a plain JSON object ``{"nodes": [int, ...]}``
with an optional ``"return"`` of ``"class"`` or ``"proba"`` for a served dataset, reads its
headers and checks its node ids with the route's own parser (:mod:`gnnaas.serving.http.requests`),
and answers it with the route's own :func:`~gnnaas.serving.http.routes.predict.answer`; a refusal
goes through the same error mapping as the route's. Bodies of any other form (embeddings,
malformed JSON, wrong types), unknown datasets and a router that is starting or stopping are left
to the FastAPI route, whose validation words them.

The lane and the route are two implementations of one endpoint, and the lane is always on: it
has no switch. ``tests/serving/test_fastlane.py`` sends the same requests, answered and refused
(400, 404, 413, 422, 503, 504), through both and requires the same status, headers and body.
"""

from __future__ import annotations

import orjson
from starlette.types import Scope, Send

from gnnaas.errors import ConfigError, DeadlineExceeded, OverloadedError
from gnnaas.inference.executor import Output
from gnnaas.serving.core.router import Router
from gnnaas.serving.http.requests import (
    START_KEY,
    RequestError,
    check_nodes,
    error_response,
    header_pairs,
    read_headers,
)
from gnnaas.serving.http.routes.predict import answer

__all__ = ["PREDICT_PREFIX", "predict_dataset", "send_json", "try_predict"]

PREDICT_PREFIX = "/v1/datasets/"
_SUFFIX = "/predict"
_BODY_KEYS = frozenset({"nodes", "return"})


def _body(body: bytes) -> tuple[list[int], Output] | None:
    """``(nodes, output)`` of a plain body, else ``None`` (the route's validation words it)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if type(data) is not dict or not data.keys() <= _BODY_KEYS:
        return None
    nodes = data.get("nodes")
    if type(nodes) is not list or not nodes:
        return None
    for v in nodes:
        if type(v) is not int:  # bools and floats are the route's to refuse
            return None
    mode = data.get("return", "class")
    if mode == "class" or mode == "proba":
        return nodes, mode
    return None  # "embedding" and every other value: left to the route


async def send_json(send: Send, status: int, content: bytes, headers: dict[str, str]) -> None:
    """Sends a whole JSON response with ``headers`` (the request id is added by the edge)."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-length", str(len(content)).encode()),
                (b"content-type", b"application/json"),
                *header_pairs(headers),
            ],
        }
    )
    await send({"type": "http.response.body", "body": content})


def predict_dataset(scope: Scope) -> str | None:
    """The dataset name of a ``POST /v1/datasets/{d}/predict`` (under the app's root path, Ray
    Serve's route prefix), else ``None``."""
    path = scope["path"]
    root = scope.get("root_path")
    if root and path.startswith(root):  # mounted under a prefix (Ray Serve's route prefix)
        path = path[len(root) :]
    if scope["method"] != "POST" or not path.startswith(PREDICT_PREFIX):
        return None
    if not path.endswith(_SUFFIX):
        return None
    name = path[len(PREDICT_PREFIX) : -len(_SUFFIX)]
    if not name or "/" in name or "%" in name:
        return None
    return name


async def try_predict(core: Router, scope: Scope, body: bytes, send: Send) -> bool:
    """Answers a ``POST /v1/datasets/{d}/predict`` with a plain body; ``False`` leaves it to
    FastAPI.

    Args:
        core (Router): the app's router.
        scope (Scope): the ASGI scope (the request's start time and id already in it).
        body (bytes): the whole request body.
        send (Send): the ASGI send callable.

    Returns:
        bool: whether the request was answered here.
    """
    name = predict_dataset(scope)
    if name is None or not core.started or core.stopping:
        return False
    served = core.registry.get(name)
    if served is None:
        return False
    headers: dict[str, str] = {}
    for key, value in scope["headers"]:
        headers[key.decode("latin-1")] = value.decode("latin-1")
    content_type = headers.get("content-type", "")
    if content_type.split(";")[0].strip().lower() != "application/json":
        return False
    parsed = _body(body)
    if parsed is None:
        return False
    nodes, output = parsed
    start = scope.get(START_KEY)
    if start is None:
        start = core.clock.now()
    try:
        asked = read_headers(headers.get)
        check_nodes(
            nodes,
            dataset=served.name,
            num_nodes=served.num_nodes,
            limit=core.settings.max_request_nodes,
        )
        content, extra = await answer(
            core,
            served,
            nodes,
            output=output,
            tolerance=asked.tolerance,
            slo_ms=asked.slo_ms,
            pinned=asked.pinned,
            deadline_ms=asked.deadline_ms,
            priority=asked.priority,
            start=start,
        )
    except (RequestError, OverloadedError, DeadlineExceeded, ConfigError) as exc:  # as the app
        status, content, extra, reason = error_response(exc)
        core.metrics.rejected(reason)
        await send_json(send, status, content, extra)
        return True
    await send_json(send, 200, content, extra)
    return True
