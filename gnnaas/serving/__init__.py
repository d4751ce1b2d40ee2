"""The server: the serving core, its HTTP face, and the ways to deploy it.

Three rooms, imports one way (``http`` and ``deploy`` import ``core``, never the reverse):

- ``core/``: what decides and computes, plain Python free of FastAPI types: the variant registry,
  the generations of lanes, the dynamic batcher, the router with its measured load (deciding with
  :mod:`gnnaas.policy`), reloads, metrics, drift, the settings and the live graph's writer;
- ``http/``: the FastAPI app (:func:`create_app`), its edge and predict fast lane, the routes,
  request parsing, dependencies and schemas (the HTTP contract of docs/architecture.md);
- ``deploy/``: one app in N worker processes on one machine, and on Ray Serve.

Names resolve lazily (PEP 562): importing the router or the batcher does not load FastAPI, and
nothing here loads training or plotting code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gnnaas._lazy import attach

if TYPE_CHECKING:
    from gnnaas.serving.core.batcher import Batched, Batcher, BatchStats
    from gnnaas.serving.core.metrics import ServingMetrics
    from gnnaas.serving.core.registry import ServedDataset, ServingVariant, VariantRegistry
    from gnnaas.serving.core.reload import Reloader, ReloadError, ReloadSummary
    from gnnaas.serving.core.router import NotFoundError, Prediction, Router
    from gnnaas.serving.core.settings import Settings
    from gnnaas.serving.http.app import create_app

_SOURCES = {
    "http.app": ("create_app",),
    "core.batcher": ("BatchStats", "Batched", "Batcher"),
    "core.metrics": ("ServingMetrics",),
    "core.registry": ("ServedDataset", "ServingVariant", "VariantRegistry"),
    "core.reload": ("ReloadError", "ReloadSummary", "Reloader"),
    "core.router": ("NotFoundError", "Prediction", "Router"),
    "core.settings": ("Settings",),
}

__all__ = [
    "BatchStats",
    "Batched",
    "Batcher",
    "NotFoundError",
    "Prediction",
    "ReloadError",
    "ReloadSummary",
    "Reloader",
    "Router",
    "ServedDataset",
    "ServingMetrics",
    "ServingVariant",
    "Settings",
    "VariantRegistry",
    "create_app",
]


__getattr__, __dir__, _MODULE_OF = attach(__name__, _SOURCES)
