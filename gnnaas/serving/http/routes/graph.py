"""Writes to a live graph: new nodes, edges added and removed, a node's features.

Every route needs ``Authorization: Bearer $GNNAAS_WRITE_TOKEN`` and a server started with
``--state-dir`` (:mod:`gnnaas.serving.core.live`). Errors:

======  ===================================================================================
status  when
======  ===================================================================================
403     writes are not configured (no ``GNNAAS_WRITE_TOKEN``, or no ``--state-dir``)
401     missing or wrong token
404     unknown dataset
413     more nodes or edges in one write than its limits (4,096 nodes, 100,000 edges); split it
422     a malformed body, or a write that cannot apply (wrong feature width, NaN, ids out of
        range, an edge to remove that is not there or to add that is):
        ``detail`` names the first offender and nothing of the write is applied
503     the server is stopping, or the write log failed: writes stop until a restart, and the
        outcome of the writes in flight is unknown until it replays the log
======  ===================================================================================

A 200 means the write is on disk (fsynced) and visible to the next prediction; its
``graph_version`` (also ``X-Graph-Version``) is the version predictions report once they see it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ValidationError

from gnnaas.data.live import Staging, Write, WriteError, WriteTooLarge
from gnnaas.errors import OverloadedError
from gnnaas.serving.core.live import LiveWriter
from gnnaas.serving.core.router import Router
from gnnaas.serving.core.settings import Settings
from gnnaas.serving.http.deps import RouterDep, check_bearer, dataset_of
from gnnaas.serving.http.schemas import (
    EdgesWrite,
    ErrorResponse,
    FeaturesWrite,
    NodesWrite,
    WriteResponse,
)

__all__ = ["router"]

DISABLED_DETAIL = (
    "writes are disabled on this server; start it with --state-dir and GNNAAS_WRITE_TOKEN set"
)
_bearer = HTTPBearer(
    auto_error=False, scheme_name="WriteToken", description="The server's `GNNAAS_WRITE_TOKEN`."
)


async def require_writer(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Dependency: 403 when writes are off, 401 unless the bearer token is the write token."""
    settings: Settings = request.app.state.settings
    token = settings.write_token if settings.state_dir is not None else None
    check_bearer(
        request,
        token,
        credentials,
        role="write",
        variable="GNNAAS_WRITE_TOKEN",
        disabled_detail=DISABLED_DETAIL,
    )


router = APIRouter(tags=["graph"], dependencies=[Depends(require_writer)])

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in (
        (401, "Missing or wrong bearer token."),
        (403, "Writes are not configured on this server."),
        (404, "Unknown dataset."),
        (413, "More nodes or edges in one write than its limits; nothing was applied."),
        (422, "Malformed body, or a write that cannot apply; nothing of it was applied."),
        (503, "The write log failed or the server is stopping; `Retry-After` says when to retry."),
    )
}


def _writer(core: Router, dataset: str) -> LiveWriter:
    if core.stopping:
        raise OverloadedError(
            "the server is stopping; retry on another instance", core.settings.retry_after_s
        )
    served = dataset_of(core, dataset)
    if served.live is None:  # pragma: no cover - every dataset is live with --state-dir
        raise HTTPException(403, f"dataset {dataset!r} is not live; {DISABLED_DETAIL}")
    return served.live.writer_for(core.exclusive, core.settings.retry_after_s)


async def _write(
    core: Router,
    dataset: str,
    request: Request,
    response: Response,
    model: type[BaseModel],
    stage: Callable[[Staging, Any], Write],
    answer: Callable[[Write, int], WriteResponse],
) -> Any:
    """One write: the raw body, parsed as ``model`` and staged in the commit thread (``stage``),
    committed, and answered (``answer`` of the write and its version) with ``X-Graph-Version``."""
    raw = await request.body()

    def build(staging: Staging) -> Write:
        return stage(staging, _parse(model, raw))

    try:
        write, version = await _writer(core, dataset).submit(build)
    except WriteError as exc:
        core.metrics.rejected("invalid_write")
        status = 413 if isinstance(exc, WriteTooLarge) else 422
        return JSONResponse({"detail": str(exc)}, status_code=status)
    response.headers["X-Graph-Version"] = str(version)
    return answer(write, version)


def _parse(model: type[BaseModel], raw: bytes) -> Any:
    """The body as ``model`` (in the commit thread: a 1,000-edge body is a millisecond of
    validation the event loop does not spend); malformed, FastAPI's own 422."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e.get("loc", ()))} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors) from None


def _documented(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI request body of a route that reads its body itself."""
    schema = model.model_json_schema()
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _route(model: type[BaseModel], summary: str) -> dict[str, Any]:
    """What every write route declares: its answer, errors, summary and documented body."""
    return {
        "response_model": WriteResponse,
        "response_model_exclude_none": True,
        "responses": _ERRORS,
        "summary": summary,
        "openapi_extra": _documented(model),
    }


@router.post("/datasets/{dataset}/nodes", **_route(NodesWrite, "Add nodes to a live graph"))
async def add_nodes(dataset: str, request: Request, core: RouterDep, response: Response) -> Any:
    """Adds nodes with their feature rows and edges; answers their ids (assigned in order)."""

    def stage(staging: Staging, body: NodesWrite) -> Write:
        return staging.add_nodes(body.features, body.edges)

    def answer(write: Write, version: int) -> WriteResponse:
        assert write.features is not None
        ids = list(range(write.first_id, write.first_id + write.features.shape[0]))
        return WriteResponse(graph_version=version, ids=ids)

    return await _write(core, dataset, request, response, NodesWrite, stage, answer)


@router.post("/datasets/{dataset}/edges", **_route(EdgesWrite, "Change edges of a live graph"))
async def change_edges(dataset: str, request: Request, core: RouterDep, response: Response) -> Any:
    """Removes, then adds edges between existing nodes, all or nothing."""

    def stage(staging: Staging, body: EdgesWrite) -> Write:
        return staging.change_edges(body.add, body.remove)

    def answer(write: Write, version: int) -> WriteResponse:
        assert write.add is not None and write.remove is not None
        added, removed = int(write.add.shape[1]), int(write.remove.shape[1])
        return WriteResponse(graph_version=version, added=added, removed=removed)

    return await _write(core, dataset, request, response, EdgesWrite, stage, answer)


@router.put(
    "/datasets/{dataset}/nodes/{node}/features",
    **_route(FeaturesWrite, "Replace a node's features in a live graph"),
)
async def set_features(
    dataset: str, node: int, request: Request, core: RouterDep, response: Response
) -> Any:
    """Replaces the feature row of ``node`` (every variant's pruned copy with it)."""

    def stage(staging: Staging, body: FeaturesWrite) -> Write:
        return staging.set_features(node, body.features)

    def answer(write: Write, version: int) -> WriteResponse:
        return WriteResponse(graph_version=version)

    return await _write(core, dataset, request, response, FeaturesWrite, stage, answer)
