"""The HTTP protocol refuses a shed request before the app: a real uvicorn server on 127.0.0.1.

The app runs on a :class:`FakeClock` (a refusal admission wrote holds until the test says), in
uvicorn on a thread of its own, with :func:`~gnnaas.serving.http.protocol.protocol_class`; the
test speaks HTTP/1.1 over a raw socket, so it decides when (and whether) a body is sent.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from serving_fakes import make_toy_registry

from gnnaas.errors import OverloadedError
from gnnaas.serving import Settings, create_app
from gnnaas.serving.core.clock import FakeClock
from gnnaas.serving.core.shedding import Shed
from gnnaas.serving.http.protocol import protocol_class

PATH = "/v1/datasets/toy/predict"
DETAIL = "X-Deadline-Ms 50: a low-priority request may wait 25% of its slack; retry later"


class _Server(uvicorn.Server):
    """uvicorn's server, saying when it accepts connections."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.up = threading.Event()

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        self.up.set()


@pytest.fixture
def served() -> Iterator[tuple[Any, socket.socket]]:
    """The toy app served by uvicorn with gnnaas' protocol, a low-priority refusal recorded."""
    registry, _ = make_toy_registry()
    app = create_app(Settings(max_wait_ms=0.0), registry=registry, clock=FakeClock())
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, http=protocol_class(), log_level="warning", lifespan="on")
    server = _Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        assert server.up.wait(30)
        error = OverloadedError(DETAIL, 2.0, cause="deadline", hold_s=1.0)
        shed = Shed(until=1.0, error=error, deadline_ms=50.0, tolerance=2.0)
        app.state.router.shed.record("toy", "low", shed)  # the clock stands at 0
        with socket.create_connection(sock.getsockname(), timeout=10) as conn:
            yield app, conn
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def _head(headers: dict[str, str], length: int) -> bytes:
    lines = [f"POST {PATH} HTTP/1.1", "Host: gnnaas", "Content-Type: application/json"]
    lines += [f"{k}: {v}" for k, v in headers.items()] + [f"Content-Length: {length}", "", ""]
    return "\r\n".join(lines).encode()


def _received(conn: socket.socket) -> bytes:
    """What ``conn`` has next; a connection the server closed fails the test (no spinning)."""
    data = conn.recv(65536)
    if not data:
        raise ConnectionError("the server closed the connection before a whole response")
    return data


def _response(conn: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a Content-Length, read off ``conn``."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += _received(conn)
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    while len(body) < int(headers["content-length"]):
        body += _received(conn)
    return int(status_line.split()[1]), headers, body


def test_a_shed_request_is_answered_before_its_body_and_the_connection_goes_on(
    served: tuple[Any, socket.socket],
) -> None:
    app, conn = served
    edge, reached = app.edge, []
    checked = edge._checked

    async def counted(*args: Any) -> None:  # the edge's path for a request that reached the app
        reached.append(args[0]["headers"])
        await checked(*args)

    edge._checked = counted
    body = json.dumps({"nodes": [1]}).encode()
    low = {"X-Priority": "low", "X-Deadline-Ms": "40", "X-Accuracy-Tolerance": "1"}
    conn.sendall(_head({**low, "X-Request-Id": "shed-1"}, len(body)))  # the head alone
    status, headers, content = _response(conn)
    assert status == 503 and headers["retry-after"] == "2"
    assert headers["x-request-id"] == "shed-1" and headers["content-type"] == "application/json"
    assert json.loads(content) == {"detail": DETAIL}
    assert reached == []  # answered by the protocol: the app never saw it
    # The body that follows is dropped; the connection serves the next requests, a request the
    # refusal does not cover (a longer deadline) going through the app to the model.
    longer = {**low, "X-Deadline-Ms": "900"}
    conn.sendall(body + _head(longer, len(body)) + body)
    status, headers, content = _response(conn)
    assert status == 200, content
    assert json.loads(content)["variant"]["id"] == headers["x-variant"]
    assert len(reached) == 1
    # A pipelined pair: the refused one and a covered-not one behind it, both answered in order.
    conn.sendall(_head(low, len(body)) + body + _head(longer, len(body)) + body)
    assert _response(conn)[0] == 503 and _response(conn)[0] == 200
    assert len(reached) == 2
    conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: gnnaas\r\n\r\n")
    status, _, metrics = _response(conn)
    shed = 'gnnaas_admission_total{dataset="toy",outcome="shed_deadline",priority="low"} 2.0'
    assert status == 200 and shed in metrics.decode()


def test_without_keep_alive_the_refusal_closes_the_connection(
    served: tuple[Any, socket.socket],
) -> None:
    _, conn = served
    asked = {"X-Priority": "low", "X-Deadline-Ms": "50", "X-Accuracy-Tolerance": "0"}
    conn.sendall(_head({**asked, "Connection": "close"}, 2))
    status, headers, _ = _response(conn)
    assert status == 503 and headers["connection"] == "close"
    assert conn.recv(1) == b""  # closed by the server
