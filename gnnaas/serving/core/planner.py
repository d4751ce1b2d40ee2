"""The batcher's decisions as one pure step: what the next batch holds, what fails, how long it
waits.

:class:`~gnnaas.serving.core.batcher.Batcher` only drives a :class:`BatchPlanner`. At each
wake-up (a request arrived, the wait for batch-mates is over, the device gate was granted) it
calls :meth:`BatchPlanner.plan` with the time on its clock and does what the returned
:class:`BatchPlan` says: fail the requests whose deadline passed, wait (for an arrival, or until
:attr:`BatchPlan.wait_until`), take the device gate, or run :attr:`BatchPlan.run`. The planner
holds the waiting requests (:class:`~gnnaas.serving.core.queues.PriorityQueues`), the batch being
formed and the request carried over to the next batch; it reads no clock and knows no event loop
or thread, so its tests call it with the times they choose.

The rules (docs/architecture.md §6), as a step applies them:

- A batch starts with the request carried over from the previous batch, else with the next
  waiting one: higher priorities first, each in arrival order, a request waiting longer than
  ``aging_s`` counted as ``high``. It takes the next ones, in that order, up to
  ``max_batch_size`` nodes; one that would overflow it is carried over to start the next batch,
  and closes this one.
- Requests whose caller gave up are skipped; those whose deadline has passed are failed
  (``"passed"``).
- A batch that is not full waits for batch-mates until ``max_wait_s`` after its first member was
  queued, unless the batcher is stopping; then it is closed, and the batcher takes the gate.
- Closing it (``closing=True``, once the gate is granted), the step takes what arrived meanwhile
  without waiting any longer, leaves out the members whose caller gave up, and fits the batch to
  its members' deadlines (:func:`~gnnaas.serving.core.deadlines.fit_batch`): those it drops fail,
  those it leaves out go back to the heads of their queues, for the next batch.

Example:
    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Request:
    ...     size: int
    ...     rank: int = 1
    ...     enqueued_at: float = 0.0
    ...     expires: float | None = None
    ...     gone: bool = False
    >>> planner = BatchPlanner(max_batch_size=4, max_wait_s=0.5)
    >>> planner.push(Request(1))
    >>> planner.plan(now=0.1).wait_until  # not full: it waits for batch-mates
    0.5
    >>> planner.plan(now=0.5).ready  # its wait is over: take the gate
    True
    >>> [r.size for r in planner.plan(now=0.5, closing=True).run]
    [1]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from gnnaas.serving.core.deadlines import Timed, fit_batch
from gnnaas.serving.core.queues import AGING_S, PriorityQueues

__all__ = ["BatchPlan", "BatchPlanner", "Waiting"]


class Waiting(Timed, Protocol):
    """A queued request as the planner sees it: :class:`~gnnaas.serving.core.deadlines.Timed`
    (its nodes, priority rank, time queued and deadline), and whether its caller gave up."""

    @property
    def gone(self) -> bool:
        """Its caller gave up (or it was answered already): it is skipped."""


W = TypeVar("W", bound=Waiting)


@dataclass(frozen=True)
class BatchPlan(Generic[W]):
    """What the batcher does after one step of its :class:`BatchPlanner`.

    Args:
        run (list): the batch to run now, in order; only a closing step fills it.
        expired (list[tuple]): requests to fail with
            :class:`~gnnaas.errors.DeadlineExceeded`, each with why (``"passed"``, ``"would pass
            in its batch"``); they are out of the queues.
        back (list): members the deadlines left out, back at the heads of their queues.
        wait_until (float, optional): the batch being formed waits for batch-mates until then
            (on the caller's clock). (default: ``None``: it does not wait)
        forming (bool): a batch is being formed: it waits (:attr:`wait_until`) or is
            :attr:`ready`. (default: ``False``)
    """

    run: list[W] = field(default_factory=list)
    expired: list[tuple[W, str]] = field(default_factory=list)
    back: list[W] = field(default_factory=list)
    wait_until: float | None = None
    forming: bool = False

    @property
    def idle(self) -> bool:
        """Nothing to run or form: wait for an arrival (or stop)."""
        return not self.forming and not self.run

    @property
    def ready(self) -> bool:
        """A batch is formed and waits no longer: take the gate, then close it."""
        return self.forming and self.wait_until is None


def _no_time(nodes: int) -> float:
    return 0.0


class BatchPlanner(Generic[W]):
    """The waiting requests of one batcher and the step that forms its batches.

    Args:
        max_batch_size (int, optional): most nodes per batch; a single larger request runs
            alone. (default: ``1024``)
        max_wait_s (float, optional): how long the first request of a batch waits for others.
            (default: ``0.0``)
        max_queue_size (int, optional): most nodes waiting (the queues' bound).
            (default: ``16384``)
        aging_s (float, optional): a request waiting longer than this is taken as ``high``.
            (default: ``0.1``)
        predict_s (Callable[[int], float], optional): the predicted time (s) of a batch of that
            many nodes, which batches are fitted to their deadlines with. (default: ``None``:
            only passed deadlines fail)
    """

    def __init__(
        self,
        *,
        max_batch_size: int = 1024,
        max_wait_s: float = 0.0,
        max_queue_size: int = 16384,
        aging_s: float = AGING_S,
        predict_s: Callable[[int], float] | None = None,
    ) -> None:
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.aging_s = aging_s
        self.predict_s = predict_s or _no_time
        self.queues: PriorityQueues[W] = PriorityQueues(max_queue_size)
        self._forming: list[W] = []  # the open batch, until a closing step takes it
        self._carry: W | None = None  # starts the next batch

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(max_batch_size={self.max_batch_size}, "
            f"max_wait_s={self.max_wait_s}, waiting={self.queues.requests})"
        )

    @property
    def forming(self) -> tuple[W, ...]:
        """The batch being formed (its members stay counted in :attr:`queues` until it runs)."""
        return tuple(self._forming)

    @property
    def carry(self) -> W | None:
        """The request that starts the next batch (it would have overflowed the last one)."""
        return self._carry

    def push(self, entry: W) -> None:
        """Queues ``entry`` behind the others of its priority."""
        self.queues.push(entry)

    def plan(self, now: float, *, closing: bool = False, stopping: bool = False) -> BatchPlan[W]:
        """One step at time ``now``: forms the next batch from what waits (module docstring).

        Args:
            now (float): the time, on the clock the requests were queued and their deadlines
                set by.
            closing (bool, optional): the gate is granted: close the batch and return it to
                run. (default: ``False``)
            stopping (bool, optional): the batcher is stopping: a batch waits for no
                batch-mates. (default: ``False``)

        Returns:
            BatchPlan: what to do; the requests it returns (to run or to fail) are out of the
            queues.
        """
        expired: list[tuple[W, str]] = []
        batch = self._forming
        if not batch:
            first = self._first(now, expired)
            if first is None:
                return BatchPlan(expired=expired)
            batch.append(first)
        size = self._fill(now, expired)
        if closing:
            return self._close(now, expired)
        if size < self.max_batch_size and self._carry is None and not stopping:
            until = batch[0].enqueued_at + self.max_wait_s
            if now < until:
                return BatchPlan(expired=expired, wait_until=until, forming=True)
        return BatchPlan(expired=expired, forming=True)

    def clear(self) -> list[W]:
        """Takes out every request waiting (the batch being formed, the carried one and the
        queued ones), uncounted."""
        waiting = [*self._forming, *([] if self._carry is None else [self._carry])]
        self._forming, self._carry = [], None
        waiting.extend(self.queues.clear())
        for entry in waiting:
            self.queues.removed(entry)
        return waiting

    def _usable(self, entry: W, now: float, expired: list[tuple[W, str]]) -> bool:
        """Whether ``entry`` may join a batch; a gone or expired one leaves the queues."""
        if entry.gone:
            self.queues.removed(entry)
            return False
        if entry.expires is not None and now > entry.expires:
            self.queues.removed(entry)
            expired.append((entry, "passed"))
            return False
        return True

    def _next(self, now: float, expired: list[tuple[W, str]]) -> W | None:
        """The next usable waiting request (aging counted at ``now``), ``None`` when none."""
        while (entry := self.queues.pop(now - self.aging_s)) is not None:
            if self._usable(entry, now, expired):
                return entry
        return None

    def _first(self, now: float, expired: list[tuple[W, str]]) -> W | None:
        carry, self._carry = self._carry, None
        if carry is not None and self._usable(carry, now, expired):
            return carry
        return self._next(now, expired)

    def _fill(self, now: float, expired: list[tuple[W, str]]) -> int:
        """Adds waiting requests to the open batch until it is full or one would overflow it
        (carried over); returns its nodes."""
        batch = self._forming
        size = sum(p.size for p in batch)
        while size < self.max_batch_size and self._carry is None:
            entry = self._next(now, expired)
            if entry is None:
                break
            if size + entry.size > self.max_batch_size:
                self._carry = entry
                break
            batch.append(entry)
            size += entry.size
        return size

    def _close(self, now: float, expired: list[tuple[W, str]]) -> BatchPlan[W]:
        batch, self._forming = self._forming, []
        live: list[W] = []
        for p in batch:
            if p.gone:  # its caller gave up while the batch waited
                self.queues.removed(p)
            else:
                live.append(p)
        back: list[W] = []
        if any(p.expires is not None for p in live):
            live, back, dropped = fit_batch(live, now, self.predict_s, now - self.aging_s)
            for p, why in dropped:
                self.queues.removed(p)
                expired.append((p, why))
            self.queues.put_back(back)
        for p in live:
            self.queues.removed(p)
        return BatchPlan(run=live, expired=expired, back=back)
