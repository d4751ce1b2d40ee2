"""Inference: the one sample → gather → copy → forward → copy-back routine.

The server's executor, the profiler and evaluation during generation share
:class:`InferencePath` (``path.py``). The server's batch handler :class:`Executor`
(``executor.py``) wraps it and is the call the profiler times for service curves, so profiled
figures are those of the served pipeline; ``scores.py`` turns outputs into per-node score parts;
``cache.py`` holds a variant's device feature cache (:class:`FeatureCache`).
Below the runtime, which builds every path and executor, in the layer order (data → sampling →
models → inference → runtime → variants → profiling → serving).
"""

from gnnaas.inference.cache import FeatureCache, Transfer
from gnnaas.inference.executor import (
    INLINE_MAX_NODES,
    ExecRequest,
    ExecResult,
    Executor,
    Output,
    embedding_dim,
)
from gnnaas.inference.path import InferencePath, PathOutput, Sampler, StageTimes
from gnnaas.inference.scores import metric, score_parts

__all__ = [
    "ExecRequest",
    "ExecResult",
    "Executor",
    "FeatureCache",
    "INLINE_MAX_NODES",
    "InferencePath",
    "Output",
    "PathOutput",
    "Sampler",
    "StageTimes",
    "Transfer",
    "embedding_dim",
    "metric",
    "score_parts",
]
