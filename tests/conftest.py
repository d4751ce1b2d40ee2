"""Shared fixtures: the data root with Cora's raw files, a throwaway cache, small graphs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

RAY_MODULES = frozenset(
    {
        "tests/inference/test_ray_layerwise.py",
        "tests/serving/test_contract.py",
        "tests/serving/test_live_graph.py",
        "tests/serving/test_ray_faults.py",
        "tests/serving/test_ray_start.py",
    }
)
"""The test modules that start a local Ray: under ``pytest -n`` they run in one worker, one after
another (see :func:`pytest_xdist_make_scheduler`)."""


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: without the plugin, never called
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist with ``--dist loadscope`` (``make test`` runs ``pytest -n 2 --dist
    loadscope``) each module's tests run in one worker, so its module fixtures are built once,
    and the modules that start Ray share one worker: they share the session's Ray, and two local
    clusters would each claim every CPU of the machine. A scheduler rather than ``xdist_group``
    marks: ``--dist loadgroup`` marks tests by rewriting their node ids, which pytest 9.2 no
    longer reads (pytest-xdist issue 1386), and then silently groups nothing."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class _RayTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "ray" if module in RAY_MODULES else module

    return _RayTogether(config, log)


def _default_data_root() -> Path:
    env = os.environ.get("GNNAAS_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Processed files go to a fresh cache, never into the data root, and imported datasets to a
    fresh data home (never the machine's); torch runs one thread.

    One intra-op thread keeps results independent of the machine's core count and avoids the
    oversubscription that makes small forwards many times slower on a busy 2-core machine.
    """
    os.environ["GNNAAS_CACHE"] = str(tmp_path_factory.mktemp("gnnaas-cache"))
    os.environ["GNNAAS_HOME"] = str(tmp_path_factory.mktemp("gnnaas-home"))  # imported datasets
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def data_root() -> Path:
    root = _default_data_root()
    if not (root / "Planetoid" / "Cora" / "raw").is_dir():
        pytest.skip(f"Cora's raw files are not under {root}; set GNNAAS_DATA")
    return root


@pytest.fixture(scope="session")
def cora(data_root: Path):  # type: ignore[no-untyped-def]
    from gnnaas.data import load_dataset

    return load_dataset("Cora", data_root, seed=0)


@pytest.fixture(scope="session")
def small_store():  # type: ignore[no-untyped-def]
    """The built-in small synthetic dataset (a few thousand nodes)."""
    from gnnaas.data import load_dataset

    return load_dataset("synth-small", seed=0)


@pytest.fixture
def umask_022():  # type: ignore[no-untyped-def]
    """The usual umask 022 for one test (files written by gnnaas should then be 0644)."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)
