"""The selection policy: interpolation, tolerance, load, ties and SLOs."""

from __future__ import annotations

import math

import pytest

from gnnaas.serving.policy import Candidate, ServiceCurve, candidates_within, select_variant

CURVE = ServiceCurve((1, 32, 256, 1024), (1.0, 4.1, 26.5, 103.3))


@pytest.mark.parametrize(
    ("batch_size", "expected"),
    [
        (1, 1.0),  # profiled points are exact
        (32, 4.1),
        (1024, 103.3),
        (16.5, 1.0 + 3.1 * 15.5 / 31),  # inside a segment
        (640, 26.5 + 76.8 * 384 / 768),
        (2048, 103.3 + 76.8 * 1024 / 768),  # beyond: the last segment's slope
    ],
)
def test_curve_interpolates_and_extrapolates(batch_size: float, expected: float) -> None:
    assert CURVE.predict(batch_size) == pytest.approx(expected)


def test_curve_never_negative_and_single_point() -> None:
    steep = ServiceCurve((10, 20), (1.0, 10.0))
    assert steep.predict(1) == 0.0  # the first segment would go below zero
    single = ServiceCurve.from_points({32: 4.0})
    assert single.predict(1) == 4.0
    assert single.predict(64) == pytest.approx(8.0)


@pytest.mark.parametrize(
    ("sizes", "times", "match"),
    [
        ((), (), "at least one"),
        ((1, 2), (1.0,), "as many"),
        ((32, 1), (1.0, 2.0), "increasing"),
        ((0, 1), (1.0, 2.0), "positive"),
        ((1,), (math.nan,), "finite"),
    ],
)
def test_curve_rejects_bad_points(
    sizes: tuple[int, ...], times: tuple[float, ...], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        ServiceCurve(sizes, times)


def _candidates() -> list[Candidate]:
    return [
        Candidate("sage-full-1x", 90.0, ServiceCurve((1, 1024), (3.0, 60.0))),
        Candidate("sage-lasso-2x", 89.0, ServiceCurve((1, 1024), (2.0, 36.0))),
        Candidate("sage-lasso-8x", 85.0, ServiceCurve((1, 1024), (1.0, 18.0))),
    ]


@pytest.mark.parametrize(
    ("tolerance", "expected"),
    [(0.0, "sage-full-1x"), (1.0, "sage-lasso-2x"), (4.9, "sage-lasso-2x"), (5.0, "sage-lasso-8x")],
)
def test_tolerance_widens_the_candidates(tolerance: float, expected: str) -> None:
    sel = select_variant(_candidates(), num_nodes=1, tolerance=tolerance)
    assert sel.variant_id == expected
    assert sel.considered[0] == "sage-full-1x"


def test_candidates_within_sorts_most_accurate_first() -> None:
    ids = [c.variant_id for c in candidates_within(list(reversed(_candidates())), 100.0)]
    assert ids == ["sage-full-1x", "sage-lasso-2x", "sage-lasso-8x"]


def test_queue_wait_moves_the_choice() -> None:
    idle = select_variant(_candidates(), num_nodes=1, tolerance=10)
    assert idle.variant_id == "sage-lasso-8x"
    busy = select_variant(_candidates(), num_nodes=1, tolerance=10, wait_ms={"sage-lasso-8x": 5.0})
    assert busy.variant_id == "sage-lasso-2x"
    assert busy.predicted_ms == pytest.approx(2.0)
    assert busy.wait_ms == 0.0


def test_batch_size_is_used() -> None:
    # At 1024 nodes the 8x variant saves 18 ms over 2x; a 10 ms queue does not outweigh it.
    sel = select_variant(_candidates(), num_nodes=1024, tolerance=10, wait_ms={"sage-lasso-8x": 10})
    assert sel.variant_id == "sage-lasso-8x"
    assert sel.predicted_ms == pytest.approx(28.0)


def test_ties_go_to_the_more_accurate() -> None:
    same = ServiceCurve((1,), (2.0,))
    cands = [Candidate("b-less", 80.0, same), Candidate("a-more", 81.0, same)]
    assert select_variant(cands, num_nodes=1, tolerance=5).variant_id == "a-more"


@pytest.mark.parametrize(
    ("slo_ms", "expected", "meets"),
    [
        (10.0, "sage-full-1x", True),  # the most accurate meets it
        (2.5, "sage-lasso-2x", True),  # the most accurate that meets it
        (0.5, "sage-lasso-8x", False),  # none meets it: the fastest
    ],
)
def test_slo(slo_ms: float, expected: str, meets: bool) -> None:
    sel = select_variant(_candidates(), num_nodes=1, tolerance=10, slo_ms=slo_ms)
    assert (sel.variant_id, sel.meets_slo) == (expected, meets)


def test_slo_respects_tolerance() -> None:
    sel = select_variant(_candidates(), num_nodes=1, tolerance=0, slo_ms=0.5)
    assert sel.variant_id == "sage-full-1x"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tolerance": -1.0}, "tolerance"),
        ({"tolerance": math.inf}, "tolerance"),
        ({"num_nodes": 0}, "num_nodes"),
        ({"slo_ms": 0.0}, "slo_ms"),
        ({"tie_margin": -0.1}, "tie_margin"),
    ],
)
def test_rejects_bad_arguments(kwargs: dict[str, float], match: str) -> None:
    args: dict[str, float] = {"num_nodes": 1, **kwargs}
    with pytest.raises(ValueError, match=match):
        select_variant(_candidates(), **args)  # type: ignore[arg-type]


