"""The rates of normal and low requests kept while high-priority ones miss their deadlines.

Pure logic on given times: no clock, no sleeps."""

from __future__ import annotations

import math

import pytest

from gnnaas.serving.core.protect import CUT, LAG_SHARE, RECOVERY_S, LowerRates


def _admit_at(rates: LowerRates, rps: float, start: float, seconds: float) -> float:
    """Offers normal and low requests at ``rps`` each from ``start``; returns the end time."""
    now, step = start, 1.0 / rps
    while now < start + seconds:
        rates.wait_s("d", "normal", now)
        rates.wait_s("d", "low", now)
        now += step
    return now


def test_without_a_high_miss_nothing_is_limited() -> None:
    rates = LowerRates()
    now = _admit_at(rates, 500.0, 0.0, 2.0)
    assert all(rates.wait_s("d", p, now) == 0.0 for p in ("high", "normal", "low"))
    assert rates.limit("d", "low", now) == math.inf


def test_a_high_miss_cuts_low_harder_than_normal_from_their_admitted_rates() -> None:
    rates = LowerRates()
    now = _admit_at(rates, 200.0, 0.0, 6.0)
    assert rates.missed("d", now, 0.02, 0.01)
    assert rates.limit("d", "low", now) == pytest.approx(CUT["low"] * 200.0, rel=0.05)
    assert rates.limit("d", "normal", now) == pytest.approx(CUT["normal"] * 200.0, rel=0.05)
    assert rates.limit("other", "low", now) == math.inf  # per dataset
    assert rates.wait_s("d", "high", now) == 0.0  # never limited


def test_a_miss_the_event_loop_took_little_of_does_not_cut() -> None:
    """The device's own load made it miss (admission predicts that): cutting normal and low
    would not help it."""
    rates = LowerRates()
    now = _admit_at(rates, 200.0, 0.0, 6.0)
    assert not rates.missed("d", now, 0.02, LAG_SHARE * 0.02 * 0.9)
    assert rates.limit("d", "low", now) == math.inf
    assert rates.missed("d", now, 0.02, LAG_SHARE * 0.02)


def test_misses_of_requests_already_on_their_way_count_as_one_cut() -> None:
    rates = LowerRates()
    now = _admit_at(rates, 200.0, 0.0, 6.0)
    assert rates.missed("d", now, 0.02, 0.01)
    cut = rates.limit("d", "low", now)
    assert not rates.missed("d", now + 0.039, 0.02, 0.01)  # within two deadlines
    assert rates.limit("d", "low", now + 0.039) > cut  # growing back, not cut again
    assert rates.missed("d", now + 0.041, 0.02, 0.01)  # a later one cuts again
    assert rates.limit("d", "low", now + 0.041) < 0.8 * cut


def test_a_limited_priority_passes_at_its_rate_and_waits_for_the_next() -> None:
    rates = LowerRates()
    now = _admit_at(rates, 200.0, 0.0, 6.0)
    rates.missed("d", now, 0.02, 0.01)
    limit = rates.limit("d", "low", now)
    wait = rates.wait_s("d", "low", now)
    assert wait == pytest.approx(1.0 / limit, rel=0.05)  # the next token
    assert rates.wait_s("d", "low", now + wait * 1.01) == 0.0  # passes then
    assert rates.wait_s("d", "low", now + wait * 1.01) > 0.0  # and the next waits again
    # Over a second at its limit, about the limit passes.
    passed, t = 0, now + 0.1
    while t < now + 1.1:
        passed += rates.wait_s("d", "low", t) == 0.0
        t += 0.001
    rise = (limit / CUT["low"]) / RECOVERY_S  # per second, per second
    assert passed == pytest.approx(limit + rise * (1.1**2 - 0.1**2) / 2, rel=0.03)


def test_a_cut_rate_grows_back_by_its_rate_before_the_cut_in_the_recovery_time() -> None:
    rates = LowerRates()
    now = _admit_at(rates, 200.0, 0.0, 6.0)
    rates.missed("d", now, 0.02, 0.01)
    cut = rates.limit("d", "normal", now)
    before = cut / CUT["normal"]
    end = _admit_at(rates, 200.0, now, RECOVERY_S)  # still offered: passing at the limit
    assert rates.limit("d", "normal", end) == pytest.approx(cut + before, rel=0.01)
    # Once nothing more is offered, a limit well above what is admitted is lifted.
    assert rates.limit("d", "normal", end + 5.0) == math.inf


def test_a_priority_that_admitted_little_is_cut_from_a_floor_and_its_limit_is_lifted() -> None:
    """A loop that stalled admitted little before the miss: the cut starts from a floor, not
    from nothing, the refusal holds briefly, and once the limit is well above what is
    admitted it stops limiting."""
    rates = LowerRates()
    rates.missed("d", 10.0, 0.02, 0.01)  # no low request admitted before
    assert 0.0 < rates.limit("d", "low", 10.0) < 10.0
    assert 0.0 < rates.wait_s("d", "low", 10.0) <= 0.1  # admission decides again soon
    assert rates.wait_s("d", "low", 10.0 + RECOVERY_S) == 0.0
    assert rates.limit("d", "low", 10.0 + 3 * RECOVERY_S) == math.inf  # lifted


def test_clear_forgets_every_limit() -> None:
    rates = LowerRates()
    rates.missed("d", 0.0, 0.02, 0.01)
    rates.clear()
    assert rates.limit("d", "low", 0.0) == math.inf
    assert rates.wait_s("d", "low", 0.0) == 0.0
