"""gnnaas's middleware in Ray Serve's proxy: a request the proxy leaves unanswered (its replica
died) gets 503 with ``Retry-After`` and a detail; answered requests pass with one request id."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gnnaas.serving.deploy.proxy import LOST_DETAIL, LostReplicaMiddleware, middlewares

SCOPE = {"type": "http", "method": "POST", "path": "/v1/datasets/toy/predict", "headers": []}


async def _lost(scope: Any, receive: Any, send: Any) -> None:
    """Serve's proxy when the replica died: no response at all."""


async def _failed(scope: Any, receive: Any, send: Any) -> None:
    raise RuntimeError("ActorDiedError")


async def _answered(scope: Any, receive: Any, send: Any) -> None:
    """The app's answer with its request id, and the proxy's copy of it added after."""
    headers = [(b"x-request-id", b"abc"), (b"content-type", b"application/json")]
    headers.append((b"x-request-id", b"abc"))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"{}"})


def _call(app: Any) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(LostReplicaMiddleware(app)(dict(SCOPE), receive, send))
    return sent


@pytest.mark.parametrize("app", [_lost, _failed])
def test_a_lost_request_gets_503_with_retry_after(
    app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GNNAAS_RETRY_AFTER_S", "2.5")
    start, body = _call(app)
    headers = dict(start["headers"])
    assert (start["status"], headers[b"retry-after"]) == (503, b"3")
    assert json.loads(body["body"]) == {"detail": LOST_DETAIL}
    assert headers[b"content-type"] == b"application/json"


def test_an_answer_passes_with_one_request_id() -> None:
    start, body = _call(_answered)
    assert start["status"] == 200 and body["body"] == b"{}"
    assert [v for k, v in start["headers"] if k == b"x-request-id"] == [b"abc"]


def test_the_proxy_callback_returns_the_middleware() -> None:
    (middleware,) = middlewares()
    assert middleware.cls is LostReplicaMiddleware