def test_rejects_no_candidates() -> None:
    with pytest.raises(ValueError, match="at least one candidate"):
        select_variant([], num_nodes=1)


def test_a_request_joins_the_queued_batch() -> None:
    # 100 nodes wait for the 8x variant behind 3 ms of other work: joining them costs
    # T(101) = 1 + 17 * 100 / 1023 ms, less than a batch of its own on another variant, which
    # would wait for the 3 ms and the 8x batch (2.66 ms).
    behind = 3.0 + 1.0 + 17.0 * 99 / 1023
    sel = select_variant(
        _candidates(),
        num_nodes=1,
        tolerance=10,
        wait_ms={"sage-lasso-8x": 3.0, "sage-lasso-2x": behind, "sage-full-1x": behind},
        queued_nodes={"sage-lasso-8x": 100},
    )
    assert sel.variant_id == "sage-lasso-8x"
    assert sel.predicted_ms == pytest.approx(3.0 + 1.0 + 17.0 * 100 / 1023)


@pytest.mark.parametrize(("margin", "expected"), [(0.0, "sage-lasso-8x"), (0.25, "sage-full-1x")])
def test_tie_margin_prefers_accuracy_among_near_equal_times(margin: float, expected: str) -> None:
    near = [
        Candidate("sage-full-1x", 90.0, ServiceCurve((1,), (2.4,))),
        Candidate("sage-lasso-2x", 89.0, ServiceCurve((1,), (2.2,))),
        Candidate("sage-lasso-8x", 85.0, ServiceCurve((1,), (2.0,))),
    ]
    sel = select_variant(near, num_nodes=1, tolerance=10, tie_margin=margin)
    assert sel.variant_id == expected
    # A clearly faster variant is not a tie.
    far = [near[0], Candidate("sage-lasso-8x", 85.0, ServiceCurve((1,), (1.0,)))]
    assert select_variant(far, num_nodes=1, tolerance=10, tie_margin=margin).variant_id == (
        "sage-lasso-8x"
    )


def test_keep_holds_a_near_tie_but_not_a_clearly_slower_variant() -> None:
    near = [
        Candidate("sage-full-1x", 90.0, ServiceCurve((1,), (2.1,))),
        Candidate("sage-lasso-8x", 85.0, ServiceCurve((1,), (2.0,))),
    ]
    args = {"num_nodes": 1, "tolerance": 10, "tie_margin": 0.1}
    assert select_variant(near, **args).variant_id == "sage-full-1x"  # type: ignore[arg-type]
    kept = select_variant(near, keep="sage-lasso-8x", **args)  # type: ignore[arg-type]
    assert kept.variant_id == "sage-lasso-8x"
    slow = [Candidate("sage-full-1x", 90.0, ServiceCurve((1,), (3.0,))), near[1]]
    moved = select_variant(slow, keep="sage-full-1x", **args)  # type: ignore[arg-type]
    assert moved.variant_id == "sage-lasso-8x"
    # A kept variant outside the tolerance is ignored.
    assert select_variant(near, keep="sage-lasso-8x", num_nodes=1, tolerance=1).variant_id == (
        "sage-full-1x"
    )
