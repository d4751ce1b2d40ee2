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

Requests the book does not cover go on to admission, which decides again (and writes again).
Plain Python, no FastAPI; one book per router, read and written on the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from gnnaas.errors import OverloadedError

__all__ = ["Shed", "ShedBook", "shed_outcome"]


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

    def covers(self, deadline_ms: float | None, now: float) -> bool:
        """Whether a request with ``deadline_ms`` (``None``: none) is refused by it at ``now``."""
        if now >= self.until:
            return False
        limit = self.deadline_ms
        return limit is None or (deadline_ms is not None and deadline_ms <= limit)


class ShedBook:
    """The refusals admission made that still hold, by (dataset, priority)."""

    def __init__(self) -> None:
        self._shed: dict[tuple[str, str], Shed] = {}

    def __len__(self) -> int:
        return len(self._shed)

    def record(self, dataset: str, priority: str, shed: Shed) -> None:
        """Writes a refusal of admission (replacing the previous one of that priority)."""
        self._shed[(dataset, priority)] = shed

    def refusal(
        self, dataset: str, priority: str, deadline_ms: float | None, now: float
    ) -> OverloadedError | None:
        """The error admission would answer a request of ``dataset`` and ``priority`` with a
        ``deadline_ms`` (``None``: none) at ``now``, when a refusal still covers it, else
        ``None`` (admission decides). A refusal that stopped holding is dropped."""
        key = (dataset, priority)
        shed = self._shed.get(key)
        if shed is None:
            return None
        if now >= shed.until:
            del self._shed[key]
            return None
        return shed.error if shed.covers(deadline_ms, now) else None

    def clear(self) -> None:
        """Forgets every refusal (the served set was replaced)."""
        self._shed.clear()
