"""Which priorities admission is shedding now: what the edge refuses before reading a body.

Admission decides who is shed (:func:`~gnnaas.serving.core.deadlines.admit`, a full queue, an
eviction); each such refusal of a request of dataset ``d`` and priority ``p`` is also written here
as a :class:`Shed`: until when it holds, for which deadlines, and the very error the request got.
The edge (:mod:`gnnaas.serving.http.edge`) reads it for every predict request from its headers
alone and refuses the requests it covers before their body is read, with the same 503,
``Retry-After`` and detail: under overload, the refusal is then the cheapest answer the server
has, and what is left of the CPU serves the requests that are admitted.

How long a refusal holds is what admission predicted it would take to change:

- a request that would wait more than its priority's share of its slack: until the predicted
  wait has shrunk to that share (the work ahead served at the profiled pace), for requests of
  that priority whose deadline is no longer than the refused one's (a longer deadline has more
  slack: admission decides it);
- a full queue or an eviction: until the running batch is predicted to end (a batch taken off
  the queue makes room), for every request of that priority.

Either covers only requests that admission would decide among no more variants: pinned to the
same variant, or not pinned with a tolerance no larger (the effective one:
:func:`~gnnaas.policy.effective_tolerance`). The edge does not know a request's size before its
body: a refusal made for a large request covers a smaller one too, for the short time it holds
(under overload the queued stream ahead, not the request, makes most of a prediction).

Requests the book does not cover go on to admission, which decides again (and writes again).
Plain Python, no FastAPI; one book per router, read and written on the event loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gnnaas.errors import OverloadedError

__all__ = ["Asked", "Shed", "ShedBook", "shed_outcome"]


def shed_outcome(error: OverloadedError) -> str:
    """The admission outcome a shed request is counted under (``gnnaas_admission_total``):
    ``shed_deadline``, ``shed_evicted``, or ``shed_queue_full`` (a full queue, or a variant
    shutting down)."""
    return {"deadline": "shed_deadline", "evicted": "shed_evicted"}.get(
        error.cause, "shed_queue_full"
    )


@dataclass(frozen=True)
class Shed:
    """One priority of one dataset shed by admission.

    Args:
        until (float): when the refusal stops holding (on the router's clock).
        error (OverloadedError): what admission answered (status, ``Retry-After``, detail).
        deadline_ms (float, optional): the refused request's ``X-Deadline-Ms``: the refusal
            covers the requests whose deadline is at most this; ``None``: every request of
            the priority. (default: ``None``)
    """

    until: float
    error: OverloadedError
    deadline_ms: float | None = None
    tolerance: float = math.inf
    pinned: str | None = None

    def covers(self, asked: Asked, now: float) -> bool:
        """Whether the request ``asked`` is refused by it at ``now``."""
        if now >= self.until or asked.pinned != self.pinned:
            return False
        if asked.pinned is None and asked.tolerance > self.tolerance:
            return False  # more variants are admissible: admission decides
        limit = self.deadline_ms
        return limit is None or (asked.deadline_ms is not None and asked.deadline_ms <= limit)


@dataclass(frozen=True)
class Asked:
    """What a predict request asks for, as its headers say (what a refusal is matched on).

    Args:
        priority (str): ``X-Priority``.
        deadline_ms (float, optional): ``X-Deadline-Ms`` (``None``: none).
        tolerance (float): the effective tolerance (:func:`~gnnaas.policy.effective_tolerance`).
        pinned (str, optional): ``X-Variant`` (``None``: the router decides).
    """

    priority: str
    deadline_ms: float | None
    tolerance: float
    pinned: str | None = None


class ShedBook:
    """The refusals admission made that still hold, by (dataset, priority, pinned variant)."""

    def __init__(self) -> None:
        self._shed: dict[tuple[str, str, str | None], Shed] = {}

    def __len__(self) -> int:
        return len(self._shed)

    def record(self, dataset: str, priority: str, shed: Shed) -> None:
        """Writes a refusal of admission (replacing the previous one of that priority and
        pinned variant)."""
        self._shed[(dataset, priority, shed.pinned)] = shed

    def refusal(self, dataset: str, asked: Asked, now: float) -> OverloadedError | None:
        """The error admission would answer the request ``asked`` of ``dataset`` with at
        ``now``, when a refusal still covers it, else ``None`` (admission decides). A refusal
        that stopped holding is dropped."""
        key = (dataset, asked.priority, asked.pinned)
        shed = self._shed.get(key)
        if shed is None:
            return None
        if now >= shed.until:
            del self._shed[key]
            return None
        return shed.error if shed.covers(asked, now) else None

    def clear(self) -> None:
        """Forgets every refusal (the served set was replaced)."""
        self._shed.clear()
