"""One parser and one error mapping for predict requests, shared by the route and the fast lane.

The FastAPI route (:mod:`gnnaas.serving.http.routes.predict`) and the edge's fast lane
(:mod:`gnnaas.serving.http.fastlane`) read a predict request's headers with :func:`read_headers`
and check its node ids with :func:`check_nodes`; both raise :class:`RequestError`, and every
refusal either of them answers goes through :func:`error_response`. A change to the contract
(a header, a limit, a status code) is therefore one edit.

Example:
    >>> read_headers({"x-accuracy-tolerance": "2"}.get).tolerance
    2.0
    >>> error_response(RequestError(400, "bad", "bad_header"))[:2]
    (400, b'{"detail":"bad"}')
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import orjson

from gnnaas.errors import ConfigError, DeadlineExceeded, OverloadedError, UnmeetableDeadline
from gnnaas.policy import LOSS_MARGIN
from gnnaas.serving.core.deadlines import SLACK_SHARES, share_words
from gnnaas.serving.core.protect import CUT, LAG_SHARE, RECOVERY_S
from gnnaas.serving.core.queues import AGING_S, PRIORITIES

__all__ = [
    "HEADER_DOCS",
    "REQUEST_ID_KEY",
    "START_KEY",
    "PredictHeaders",
    "RequestError",
    "check_nodes",
    "error_response",
    "header_number",
    "header_pairs",
    "read_headers",
]

START_KEY = "gnnaas.start"
"""ASGI scope key holding when the request arrived, on the router's clock (set by the edge)."""

REQUEST_ID_KEY = "gnnaas.request_id"
"""ASGI scope key holding the request's id, also sent as ``X-Request-Id`` (set by the edge)."""

_MAX_OFFENDERS = 5

HEADER_DOCS: dict[str, str] = {
    "X-Accuracy-Tolerance": (
        "Accuracy points the client accepts to lose versus the most accurate variant (a finite "
        "number >= 0; default 0 = the most accurate variant, or any variant when only "
        "X-Latency-SLO-Ms or X-Deadline-Ms is given), admitted by the paired rule: a variant's "
        "loss is not measurably above it and, with 95% confidence, at most "
        f"{LOSS_MARGIN:g} point{'s' if LOSS_MARGIN != 1 else ''} more."
    ),
    "X-Latency-SLO-Ms": (
        "Optional latency target in ms, a soft one: the most accurate variant within tolerance "
        "predicted to meet it serves the request, else the fastest. Without "
        "X-Accuracy-Tolerance every variant is within tolerance."
    ),
    "X-Variant": (
        "Optional variant id to serve with (debugging, A/B); skips selection. Unknown → 404."
    ),
    "X-Deadline-Ms": (
        "Optional deadline in ms from the request's arrival at the server, a hard one (while "
        "the server's event loop runs behind, the time a request waits before the server reads "
        "it, and its answer's wait beyond computing before it is sent, count against it, as the "
        "loop's measured lag): "
        "the variant is chosen as for X-Latency-SLO-Ms (the smaller of the two when both are "
        "given), and when no variant within tolerance is predicted to answer in time under the "
        "current load the answer is 503 with Retry-After at once, or 422 without it when even "
        "the fastest of them alone on an idle server would not (do not retry that one as is); a "
        "request still queued at its deadline, or whose batch is predicted to end after it, is "
        "never computed: 504 (also when its answer was ready only after the deadline less the "
        "wait it met: discarded, never a late 200)."
    ),
    "X-Priority": (
        f"Optional `{'`, `'.join(PRIORITIES[:-1])}` or `{PRIORITIES[-1]}` (default `normal`): "
        f"batches take higher priorities first (a request that has waited {AGING_S:g} s "
        "competes as high, so none starves while the server keeps up); under overload low "
        "requests are shed first, then normal ones (503 + Retry-After); with X-Deadline-Ms a "
        f"normal request may wait {share_words(SLACK_SHARES[1])} of its slack (deadline minus "
        f"its service), a low one {share_words(SLACK_SHARES[2])}, so that a high one still "
        "makes its deadline; and each time a high one misses its deadline while the event "
        f"loop's recent lag beyond computing is {share_words(LAG_SHARE)} of it or more, the "
        "rate of low "
        f"requests with a deadline admitted is cut to {CUT['low']:.0%}, that of normal ones to "
        f"{CUT['normal']:.0%}, growing back over {RECOVERY_S:g} s."
    ),
}
"""What each request header of ``POST /v1/datasets/{d}/predict`` means (OpenAPI,
``GET /v1/datasets/{d}/variants`` and the README show them), its numbers written from the
constants that apply them."""


