"""FastAPI dependencies: the app's router and the dataset named in the path.

The dependencies are ``async`` so that FastAPI runs them on the event loop, not in a worker thread.
The hot predict route calls the plain helpers :func:`router_of` and :func:`dataset_of` directly:
FastAPI's dependency resolution costs more per request than the lookups themselves.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from gnnaas.errors import OverloadedError
from gnnaas.serving.registry import ServedDataset
from gnnaas.serving.router import NotFoundError, Router

__all__ = ["DatasetDep", "RouterDep", "dataset_of", "get_dataset", "get_router", "router_of"]


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
