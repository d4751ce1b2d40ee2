"""Lazy package attributes (PEP 562), shared by the package ``__init__``s.

A package lists where each public name lives; a name's module is imported on first access, so
importing ``gnnaas.serving`` loads no FastAPI and importing the policy loads no training code.

Example:
    >>> __getattr__, __dir__, _MODULE_OF = attach(__name__, {"core.router": ("Router",)})
    ... # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["attach"]


def attach(
    package: str, sources: Mapping[str, Iterable[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]], dict[str, str]]:
    """``__getattr__`` and ``__dir__`` for ``package``, and its name → submodule map.

    Args:
        package (str): the package's ``__name__``.
        sources (Mapping[str, Iterable[str]]): submodule name → the public names it defines.

    Returns:
        tuple: ``(__getattr__, __dir__, module_of)``.
    """
    module_of = {name: module for module, names in sources.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:
        namespace = vars(sys.modules[package])
        return sorted(set(namespace) | set(namespace.get("__all__", ())))

    return __getattr__, __dir__, module_of
