"""The one exception tree of gnnaas.

::

    GnnaasError
     ├── ConfigError      a bad name, option or value given by the user (unknown dataset, arch, ...)
     │    └── UnmeetableDeadline  a deadline no admissible variant meets even on an idle server
     ├── ArtifactError    a variant or profile on disk that is missing, corrupt or does not match
     ├── OverloadedError  the server's queue is full; retry later
     └── DeadlineExceeded a request's deadline passed before it could be computed

Library code raises these (or ``ValueError``/``TypeError`` for programming errors); the CLI prints
``ErrorName: message`` on one line and exits 1, the HTTP app maps each family to a status code.
"""

from __future__ import annotations

__all__ = [
    "ArtifactError",
    "ConfigError",
    "DeadlineExceeded",
    "GnnaasError",
    "OverloadedError",
    "UnmeetableDeadline",
]


class GnnaasError(Exception):
    """Base class of every error gnnaas reports to a user."""


class ConfigError(GnnaasError, ValueError):
    """A user-supplied name, option or value is invalid; the message says which and the fix."""


class UnmeetableDeadline(ConfigError):
    """A request's deadline (``X-Deadline-Ms``) is shorter than the profiled time of the fastest
    variant it admits, served alone on an idle server: no load, now or later, lets it be met, so
    the same request must not be retried (HTTP 422, no ``Retry-After``); a longer deadline, a
    larger tolerance or fewer nodes can be served."""


class ArtifactError(GnnaasError):
    """A stored artifact (variant weights, manifest, profile) is missing, corrupt or mismatched."""


class OverloadedError(GnnaasError):
    """The server cannot take the request now (HTTP 503 with ``Retry-After``).

    Args:
        message (str): what is full, and what to do.
        retry_after_s (float, optional): a hint for when to retry. (default: ``1.0``)
        cause (str, optional): why, as the metrics count it: ``queue_full`` (no room in the
            variant's queue), ``evicted`` (shed for higher-priority traffic), ``deadline`` (not
            predicted to meet its deadline), ``stopping`` (the server or a variant is shutting
            down or being replaced). (default: ``"queue_full"``)
        hold_s (float, optional): how long the load that refused it is predicted to last (s);
            ``0`` when not predicted. (default: ``0.0``)
    """

    def __init__(
        self,
        message: str,
        retry_after_s: float = 1.0,
        *,
        cause: str = "queue_full",
        hold_s: float = 0.0,
    ) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.cause = cause
        self.hold_s = hold_s


class DeadlineExceeded(GnnaasError):
    """A request's deadline (``X-Deadline-Ms``) passed while it waited, or its batch would have
    passed it: it was not computed (HTTP 504)."""
