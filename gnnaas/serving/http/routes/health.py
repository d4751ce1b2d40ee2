"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from gnnaas.serving.core.metrics import CONTENT_TYPE, ServingMetrics
from gnnaas.serving.core.router import Router
from gnnaas.serving.http.schemas import Health, Readiness

__all__ = ["readiness", "router"]

router = APIRouter(tags=["health"])


def readiness(core: Router) -> Readiness:
    """Whether ``core`` can serve, and why not: the body of ``/readyz`` (also what a Ray replica
    reports to the deployment's catalog)."""
    reasons = list(core.registry.not_ready_reasons())
    if not core.started:
        reasons.insert(0, "starting: variants are being loaded and warmed up")
    if core.stopping:
        reasons.insert(0, "shutting down")
    return Readiness(
        status="not ready" if reasons else "ready",
        reasons=reasons,
        datasets=list(core.registry.datasets),
        not_routed=core.registry.not_routed(),
        notes=core.registry.notes,
    )


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """Liveness: the process answers."""
    return Health()


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "Not ready; `reasons` says why."}},
)
async def readyz(request: Request) -> JSONResponse:
    """Readiness: 200 once every served dataset has a routable variant, else 503 with reasons."""
    body = readiness(request.app.state.router)
    return JSONResponse(body.model_dump(), status_code=503 if body.reasons else 200)


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    """Prometheus metrics in the text exposition format."""
    m: ServingMetrics = request.app.state.metrics
    return Response(m.render(), media_type=CONTENT_TYPE)
