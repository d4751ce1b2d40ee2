"""The batcher's pure step: windows, full batches, carry, priorities and aging, gone callers,
deadlines, stopping. No event loop and no clock: each step is given its time."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gnnaas.serving.core.planner import BatchPlan, BatchPlanner
from gnnaas.serving.core.queues import RANK


@dataclass(eq=False)
class Request:
    name: str
    size: int = 1
    rank: int = 1
    enqueued_at: float = 0.0
    expires: float | None = None
    gone: bool = False


def _request(name: str, size: int = 1, priority: str = "normal", **kw: object) -> Request:
    return Request(name, size, RANK[priority], **kw)  # type: ignore[arg-type]


def _names(requests: list[Request]) -> list[str]:
    return [r.name for r in requests]


def _planner(*requests: Request, **kw: object) -> BatchPlanner[Request]:
    planner: BatchPlanner[Request] = BatchPlanner(**kw)  # type: ignore[arg-type]
    for r in requests:
        planner.push(r)
    return planner


def test_nothing_waits_nothing_forms() -> None:
    plan = _planner().plan(0.0)
    assert plan == BatchPlan() and plan.idle and not plan.ready


def test_a_batch_waits_for_batch_mates_until_max_wait_after_its_first_was_queued() -> None:
    planner = _planner(_request("a", enqueued_at=1.0), max_batch_size=4, max_wait_s=0.5)
    waiting = planner.plan(1.2)
    assert (waiting.forming, waiting.wait_until, waiting.run) == (True, 1.5, [])
    assert _names(list(planner.forming)) == ["a"]
    planner.push(_request("b", enqueued_at=1.3))  # joins without moving the window
    assert planner.plan(1.3).wait_until == 1.5
    assert planner.plan(1.5).ready  # the window is over: take the gate
    planner.push(_request("c", enqueued_at=1.6))  # arrived while the gate was busy: joins
    closed = planner.plan(1.7, closing=True)
    assert _names(closed.run) == ["a", "b", "c"] and not closed.expired and not closed.back
    assert planner.queues.nodes == 0 and planner.queues.requests == 0 and not planner.forming


def test_a_full_batch_does_not_wait_and_later_arrivals_wait_for_the_next() -> None:
    planner = _planner(*(_request(n, size=2) for n in "abc"), max_batch_size=4, max_wait_s=60.0)
    plan = planner.plan(0.0)
    assert plan.ready and plan.wait_until is None
    assert _names(planner.plan(0.0, closing=True).run) == ["a", "b"]
    assert planner.queues.nodes == 2  # c waits for the next batch
    assert planner.plan(0.0).wait_until == 60.0


def test_a_request_that_would_overflow_starts_the_next_batch_and_closes_this_one() -> None:
    planner = _planner(
        _request("a", size=3),
        _request("b", size=3),
        _request("c", size=1),
        max_batch_size=4,
        max_wait_s=60.0,
    )
    assert planner.plan(0.0).ready  # 3 nodes, but b would overflow: no more waiting
    assert planner.carry is not None and planner.carry.name == "b"
    assert planner.queues.nodes == 7  # the open batch and the carry are still counted
    # c would fit beside a, but the carried request closed the batch: no joiner after it.
    assert _names(planner.plan(0.0, closing=True).run) == ["a"]
    assert _names(planner.plan(0.0, closing=True).run) == ["b", "c"]  # the carry goes first


def test_a_single_request_larger_than_a_batch_runs_alone() -> None:
    planner = _planner(_request("big", size=10), _request("small"), max_batch_size=4)
    assert _names(planner.plan(0.0, closing=True).run) == ["big"]
    assert _names(planner.plan(0.0, closing=True).run) == ["small"]


@pytest.mark.parametrize(
    ("now", "order"),
    [(0.05, ["h", "n", "l"]), (0.1, ["l", "h", "n"]), (0.2, ["l", "n", "h"])],
)
def test_higher_priorities_go_first_until_the_older_have_aged(now: float, order: list[str]) -> None:
    requests = [
        _request("l", priority="low", enqueued_at=0.0),
        _request("n", priority="normal", enqueued_at=0.01),
        _request("h", priority="high", enqueued_at=0.02),
    ]
    planner = _planner(*requests, max_batch_size=1, aging_s=0.1)
    # A request queued aging_s ago or more competes as high, older first: at 0.1 only l has.
    assert [_names(planner.plan(now, closing=True).run)[0] for _ in requests] == order


def test_callers_that_gave_up_are_skipped_and_uncounted() -> None:
    a, b, c = _request("a"), _request("b", size=2), _request("c")
    planner = _planner(a, b, max_batch_size=10, max_wait_s=1.0)
    a.gone = True  # before its batch formed
    assert planner.plan(0.0).wait_until == 1.0 and _names(list(planner.forming)) == ["b"]
    assert planner.queues.nodes == 2
    planner.push(c)
    planner.plan(0.5)
    c.gone = True  # while its batch waited for the gate
    closed = planner.plan(1.0, closing=True)
    assert _names(closed.run) == ["b"]
    assert planner.queues.nodes == 0 and planner.queues.requests == 0


def test_a_passed_deadline_fails_when_the_batch_forms_and_the_batch_runs_without_it() -> None:
    planner = _planner(
        _request("late", enqueued_at=0.0, expires=0.5),
        _request("fine", enqueued_at=0.0, expires=5.0),
        max_batch_size=10,
    )
    plan = planner.plan(1.0)
    assert [(r.name, why) for r, why in plan.expired] == [("late", "passed")]
    assert _names(planner.plan(1.0, closing=True).run) == ["fine"]
    assert planner.queues.requests == 0


def test_closing_fits_the_batch_to_its_deadlines() -> None:
    # One second per node. The high request has 7 s, 6 s of slack beyond its own second: the
    # normal one may join (1 s more, within its third), the low one may not (2 s more, past its
    # quarter) and goes back to the head of its queue. The first in line, which needs 3 s alone
    # but has 2 s, fails.
    hopeless = _request("hopeless", size=3, priority="high", expires=2.0)
    high = _request("high", priority="high", expires=7.0)
    normal = _request("normal", expires=60.0)
    low = _request("low", priority="low")
    planner = _planner(low, normal, hopeless, high, predict_s=float, aging_s=60.0)
    plan = planner.plan(0.0, closing=True)
    assert _names(plan.run) == ["high", "normal"]
    assert _names(plan.back) == ["low"]
    assert [(r.name, why) for r, why in plan.expired] == [("hopeless", "would pass in its batch")]
    assert (planner.queues.requests, planner.queues.nodes) == (1, 1)  # low, put back
    assert _names(planner.plan(0.0, closing=True).run) == ["low"]


def test_requests_cheap_to_add_fill_a_batch_under_tight_deadlines() -> None:
    requests = [_request(str(i), expires=20.0) for i in range(50)]
    planner = _planner(*requests, predict_s=lambda nodes: 8.0 + 1e-3 * nodes)
    assert len(planner.plan(0.0, closing=True).run) == 50  # one batch, not fifty


def test_a_stopping_batcher_waits_for_no_batch_mates() -> None:
    planner = _planner(_request("a"), max_wait_s=60.0)
    assert planner.plan(0.0).wait_until == 60.0
    assert planner.plan(0.0, stopping=True).ready


def test_clear_takes_out_the_open_batch_the_carry_and_the_queued() -> None:
    planner = _planner(
        _request("a", size=3), _request("b", size=3), _request("c"), max_batch_size=4
    )
    planner.plan(0.0)
    assert sorted(_names(planner.clear())) == ["a", "b", "c"]
    assert planner.queues.nodes == 0 and planner.queues.requests == 0
    assert planner.carry is None and not planner.forming and planner.plan(0.0).idle
