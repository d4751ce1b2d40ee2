"""A batcher's waiting requests: one queue per priority, counted in nodes.

:class:`~gnnaas.serving.core.batcher.Batcher` keeps what waits for its next batch here. The
queues know the priority rules of docs/architecture.md §6 that depend on what waits only: which
request goes next (higher priority first, each in arrival order, a request older than the aging
time counted as ``high``), how much room each priority has (its share of the queue,
:data:`QUEUE_SHARES`), and which requests make room for a higher priority (lower ones, low
first, newest first). The batcher decides what to do with them (batching, deadlines, errors).
"""

from __future__ import annotations

import math
import sys
from collections import deque
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar

__all__ = ["AGING_S", "PRIORITIES", "QUEUE_SHARES", "RANK", "PriorityQueues", "taken_rank"]

PRIORITIES = ("high", "normal", "low")
"""Request priorities, most important first; a request's rank is its index."""
QUEUE_SHARES = (1.0, 1.0, 0.5)
"""The share of the queue's nodes each priority may fill (high, normal, low)."""
RANK = {priority: rank for rank, priority in enumerate(PRIORITIES)}
"""A priority's rank (its index in :data:`PRIORITIES`)."""
AGING_S = 0.1
"""A request that has waited this long (s) is taken as ``high``: no priority starves while the
server keeps up (the batcher's default ``aging_s``)."""


class Entry(Protocol):
    """What the queues need of a waiting request."""

    size: int  # its nodes
    rank: int  # its priority's rank
    enqueued_at: float  # when it was queued, on the batcher's clock


E = TypeVar("E", bound=Entry)


def taken_rank(entry: Entry, aged_before: float) -> int:
    """The rank ``entry`` is taken at: its priority's, or ``high``'s once it was queued before
    ``aged_before`` (it has waited the aging time)."""
    return 0 if entry.enqueued_at <= aged_before else entry.rank


class PriorityQueues(Generic[E]):
    """Waiting requests by priority, with their nodes counted.

    Args:
        max_nodes (int): the most nodes waiting (``high`` and ``normal`` may fill it all, ``low``
            its share).
    """

    def __init__(self, max_nodes: int) -> None:
        self.max_nodes = max_nodes
        self._queues: tuple[deque[E], ...] = tuple(deque() for _ in PRIORITIES)
        self.nodes = 0  # nodes waiting
        self.requests = 0  # requests waiting
        self.nodes_by_rank = [0] * len(PRIORITIES)

    def __iter__(self) -> Iterator[E]:
        for queue in self._queues:
            yield from queue

    def cap(self, rank: int) -> int:
        """The most nodes that may wait when a request of ``rank`` is queued."""
        return int(self.max_nodes * QUEUE_SHARES[rank])

    def ahead(self, priority: str) -> int:
        """Nodes a new request of ``priority`` waits behind: its own and higher priorities'."""
        if priority == "low":
            return self.nodes
        by_rank = self.nodes_by_rank
        return by_rank[0] if priority == "high" else by_rank[0] + by_rank[1]

    def room(self, priority: str) -> int:
        """Nodes of ``priority`` that fit without evicting (any number while nothing waits)."""
        if self.nodes == 0:
            return sys.maxsize
        room = self.cap(RANK[priority]) - self.nodes
        return room if room > 0 else 0

    def evictable(self, priority: str) -> int:
        """Waiting nodes of priorities lower than ``priority`` (what it may evict)."""
        return sum(self.nodes_by_rank[RANK[priority] + 1 :])

    def push(self, entry: E) -> None:
        """Queues ``entry`` behind the others of its priority."""
        self._queues[entry.rank].append(entry)
        self.nodes += entry.size
        self.requests += 1
        self.nodes_by_rank[entry.rank] += entry.size

    def removed(self, entry: E) -> None:
        """Uncounts an entry taken out of the queues (popped, evicted or cleared)."""
        self.nodes -= entry.size
        self.requests -= 1
        self.nodes_by_rank[entry.rank] -= entry.size

    def pop(self, aged_before: float) -> E | None:
        """The next entry by priority (one queued before ``aged_before`` counts as ``high``),
        then arrival; ``None`` when nothing waits. Still counted until :meth:`removed`."""
        best: deque[E] | None = None
        key = (len(PRIORITIES), math.inf)
        for queue in self._queues:
            if queue:
                head = queue[0]
                mine = (taken_rank(head, aged_before), head.enqueued_at)
                if mine < key:
                    best, key = queue, mine
        return None if best is None else best.popleft()

    def put_back(self, entries: list[E]) -> None:
        """Returns popped, still counted ``entries`` to the heads of their queues, in their
        order: they go next, before what arrived since."""
        for entry in reversed(entries):
            self._queues[entry.rank].appendleft(entry)

    def evict_for(self, rank: int, size: int) -> Iterator[E]:
        """Takes out (and uncounts) entries of ranks lower than ``rank``, lowest first, newest
        first, until ``size`` nodes of ``rank`` fit its share; yields each one."""
        cap = self.cap(rank)
        for lower in range(len(PRIORITIES) - 1, rank, -1):
            queue = self._queues[lower]
            while queue and self.nodes + size > cap:
                victim = queue.pop()
                self.removed(victim)
                yield victim

    def clear(self) -> list[E]:
        """Takes out every entry (still counted until :meth:`removed`)."""
        out = [*self]
        for queue in self._queues:
            queue.clear()
        return out
