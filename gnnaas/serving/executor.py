"""The server's batch handler: :class:`gnnaas.inference.Executor`, re-exported.

It lives in :mod:`gnnaas.inference` because the profiler times the same call for the service
curves; the serving layer only runs it.
"""

from gnnaas.inference.executor import (
    ExecRequest,
    ExecResult,
    Executor,
    Output,
    Sampler,
    StageTimes,
    embedding_dim,
)

__all__ = [
    "ExecRequest",
    "ExecResult",
    "Executor",
    "Output",
    "Sampler",
    "StageTimes",
    "embedding_dim",
]
