"""Import hygiene: the server loads no training or plotting code; package names resolve lazily."""

from __future__ import annotations

import ast
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
    "gnnaas.variants.progress",
    "gnnaas.profiling.profiler",
    "gnnaas.profiling.measurement",
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


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def _imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """The gnnaas modules ``path`` imports anywhere (functions included: a lazy import is still
    an edge), except under ``if TYPE_CHECKING:``; ``from a import b`` is ``a.b`` when that is a
    module, else ``a``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(_without_type_checking(ast.parse(path.read_text()))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base)
    return {m for m in out if m in modules and m != name}


def _without_type_checking(tree: ast.Module) -> ast.Module:
    class Strip(ast.NodeTransformer):
        def visit_If(self, node: ast.If) -> ast.AST | None:
            if "TYPE_CHECKING" in ast.unparse(node.test):
                return None
            return self.generic_visit(node)

    return Strip().visit(tree)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycles_are_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_gnnaas() -> None:
    """No gnnaas module imports, directly or through others, one that imports it back, not even
    from inside a function: the layers of docs/architecture.md §2 depend one way."""
    paths = sorted((REPO / "gnnaas").rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    graph = {_module_name(p): _imports(p, _module_name(p), modules) for p in paths}
    assert len(graph) > 50 and graph["gnnaas.serving.core.router"]  # the walk saw the package
    assert _cycles(graph) == []


def _layer(module: str, packages: set[str]) -> str:
    """The layer of docs/architecture.md §2 a module belongs to: ``gnnaas.<package>`` (its
    subpackages folded in, ``gnnaas.data.live`` into ``gnnaas.data``), the three rooms of
    ``gnnaas.serving`` apart (``core``, ``http``, ``deploy``), a top-level module on its own."""
    parts = module.split(".")
    if len(parts) == 2 and module not in packages:  # gnnaas.errors, gnnaas.config, ...
        return module
    return ".".join(parts[: 3 if parts[1:2] == ["serving"] else 2])


def test_no_import_circle_between_packages() -> None:
    """The layers depend one way, counting the imports inside functions too (a lazy import is
    still a dependency): no package imports one that imports it back, directly or through
    others."""
    paths = sorted((REPO / "gnnaas").rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    packages = {_module_name(p) for p in paths if p.name == "__init__.py"}
    graph: dict[str, set[str]] = {}
    for p in paths:
        name = _module_name(p)
        here = _layer(name, packages)
        graph.setdefault(here, set()).update(
            _layer(m, packages) for m in _imports(p, name, modules) if _layer(m, packages) != here
        )
    for deps in list(graph.values()):
        for d in deps:
            graph.setdefault(d, set())
    assert {"gnnaas.profiling", "gnnaas.serving.core", "gnnaas.runtime"} <= set(graph)
    assert "gnnaas.profiling" in graph["gnnaas.serving.core"]  # the walk saw the edges
    assert _cycles(graph) == []


def test_layers_fold_subpackages_and_keep_the_serving_rooms_apart() -> None:
    packages = {"gnnaas", "gnnaas.data", "gnnaas.data.live", "gnnaas.serving"}
    assert _layer("gnnaas.data.live.wal", packages) == "gnnaas.data"
    assert _layer("gnnaas.serving.http.routes.predict", packages) == "gnnaas.serving.http"
    assert _layer("gnnaas.serving", packages) == "gnnaas.serving"
    assert _layer("gnnaas.errors", packages) == "gnnaas.errors"
    assert _layer("gnnaas.data", packages) == "gnnaas.data"
