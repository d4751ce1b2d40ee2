"""Deadlines and priorities: who is admitted with a deadline, and what a formed batch takes.

The rules of docs/architecture.md §6 that depend on a request's deadline, apart from the
machinery that applies them: :class:`~gnnaas.serving.core.router.Router` calls :func:`admit`
before it queues a request with ``X-Deadline-Ms``, and the batcher's step
(:meth:`~gnnaas.serving.core.planner.BatchPlanner.plan`) calls :func:`fit_batch` on every batch
that holds a deadline, then fails or puts back what it left out.

A deadline shorter than the profiled time of the fastest variant the request admits, served
alone on an idle device, is refused as :class:`~gnnaas.errors.UnmeetableDeadline` (422 over
HTTP): no load lets it be met, so it must not be retried as it is. Every other deadline refused
at admission depends on the load (its queue, the device's measured speed) and is an
:class:`~gnnaas.errors.OverloadedError` (503 with ``Retry-After``).

The slack of a request (its deadline left minus its own predicted service) is shared by
priority (:data:`SLACK_SHARES`): a normal or low request is refused at admission while its
predicted wait takes more than its share, and the time joiners add to a batch stays within the
joiner's share of the batch's slack. So under overload the queue and the batches stay short
enough for a high request arriving behind them to make its deadline, while requests cheap to add
still fill a batch; on an idle server there is no wait and every priority is admitted alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from gnnaas.errors import DeadlineExceeded, OverloadedError, UnmeetableDeadline
from gnnaas.policy import LoadSnapshot, Selection
from gnnaas.serving.core.queues import RANK, Entry, taken_rank
from gnnaas.serving.core.registry import ServingVariant

__all__ = ["SLACK_SHARES", "admit", "fit_batch", "late_answer", "share_words"]

SLACK_SHARES = (1.0, 1 / 3, 0.25)
"""The share of a request's slack (its deadline left minus its own predicted service time) that
its predicted queue wait may take at admission, and of a batch's slack (the tightest deadline in
it minus the first member's own time) that the time added by joining it may take (high, normal,
low). Lower priorities are thus refused while the queue is still short enough for a high one to
wait behind it, and they stretch a batch (a high one's, or one a high one arriving later waits
for) by a third or a quarter of its slack at most, the rest a margin for prediction error. A
request alone is never held back by its share, and on an idle server (no wait) every priority is
admitted alike."""


_WORDS = {1.0: "all of it", 0.5: "half", 1 / 3: "a third", 0.25: "a quarter"}


def share_words(share: float) -> str:
    """A share of a request's slack in words (``all of it``, ``half``, ``a third``, ``a
    quarter``, else a percentage), for the messages and the docs.

    Example:
        >>> [share_words(s) for s in SLACK_SHARES]
        ['all of it', 'a third', 'a quarter']
    """
    for value, words in _WORDS.items():
        if math.isclose(share, value):
            return words
    return f"{share:.0%}"


class Timed(Entry, Protocol):
    """A waiting request as :func:`fit_batch` sees it."""

    expires: float | None  # never computed after this time (on the batcher's clock)


P = TypeVar("P", bound=Timed)


def admit(
    variant: ServingVariant,
    selection: Selection | None,
    num_nodes: int,
    deadline_ms: float,
    left_ms: float,
    priority: str,
    *,
    load: Callable[[], LoadSnapshot],
    slowdown: float,
    max_batch_nodes: int,
    retry_after_s: float,
    fastest_alone: Callable[[], tuple[str, float]],
    lag_ms: float = 0.0,
) -> None:
    """Refuses a request that ``variant`` (the router's choice for it, or the pinned one when
    ``selection`` is ``None``) is not predicted to answer within its ``left_ms``, or with which a
    normal or low request would wait more than its share of its slack; returns otherwise. A high
    request the decision's prediction (the stream's next batch) does not fit is predicted again
    as leading a batch of its own (:meth:`~gnnaas.policy.LoadSnapshot.leading_at`): batches take
    it first and what joins stays within its deadline.

    ``load`` reads the variant's load now (only when ``selection`` holds no prediction);
    ``slowdown`` is the device's slowdown at the request's batch size
    (:meth:`~gnnaas.serving.core.slowdown.Slowdown.at`); ``fastest_alone``
    gives, read only when the deadline is not predicted to be met, the variant with the smallest
    profiled time for the request alone among those it admits (the pinned one when pinned), and
    that time in ms; ``lag_ms`` is the event loop's lag already taken off ``left_ms``
    (:mod:`~gnnaas.serving.core.looplag`), named in the refusals.

    Raises:
        UnmeetableDeadline: even that time alone exceeds ``deadline_ms``: no load lets it be met.
        OverloadedError: any other refusal (the load decides: retry later).
    """
    profile = variant.profile
    if profile is None:  # never routed to; a pinned one is served as asked
        return
    predicted = math.nan if selection is None else selection.predicted_ms
    if not math.isfinite(predicted):  # pinned, or chosen without reading the load
        lookup = variant.answers is not None
        predicted = load().completion_ms(variant.variant_id, profile.service, num_nodes, lookup)
    unmeetable = predicted > left_ms if selection is None else selection.meets_slo is False
    if unmeetable and priority == "high":
        # The decision judged the dataset's stream (its next batch about the running one's
        # size); a high request leads a batch of its own instead, taken before the lower
        # priorities queued and joined only within its deadline (fit_batch).
        predicted = load().leading_at(profile.service, num_nodes, slowdown)
        unmeetable = predicted > left_ms
    if unmeetable:
        fastest, alone_ms = fastest_alone()
        if alone_ms > deadline_ms:
            raise _never_met(deadline_ms, num_nodes, fastest, alone_ms, pinned=selection is None)
        raise OverloadedError(
            f"X-Deadline-Ms {deadline_ms:g}: no admissible variant is predicted to answer "
            f"within the {max(left_ms, 0.0):.1f} ms left{_lag_words(lag_ms)} (best prediction: "
            f"{predicted:.1f} ms "
            f"({variant.variant_id})); retry later, with a longer deadline or a larger "
            "X-Accuracy-Tolerance",
            retry_after_s,
            cause="deadline",
            hold_s=max(predicted - left_ms, 0.0) / 1e3,  # until the best prediction fits
        )
    share = SLACK_SHARES[RANK[priority]]
    own_ms = slowdown * profile.service.predict_batched(num_nodes, max_batch_nodes)
    wait_ms = predicted - own_ms  # the queue part of the prediction
    allowed_ms = share * (left_ms - own_ms)
    if share >= 1.0 or wait_ms <= allowed_ms:
        return
    raise OverloadedError(
        f"X-Deadline-Ms {deadline_ms:g}: a {priority}-priority request may wait {share:.0%} of "
        f"its slack (the {max(left_ms, 0.0):.1f} ms left{_lag_words(lag_ms)} minus its own "
        f"{own_ms:.1f} ms on "
        f"{variant.variant_id}), and it is predicted to wait {wait_ms:.1f} ms; the rest is kept "
        "for higher priorities; retry later, or with a higher X-Priority or a longer deadline",
        retry_after_s,
        cause="deadline",
        hold_s=(wait_ms - max(allowed_ms, 0.0)) / 1e3,  # until the wait has shrunk to the share
    )


def _met_words(met_ms: float) -> str:
    """How much of the event loop's lag a late answer's deadline already counts ("" for none)."""
    if met_ms < 0.05:
        return ""
    return (
        f", counted from {met_ms:.1f} ms before the request reached the app, the event loop's "
        "lag it met"
    )


def _lag_words(lag_ms: float) -> str:
    """How much of the event loop's lag a refusal's time left already counts ("" for none)."""
    return f" after {lag_ms:.1f} ms of the event loop's lag" if lag_ms >= 0.05 else ""


def _never_met(
    deadline_ms: float, num_nodes: int, fastest: str, alone_ms: float, *, pinned: bool
) -> UnmeetableDeadline:
    """The error for a deadline shorter than ``fastest``'s profiled ``alone_ms``."""
    nodes = f"{num_nodes} node{'s' if num_nodes != 1 else ''}"
    if pinned:
        who, other = f"the pinned variant {fastest} takes", "another variant"
    else:
        who, other = f"the fastest admissible one, {fastest}, takes", "a larger tolerance"
    return UnmeetableDeadline(
        f"X-Deadline-Ms {deadline_ms:g}: {nodes} cannot be answered in time even on an idle "
        f"server: {who} {alone_ms:.1f} ms alone as profiled; do not retry as is: ask with a "
        f"deadline of at least {math.ceil(alone_ms)} ms, {other} or fewer nodes"
    )


