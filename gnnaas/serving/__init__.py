"""The router: FastAPI app, selection policy, dynamic batcher, executor and metrics.

The serving core (:class:`VariantRegistry`, :func:`select_variant`, :class:`Batcher`,
:class:`Executor`, :class:`Router`) is plain Python free of FastAPI types; :func:`create_app` wraps
it in the HTTP API of ARCHITECTURE.md §6.

Names resolve lazily (PEP 562): importing the policy or the batcher does not load FastAPI, and
nothing here loads training or plotting code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gnnaas._lazy import attach

if TYPE_CHECKING:
    from gnnaas.serving.app import create_app
    from gnnaas.serving.batcher import Batched, Batcher, BatchStats
    from gnnaas.serving.executor import ExecRequest, ExecResult, Executor, StageTimes
    from gnnaas.serving.metrics import ServingMetrics
    from gnnaas.serving.policy import (
        Candidate,
        LoadSnapshot,
        RequestSpec,
        Selection,
        ServiceCurve,
        VariantLoad,
        select_variant,
    )
    from gnnaas.serving.profiles import VariantProfile
    from gnnaas.serving.registry import ServedDataset, ServingVariant, VariantRegistry
    from gnnaas.serving.reload import Reloader, ReloadError, ReloadSummary
    from gnnaas.serving.router import NotFoundError, Prediction, Router
    from gnnaas.serving.sampler import DepthSampler
    from gnnaas.serving.settings import Settings

_SOURCES = {
    "app": ("create_app",),
    "batcher": ("BatchStats", "Batched", "Batcher"),
    "executor": ("ExecRequest", "ExecResult", "Executor", "StageTimes"),
    "metrics": ("ServingMetrics",),
    "policy": (
        "Candidate",
        "LoadSnapshot",
        "RequestSpec",
        "Selection",
        "ServiceCurve",
        "VariantLoad",
        "select_variant",
    ),
    "profiles": ("VariantProfile",),
    "registry": ("ServedDataset", "ServingVariant", "VariantRegistry"),
    "reload": ("ReloadError", "ReloadSummary", "Reloader"),
    "router": ("NotFoundError", "Prediction", "Router"),
    "sampler": ("DepthSampler",),
    "settings": ("Settings",),
}

__all__ = [
    "BatchStats",
    "Batched",
    "Batcher",
    "Candidate",
    "DepthSampler",
    "ExecRequest",
    "ExecResult",
    "Executor",
    "LoadSnapshot",
    "NotFoundError",
    "Prediction",
    "ReloadError",
    "ReloadSummary",
    "Reloader",
    "RequestSpec",
    "Router",
    "Selection",
    "ServedDataset",
    "ServiceCurve",
    "ServingMetrics",
    "ServingVariant",
    "Settings",
    "StageTimes",
    "VariantLoad",
    "VariantProfile",
    "VariantRegistry",
    "create_app",
    "select_variant",
]


__getattr__, __dir__, _MODULE_OF = attach(__name__, _SOURCES)
