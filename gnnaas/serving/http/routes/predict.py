"""The model-less predict endpoint.

The route builds its JSON body itself with orjson. Bodies with many values (``proba`` or
``embedding`` rows for many nodes) are encoded in a worker thread, in chunks of rows: orjson holds
the GIL while it runs, so short chunks let the event loop take turns instead of stalling every
other request for the whole body.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

import anyio.to_thread
import orjson
from fastapi import APIRouter, Header, Path, Request, Response

from gnnaas.inference.executor import Output
from gnnaas.serving.core.registry import ServedDataset
from gnnaas.serving.core.router import Router
from gnnaas.serving.http.deps import dataset_of, router_of
from gnnaas.serving.http.requests import HEADER_DOCS, START_KEY, check_nodes, read_headers
from gnnaas.serving.http.schemas import ErrorResponse, PredictRequest, PredictResponse

__all__ = ["CHUNK_ROWS", "OFFLOAD_VALUES", "answer", "encode_payload", "router"]

_log = logging.getLogger(__name__)

#: bodies with more values than this are encoded in a worker thread
OFFLOAD_VALUES = 16_384
#: rows per orjson call when encoding in a worker thread
CHUNK_ROWS = 256

router = APIRouter(tags=["predict"])


def _ms(value: float) -> float:
    return round(value, 3)


def encode_payload(payload: dict[str, Any], chunk_rows: int | None = None) -> bytes:
    """Compact JSON of a predict body, ``predictions`` encoded ``chunk_rows`` rows at a time.

    The result parses to the same value as ``json.dumps(payload)``; between chunks another thread
    (the event loop) can take the GIL.

    Args:
        payload (dict): ``variant``, ``predictions`` and ``timing_ms``, in that order.
        chunk_rows (int, optional): rows per orjson call. (default: :data:`CHUNK_ROWS`)

    Returns:
        bytes: the UTF-8 JSON body.
    """
    rows = chunk_rows or CHUNK_ROWS
    option = orjson.OPT_SERIALIZE_NUMPY
    preds = payload["predictions"]
    parts = [
        orjson.dumps(preds[i : i + rows], option=option)[1:-1]  # "[a,b]" -> "a,b"
        for i in range(0, len(preds), rows)
    ]
    rest = {k: v for k, v in payload.items() if k != "predictions"}
    head = orjson.dumps({"variant": rest.pop("variant")}, option=option)[:-1]
    tail = orjson.dumps(rest, option=option)[1:] if rest else b"}"
    sep = b"," if rest else b""
    return b"".join((head, b',"predictions":[', b",".join(parts), b"]", sep, tail))


def _header(description: str, example: str) -> dict[str, Any]:
    return {"description": description, "schema": {"type": "string", "example": example}}


_REQUEST_ID = _header("Id of this request in the server log.", "9f2c41d0-17")
_SUCCESS_HEADERS = {
    "X-Variant": _header("Id of the variant that served the request.", "sage-greedy-8x"),
    "Server-Timing": _header(
        "Server-side ms per stage (queue, sample, gather, compute) and in all (total), as in "
        "`timing_ms`.",
        "queue;dur=0.05, sample;dur=0.31, gather;dur=0.02, compute;dur=0.4, total;dur=0.9",
    ),
    "X-Request-Id": _REQUEST_ID,
}


@router.post(
    "/datasets/{dataset}/predict",
    response_model=PredictResponse,
    responses={
        200: {"headers": _SUCCESS_HEADERS},
        400: {"model": ErrorResponse, "description": "A header is not a valid value."},
        404: {"model": ErrorResponse, "description": "Unknown dataset or pinned variant."},
        413: {"model": ErrorResponse, "description": "Too many nodes or too large a body."},
        422: {
            "model": ErrorResponse,
            "description": "Malformed body, invalid node ids, or an X-Deadline-Ms shorter than "
            "the fastest admissible variant's profiled time alone (never met under any load: "
            "do not retry as is; no `Retry-After`).",
        },
        500: {
            "model": ErrorResponse,
            "description": "Internal error; `detail` names the request id the server log has.",
            "headers": {"X-Request-Id": _REQUEST_ID},
        },
        503: {
            "model": ErrorResponse,
            "description": "Queue full (for the request's priority), shed for higher-priority "
            "traffic, no variant predicted to meet X-Deadline-Ms under the current load, "
            "starting or shutting down; "
            "retry after `Retry-After`.",
            "headers": {"Retry-After": _header("Seconds to wait before retrying.", "1")},
        },
        504: {
            "model": ErrorResponse,
            "description": "X-Deadline-Ms passed while the request was queued; it was not "
            "computed.",
        },
    },
)
async def predict(
    request: Request,
    dataset: Annotated[str, Path(description="Dataset name, e.g. `Cora` or `synth-small`.")],
    body: PredictRequest,
    # The headers are declared for the OpenAPI schema; read_headers parses them.
    x_accuracy_tolerance: Annotated[
        str | None,
        Header(alias="X-Accuracy-Tolerance", description=HEADER_DOCS["X-Accuracy-Tolerance"]),
    ] = None,
    x_latency_slo_ms: Annotated[
        str | None, Header(alias="X-Latency-SLO-Ms", description=HEADER_DOCS["X-Latency-SLO-Ms"])
    ] = None,
    x_variant: Annotated[
        str | None, Header(alias="X-Variant", description=HEADER_DOCS["X-Variant"])
    ] = None,
    x_deadline_ms: Annotated[
        str | None, Header(alias="X-Deadline-Ms", description=HEADER_DOCS["X-Deadline-Ms"])
    ] = None,
    x_priority: Annotated[
        str | None, Header(alias="X-Priority", description=HEADER_DOCS["X-Priority"])
    ] = None,
) -> Response:
    """Predicts classes, probabilities or embeddings with the fastest variant within tolerance."""
    core = router_of(request)
    start = request.scope.get(START_KEY)
    if start is None:
        start = core.clock.now()
    served = dataset_of(core, dataset)
    # The fast lane reads the same headers with the same parser (gnnaas.serving.http.requests);
    # its RequestError is answered by the app's handler with the same mapping.
    asked = read_headers(request.headers.get)
    check_nodes(
        body.nodes,
        dataset=served.name,
        num_nodes=served.num_nodes,
        limit=core.settings.max_request_nodes,
    )
    # Unexpected errors propagate: the app logs them with the request id and answers 500.
    content, headers = await answer(
        core,
        served,
        body.nodes,
        output=body.return_,
        tolerance=asked.tolerance,  # None: 0, or unbounded with an SLO or a deadline alone
        slo_ms=asked.slo_ms,
        pinned=asked.pinned,
        deadline_ms=asked.deadline_ms,
        priority=asked.priority,
        start=start,
    )
    return Response(content, media_type="application/json", headers=headers)


async def answer(
    core: Router,
    served: ServedDataset,
    nodes: list[int],
    *,
    output: Output,
    tolerance: float | None,
    slo_ms: float | None,
    pinned: str | None,
    start: float,
    deadline_ms: float | None = None,
    priority: str = "normal",
) -> tuple[bytes, dict[str, str]]:
    """Serves validated node ids and builds the response: the JSON body and its headers.

    The one place a predict answer is made, for the route above and for the app's fast lane
    (:mod:`gnnaas.serving.http.fastlane`), so both answer byte for byte alike.

    Raises:
        NotFoundError: unknown pinned variant.
        OverloadedError: the chosen variant's queue is full, or the router is stopping.
    """
    metrics = core.metrics
    out = await core.predict(
        served,
        nodes,
        output=output,
        tolerance=tolerance,
        slo_ms=slo_ms,
        pinned=pinned,
        deadline_ms=deadline_ms,
        priority=priority,
        arrived=start,
    )
    variant_id = out.variant.variant_id
    total_ms = (core.clock.now() - start) * 1e3
    metrics.served(
        served.name,
        variant_id,
        len(nodes),
        queue_s=out.queue_ms / 1e3,
        sample_s=out.sample_ms / 1e3,
        gather_s=out.comm_ms / 1e3,
        compute_s=out.compute_ms / 1e3,
        total_s=total_ms / 1e3,
    )
    timing = {
        "queue": _ms(out.queue_ms),
        "sample": _ms(out.sample_ms),
        "gather": _ms(out.comm_ms),
        "compute": _ms(out.compute_ms),
        "total": _ms(total_ms),
    }
    payload = {
        "variant": out.variant.describe(),
        "predictions": out.predictions,
        "timing_ms": timing,
    }
    server_timing = ", ".join(
        f"{stage};dur={timing[stage]}"
        for stage in ("queue", "sample", "gather", "compute", "total")
    )
    first = out.predictions[0] if out.predictions else None
    width = len(first) if isinstance(first, list) else 1  # proba, embedding or multi-label rows
    if len(nodes) * width > OFFLOAD_VALUES:
        content = await anyio.to_thread.run_sync(encode_payload, payload)
    else:
        content = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
    headers = {
        "X-Variant": variant_id,
        "Server-Timing": server_timing,
        "X-Graph-Version": str(out.graph_version),
    }
    return content, headers