def late_answer(
    deadline_ms: float,
    over_ms: float,
    queue_ms: float,
    batch_nodes: int,
    variant_id: str,
    met_ms: float = 0.0,
) -> DeadlineExceeded:
    """The error for an answer ready ``over_ms`` after its deadline: discarded, never sent.
    ``met_ms``: the event loop's lag the request met before the app read it, which the deadline
    already counts (:mod:`~gnnaas.serving.core.looplag`), named when there is one."""
    return DeadlineExceeded(
        f"X-Deadline-Ms {deadline_ms:g}: the answer was ready {over_ms:.1f} ms after the "
        f"deadline{_met_words(met_ms)} (queued {queue_ms:.1f} ms, then a batch of {batch_nodes} "
        f"nodes on {variant_id}); it was discarded, never answered late (retry with a longer "
        "deadline or when the load is lower)"
    )


def fit_batch(
    batch: Sequence[P],
    now: float,
    predict_s: Callable[[int], float],
    aged_before: float,
) -> tuple[list[P], list[P], list[tuple[P, str]]]:
    """``batch`` fitted to its members' deadlines at ``now`` (on the clock of their queueing
    times and deadlines).

    Members are taken in priority order (one queued before ``aged_before`` as ``high``), then
    arrival. The first runs unless it would miss its deadline even alone; each later one joins
    only if the batch (``predict_s``: seconds for that many nodes) still meets every deadline in
    it and the time the joiners add to the first member's stays within the joiner's share of the
    batch's slack (:data:`SLACK_SHARES`).

    Returns:
        tuple: the members kept, in that order; those left out (for the next batch), in that
        order; those to fail, each with why (``"passed"``, ``"would pass in its batch"``).
    """
    kept: list[P] = []
    back: list[P] = []
    dropped: list[tuple[P, str]] = []
    size, tightest, first_s = 0, math.inf, 0.0
    for p in sorted(batch, key=lambda p: (taken_rank(p, aged_before), p.enqueued_at)):
        expires = math.inf if p.expires is None else p.expires
        if expires < now:
            dropped.append((p, "passed"))
        elif not kept:
            first_s = predict_s(p.size)
            if now + first_s > expires:
                dropped.append((p, "would pass in its batch"))
            else:
                kept.append(p)
                size, tightest = p.size, expires
        else:
            limit = min(tightest, expires)
            took = predict_s(size + p.size)
            share = SLACK_SHARES[taken_rank(p, aged_before)]
            if now + took <= limit and took - first_s <= share * (limit - now - first_s):
                kept.append(p)
                size, tightest = size + p.size, limit
            else:
                back.append(p)
    return kept, back, dropped
