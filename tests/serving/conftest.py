"""Fixtures of the serving tests (the fakes live in ``serving_fakes.py``)."""

from __future__ import annotations

import os
import socket
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from serving_fakes import FakeModel, make_toy_registry

from gnnaas.serving import VariantRegistry

# Starlette 1.x warns once, at import, that its TestClient prefers `httpx2` over the installed
# `httpx`; the tests run with warnings as errors, so import it here quietly, once.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*httpx2", category=UserWarning)
    import starlette.testclient  # noqa: F401


@pytest.fixture
def toy() -> tuple[VariantRegistry, dict[str, FakeModel]]:
    """A fresh toy registry and its models."""
    return make_toy_registry()


@pytest.fixture(autouse=True)
def _batches_in_worker_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every batch in its variant's worker thread (``GNNAAS_INLINE_MAX_NODES=0``): the tests hold
    a fake model inside a batch to make a lane busy, which on the event loop's own thread would
    stop the loop that must go on serving. Tests of the inline path set it themselves."""
    monkeypatch.setenv("GNNAAS_INLINE_MAX_NODES", "0")


@pytest.fixture(scope="session")
def ray_serve() -> Iterator[int]:
    """One local Ray (2 CPUs, no dashboard) with Serve's proxy on a free loopback port, shared by
    every Ray test of the session; skipped when the ``[ray]`` extra is not installed.

    The replicas import the fakes of this folder: it goes on their ``PYTHONPATH`` (they inherit
    the environment Ray starts with).
    """
    pytest.importorskip("ray.serve")
    from gnnaas.serving.deploy import ray as ray_backend

    here = str(Path(__file__).resolve().parent)
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, before) if p)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    try:
        ray_backend.start_ray(num_cpus=2, host="127.0.0.1", port=port)
        yield port
    finally:
        ray_backend.shutdown_ray()
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before
