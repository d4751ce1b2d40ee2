"""The predict fast lane: well-formed requests answered without FastAPI's per-request machinery.

Measured with py-spy on one core (synth-flickr@0.2, one node per request, sequential): the event
loop spent about 0.7 ms per request in the ASGI stack (dependency resolution, pydantic body and
header validation, routing, response classes) around 0.2 ms of model work. :func:`try_predict` takes
a request that is certainly valid (a JSON object ``{"nodes": [int, ...]}`` with an optional
``"return"`` of ``"class"`` or ``"proba"``, well-formed headers, a served dataset, node ids in
range, a known pinned variant) and answers it with the route's own
:func:`~gnnaas.serving.routes.predict.answer`, so body and headers are byte for byte the route's.
Anything else (embeddings, every error, every unusual form) is left to the FastAPI route, which owns
the error contract (ARCHITECTURE §6): the fast lane never answers an error except 503 for a full
queue, with the route's body and ``Retry-After``.
"""

from __future__ import annotations

import math
import time
from typing import Any

import orjson

from gnnaas.errors import OverloadedError
from gnnaas.serving.executor import Output
from gnnaas.serving.router import Router
from gnnaas.serving.routes.predict import START_KEY, answer

__all__ = ["PREDICT_PREFIX", "try_predict"]

PREDICT_PREFIX = "/v1/datasets/"
_SUFFIX = "/predict"
_BODY_KEYS = frozenset({"nodes", "return"})


def _number(text: bytes | None, *, strictly_positive: bool) -> float | None | bool:
    """The header's number, ``None`` when absent, ``False`` when the route must judge it."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return False
    if not math.isfinite(value) or value < 0 or (strictly_positive and value == 0):
        return False
    return value


def _nodes(body: bytes, num_nodes: int, limit: int) -> tuple[list[int], Output] | None:
    """``(nodes, output)`` of a certainly valid body, else ``None``."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if type(data) is not dict or not data.keys() <= _BODY_KEYS:
        return None
    nodes = data.get("nodes")
    if type(nodes) is not list or not 0 < len(nodes) <= limit:
        return None
    for v in nodes:
        if type(v) is not int:  # bools and floats are the route's to refuse
            return None
    if min(nodes) < 0 or max(nodes) >= num_nodes:
        return None
    mode = data.get("return", "class")
    if mode == "class" or mode == "proba":
        return nodes, mode
    return None  # "embedding" and every error: left to the route


async def try_predict(core: Router, scope: dict[str, Any], body: bytes, send: Any) -> bool:
    """Answers a well-formed ``POST /v1/datasets/{d}/predict``; ``False`` leaves it to FastAPI.

    Args:
        core (Router): the app's router.
        scope (dict): the ASGI scope (the request's start time and id already in it).
        body (bytes): the whole request body.
        send: the ASGI send callable.

    Returns:
        bool: whether the request was answered here.
    """
    path = scope["path"]
    if scope["method"] != "POST" or not path.startswith(PREDICT_PREFIX):
        return False
    if not path.endswith(_SUFFIX) or not core.started or core.stopping:
        return False
    name = path[len(PREDICT_PREFIX) : -len(_SUFFIX)]
    if not name or "/" in name or "%" in name:
        return False
    served = core.registry.get(name)
    if served is None:
        return False
    content_type = tolerance_h = slo_h = pinned_h = None
    for key, value in scope["headers"]:
        if key == b"content-type":
            content_type = value
        elif key == b"x-accuracy-tolerance":
            tolerance_h = value
        elif key == b"x-latency-slo-ms":
            slo_h = value
        elif key == b"x-variant":
            pinned_h = value
    if content_type is None or content_type.split(b";")[0].strip().lower() != b"application/json":
        return False
    tolerance = _number(tolerance_h, strictly_positive=False)
    slo_ms = _number(slo_h, strictly_positive=True)
    if tolerance is False or slo_ms is False:
        return False
    pinned = None
    if pinned_h is not None:
        try:
            pinned = pinned_h.decode("latin-1")
        except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
            return False
        if pinned not in served.variants:
            return False
    parsed = _nodes(body, served.num_nodes, core.settings.max_request_nodes)
    if parsed is None:
        return False
    nodes, output = parsed
    start = scope.get(START_KEY) or time.perf_counter()
    try:
        content, headers = await answer(
            core,
            served,
            nodes,
            output=output,
            tolerance=tolerance,  # type: ignore[arg-type]
            slo_ms=slo_ms,  # type: ignore[arg-type]
            pinned=pinned,
            start=start,
        )
        status = 200
    except OverloadedError as exc:  # the route's 503, as its exception handler answers it
        core.metrics.rejected("overloaded")
        content = orjson.dumps({"detail": str(exc)})
        headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
        status = 503
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-length", str(len(content)).encode()),
                (b"content-type", b"application/json"),
                *raw,
            ],
        }
    )
    await send({"type": "http.response.body", "body": content})
    return True
