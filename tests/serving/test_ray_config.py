"""``gnnaas ray-config``: a Serve config of the catalog and one application per dataset, valid
for ``serve deploy``, whose builders make the applications."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from serving_fakes import tiny_store, write_tiny_repository

from gnnaas.cli import main

pytest.importorskip("ray.serve")


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("ray-config")
    write_tiny_repository(root, tiny_store("first"))
    return write_tiny_repository(root, tiny_store("second"))


def _config(repository: tuple[Path, Path], tmp_path: Path, *extra: str) -> dict[str, Any]:
    import yaml
    from ray.serve.schema import ServeDeploySchema

    out = tmp_path / "serve.yaml"
    args = ["--variants", str(repository[0]), "--profiles", str(repository[1]), "-o", str(out)]
    assert main(["-q", "ray-config", *args, *extra]) == 0
    text = out.read_text()
    assert "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=gnnaas.serving.deploy.proxy:middlewares" in (
        text
    )
    config: dict[str, Any] = yaml.safe_load(text)
    ServeDeploySchema.model_validate(config)  # what `serve deploy` checks first
    return config


def test_one_application_per_dataset_and_the_catalog(
    repository: tuple[Path, Path], tmp_path: Path
) -> None:
    from ray import serve

    from gnnaas.serving.deploy import ray_apps

    config = _config(repository, tmp_path, "--replicas", "2", "--replica-cpus", "0.5")
    apps = {a["name"]: a for a in config["applications"]}
    assert {name: a["route_prefix"] for name, a in apps.items()} == {
        "gnnaas": "/",
        "gnnaas-first": "/v1/datasets/first",
        "gnnaas-second": "/v1/datasets/second",
    }
    catalog = apps["gnnaas"]
    assert catalog["args"]["apps"] == {"gnnaas-first": ["first"], "gnnaas-second": ["second"]}
    first = apps["gnnaas-first"]
    assert (first["args"]["datasets"], first["args"]["catalog"]) == (["first"], "gnnaas")
    (deployment,) = first["deployments"]
    assert deployment["name"] == "DatasetApp" and deployment["num_replicas"] == 2
    assert deployment["ray_actor_options"] == {"num_cpus": 0.5}
    settings = first["args"]["settings"]
    assert Path(settings["variants_dir"]).is_absolute() and "admin_token" not in settings
    for app in config["applications"]:  # the import paths build the applications
        module, _, builder = app["import_path"].partition(":")
        assert module == ray_apps.__name__
        assert isinstance(getattr(ray_apps, builder)(app["args"]), serve.Application)


def test_one_application_for_every_dataset(repository: tuple[Path, Path], tmp_path: Path) -> None:
    config = _config(repository, tmp_path, "--one-app", "--autoscale", "1:3")
    apps = {a["name"]: a for a in config["applications"]}
    assert apps["gnnaas-datasets"]["route_prefix"] == "/v1/datasets"
    assert apps["gnnaas-datasets"]["args"]["datasets"] == ["first", "second"]
    (deployment,) = apps["gnnaas-datasets"]["deployments"]
    assert deployment["autoscaling_config"]["max_replicas"] == 3
    assert "num_replicas" not in deployment
