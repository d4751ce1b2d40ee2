"""The HTTP protocol of ``gnnaas serve``: uvicorn's, refusing shed requests before the app.

Under overload a refusal is the answer the server gives most often, so what it costs decides
what is left to serve the admitted traffic (``benchmarks/bench_shed_cost.py``). The edge
(:class:`~gnnaas.serving.http.edge.Edge`) already refuses a predict request that a refusal of
admission covers before reading its body; :class:`ShedProtocol` applies the same decision one
layer earlier, when uvicorn's httptools protocol has parsed a request's head and would start the
app's task: the refusal's bytes (the edge's status, headers, body and request id, from
:meth:`Edge.shed_answer <gnnaas.serving.http.edge.Edge.shed_answer>`) are written to the
connection at once, no ASGI task, scope or middleware runs, and the request's body, when it
arrives, is discarded by the parser as for any completed response. Admission still decides: the
protocol only reads the shed book it writes.

A connection keeps its keep-alive and pipelining as uvicorn handles them: the request is marked
answered and uvicorn's own completion callback runs (the next pipelined request starts; with
none, the keep-alive timer is set once the parser has read what followed in the same chunk, so a
request sent right behind the refusal is not cut by it). Anything else (no edge, nothing shed, a
request the book does not cover) goes to uvicorn's path unchanged. It extends uvicorn's
httptools protocol at the method that starts a request's task (``_start_asgi_task``, not a public
interface: ``tests/serving/test_protocol.py`` runs it on the installed uvicorn).
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

__all__ = ["ShedProtocol", "protocol_class"]


def protocol_class() -> type[ShedProtocol]:
    """The protocol class to give ``uvicorn.Config(http=...)``."""
    return ShedProtocol


def _edge(config: Any) -> Any:
    """The gnnaas app's edge under uvicorn's ``config``: the app given (or, from a factory, the
    one it built, inside uvicorn's middleware), ``None`` for another app."""
    edge = getattr(config, "gnnaas_edge", False)
    if edge is False:
        app = config.app if not isinstance(config.app, str) else config.loaded_app
        while app is not None and not hasattr(app, "edge"):
            app = getattr(app, "app", None)  # uvicorn's middleware keep the app they wrap
        edge = config.gnnaas_edge = None if app is None else app.edge
    return edge


class ShedProtocol(HttpToolsProtocol):  # type: ignore[misc]
    """uvicorn's httptools protocol, answering a shed predict request itself."""

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        edge = _edge(self.config)
        answer = None if edge is None else edge.shed_answer(cycle.scope)
        if answer is None:
            super()._start_asgi_task(cycle, app)
            return
        status, headers, body = answer
        head = [STATUS_LINE[status]]
        for name, value in (
            *self.server_state.default_headers,
            *headers,
            (b"x-request-id", edge.request_id(cycle.scope).encode()),
        ):
            head += [name, b": ", value, b"\r\n"]
        if not cycle.keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        cycle.response_started = cycle.response_complete = True
        if self.access_log:
            self.access_logger.info(
                '%s - "%s %s HTTP/%s" %d',
                self.client and f"{self.client[0]}:{self.client[1]}",
                cycle.scope["method"],
                cycle.scope["path"],
                cycle.scope["http_version"],
                status,
            )
        self.transport.write(b"".join(head) + body)
        if not cycle.keep_alive:
            self.transport.close()
        if self.pipeline:  # requests parsed behind it: uvicorn's callback starts the next
            cycle.on_response()
        else:  # the parser may still read one behind it in this very chunk
            self.loop.call_soon(self._refused, cycle)

    def _refused(self, cycle: Any) -> None:
        """After a refusal: uvicorn's completion callback (the keep-alive timer) when no request
        followed it; one that did was started as the refusal had completed."""
        if self.cycle is cycle:
            cycle.on_response()
        else:
            self.server_state.total_requests += 1
