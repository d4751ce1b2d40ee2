"""Every subpackage declares a sorted, complete ``__all__``."""

from __future__ import annotations

import importlib
import inspect

import pytest

PACKAGES = [
    "gnnaas",
    "gnnaas.errors",
    "gnnaas.cli",
    "gnnaas.config",
    "gnnaas.data",
    "gnnaas.sampling",
    "gnnaas.models",
    "gnnaas.inference",
    "gnnaas.variants",
    "gnnaas.profiling",
    "gnnaas.serving",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_sorted_and_resolves(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert exported == sorted(exported), f"{name}.__all__ is not sorted"
    assert len(set(exported)) == len(exported), f"{name}.__all__ has duplicates"
    for symbol in exported:
        assert hasattr(module, symbol), f"{name}.__all__ names missing {symbol}"


@pytest.mark.parametrize("name", PACKAGES[2:])
def test_all_is_complete(name: str) -> None:
    module = importlib.import_module(name)
    public = {
        attr
        for attr, value in vars(module).items()
        if not attr.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and getattr(value, "__module__", "").startswith(name)
    }
    assert public <= set(module.__all__), (
        f"{name} exports without __all__: {public - set(module.__all__)}"
    )
