"""The one exception tree of gnnaas.

::

    GnnaasError
     ├── ConfigError      a bad name, option or value given by the user (unknown dataset, arch, ...)
     ├── ArtifactError    a variant or profile on disk that is missing, corrupt or does not match
     ├── OverloadedError  the server's queue is full; retry later
     └── DeadlineExceeded a request's deadline passed before it could be computed

Library code raises these (or ``ValueError``/``TypeError`` for programming errors); the CLI prints
``ErrorName: message`` on one line and exits 1, the HTTP app maps each family to a status code.
"""

from __future__ import annotations

__all__ = ["ArtifactError", "ConfigError", "DeadlineExceeded", "GnnaasError", "OverloadedError"]


class GnnaasError(Exception):
    """Base class of every error gnnaas reports to a user."""


class ConfigError(GnnaasError, ValueError):
    """A user-supplied name, option or value is invalid; the message says which and the fix."""


class ArtifactError(GnnaasError):
    """A stored artifact (variant weights, manifest, profile) is missing, corrupt or mismatched."""


class OverloadedError(GnnaasError):
    """The serving queue is full.

    Args:
        message (str): what is full.
        retry_after_s (float): a hint for when to retry.
    """

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DeadlineExceeded(GnnaasError):
    """A request's deadline (``X-Deadline-Ms``) passed while it waited, or its batch would have
    passed it: it was not computed (HTTP 504)."""
