"""The router: FastAPI app, selection policy, dynamic batcher, executor and metrics.

The serving core (:class:`VariantRegistry`, :func:`select_variant`, :class:`Batcher`,
:class:`Executor`, :class:`Router`) is plain Python free of FastAPI types; :func:`create_app` wraps
it in the HTTP API of ARCHITECTURE.md §6.
"""

from gnnaas.serving.app import create_app
from gnnaas.serving.batcher import Batched, Batcher, BatchStats
from gnnaas.serving.executor import ExecRequest, ExecResult, Executor, StageTimes
from gnnaas.serving.metrics import ServingMetrics
from gnnaas.serving.policy import Candidate, Selection, ServiceCurve, select_variant
from gnnaas.serving.profiles import VariantProfile
from gnnaas.serving.registry import ServedDataset, ServingVariant, VariantRegistry
from gnnaas.serving.router import NotFoundError, Prediction, Router
from gnnaas.serving.sampler import DepthSampler
from gnnaas.serving.settings import Settings

__all__ = [
    "BatchStats",
    "Batched",
    "Batcher",
    "Candidate",
    "DepthSampler",
    "ExecRequest",
    "ExecResult",
    "Executor",
    "NotFoundError",
    "Prediction",
    "Router",
    "Selection",
    "ServedDataset",
    "ServiceCurve",
    "ServingMetrics",
    "ServingVariant",
    "Settings",
    "StageTimes",
    "VariantProfile",
    "VariantRegistry",
    "create_app",
    "select_variant",
]
