"""Import hygiene: the server loads no training or plotting code; package names resolve lazily."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Modules a server must never load: training, generation, the profiler and the report's plots.
FORBIDDEN = [
    "gnnaas.variants.training",
    "gnnaas.variants.pipeline",
    "gnnaas.profiling.profiler",
    "gnnaas.profiling.measurement",
    "gnnaas.profiling.inputs",
    "gnnaas.profiling.report",
    "gnnaas.profiling.frontier",
    "gnnaas.profiling.plots",
    "gnnaas.profiling.frontier_plots",
    "matplotlib",
]

_SERVER = """
import json, sys
sys.path.insert(0, {fakes!r})
import gnnaas.data
from serving_fakes import tiny_store

store = tiny_store()
gnnaas.data.load_dataset = lambda name, data_root=None, **kwargs: store
from gnnaas.serving.http.app import create_app
from gnnaas.serving.core.settings import Settings

from fastapi.testclient import TestClient

app = create_app(Settings(variants_dir={variants!r}, profiles_dir={profiles!r}, device="cpu"))
with TestClient(app) as client:  # serve, so that lazily imported code paths run too
    name = next(iter(app.state.router.registry.datasets))
    answer = client.post(
        f"/v1/datasets/{{name}}/predict", json={{"nodes": [0, 1]}},
        headers={{"X-Accuracy-Tolerance": "1"}},
    )
    assert answer.status_code == 200, answer.text
    assert client.get(f"/v1/datasets/{{name}}/variants").status_code == 200
print(json.dumps([m for m in {forbidden!r} if m in sys.modules]))
"""


def test_server_loads_no_training_or_plotting_code(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "tests" / "serving"))
    try:
        from serving_fakes import tiny_store, write_tiny_repository
    finally:
        sys.path.pop(0)
    variants_dir, profiles_dir = write_tiny_repository(tmp_path, tiny_store())
    script = _SERVER.format(
        fakes=str(REPO / "tests" / "serving"),
        variants=str(variants_dir),
        profiles=str(profiles_dir),
        forbidden=FORBIDDEN,
    )
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


@pytest.mark.parametrize("name", ["gnnaas.profiling", "gnnaas.serving", "gnnaas.variants"])
def test_lazy_names_match_all(name: str) -> None:
    module = importlib.import_module(name)
    assert sorted(module._MODULE_OF) == sorted(module.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        module.nope  # noqa: B018
    assert set(module.__all__) <= set(dir(module))
