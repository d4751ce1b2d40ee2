"""A trivial FastAPI app with the router's request shape: the FastAPI + uvicorn + driver ceiling.

``POST /v1/datasets/{dataset}/predict`` parses the same JSON body as the router and answers one
constant class per node with the router's response headers, doing no other work; ``/readyz`` and
``/healthz`` answer at once. Served exactly as ``gnnaas serve`` serves the router (``uvicorn.run``,
``access_log=False``), so ``bench_router.py`` can report every router figure next to this ceiling.

Example:
    python benchmarks/trivial_app.py --port 8123
"""

# No `from __future__ import annotations`: Ray Serve ships this module by value, and FastAPI
# must see the route's parameter types as objects there, not as names to resolve.
import argparse

from fastapi import FastAPI, Response
from pydantic import BaseModel

__all__ = ["PredictRequest", "create_app", "main"]


class PredictRequest(BaseModel):
    """Same body as the router's: node ids."""

    nodes: list[int]


def create_app() -> FastAPI:
    """The trivial app."""
    app = FastAPI(title="trivial")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness."""
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> dict[str, str]:
        """Readiness."""
        return {"status": "ready"}

    @app.post("/v1/datasets/{dataset}/predict")
    async def predict(dataset: str, body: PredictRequest, response: Response) -> dict[str, object]:
        """Answers class 0 for every node."""
        response.headers["X-Variant"] = "trivial"
        response.headers["Server-Timing"] = "queue;dur=0, sample;dur=0, gather;dur=0, compute;dur=0"
        return {"variant": {"id": "trivial"}, "predictions": [0] * len(body.nodes)}

    return app


def main() -> None:
    """Serves the trivial app on 127.0.0.1."""
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8123)
    args = parser.parse_args()
    uvicorn.run(
        create_app(), host="127.0.0.1", port=args.port, log_level="warning", access_log=False
    )


if __name__ == "__main__":
    main()
