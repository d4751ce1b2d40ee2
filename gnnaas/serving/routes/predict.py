"""The model-less predict endpoint."""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Path, Request, Response

from gnnaas.errors import GnnaasError
from gnnaas.serving.deps import dataset_of, router_of
from gnnaas.serving.schemas import ErrorResponse, PredictRequest, PredictResponse

__all__ = ["START_KEY", "router"]

_log = logging.getLogger(__name__)

START_KEY = "gnnaas.start"
"""ASGI scope key holding ``time.perf_counter()`` when the request arrived (set by the app)."""

_MAX_OFFENDERS = 5

router = APIRouter(tags=["predict"])

_TOLERANCE_DOC = (
    "Accuracy points the client accepts to lose versus the most accurate variant "
    "(a finite number >= 0; default 0 = the most accurate variant)."
)
_SLO_DOC = (
    "Optional latency target in ms: the most accurate variant within tolerance that is predicted "
    "to meet it serves the request, else the fastest."
)
_PIN_DOC = "Optional variant id to serve with (debugging, A/B); skips selection. Unknown → 404."


def _header_number(name: str, text: str | None, *, strictly_positive: bool) -> float | None:
    if text is None:
        return None
    bound = "> 0" if strictly_positive else ">= 0"
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (strictly_positive and value == 0):
        raise HTTPException(400, f"{name} must be a finite number {bound} (got {text!r})")
    return value


def _offenders(nodes: list[int], num_nodes: int) -> list[str]:
    """``nodes[i]=v`` for the first ids outside ``[0, num_nodes)``."""
    out = []
    for i, v in enumerate(nodes):
        if not 0 <= v < num_nodes:
            out.append(f"nodes[{i}]={v}")
            if len(out) == _MAX_OFFENDERS:
                break
    return out


def _ms(value: float) -> float:
    return round(value, 3)


@router.post(
    "/datasets/{dataset}/predict",
    response_model=PredictResponse,
    responses={
        400: {"model": ErrorResponse, "description": "A header is not a valid number."},
        404: {"model": ErrorResponse, "description": "Unknown dataset or pinned variant."},
        413: {"model": ErrorResponse, "description": "Too many nodes or too large a body."},
        422: {"model": ErrorResponse, "description": "Malformed body or invalid node ids."},
        503: {"model": ErrorResponse, "description": "Queue full; see `Retry-After`."},
    },
)
async def predict(
    request: Request,
    dataset: Annotated[str, Path(description="Dataset name, e.g. `Cora` or `synth-small`.")],
    body: PredictRequest,
    x_accuracy_tolerance: Annotated[
        str | None, Header(alias="X-Accuracy-Tolerance", description=_TOLERANCE_DOC)
    ] = None,
    x_latency_slo_ms: Annotated[
        str | None, Header(alias="X-Latency-SLO-Ms", description=_SLO_DOC)
    ] = None,
    x_variant: Annotated[str | None, Header(alias="X-Variant", description=_PIN_DOC)] = None,
) -> Response:
    """Predicts node classes with the fastest variant within the accuracy tolerance."""
    start = request.scope.get(START_KEY) or time.perf_counter()
    core = router_of(request)
    served = dataset_of(core, dataset)
    metrics = core.metrics
    try:
        tolerance = _header_number(
            "X-Accuracy-Tolerance", x_accuracy_tolerance, strictly_positive=False
        )
        slo_ms = _header_number("X-Latency-SLO-Ms", x_latency_slo_ms, strictly_positive=True)
    except HTTPException:
        metrics.rejected("bad_header")
        raise
    nodes = body.nodes
    limit = core.settings.max_request_nodes
    if len(nodes) > limit:
        metrics.rejected("too_many_nodes")
        raise HTTPException(
            413, f"too many nodes: {len(nodes)} in one request, the limit is {limit}; split it"
        )
    num_nodes = served.num_nodes
    # min/max over a Python list beats building a tensor here; the executor thread converts
    # the ids of a whole batch at once.
    if min(nodes) < 0 or max(nodes) >= num_nodes:
        metrics.rejected("invalid_nodes")
        raise HTTPException(
            422,
            f"node ids must be in [0, {num_nodes}) for dataset {served.name!r}; "
            f"first offenders: {', '.join(_offenders(nodes, num_nodes))}",
        )

    try:
        out = await core.predict(
            served,
            nodes,
            proba=body.return_ == "proba",
            tolerance=tolerance or 0.0,
            slo_ms=slo_ms,
            pinned=x_variant,
        )
    except GnnaasError:
        raise  # mapped by the app's handlers
    except Exception as exc:
        _log.exception("predict on %s failed", served.name)
        raise HTTPException(
            500,
            f"serving this batch failed ({type(exc).__name__}: {exc}); see the server log",
        ) from exc

    variant_id = out.variant.variant_id
    total_ms = (time.perf_counter() - start) * 1e3
    metrics.served(
        served.name,
        variant_id,
        len(nodes),
        queue_s=out.queue_ms / 1e3,
        sample_s=out.sample_ms / 1e3,
        gather_s=out.gather_ms / 1e3,
        compute_s=out.compute_ms / 1e3,
        total_s=total_ms / 1e3,
    )
    timing = {
        "queue": _ms(out.queue_ms),
        "sample": _ms(out.sample_ms),
        "gather": _ms(out.gather_ms),
        "compute": _ms(out.compute_ms),
        "total": _ms(total_ms),
    }
    payload = {
        "variant": out.variant.describe(),
        "predictions": out.predictions,
        "timing_ms": timing,
    }
    server_timing = ", ".join(
        f"{stage};dur={timing[stage]}" for stage in ("queue", "sample", "gather", "compute")
    )
    return Response(
        json.dumps(payload, separators=(",", ":")).encode(),
        media_type="application/json",
        headers={"X-Variant": variant_id, "Server-Timing": server_timing},
    )
