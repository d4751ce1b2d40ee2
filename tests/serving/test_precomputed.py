"""A precomputed variant (``<base>@exact``): stored, profiled, routed, and stale after writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from serving_fakes import write_tiny_repository

from gnnaas.data.live import read_live
from gnnaas.inference.layerwise import layerwise_inference
from gnnaas.profiling.perfmodel import Calibration
from gnnaas.profiling.profiler import profile_dataset
from gnnaas.serving import Settings, create_app
from gnnaas.variants.exact import exact_pass, precompute
from gnnaas.variants.repository import VariantRepository

TOKEN = "precomputed-writes"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
EXACT = "sage-full-1x@exact"


@pytest.fixture(scope="module")
def repository(small_store: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    variants, profiles = write_tiny_repository(tmp_path_factory.mktemp("exact-repo"), small_store)
    repo = VariantRepository(variants)
    precompute(repo, exact_pass(small_store, repo, "sage-full-1x", embeddings=True))
    profile_dataset(  # real profiles of every variant: the lookup's is the fastest
        small_store,
        repo,
        profiles,
        batch_size=256,
        runs=2,
        warmup=1,
        service_runs=2,
        min_time_s=0.0,
        calibration=Calibration(bw=1e10, ops=1e11, device="cpu"),
    )
    return variants, profiles


def _settings(repo: tuple[Path, Path], state: Path | None) -> Settings:
    return Settings(
        variants_dir=repo[0],
        profiles_dir=repo[1],
        device="cpu",
        state_dir=state,
        write_token=TOKEN,
        warmup=False,
    )


def _predict(client: TestClient, name: str, nodes: list[int], **headers: str) -> Any:
    r = client.post(f"/v1/datasets/{name}/predict", json={"nodes": nodes}, headers=headers)
    assert r.status_code == 200, r.text
    return r


def test_the_precomputed_variant_is_stored_with_the_exact_answers(
    repository: tuple[Path, Path], small_store: Any
) -> None:
    repo = VariantRepository(repository[0])
    manifest = repo.manifest(small_store.name, EXACT)
    assert manifest.precomputed is not None and manifest.precomputed["base"] == "sage-full-1x"
    assert manifest.fanouts == [-1, -1]
    answers = repo.load_answers(manifest)
    assert answers["logits"].shape == (small_store.num_nodes, small_store.num_classes)
    assert answers["embeddings"].shape == (small_store.num_nodes, manifest.hidden_channels)
    assert EXACT in [m.variant_id for m in repo.list(small_store.name)]


def test_it_answers_the_exact_class_and_is_routed_when_fastest(
    repository: tuple[Path, Path], small_store: Any
) -> None:
    repo = VariantRepository(repository[0])
    run = exact_pass(small_store, repo, "sage-full-1x", compare=False)
    nodes = [0, 7, 42, 99, 500]
    with TestClient(create_app(_settings(repository, None))) as client:
        pinned = _predict(client, small_store.name, nodes, **{"X-Variant": EXACT})
        assert pinned.json()["predictions"] == run.predictions()[nodes].tolist()
        routed = _predict(client, small_store.name, nodes, **{"X-Accuracy-Tolerance": "100"})
        assert routed.headers["X-Variant"] == EXACT
        listing = client.get(f"/v1/datasets/{small_store.name}/variants").json()["variants"]
        exact = next(v for v in listing if v["id"] == EXACT)
        assert exact["routable"] and exact["precomputed"] and exact["stale_fraction"] == 0.0
        # Lookups are timed apart from computed batches: an idle precomputed variant is
        # predicted at a lookup's speed, an idle computed one at the device's.
        core = client.app.state.router  # type: ignore[attr-defined]
        ds = core.registry.get(small_store.name)
        # A graph without writes: its lookup covers every node for good, no per-request check.
        assert ds.live is None and ds.covered == {EXACT}
        core.slowdown.reset(1.0)
        for _ in range(40):
            core.slowdown.observe(3.0, 1.0, len(nodes), lookup=True)
        snap = core.decision_load(ds, len(nodes))
        assert snap.load(EXACT, lookup=True).slowdown == pytest.approx(3.0, rel=0.05)
        assert snap.load("sage-full-1x").slowdown == snap.slowdown == 1.0
        assert core.lane(small_store.name, EXACT).slowdown_at(len(nodes)) == snap.lookup_slowdown


def _downstream(store: Any, node: int, hops: int) -> set[int]:
    """Nodes whose ``hops``-hop upstream neighborhood holds ``node`` (and ``node``)."""
    edge_index = store.edge_index
    reached, frontier = {node}, {node}
    for _ in range(hops):
        mask = torch.isin(edge_index[0], torch.tensor(sorted(frontier)))
        frontier = set(edge_index[1, mask].tolist()) - reached
        reached |= frontier
    return reached


def test_a_write_makes_the_k_hop_neighborhood_stale_and_served_by_another_variant(
    repository: tuple[Path, Path], small_store: Any, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    name = small_store.name
    source, target = 3, 11
    affected = _downstream(small_store, target, 2)
    far = next(
        v for v in range(small_store.num_nodes) if v not in _downstream(small_store, target, 3)
    )
    tolerant = {"X-Accuracy-Tolerance": "100"}
    with TestClient(create_app(_settings(repository, state))) as client:
        assert _predict(client, name, [target], **tolerant).headers["X-Variant"] == EXACT
        r = client.post(
            f"/v1/datasets/{name}/edges", json={"add": [[source, target]]}, headers=AUTH
        )
        assert r.status_code == 200, r.text
        served = client.app.state.router.registry.get(name)
        assert served.live is not None and not served.covered  # a live graph: checked per request
        stale = served.variants[EXACT].answers.staleness.stale
        assert set(stale[: small_store.num_nodes].nonzero()[0].tolist()) == affected
        for node in (target, max(affected)):
            routed = _predict(client, name, [node], **tolerant)
            assert routed.headers["X-Variant"] != EXACT  # stale: a sampled variant serves it
        assert _predict(client, name, [far], **tolerant).headers["X-Variant"] == EXACT
        listing = client.get(f"/v1/datasets/{name}/variants").json()["variants"]
        fraction = next(v for v in listing if v["id"] == EXACT)["stale_fraction"]
        assert fraction == pytest.approx(len(affected) / small_store.num_nodes)
        # pinned, the stale node is computed exactly on the graph as it is now
        pinned = client.post(
            f"/v1/datasets/{name}/predict",
            json={"nodes": [target, far], "return": "proba"},
            headers={"X-Variant": EXACT},
        )
        assert pinned.status_code == 200
    repo = VariantRepository(repository[0])
    loaded = repo.load(name, "sage-full-1x")
    graph = read_live(small_store, state)
    rowptr, col = graph.merged_csr()
    keep = torch.as_tensor(loaded.manifest.kept_features)
    now = layerwise_inference(
        loaded.model, graph.features(keep)[: graph.num_nodes], rowptr, col
    ).logits.softmax(-1)
    got = torch.tensor(pinned.json()["predictions"])
    torch.testing.assert_close(got, now[[target, far]], atol=1e-5, rtol=1e-4)
    # a restart replays the log: the same nodes are stale again
    with TestClient(create_app(_settings(repository, state))) as client:
        served = client.app.state.router.registry.get(name)
        again = served.variants[EXACT].answers.staleness.stale
        assert set(again[: small_store.num_nodes].nonzero()[0].tolist()) == affected
        assert _predict(client, name, [target], **tolerant).headers["X-Variant"] != EXACT


def _commands(text: str) -> list[list[str]]:
    """The ``gnnaas ...`` commands quoted in backticks in ``text``, as argv lists."""
    import re
    import shlex

    return [shlex.split(c)[1:] for c in re.findall(r"`(gnnaas [^`]+)`", text)]


def test_after_a_new_node_and_a_compaction_the_printed_commands_route_it_again(
    small_store: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gnnaas.cli import main
    from gnnaas.serving.core.registry import VariantRegistry

    # The folders as a user has them in the environment, so the printed commands run as they are.
    variants, profiles = write_tiny_repository(tmp_path / "repo", small_store)
    monkeypatch.setenv("GNNAAS_VARIANTS_DIR", str(variants))
    monkeypatch.setenv("GNNAAS_PROFILES_DIR", str(profiles))
    monkeypatch.delenv("GNNAAS_STATE_DIR", raising=False)
    name, state = small_store.name, tmp_path / "state"
    quick = ["-q", "--threads", "1"]
    assert main([*quick, "precompute", "--dataset", name, "--variant", "sage-full-1x"]) == 0
    assert main([*quick, "profile", "--dataset", name, "--runs", "2", "--only", EXACT]) == 0
    capsys.readouterr()

    with TestClient(create_app(_settings((variants, profiles), state))) as client:
        added = client.post(
            f"/v1/datasets/{name}/nodes",
            json={"features": [[0.5] * small_store.num_features], "edges": [[0, -1], [-1, 0]]},
            headers=AUTH,
        )
        assert added.status_code == 200, added.text
    assert main(["-q", "compact", "--dataset", name, "--state-dir", str(state)]) == 0

    registry = VariantRegistry.load(_settings((variants, profiles), state))
    try:
        reason = registry.get(name).variants[EXACT].not_routed
    finally:
        registry.get(name).live.close()
    assert reason is not None and "compacted after version 0" in reason
    precompute, profile = _commands(reason)
    live = ["--state-dir", str(state)]
    assert precompute == ["precompute", "--dataset", name, "--variant", "sage-full-1x", *live]
    assert profile == ["profile", "--dataset", name, "--only", EXACT, *live]

    # The answers cover the live graph's 3,001 nodes: profiling them on the dataset's graph
    # fails in one line and changes no file.
    assert main([*quick, *precompute]) == 0
    out = capsys.readouterr().out
    assert f"{small_store.num_nodes + 1:,} nodes" in out
    assert out.strip().endswith(f"gnnaas profile --dataset {name} --only {EXACT} {' '.join(live)}")
    before = {f.name: f.read_bytes() for f in (profiles / name).iterdir()}
    assert main([*quick, "profile", "--dataset", name, "--only", EXACT]) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith(f"ArtifactError: could not time {EXACT}: ")
    assert "--state-dir" in error[0] and error[0].endswith("no profile was changed")
    assert {f.name: f.read_bytes() for f in (profiles / name).iterdir()} == before

    assert main([*quick, *profile, "--runs", "2"]) == 0
    with TestClient(create_app(_settings((variants, profiles), state))) as client:
        served = client.app.state.router.registry.get(name)
        assert served.variants[EXACT].routable and served.variants[EXACT].not_routed is None
        tolerant = {"X-Accuracy-Tolerance": "100"}
        assert _predict(client, name, [5], **tolerant).headers["X-Variant"] == EXACT
        new = _predict(client, name, [small_store.num_nodes], **{"X-Variant": EXACT})
        assert new.headers["X-Graph-Version"] == "1"