class RequestError(Exception):
    """A request refused with a status code and a ``detail`` a person can act on.

    Args:
        status (int): the HTTP status (400, 404, 413, 422...).
        detail (str): the message of the ``{"detail": ...}`` body.
        reason (str): the ``gnnaas_rejected_total`` reason it counts as.
        headers (dict[str, str], optional): extra response headers. (default: none)
    """

    def __init__(
        self, status: int, detail: str, reason: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.reason = reason
        self.headers = headers or {}


def header_number(name: str, text: str | None, *, strictly_positive: bool) -> float | None:
    """The number a header holds, ``None`` when absent.

    Raises:
        RequestError: 400 when it is not a finite number ``>= 0`` (``> 0`` when
            ``strictly_positive``).
    """
    if text is None:
        return None
    bound = "> 0" if strictly_positive else ">= 0"
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (strictly_positive and value == 0):
        detail = f"{name} must be a finite number {bound} (got {text!r})"
        raise RequestError(400, detail, "bad_header")
    return value


@dataclass(frozen=True)
class PredictHeaders:
    """What a predict request's headers ask for.

    Args:
        tolerance (float, optional): ``X-Accuracy-Tolerance`` (``None``: not given).
        slo_ms (float, optional): ``X-Latency-SLO-Ms``.
        pinned (str, optional): ``X-Variant``.
        deadline_ms (float, optional): ``X-Deadline-Ms``, from the request's arrival.
        priority (str, optional): ``X-Priority``: ``high``, ``normal`` or ``low``.
            (default: ``"normal"``)
    """

    tolerance: float | None = None
    slo_ms: float | None = None
    pinned: str | None = None
    deadline_ms: float | None = None
    priority: str = "normal"


def read_headers(get: Callable[[str], str | None]) -> PredictHeaders:
    """Parses a predict request's headers.

    Args:
        get (Callable[[str], str | None]): the value of a (lower-case) header name, ``None``
            when absent.

    Raises:
        RequestError: 400 for a header that is not a valid value.
    """
    priority = get("x-priority")
    if priority is not None:
        priority = priority.strip().lower()
        if priority not in PRIORITIES:
            raise RequestError(
                400,
                f"X-Priority must be one of {', '.join(PRIORITIES)} (got {get('x-priority')!r})",
                "bad_header",
            )
    return PredictHeaders(
        tolerance=header_number(
            "X-Accuracy-Tolerance", get("x-accuracy-tolerance"), strictly_positive=False
        ),
        slo_ms=header_number("X-Latency-SLO-Ms", get("x-latency-slo-ms"), strictly_positive=True),
        pinned=get("x-variant"),
        deadline_ms=header_number("X-Deadline-Ms", get("x-deadline-ms"), strictly_positive=True),
        priority=priority or "normal",
    )


def _offenders(nodes: Sequence[int], num_nodes: int) -> list[str]:
    """``nodes[i]=v`` for the first ids outside ``[0, num_nodes)``."""
    out = []
    for i, v in enumerate(nodes):
        if not 0 <= v < num_nodes:
            out.append(f"nodes[{i}]={v}")
            if len(out) == _MAX_OFFENDERS:
                break
    return out


def check_nodes(nodes: Sequence[int], *, dataset: str, num_nodes: int, limit: int) -> None:
    """Checks a request's node ids (already integers) against the limit and the graph.

    Raises:
        RequestError: 413 for more than ``limit`` ids; 422 naming the first ids outside
            ``[0, num_nodes)``.
    """
    if len(nodes) > limit:
        raise RequestError(
            413,
            f"too many nodes: {len(nodes)} in one request, the limit is {limit}; split it",
            "too_many_nodes",
        )
    # min/max over a Python list beats building a tensor here; the executor thread converts
    # the ids of a whole batch at once.
    if min(nodes) < 0 or max(nodes) >= num_nodes:
        raise RequestError(
            422,
            f"node ids must be in [0, {num_nodes}) for dataset {dataset!r}; "
            f"first offenders: {', '.join(_offenders(nodes, num_nodes))}",
            "invalid_nodes",
        )


def _retry_after(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))


def error_response(exc: Exception) -> tuple[int, bytes, dict[str, str], str]:
    """``(status, JSON body, headers, rejection reason)`` of a refused request.

    :class:`RequestError` as it says; ``OverloadedError`` 503 with ``Retry-After`` (a full queue,
    a request shed for higher priorities, a deadline no variant is predicted to meet under the
    current load); ``UnmeetableDeadline`` 422 without ``Retry-After`` (a deadline shorter than the
    fastest admissible variant's profiled time alone: the request as sent can never be served,
    and a 4xx is what clients and proxies do not retry); ``DeadlineExceeded`` 504 (the deadline
    passed before the request was computed); a ``ConfigError`` that is a ``LookupError`` (an
    unknown dataset or pinned variant) 404, any other ``ConfigError`` 400.

    Raises:
        TypeError: ``exc`` is none of these (an internal error: the app's 500 handles it).
    """
    headers: dict[str, str]
    if isinstance(exc, RequestError):
        status, detail, headers, reason = exc.status, exc.detail, exc.headers, exc.reason
    elif isinstance(exc, OverloadedError):
        status, detail, reason = 503, str(exc), "overloaded"
        headers = {"Retry-After": _retry_after(exc.retry_after_s)}
    elif isinstance(exc, DeadlineExceeded):
        status, detail, headers, reason = 504, str(exc), {}, "expired"
    elif isinstance(exc, UnmeetableDeadline):
        status, detail, headers, reason = 422, str(exc), {}, "deadline_unmeetable"
    elif isinstance(exc, ConfigError):
        not_found = isinstance(exc, LookupError)
        status, detail, headers = (404 if not_found else 400), str(exc), {}
        reason = "not_found" if not_found else "bad_value"
    else:
        raise TypeError(f"error_response: {type(exc).__name__} is not a request error") from exc
    return status, orjson.dumps({"detail": detail}), headers, reason


def header_pairs(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """ASGI header pairs of ``headers``."""
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
