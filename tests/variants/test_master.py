"""A user's PyG master model: layouts, checks, and the whole path to served variants."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from torch_geometric.nn.models import GIN, GraphSAGE

from gnnaas.errors import ConfigError
from gnnaas.models import build_model
from gnnaas.sampling import DepthSampler
from gnnaas.variants.master import import_master, read_model_config, warm_start_state
from gnnaas.variants.pipeline import generate_variants
from gnnaas.variants.repository import VariantRepository
from gnnaas.variants.training import TrainConfig

PYG = {"GraphSAGE": GraphSAGE, "GIN": GIN}


def _graph(n: int, f: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, f, generator=g), torch.randint(0, n, (2, 4 * n), generator=g)


@pytest.mark.parametrize("cls", ["GraphSAGE", "GIN"])
def test_pyg_state_dicts_load_and_run_the_same(cls: str) -> None:
    torch.manual_seed(0)
    ref = PYG[cls](12, 16, num_layers=2, out_channels=3).eval()
    ours = build_model("sage" if cls == "GraphSAGE" else "gin", 12, 16, 3, family="pyg").eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    x, edge_index = _graph(40, 12)
    with torch.inference_mode():
        full = ref(x, edge_index)
        torch.testing.assert_close(ours(x, edge_index), full, atol=1e-5, rtol=1e-5)
        # Sampled blocks with every neighbor (fanout -1) give each seed its full-graph answer.
        order = torch.argsort(edge_index[1], stable=True)
        src, dst = edge_index[0][order], edge_index[1][order]
        rowptr = torch.zeros(41, dtype=torch.long)
        rowptr[1:] = torch.bincount(dst, minlength=40).cumsum(0)
        seeds = torch.tensor([3, 17, 29])
        sub = DepthSampler(rowptr, src, (-1, -1)).sample(seeds)
        out = ours(x[sub.n_id], sub.blocks)
    torch.testing.assert_close(out, full[seeds], atol=1e-5, rtol=1e-5)


def _config(path: Path, **fields: Any) -> Path:
    path.write_text(json.dumps(fields))
    return path


GOOD = {"class": "GraphSAGE", "in_channels": 8, "hidden_channels": 4, "num_layers": 2}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({**GOOD, "class": "GAT", "out_channels": 2}, "'class' must be one of GraphSAGE, GIN"),
        (GOOD, "'out_channels' must be an integer >= 1 (got None)"),
        ({**GOOD, "out_channels": 2, "hidden_channels": 1.5}, "'hidden_channels' must be"),
        ({**GOOD, "out_channels": 2, "norm": "batch_norm"}, "norm='batch_norm' is not supported"),
        ({**GOOD, "out_channels": 2, "jk": "cat"}, "jk='cat' is not supported"),
        ({**GOOD, "out_channels": 2, "heads": 4}, "unknown keys ['heads']"),
        ({**GOOD, "out_channels": 2, "dropout": 1.0}, "'dropout' must be a number in [0, 1)"),
    ],
)
def test_bad_model_configs_name_the_key(
    tmp_path: Path, fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        read_model_config(_config(tmp_path / "c.json", **fields))
    assert message in str(err.value)


def test_unreadable_configs(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        read_model_config(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="is not JSON"):
        read_model_config(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="must be a JSON object"):
        read_model_config(tmp_path / "list.json")


def _pyg_files(
    tmp_path: Path, store: Any, cls: str = "GraphSAGE", **over: Any
) -> tuple[Path, Path]:
    torch.manual_seed(0)
    f, c = store.num_features, store.num_classes
    model = PYG[cls](f, 16, num_layers=2, out_channels=c)
    weights = tmp_path / "model.safetensors"
    save_file(model.state_dict(), str(weights))
    fields = {"class": cls, "in_channels": f, "hidden_channels": 16, "num_layers": 2}
    config = _config(tmp_path / "model.json", **{**fields, "out_channels": c, **over})
    return weights, config


def test_a_model_that_does_not_fit_is_refused_and_nothing_written(
    tmp_path: Path, small_store: Any
) -> None:
    repo = VariantRepository(tmp_path / "variants")
    weights, config = _pyg_files(tmp_path, small_store)
    f, c = small_store.num_features, small_store.num_classes

    def refused(message: str, w: Path = weights, cfg: Path = config) -> None:
        with pytest.raises(ConfigError) as err:
            import_master(small_store, repo, w, cfg)
        assert message in str(err.value)
        assert repo.list(small_store.name) == []

    fields = {"class": "GraphSAGE", "hidden_channels": 16, "num_layers": 2}
    # Weights and config agree, but not with the graph.
    wide = tmp_path / "wide.safetensors"
    save_file(GraphSAGE(f + 1, 16, num_layers=2, out_channels=c).state_dict(), str(wide))
    refused(
        f"in_channels={f + 1} (and the weights agree), but dataset '{small_store.name}' has {f} "
        "features",
        w=wide,
        cfg=_config(tmp_path / "wide.json", **fields, in_channels=f + 1, out_channels=c),
    )
    more = tmp_path / "more.safetensors"
    save_file(GraphSAGE(f, 16, num_layers=2, out_channels=c + 1).state_dict(), str(more))
    refused(
        f"out_channels={c + 1} (and the weights agree), but dataset '{small_store.name}' has {c} "
        "classes",
        w=more,
        cfg=_config(tmp_path / "cls.json", **fields, in_channels=f, out_channels=c + 1),
    )
    # A config that disagrees with the weights: the key or shape is named.
    refused(
        "'convs.0.lin_l.weight' has shape [16, " + str(f) + "], the config's model expects [32, ",
        cfg=_config(
            tmp_path / "hidden.json", **{**fields, "hidden_channels": 32}, in_channels=f,
            out_channels=c,
        ),
    )  # fmt: skip
    refused(
        "lack 3 key(s) the config's model has, first 'convs.2.lin_l.weight'",
        cfg=_config(
            tmp_path / "deep.json", **{**fields, "num_layers": 3}, in_channels=f, out_channels=c
        ),
    )
    refused(
        "no default fanouts for a 4-layer model; give one per layer",
        w=_deep(tmp_path, f, c, 4),
        cfg=_config(
            tmp_path / "deeper.json", **{**fields, "num_layers": 4}, in_channels=f, out_channels=c
        ),
    )
    gin_cfg = _config(
        tmp_path / "gin.json", **{**fields, "class": "GIN"}, in_channels=f, out_channels=c
    )
    refused("lack", cfg=gin_cfg)
    # A pickle (torch.save) is refused, never unpickled.
    pickled = tmp_path / "model.pt"
    torch.save(GraphSAGE(f, 16, num_layers=2, out_channels=c).state_dict(), pickled)
    refused("are not a safetensors file", w=pickled)
    nan = tmp_path / "nan.safetensors"
    state = GraphSAGE(f, 16, num_layers=2, out_channels=c).state_dict()
    state["convs.1.lin_l.bias"][0] = float("nan")
    save_file(state, str(nan))
    refused("'convs.1.lin_l.bias' holds NaN or inf values", w=nan)


def _deep(tmp_path: Path, f: int, c: int, layers: int) -> Path:
    path = tmp_path / f"deep{layers}.safetensors"
    save_file(GraphSAGE(f, 16, num_layers=layers, out_channels=c).state_dict(), str(path))
    return path


def test_warm_start_keeps_the_kept_columns() -> None:
    master = build_model("gin", 8, 4, 2, family="pyg")
    keep = torch.tensor([1, 5, 6])
    state = warm_start_state(master, keep)
    pruned = build_model("gin", 3, 4, 2, family="pyg")
    pruned.load_state_dict(state, strict=True)
    first = master.first_layer_weights()[0].detach()
    assert torch.equal(pruned.first_layer_weights()[0].detach(), first[:, keep])
    assert torch.equal(
        pruned.state_dict()["convs.1.nn.lins.1.weight"],
        master.state_dict()["convs.1.nn.lins.1.weight"],
    )


def _train_in_plain_pyg(store: Any, epochs: int) -> tuple[GraphSAGE, float]:
    """What a PyG user does: full-graph GraphSAGE on the training nodes, then evaluate."""
    torch.manual_seed(0)
    model = GraphSAGE(store.num_features, 32, num_layers=2, out_channels=store.num_classes)
    col, rowptr = store.col, store.rowptr
    dst = torch.repeat_interleave(torch.arange(store.num_nodes), rowptr[1:] - rowptr[:-1])
    edge_index = torch.stack([col, dst])
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    for _ in range(epochs):
        model.train()
        opt.zero_grad()
        out = model(store.x, edge_index)
        loss = torch.nn.functional.cross_entropy(out[store.train_idx], store.y[store.train_idx])
        loss.backward()
        opt.step()
    model.eval()
    with torch.inference_mode():
        pred = model(store.x, edge_index).argmax(-1)
    acc = float((pred[store.test_idx] == store.y[store.test_idx]).float().mean())
    return model, acc


def test_a_pyg_master_on_cora_becomes_a_served_set_of_variants(
    tmp_path: Path, cora: Any, data_root: Path
) -> None:
    from starlette.testclient import TestClient

    from gnnaas.profiling.profiler import profile_dataset
    from gnnaas.serving import Settings, create_app

    model, script_acc = _train_in_plain_pyg(cora, epochs=30)
    weights = tmp_path / "sage.safetensors"
    save_file(model.state_dict(), str(weights))
    config = _config(
        tmp_path / "sage.json",
        **{
            "class": "GraphSAGE",
            "in_channels": cora.num_features,
            "hidden_channels": 32,
            "num_layers": 2,
            "out_channels": cora.num_classes,
        },
    )
    repo = VariantRepository(tmp_path / "variants")
    manifest, _ = import_master(cora, repo, weights, config)
    assert (manifest.variant_id, manifest.family, manifest.origin) == (
        "sage-full-1x",
        "pyg",
        "user",
    )
    # Served through sampled neighborhoods (25, 10), the 1x model scores as the script did.
    assert abs(manifest.metrics["test_acc"] - script_acc) * 100 <= 0.5

    tiny = TrainConfig(hidden_channels=8, max_epochs=2, patience=1, batch_size=512)
    rows = generate_variants(
        cora, repo, archs=["sage"], prunes=[1, 2, 4, 8], config=tiny, warm_start=True
    )
    assert [r.status for r in rows] == ["user"] + ["trained"] * 9
    stored = {m.variant_id: m for m in repo.list(cora.name)}
    assert len(stored) == 10
    # The user's layout and sizes, not the config's hidden width; the master untouched.
    assert {(m.family, m.hidden_channels) for m in stored.values()} == {("pyg", 32)}
    assert stored["sage-full-1x"].weights_sha256 == manifest.weights_sha256
    # A second run without --force keeps everything, the master included.
    again = generate_variants(cora, repo, archs=["sage"], prunes=[1, 2, 4, 8], config=tiny)
    assert [r.status for r in again] == ["user"] + ["skipped"] * 9

    profiles = tmp_path / "profiles"
    profile_dataset(
        cora, repo, profiles, runs=1, warmup=0, service_runs=1, min_time_s=0.0, threads=1
    )
    settings = Settings(
        variants_dir=repo.root, profiles_dir=profiles, data_root=data_root, warmup=False
    )
    with TestClient(create_app(settings)) as client:
        listing = client.get("/v1/datasets/Cora/variants").json()["variants"]
        assert len([v for v in listing if v["routable"]]) == 10
        for headers in ({"X-Variant": "sage-greedy-8x"}, {"X-Accuracy-Tolerance": "50"}):
            r = client.post("/v1/datasets/Cora/predict", json={"nodes": [0, 1, 2]}, headers=headers)
            assert r.status_code == 200, r.text
            assert r.headers["X-Variant"] in stored


def test_a_user_trained_variant_is_added_with_its_columns_in_order(
    tmp_path: Path, small_store: Any
) -> None:
    from gnnaas.variants.master import add_user_variant

    f, c = small_store.num_features, small_store.num_classes
    kept = [f - 1, 0, 5, 3, 2, 9, 7, 4][: max(2, f // 4)]  # the user's own (unsorted) order
    torch.manual_seed(0)
    user = GraphSAGE(len(kept), 16, num_layers=2, out_channels=c).eval()
    save_file(user.state_dict(), str(tmp_path / "v.safetensors"))
    (tmp_path / "kept.json").write_text(json.dumps(kept))
    cfg = _config(
        tmp_path / "v.json",
        **{"class": "GraphSAGE", "in_channels": len(kept), "hidden_channels": 16},
        num_layers=2,
        out_channels=c,
    )
    repo = VariantRepository(tmp_path / "variants")
    args = (small_store, repo, tmp_path / "v.safetensors", cfg, tmp_path / "kept.json")
    manifest = add_user_variant(*args)
    k = round(f / len(kept))
    assert manifest.variant_id == f"sage-user-{k}x"
    assert (manifest.family, manifest.origin, manifest.ranking) == ("pyg", "user", "user")
    assert manifest.kept_features == sorted(kept)
    assert 0.0 <= manifest.metrics["val_acc"] <= 1.0
    stored = repo.load(small_store.name, manifest.variant_id).model
    x, edge_index = _graph(30, f)
    with torch.inference_mode():  # same answers on the user's columns and on the sorted ones
        torch.testing.assert_close(
            stored(x[:, sorted(kept)], edge_index), user(x[:, kept], edge_index)
        )
    with pytest.raises(ConfigError, match="exists; pass --force"):
        add_user_variant(*args)
    assert add_user_variant(*args, force=True).variant_id == manifest.variant_id

    def refused(kept_text: str, message: str) -> None:
        (tmp_path / "bad.json").write_text(kept_text)
        with pytest.raises(ConfigError) as err:
            add_user_variant(*args[:4], tmp_path / "bad.json", force=True)
        assert message in str(err.value)

    refused(json.dumps([0, f]), f"[1] = {f} is outside [0, {f})")
    refused(json.dumps([1, 1]), "column 1 is listed twice")
    refused(json.dumps([[0, 1]]), "must be a non-empty flat list of integer column ids")
    refused(json.dumps([0, 1, 2]), f"in_channels={len(kept)} (and the weights agree), but --kept")
    refused(json.dumps(list(range(f))), "keeps every feature: that is a master model")
    assert [m.variant_id for m in repo.list(small_store.name)] == [manifest.variant_id]


def test_an_existing_1x_variant_is_replaced_only_with_force(
    tmp_path: Path, small_store: Any
) -> None:
    f, c = small_store.num_features, small_store.num_classes
    fields = {"class": "GraphSAGE", "in_channels": f, "hidden_channels": 8, "num_layers": 2}
    cfg = _config(tmp_path / "sage.json", **fields, out_channels=c)
    repo = VariantRepository(tmp_path / "variants")
    paths = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        paths.append(tmp_path / f"sage{seed}.safetensors")
        save_file(GraphSAGE(f, 8, num_layers=2, out_channels=c).state_dict(), str(paths[-1]))
    first, _ = import_master(small_store, repo, paths[0], cfg)
    with pytest.raises(ConfigError, match="variant sage-full-1x of .* exists; pass --force"):
        import_master(small_store, repo, paths[1], cfg)
    assert repo.manifest(small_store.name, "sage-full-1x").weights_sha256 == first.weights_sha256
    second, _ = import_master(small_store, repo, paths[1], cfg, force=True)
    assert second.weights_sha256 != first.weights_sha256
    assert repo.manifest(small_store.name, "sage-full-1x").weights_sha256 == second.weights_sha256
