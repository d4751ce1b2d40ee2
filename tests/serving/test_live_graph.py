"""Live graph writes through the HTTP API: auth, validation, read-your-writes, restart, versions."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from serving_fakes import write_tiny_repository

from gnnaas.serving import Settings, create_app

TOKEN = "live-writes"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def repository(small_store: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_tiny_repository(tmp_path_factory.mktemp("live-repo"), small_store)


def _settings(repo: tuple[Path, Path], state: Path | None, **extra: Any) -> Settings:
    return Settings(
        variants_dir=repo[0],
        profiles_dir=repo[1],
        device="cpu",
        state_dir=state,
        write_token=TOKEN,
        warmup=False,
        **extra,
    )


@pytest.fixture
def live(repository: tuple[Path, Path], tmp_path: Path) -> Iterator[tuple[TestClient, Any]]:
    app = create_app(_settings(repository, tmp_path / "state"))
    with TestClient(app) as client:
        yield client, app


def _predict(client: TestClient, store: Any, nodes: list[int], **headers: str) -> Any:
    r = client.post(
        f"/v1/datasets/{store.name}/predict",
        json={"nodes": nodes, "return": "proba"},
        headers={"X-Variant": "sage-full-1x", **headers},
    )
    assert r.status_code == 200, r.text
    return r


def test_writes_need_the_token_and_a_state_dir(
    live: tuple[TestClient, Any], small_store: Any, repository: tuple[Path, Path]
) -> None:
    client, _ = live
    url = f"/v1/datasets/{small_store.name}/edges"
    body = {"add": [[1, 2]]}
    missing = client.post(url, json=body)
    assert missing.status_code == 401 and "missing write token" in missing.json()["detail"]
    wrong = client.post(url, json=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.headers["WWW-Authenticate"] == "Bearer"
    assert client.post("/v1/datasets/nope/edges", json=body, headers=AUTH).status_code == 404
    frozen = create_app(_settings(repository, None))  # no --state-dir: writes are off
    with TestClient(frozen) as other:
        refused = other.post(url, json=body, headers=AUTH)
        assert refused.status_code == 403 and "--state-dir" in refused.json()["detail"]
        assert _predict(other, small_store, [0]).headers["X-Graph-Version"] == "0"


def test_a_new_node_is_predicted_and_survives_a_restart(
    repository: tuple[Path, Path], small_store: Any, tmp_path: Path
) -> None:
    n, f = small_store.num_nodes, small_store.num_features
    row = torch.randn(f, generator=torch.Generator().manual_seed(3)).tolist()
    state = tmp_path / "state"
    with TestClient(create_app(_settings(repository, state))) as client:
        added = client.post(
            f"/v1/datasets/{small_store.name}/nodes",
            json={"features": [row], "edges": [[0, -1], [1, -1], [-1, 0]]},
            headers=AUTH,
        )
        assert added.status_code == 200, added.text
        assert added.json() == {"graph_version": 1, "ids": [n]}
        assert added.headers["X-Graph-Version"] == "1"
        first = _predict(client, small_store, [n])  # read-your-writes: the very next request
        assert first.headers["X-Graph-Version"] == "1"
        listing = client.get("/v1/datasets").json()["datasets"][0]
        assert listing["num_nodes"] == n + 1 and listing["graph_version"] == 1 and listing["live"]
        assert client.get(f"/v1/datasets/{small_store.name}").json() == listing
    with TestClient(create_app(_settings(repository, state))) as client:  # replayed from the log
        again = _predict(client, small_store, [n])
        assert again.headers["X-Graph-Version"] == "1"
        got, want = again.json()["predictions"][0], first.json()["predictions"][0]
        assert got == pytest.approx(want, abs=1e-5)


def test_removing_an_edge_changes_the_neighbors_sample(
    live: tuple[TestClient, Any], small_store: Any
) -> None:
    client, app = live
    served = app.state.router.registry.get(small_store.name)
    sampler = served.graph.sampler((-1, -1))
    target = 5
    source = int(small_store.col[small_store.rowptr[target]])
    before = sampler.sample(torch.tensor([target])).n_id.tolist()
    r = client.post(
        f"/v1/datasets/{small_store.name}/edges",
        json={"remove": [[source, target]]},
        headers=AUTH,
    )
    assert r.status_code == 200 and r.json() == {"graph_version": 1, "added": 0, "removed": 1}
    after = sampler.sample(torch.tensor([target]))
    level1 = after.n_id[1 : 1 + after.num_sampled_nodes[1]].tolist()
    assert source in before[1:] and source not in level1
    moved = client.put(
        f"/v1/datasets/{small_store.name}/nodes/{target}/features",
        json={"features": [0.5] * small_store.num_features},
        headers=AUTH,
    )
    assert moved.status_code == 200 and moved.json() == {"graph_version": 2}
    assert served.graph.features(torch.tensor([0, 1]))[target].tolist() == [0.5, 0.5]


@pytest.mark.parametrize(
    ("path", "method", "body", "message"),
    [
        ("nodes", "post", lambda f: {"features": [[1.0] * (f + 1)]}, "values per node"),
        ("nodes", "post", lambda f: {"features": "x"}, None),  # malformed: FastAPI's own 422
        (
            "nodes",
            "post",
            lambda f: {"features": [[1.0] * f], "edges": [[0, 10**9]]},
            r"edges\[0\] = \[0, 1000000000\]: node ids must lie in",
        ),
        ("nodes", "post", lambda f: {"features": [[float("nan")] * f]}, None),  # not JSON
        ("edges", "post", lambda f: {"remove": [[0, 0]]}, r"remove\[0\] = \[0, 0\] is not in"),
        ("edges", "post", lambda f: {"add": [[0, 1], [0, 1]]}, r"add\[1\] = \[0, 1\]"),
        ("edges", "post", lambda f: {}, "at least one edge"),
        ("nodes/99999999/features", "put", lambda f: {"features": [1.0] * f}, "not in the graph"),
        ("nodes/0/features", "put", lambda f: {"features": [1.0] * (f - 1)}, "values per node"),
    ],
)
def test_a_bad_write_is_refused_whole(
    live: tuple[TestClient, Any], small_store: Any, path: str, method: str, body: Any, message: Any
) -> None:
    import re

    client, app = live
    graph = app.state.router.registry.get(small_store.name).live.graph
    before = (graph.version, graph.num_nodes, graph.stats()["overlay_entries"])
    url = f"/v1/datasets/{small_store.name}/{path}"
    content = body(small_store.num_features)
    if any(isinstance(v, list) and v and v[0] != v[0] for v in content.get("features", [[]])):
        r = getattr(client, method)(  # NaN is not JSON: sent as the bare token
            url,
            content=b'{"features": [[NaN]]}',
            headers={**AUTH, "Content-Type": "application/json"},
        )
    else:
        r = getattr(client, method)(url, json=content, headers=AUTH)
    assert r.status_code == 422, r.text
    if message is not None:
        assert re.search(message, r.json()["detail"]), r.json()["detail"]
    assert (graph.version, graph.num_nodes, graph.stats()["overlay_entries"]) == before


def test_compact_folds_the_log_and_the_server_starts_from_the_snapshot(
    repository: tuple[Path, Path],
    small_store: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gnnaas.cli import main

    n = small_store.num_nodes
    state = tmp_path / "state"
    with TestClient(create_app(_settings(repository, state))) as client:
        url = f"/v1/datasets/{small_store.name}"
        row = [0.25] * small_store.num_features
        assert (
            client.post(f"{url}/nodes", json={"features": [row]}, headers=AUTH).status_code == 200
        )
        r = client.post(f"{url}/edges", json={"add": [[n, 3], [3, n]]}, headers=AUTH)
        assert r.status_code == 200
        # While the server runs, its state is locked: compaction refuses, one line, exit 1.
        assert main(["compact", "--dataset", small_store.name, "--state-dir", str(state)]) == 1
        assert "in use by another gnnaas process" in capsys.readouterr().err
        before = _predict(client, small_store, [3, n]).json()["predictions"]
    assert main(["compact", "--dataset", small_store.name, "--state-dir", str(state)]) == 0
    assert "version 2, 2 log records folded" in capsys.readouterr().out
    assert (state / small_store.name / "log.wal").stat().st_size == 0
    with TestClient(create_app(_settings(repository, state))) as client:
        after = _predict(client, small_store, [3, n])
        assert after.headers["X-Graph-Version"] == "2"
        for got, want in zip(after.json()["predictions"], before, strict=True):
            assert got == pytest.approx(want, abs=1e-5)


def test_a_live_graph_is_served_by_one_process(
    repository: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_server import _free_port

    from gnnaas.cli import main

    for extra in (["--workers", "2"], ["--backend", "ray"]):
        argv = ["serve", "--variants", str(repository[0]), "--profiles", str(repository[1])]
        argv += ["--state-dir", str(tmp_path), "--port", str(_free_port()), *extra]
        assert main(argv) == 1
        assert "served by one process" in capsys.readouterr().err


def test_a_write_over_the_limits_is_413(live: tuple[TestClient, Any], small_store: Any) -> None:
    client, app = live
    graph = app.state.router.registry.get(small_store.name).live.graph
    graph.max_write_edges = 1
    r = client.post(
        f"/v1/datasets/{small_store.name}/edges", json={"add": [[1, 2], [2, 1]]}, headers=AUTH
    )
    assert r.status_code == 413 and "at most 1 edges" in r.json()["detail"]
    assert graph.version == 0
