"""The ingress's :class:`RemoteRouter` over an in-process replica: a call that hangs past
``call_timeout_s`` and a call lost with its replica are both answered 503 (``OverloadedError``
with ``retry_after_s``), never a hang; a served call makes its replica known to the policy."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from serving_fakes import make_toy_registry
from test_app import SETTINGS

from gnnaas.errors import OverloadedError
from gnnaas.serving import Settings
from gnnaas.serving.deploy.remote import DatasetDescription, DatasetServer, RemoteRouter


class _Lost(Exception):
    """Stands for Ray's actor errors."""


class _Caller:
    """A :class:`~gnnaas.serving.deploy.remote.DatasetCaller` over an in-process replica that serves,
    hangs (never answers) or loses the call, as ``mode`` says."""

    def __init__(self, server: DatasetServer) -> None:
        self.server = server
        self.mode = "serve"

    async def describe(self) -> DatasetDescription:
        return self.server.describe()

    async def predict(self, variant_id: str, nodes: list[int], output: Any) -> Any:
        if self.mode == "hang":
            await asyncio.Event().wait()  # cancelled by the router's timeout
        if self.mode == "lost":
            raise _Lost("replica died")
        return await self.server.predict(variant_id, nodes, output)


def test_served_lost_and_hung_calls() -> None:
    settings = Settings(**{**SETTINGS, "retry_after_s": 3.0})

    async def scenario() -> None:
        server = DatasetServer(make_toy_registry()[0], settings, replica="r1")
        await server.start()
        caller = _Caller(server)
        router = RemoteRouter(settings, {"toy": caller}, lost_errors=(_Lost,), call_timeout_s=0.2)
        await router.start()
        toy = router.registry.get("toy")
        assert toy is not None
        try:
            served = await router.predict(toy, [1, 2, 3])
            assert len(served.predictions) == 3
            assert router.replicas("toy") == {"r1": server.pid}

            caller.mode = "lost"
            with pytest.raises(OverloadedError, match="was lost while answering") as lost:
                await router.predict(toy, [4])
            assert lost.value.retry_after_s == 3.0

            caller.mode, router.call_timeout_s = "hang", 0.2  # served calls keep 30 s
            with pytest.raises(OverloadedError, match="answered within 0.2 s") as hung:
                await router.predict(toy, [5])
            assert hung.value.retry_after_s == 3.0
            assert router.lost_calls == 2

            caller.mode, router.call_timeout_s = "serve", 30  # the next call is served again
            assert len((await router.predict(toy, [6])).predictions) == 1
        finally:
            await server.stop()

    asyncio.run(scenario())
