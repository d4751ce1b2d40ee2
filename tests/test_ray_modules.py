"""Every test module that starts a local Ray is listed in ``RAY_MODULES`` (``tests/conftest.py``).

``make test`` runs the suite in two pytest-xdist workers and sends the listed modules to one of
them, one after another: they share the session's Ray, and two local clusters would each claim
every CPU of the machine. A module that starts Ray without being listed would run beside them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

# What starts a Ray in a test: the session's fixture, ray.init, gnnaas's own starters, or a
# `gnnaas serve --backend ray` process.
STARTS_RAY = re.compile(
    r'\bray_serve\b|\bray\.init\(|\bstart_ray\(|\bray_layerwise_inference\(|"--backend", "ray"'
)


def _ray_modules(config: pytest.Config) -> frozenset[str]:
    conftest = TESTS / "conftest.py"
    for plugin in config.pluginmanager.get_plugins():
        if getattr(plugin, "__file__", None) == str(conftest):
            return plugin.RAY_MODULES  # type: ignore[no-any-return]
    raise AssertionError(f"{conftest} is not loaded")


def test_every_module_that_starts_ray_is_listed(pytestconfig: pytest.Config) -> None:
    starting = {
        path.relative_to(TESTS.parent).as_posix()
        for path in TESTS.rglob("test_*.py")
        if path.name != Path(__file__).name and STARTS_RAY.search(path.read_text())
    }
    assert starting == _ray_modules(pytestconfig)
