"""FastAPI dependencies: the app's router and the dataset named in the path.

The dependencies are ``async`` so that FastAPI runs them on the event loop, not in a worker thread.
The hot predict route calls the plain helpers :func:`router_of` and :func:`dataset_of` directly:
FastAPI's dependency resolution costs more per request than the lookups themselves.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import SecretStr

from gnnaas.errors import OverloadedError
from gnnaas.serving.core.registry import ServedDataset
from gnnaas.serving.core.router import NotFoundError, Router

__all__ = [
    "DatasetDep",
    "RouterDep",
    "check_bearer",
    "dataset_of",
    "get_dataset",
    "get_router",
    "router_of",
]


def router_of(request: Request) -> Router:
    """The app's :class:`Router`; 503 while it starts or stops."""
    router: Router = request.app.state.router
    if not router.started:
        raise OverloadedError("the server is still starting; retry shortly")
    if router.stopping:
        raise OverloadedError("the server is shutting down; retry on another instance")
    return router


def dataset_of(router: Router, name: str) -> ServedDataset:
    """The served dataset called ``name``; 404 when unknown."""
    served = router.registry.get(name)
    if served is None:
        known = ", ".join(router.registry.datasets) or "none"
        raise NotFoundError(f"unknown dataset {name!r}; served datasets: {known}")
    return served


async def get_router(request: Request) -> Router:
    """Dependency: the app's :class:`Router`."""
    return router_of(request)


RouterDep = Annotated[Router, Depends(get_router)]


async def get_dataset(
    router: RouterDep,
    dataset: Annotated[str, Path(description="Dataset name, e.g. `Cora` or `synth-small`.")],
) -> ServedDataset:
    """Dependency: the served dataset named in the path."""
    return dataset_of(router, dataset)


DatasetDep = Annotated[ServedDataset, Depends(get_dataset)]


def check_bearer(
    request: Request,
    token: SecretStr | None,
    credentials: HTTPAuthorizationCredentials | None,
    *,
    role: str,
    variable: str,
    disabled_detail: str,
) -> None:
    """403 when ``token`` is unset, 401 unless the bearer token equals it (constant time).

    Args:
        request (Request): the request (its app's metrics count the refusals).
        token (SecretStr, optional): the server's token for this role.
        credentials (HTTPAuthorizationCredentials, optional): what the client sent.
        role (str): ``admin`` or ``write``, for the messages and the rejection reason.
        variable (str): the environment variable that sets the token.
        disabled_detail (str): the 403's detail.
    """
    metrics = request.app.state.metrics
    if token is None:
        metrics.rejected(f"{role}_disabled" if role == "admin" else f"{role}s_disabled")
        raise HTTPException(403, disabled_detail)
    given = b"" if credentials is None else credentials.credentials.encode()
    if not hmac.compare_digest(given, token.get_secret_value().encode()):
        metrics.rejected("unauthorized")
        detail = (
            f"missing {role} token; send 'Authorization: Bearer <{variable}>'"
            if credentials is None
            else f"wrong {role} token"
        )
        raise HTTPException(401, detail, headers={"WWW-Authenticate": "Bearer"})
