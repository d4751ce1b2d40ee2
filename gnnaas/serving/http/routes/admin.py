"""Admin endpoints: reload the served set without downtime.

Every admin route takes ``Authorization: Bearer <token>`` with the token of
``GNNAAS_ADMIN_TOKEN`` (read at start-up, compared in constant time). Without a configured token
the routes are off (403); a missing or wrong token gets 401 with ``WWW-Authenticate: Bearer``.

``POST /v1/admin/reload`` takes no parameters: it rereads the folders the server was started with
(never a path or URL from a request). Its errors:

======  ===================================================================================
status  when
======  ===================================================================================
409     ``gnnaas serve --workers N`` runs this process as one of N workers: ``detail`` says to
        send SIGHUP to the supervisor instead (reloading one worker would split the service);
        or the files on disk cannot be served as they are now (a corrupt manifest or weights, a
        profile table that does not parse, a graph that cannot be read, nothing left to
        serve): the previous set is still served; ``detail`` names the file and the fix.
        Conflict, not 422: the request is fine, the repository's state is not; fix it and
        send the same request again.
500     an unexpected error while building the new set (a bug, memory): the previous set is
        still served; ``detail`` names the stage and the error type, the log has the traceback
        under the request id.
503     the server is starting or shutting down.
======  ===================================================================================

A reload while another runs waits for it, then runs (no 409 for concurrency): each caller gets a
reload that started after it asked.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gnnaas.serving.core.reload import Reloader, ReloadError
from gnnaas.serving.core.settings import Settings
from gnnaas.serving.http.deps import check_bearer
from gnnaas.serving.http.requests import REQUEST_ID_KEY
from gnnaas.serving.http.schemas import ErrorResponse, ReloadResponse

__all__ = ["DISABLED_DETAIL", "require_admin", "router"]

DISABLED_DETAIL = "admin endpoints disabled; set GNNAAS_ADMIN_TOKEN"

_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="AdminToken",
    description="The server's `GNNAAS_ADMIN_TOKEN`.",
)


async def require_admin(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Dependency: 403 when admin is off, 401 unless the bearer token is the admin token."""
    settings: Settings = request.app.state.settings
    check_bearer(
        request,
        settings.admin_token,
        credentials,
        role="admin",
        variable="GNNAAS_ADMIN_TOKEN",
        disabled_detail=DISABLED_DETAIL,
    )


router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(require_admin)])

_AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {
        "model": ErrorResponse,
        "description": "Missing or wrong bearer token.",
        "headers": {"WWW-Authenticate": {"schema": {"type": "string", "example": "Bearer"}}},
    },
    403: {"model": ErrorResponse, "description": "No `GNNAAS_ADMIN_TOKEN` configured."},
}


@router.post(
    "/reload",
    response_model=ReloadResponse,
    responses={
        **_AUTH_ERRORS,
        409: {
            "model": ErrorResponse,
            "description": "The files cannot be served as they are (corrupt variant, bad "
            "profile, unreadable graph); the previous set is still served, `detail` says why.",
        },
        500: {
            "model": ErrorResponse,
            "description": "Unexpected error while building; the previous set is still served, "
            "the server log has the traceback under the request id.",
        },
        503: {"model": ErrorResponse, "description": "Starting or shutting down."},
    },
)
async def reload(request: Request) -> Any:
    """Reloads variants, profiles and datasets from the server's folders, without downtime."""
    reloader: Reloader = request.app.state.reloader
    request_id = request.scope.get(REQUEST_ID_KEY, "-")
    supervisor = request.app.state.settings.supervisor_pid
    # one of several workers: reloading only this one would split the service
    if supervisor is not None:
        detail = (
            f"this server runs several worker processes; reload them all with SIGHUP to the "
            f"`gnnaas serve` process (kill -HUP {supervisor}), which restarts them one by one"
        )
        return JSONResponse({"detail": detail}, status_code=409)
    try:
        # The trigger names the request id, so the reload's log lines carry it.
        summary = await reloader.reload(f"api, request id {request_id}")
    except ReloadError as exc:
        if exc.internal:
            detail = f"{exc}; see server log (request id {request_id})"
            return JSONResponse({"detail": detail}, status_code=500)
        return JSONResponse({"detail": str(exc)}, status_code=409)
    return ReloadResponse(
        generation=summary.generation,
        datasets=list(summary.datasets),
        variants=summary.variants,
        datasets_added=list(summary.datasets_added),
        datasets_removed=list(summary.datasets_removed),
        variants_added=len(summary.variants_added),
        variants_removed=len(summary.variants_removed),
        variants_reprofiled=len(summary.variants_reprofiled),
        changes={
            "added": list(summary.variants_added),
            "removed": list(summary.variants_removed),
            "reprofiled": list(summary.variants_reprofiled),
        },
        notes=list(summary.notes),
        duration_ms=round(summary.duration_ms, 3),
    )
