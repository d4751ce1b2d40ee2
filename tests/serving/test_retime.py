"""A server never routes on a curve measured under other execution settings without re-timing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from serving_fakes import tiny_store, write_tiny_repository
from starlette.testclient import TestClient

import gnnaas.data
from gnnaas.inference.settings import execution_settings
from gnnaas.serving import Settings
from gnnaas.serving.http.app import create_app


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch) -> Any:
    store = tiny_store()
    monkeypatch.setattr(gnnaas.data, "load_dataset", lambda name, *a, **k: store, raising=False)
    return store


def test_the_server_retimes_a_curve_of_other_threads_and_says_so(tmp_path: Path, tiny: Any) -> None:
    inline = Settings().inline_max_nodes
    other = {**execution_settings("cpu", inline_max_nodes=inline), "threads": 2}
    variants_dir, profiles_dir = write_tiny_repository(tmp_path, tiny, settings=other)
    settings = Settings(variants_dir=variants_dir, profiles_dir=profiles_dir, device="cpu")
    with TestClient(create_app(settings)) as client:
        listing = client.get("/v1/datasets/tiny/variants").json()["variants"]
        answer = client.post("/v1/datasets/tiny/predict", json={"nodes": [0, 1]})
    assert answer.status_code == 200
    for variant in listing:
        assert variant["retimed"] is True and variant["routable"] is True
        profile = variant["profile"]
        assert profile["threads"] == settings.torch_threads  # the server's, no longer 2
        points = profile["service_times"]
        assert {p["threads"] for p in points} == {settings.torch_threads}
        # the fake profile's times (4 ms for one node, 100 ms for 1,024) were replaced by
        # measured ones of these tiny untrained models
        assert [p["batch_size"] for p in points] == [1, 4, 16, 64, 256, 1024]
        assert points[0]["e2e_ms"] != 4.0 and points[-1]["e2e_ms"] < 100.0


def test_a_curve_of_the_same_settings_is_not_retimed(tmp_path: Path, tiny: Any) -> None:
    variants_dir, profiles_dir = write_tiny_repository(tmp_path, tiny)
    settings = Settings(variants_dir=variants_dir, profiles_dir=profiles_dir, device="cpu")
    with TestClient(create_app(settings)) as client:
        listing = client.get("/v1/datasets/tiny/variants").json()["variants"]
    assert {v["retimed"] for v in listing} == {False}
    full = next(v for v in listing if v["id"] == "sage-full-1x")
    assert [p["e2e_ms"] for p in full["profile"]["service_times"]] == [4.0, 8.0, 30.0, 100.0]
