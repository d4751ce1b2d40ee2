"""Fixtures of the serving tests (the fakes live in ``serving_fakes.py``)."""

from __future__ import annotations

import warnings

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
