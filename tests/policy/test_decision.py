"""The policy: curves, tolerance (point and paired), the frontier, and the decision under load
(ties, targets, stability, its memoized paths against a plain reading of the rule)."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable

import pytest

from gnnaas import policy
from gnnaas.policy import (
    Candidate,
    DecisionTable,
    LoadSnapshot,
    PairedDiff,
    RequestSpec,
    Selection,
    ServiceCurve,
    VariantLoad,
    at_most_everywhere,
    candidates_within,
    fastest_everywhere,
)
from gnnaas.policy import rule as candidates


def select_variant(
    request: RequestSpec,
    cands: list[Candidate],
    snapshot: LoadSnapshot | None = None,
    *,
    tie_margin: float = 0.0,
) -> Selection:
    """The decision of a fresh table (nothing memoized yet) at time 0."""
    table = DecisionTable(cands, tie_margin=tie_margin)
    return table.decide(request, snapshot or LoadSnapshot(), now=0.0)


def plain_rule(
    request: RequestSpec,
    cands: list[Candidate],
    snap: LoadSnapshot,
    tie_margin: float,
    now: float = 0.0,
    lookups: frozenset[str] = frozenset(),
) -> tuple[str, float]:
    """The rule of docs/architecture.md §6 read plainly, with no memo and no shortcut: the
    oracle the decision table's fast paths are checked against."""
    admitted = candidates_within(cands, request.effective_tolerance)
    stream = snap.stream_nodes + request.num_nodes
    scored = []
    for c in admitted:
        load = snap.variants.get(c.variant_id)
        idle = snap.lookup_slowdown if c.variant_id in lookups else snap.slowdown
        slowdown = idle if load is None else load.slowdown
        room = math.inf if load is None else load.room_nodes
        served = c.service.predict_batched(stream, snap.max_batch_nodes)
        predicted = max(snap.ahead_ms, 0.0) + slowdown * served
        scored.append((predicted, c.variant_id, room >= request.num_nodes))
    if any(ok for *_, ok in scored) and not all(ok for *_, ok in scored):
        scored = [s for s in scored if s[2]]
    target = request.target_ms(now)
    if target is not None:
        meeting = [s for s in scored if s[0] <= target]
        if meeting:
            return meeting[0][1], meeting[0][0]
    band = min(s[0] for s in scored) * (1 + tie_margin)
    ties = [s for s in scored if s[0] <= band]
    kept = [s for s in ties if snap.busy and s[1] == snap.current]
    chosen = (kept or ties)[0]
    return chosen[1], chosen[0]


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


def _pick(
    nodes: int = 1,
    tolerance: float | None = None,
    slo_ms: float | None = None,
    snapshot: LoadSnapshot | None = None,
    cands: list[Candidate] | None = None,
    tie_margin: float = 0.0,
) -> Selection:
    return select_variant(
        RequestSpec(nodes, tolerance, slo_ms),
        _candidates() if cands is None else cands,
        snapshot,
        tie_margin=tie_margin,
    )


@pytest.mark.parametrize(
    ("tolerance", "expected"),
    [
        (None, "sage-full-1x"),  # no tolerance header: the most accurate
        (0.0, "sage-full-1x"),
        (1.0, "sage-lasso-2x"),
        (4.9, "sage-lasso-2x"),
        (5.0, "sage-lasso-8x"),
        (math.inf, "sage-lasso-8x"),
    ],
)
def test_tolerance_widens_the_candidates(tolerance: float | None, expected: str) -> None:
    sel = _pick(tolerance=tolerance)
    assert sel.variant_id == expected
    assert sel.considered[0] == "sage-full-1x"


def test_candidates_within_sorts_most_accurate_first() -> None:
    ids = [c.variant_id for c in candidates_within(list(reversed(_candidates())), 100.0)]
    assert ids == ["sage-full-1x", "sage-lasso-2x", "sage-lasso-8x"]


def test_waiting_nodes_move_the_choice() -> None:
    # Idle, 1x (3 ms) is within the 50 % tie band of 2x (2 ms): the more accurate wins. With 500
    # nodes waiting, 1x would take 3 + 57·500/1023 = 30.9 ms for them, 2x 18.6 ms.
    assert _pick(tolerance=1.0, tie_margin=0.5).variant_id == "sage-full-1x"
    busy = _pick(tolerance=1.0, tie_margin=0.5, snapshot=LoadSnapshot(2.0, 500))
    assert busy.variant_id == "sage-lasso-2x"
    assert busy.wait_ms == 2.0
    assert busy.predicted_ms == pytest.approx(2.0 + 2.0 + 34.0 * 500 / 1023)


def test_running_batch_counts_as_the_stream() -> None:
    # Right after a 500-node batch closed nothing waits yet, but the next batch will gather
    # about as many nodes: the stream is judged at that size, not at the request's alone.
    snap = LoadSnapshot(ahead_ms=5.0, waiting_nodes=3, running_nodes=500)
    assert snap.stream_nodes == 500
    sel = _pick(tolerance=1.0, tie_margin=0.5, snapshot=snap)
    assert sel.variant_id == "sage-lasso-2x"
    assert sel.predicted_ms == pytest.approx(5.0 + 2.0 + 34.0 * 500 / 1023)


def test_batch_size_and_max_batch_are_used() -> None:
    one = _pick(nodes=1024, tolerance=10)
    assert (one.variant_id, one.predicted_ms) == ("sage-lasso-8x", pytest.approx(18.0))
    split = _pick(nodes=1024, tolerance=10, snapshot=LoadSnapshot(max_batch_nodes=512))
    assert split.predicted_ms == pytest.approx(2 * (1.0 + 17.0 * 511 / 1023))


def test_per_variant_speed_scales_its_curve() -> None:
    slow_8x = LoadSnapshot(variants={"sage-lasso-8x": VariantLoad(slowdown=3.0)})
    sel = _pick(tolerance=10, snapshot=slow_8x)
    assert (sel.variant_id, sel.predicted_ms) == ("sage-lasso-2x", pytest.approx(2.0))


def test_a_full_queue_is_skipped_unless_all_are_full() -> None:
    full = VariantLoad(room_nodes=0)
    assert _pick(
        tolerance=10, snapshot=LoadSnapshot(variants={"sage-lasso-8x": full})
    ).variant_id == ("sage-lasso-2x")
    everything = LoadSnapshot(variants=dict.fromkeys(["sage-full-1x", "sage-lasso-8x"], full))
    assert _pick(tolerance=0, snapshot=everything).variant_id == "sage-full-1x"


def test_ties_go_to_the_more_accurate() -> None:
    same = ServiceCurve((1,), (2.0,))
    cands = [Candidate("b-less", 80.0, same), Candidate("a-more", 81.0, same)]
    assert _pick(tolerance=5, cands=cands).variant_id == "a-more"


@pytest.mark.parametrize(
    ("tolerance", "slo_ms", "expected", "meets"),
    [
        (10.0, 10.0, "sage-full-1x", True),  # the most accurate meets it
        (10.0, 2.5, "sage-lasso-2x", True),  # the most accurate that meets it
        (10.0, 0.5, "sage-lasso-8x", False),  # none meets it: the fastest
        (0.0, 0.5, "sage-full-1x", False),  # an explicit tolerance still holds
        (1.0, 1.5, "sage-lasso-2x", False),  # ... and bounds "the fastest"
        # X-Latency-SLO-Ms alone: every variant is within tolerance.
        (None, 10.0, "sage-full-1x", True),
        (None, 2.5, "sage-lasso-2x", True),
        (None, 1.5, "sage-lasso-8x", True),
        (None, 0.5, "sage-lasso-8x", False),
    ],
)
def test_slo(tolerance: float | None, slo_ms: float, expected: str, meets: bool) -> None:
    sel = _pick(tolerance=tolerance, slo_ms=slo_ms)
    assert (sel.variant_id, sel.meets_slo) == (expected, meets)


def test_slo_alone_sees_the_load() -> None:
    # 300 waiting nodes: 1x needs 3 + 57·300/1023 = 19.7 ms, 2x 12.0 ms, 8x 6.0 ms.
    sel = _pick(slo_ms=15.0, snapshot=LoadSnapshot(waiting_nodes=300))
    assert (sel.variant_id, sel.meets_slo) == ("sage-lasso-2x", True)
    assert RequestSpec(1, slo_ms=15.0).effective_tolerance == math.inf
    assert RequestSpec(1).effective_tolerance == 0.0


@pytest.mark.parametrize(
    ("spec", "targeted", "target", "tolerance"),
    [
        (RequestSpec(1), False, None, 0.0),
        (RequestSpec(1, 2.0), False, None, 2.0),
        (RequestSpec(1, slo_ms=15.0), True, 15.0, math.inf),
        (RequestSpec(1, 1.0, deadline_at=10.02), True, 20.0, 1.0),
        (RequestSpec(1, slo_ms=15.0, deadline_at=10.02), True, 15.0, math.inf),
    ],
)
def test_request_spec_target_and_tolerance(
    spec: RequestSpec, targeted: bool, target: float | None, tolerance: float
) -> None:
    """What a decision reads of a request: whether it aims at a time, which (at now = 10 s),
    and the tolerance applied; the spec stays a value (equal specs hash alike once read)."""
    assert spec.targeted is targeted
    assert spec.target_ms(10.0) == pytest.approx(target)
    assert spec.effective_tolerance == tolerance
    twin = RequestSpec(spec.num_nodes, spec.tolerance, spec.slo_ms, spec.deadline_at)
    assert spec == twin and hash(spec) == hash(twin)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tolerance": -1.0}, "tolerance"),
        ({"tolerance": math.nan}, "tolerance"),
        ({"num_nodes": 0}, "num_nodes"),
        ({"slo_ms": 0.0}, "slo_ms"),
        ({"slo_ms": math.inf}, "slo_ms"),
    ],
)
def test_request_spec_rejects_bad_values(kwargs: dict[str, float], match: str) -> None:
    args: dict[str, float] = {"num_nodes": 1, **kwargs}
    with pytest.raises(ValueError, match=f"RequestSpec {match}|RequestSpec needs {match}"):
        RequestSpec(**args)  # type: ignore[arg-type]


def test_rejects_bad_tie_margin_and_no_candidates() -> None:
    with pytest.raises(ValueError, match="tie_margin"):
        _pick(tie_margin=-0.1)
    with pytest.raises(ValueError, match="at least one candidate"):
        select_variant(RequestSpec(1), [])
    with pytest.raises(ValueError, match="DecisionTable tie_margin"):
        DecisionTable(_candidates(), tie_margin=math.inf)
    with pytest.raises(ValueError, match="tolerance"):
        candidates_within(_candidates(), math.nan)


def test_snapshot_is_frozen() -> None:
    snap = LoadSnapshot(variants={"a": VariantLoad(queued_nodes=3)})
    with pytest.raises(AttributeError):
        snap.ahead_ms = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        snap.variants["b"] = VariantLoad()  # type: ignore[index]
    assert snap.load("a").queued_nodes == 3 and snap.load("missing") == VariantLoad()


@pytest.mark.parametrize(("margin", "expected"), [(0.0, "sage-lasso-8x"), (0.25, "sage-full-1x")])
def test_tie_margin_prefers_accuracy_among_near_equal_times(margin: float, expected: str) -> None:
    near = [
        Candidate("sage-full-1x", 90.0, ServiceCurve((1,), (2.4,))),
        Candidate("sage-lasso-2x", 89.0, ServiceCurve((1,), (2.2,))),
        Candidate("sage-lasso-8x", 85.0, ServiceCurve((1,), (2.0,))),
    ]
    assert _pick(tolerance=10, cands=near, tie_margin=margin).variant_id == expected
    # A clearly faster variant is not a tie.
    far = [near[0], Candidate("sage-lasso-8x", 85.0, ServiceCurve((1,), (1.0,)))]
    assert _pick(tolerance=10, cands=far, tie_margin=margin).variant_id == "sage-lasso-8x"


def test_current_holds_a_near_tie_busy_or_idle_but_not_a_clearly_slower_variant() -> None:
    near = [
        Candidate("sage-full-1x", 90.0, ServiceCurve((1,), (2.1,))),
        Candidate("sage-lasso-8x", 85.0, ServiceCurve((1,), (2.0,))),
    ]
    busy = LoadSnapshot(ahead_ms=1.0, current="sage-lasso-8x")
    args = {"tolerance": 10, "cands": near, "tie_margin": 0.1}
    assert _pick(**args).variant_id == "sage-full-1x"  # type: ignore[arg-type]
    assert _pick(snapshot=busy, **args).variant_id == "sage-lasso-8x"  # type: ignore[arg-type]
    # A batch that overran its prediction (nothing ahead by the profile) still means busy.
    overran = LoadSnapshot(running_nodes=1, current="sage-lasso-8x")
    assert overran.busy
    assert _pick(snapshot=overran, **args).variant_id == "sage-lasso-8x"  # type: ignore[arg-type]
    # Idle between two of the stream's batches, or after it: still a near-tie, still kept (the
    # most accurate near-tie at every idle instant would split a stream load had moved)...
    idle = LoadSnapshot(current="sage-lasso-8x")
    assert _pick(snapshot=idle, **args).variant_id == "sage-lasso-8x"  # type: ignore[arg-type]
    # ...and without a stream, or on a variant that is no near-tie for this request alone, the
    # most accurate near-tie.
    assert _pick(snapshot=LoadSnapshot(), **args).variant_id == "sage-full-1x"  # type: ignore[arg-type]
    slow = [Candidate("sage-full-1x", 90.0, ServiceCurve((1,), (3.0,))), near[1]]
    on_1x = LoadSnapshot(ahead_ms=1.0, current="sage-full-1x")
    moved = _pick(tolerance=10, cands=slow, tie_margin=0.1, snapshot=on_1x)
    assert moved.variant_id == "sage-lasso-8x"
    # A current variant outside the tolerance is ignored.
    assert _pick(tolerance=1, cands=near, snapshot=busy).variant_id == "sage-full-1x"


# -- the paired-difference rule ---------------------------------------------------------------


def _paired() -> list[Candidate]:
    """Planted variants: best 1x; 2x tied with it; 8x 1.5 points below; 4x uncertain."""
    curve = ServiceCurve((1,), (1.0,))
    best = "sage-full-1x"
    return [
        Candidate("sage-full-1x", 90.0, curve.scaled(4.0), PairedDiff(0.0, 0.0, 0.0, True, best)),
        Candidate(
            "sage-lasso-2x", 89.5, curve.scaled(3.0), PairedDiff(-0.5, -0.9, 0.1, True, best)
        ),
        Candidate("sage-lasso-8x", 88.5, curve, PairedDiff(-1.5, -2.0, -1.0, False, best)),
        Candidate(
            "sage-random-4x", 89.5, curve.scaled(2.0), PairedDiff(-0.5, -3.0, 2.0, True, best)
        ),
    ]


@pytest.mark.parametrize(
    ("tolerance", "paired", "point"),
    [
        # 2x is statistically tied with the best (loss interval [-0.1, 0.9] <= 0 + 1): admitted at
        # 0, where the point rule keeps only the single best estimate.
        (0.0, {"sage-full-1x", "sage-lasso-2x"}, {"sage-full-1x"}),
        # 8x: loss [1.0, 2.0] fits tolerance 1 (+1 margin); the point rule (1.5 > 1) rejects it.
        # 4x: loss up to 3.0 > 1 + 1 with 95% confidence is not ruled out: rejected although its
        # point estimate (0.5) is within 1.
        (
            1.0,
            {"sage-full-1x", "sage-lasso-2x", "sage-lasso-8x"},
            {"sage-full-1x", "sage-lasso-2x", "sage-random-4x"},
        ),
        (2.0, {"sage-full-1x", "sage-lasso-2x", "sage-lasso-8x", "sage-random-4x"}, None),
    ],
)
def test_paired_rule_admits_and_rejects_what_it_should(
    tolerance: float, paired: set[str], point: set[str] | None
) -> None:
    assert {c.variant_id for c in candidates_within(_paired(), tolerance)} == paired
    if point is not None:
        unpaired = [Candidate(c.variant_id, c.accuracy, c.service) for c in _paired()]
        assert {c.variant_id for c in candidates_within(unpaired, tolerance)} == point


def test_paired_rule_is_the_one_of_uncertainty(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[float, float, float, float]] = []

    def fake(diff: float, lo: float, hi: float, tolerance: float) -> bool:
        seen.append((diff, lo, hi, tolerance))
        return diff == 0.0  # only the best

    monkeypatch.setattr(candidates, "admissible", fake)
    assert [c.variant_id for c in candidates_within(_paired(), 7.0)] == ["sage-full-1x"]
    assert (-1.5, -2.0, -1.0, 7.0) in seen
    # An unbounded tolerance admits everything without asking the rule.
    seen.clear()
    assert len(candidates_within(_paired(), math.inf)) == 4 and not seen


def test_point_rule_without_comparable_paired_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(candidates, "admissible", lambda *args: True)
    cands = _paired()
    # One variant profiled before intervals existed: the point rule for all.
    older = [*cands[:3], Candidate("sage-random-4x", 80.0, cands[3].service)]
    assert {c.variant_id for c in candidates_within(older, 1.0)} == {
        "sage-full-1x",
        "sage-lasso-2x",
    }
    # Differences taken against a variant that is not routable: the point rule.
    other_best = [
        Candidate(c.variant_id, c.accuracy, c.service, PairedDiff(-1.0, -2.0, 0.0, True, "gin-x"))
        for c in cands
    ]
    assert len(candidates_within(other_best, 0.0)) == 1
    # The rule admitting nothing falls back to the point rule as well.
    monkeypatch.setattr(candidates, "admissible", lambda *args: False)
    assert [c.variant_id for c in candidates_within(cands, 0.0)] == ["sage-full-1x"]


def test_paired_rule_decides_the_route() -> None:
    # Tolerance 0: 1x and the tied 2x are admissible and 2x is faster.
    assert _pick(tolerance=0.0, cands=_paired()).variant_id == "sage-lasso-2x"


# -- never losing to a fixed choice -----------------------------------------------------------

# Two admissible variants whose curves cross at 101 nodes: the accurate one has the smaller
# fixed cost, the other the smaller cost per node.
CROSS = [
    Candidate("sage-full-1x", 90.0, ServiceCurve((1, 1024), (1.0, 1.0 + 0.02 * 1023))),
    Candidate("sage-greedy-8x", 89.0, ServiceCurve((1, 1024), (2.0, 2.0 + 0.01 * 1023))),
]


def _within_margin_of_best_fixed(sel: Selection, snap: LoadSnapshot, n: int, margin: float) -> bool:
    best_fixed = min(snap.completion_ms(c.variant_id, c.service, n) for c in CROSS)
    return sel.predicted_ms <= best_fixed * (1 + margin) + 1e-9


@pytest.mark.parametrize(("margin", "max_switches"), [(0.1, 0), (0.0, 199)])
def test_a_backlog_hovering_at_the_crossing_does_not_make_the_stream_oscillate(
    margin: float, max_switches: int
) -> None:
    # Steady load: the dataset's stream alternates between 90 and 110 waiting nodes, on both
    # sides of the crossing (3 % either way). With the tie margin the stream stays where it is;
    # without it, it would flip on every decision (shown by the margin-0 case).
    choices = []
    current = None
    for i in range(200):
        snap = LoadSnapshot(ahead_ms=1.0, waiting_nodes=(90, 110)[i % 2], current=current)
        sel = select_variant(RequestSpec(1, 2.0), CROSS, snap, tie_margin=margin)
        assert _within_margin_of_best_fixed(sel, snap, 1, margin)
        choices.append(current := sel.variant_id)
    switches = sum(a != b for a, b in zip(choices, choices[1:], strict=False))
    assert switches == max_switches
    assert len(set(choices)) == (1 if margin else 2)


class _Device:
    """A discrete-event device: one batch at a time, the lane whose head waited longest first.

    Batches take exactly their profiled time; requests of a lane that arrived before its batch
    starts merge into it (up to ``max_batch``). Time is simulated, so runs are deterministic.
    """

    def __init__(self, cands: list[Candidate], max_batch: int = 1024) -> None:
        self.curves = {c.variant_id: c.service for c in cands}
        self.queues: dict[str, list[tuple[float, int]]] = {c.variant_id: [] for c in cands}
        self.max_batch = max_batch
        self.free_at = 0.0
        self.running = (0, 0.0)  # nodes and end of the last batch
        self.latencies: list[float] = []
        self.batches: list[tuple[str, int]] = []

    def run_until(self, t: float) -> None:
        while True:
            heads = [(q[0][0], v) for v, q in self.queues.items() if q]
            if not heads:
                return
            head, v = min(heads)
            start = max(self.free_at, head)
            if start > t:
                return
            queue, arrived, size = self.queues[v], [], 0
            while queue and queue[0][0] <= start and size + queue[0][1] <= self.max_batch:
                a, k = queue.pop(0)
                arrived.append(a)
                size += k
            self.free_at = start + self.curves[v].predict(size)
            self.running = (size, self.free_at)
            self.batches.append((v, size))
            self.latencies += [self.free_at - a for a in arrived]

    def snapshot(self, t: float, current: str | None) -> LoadSnapshot:
        running = self.running[0] if self.running[1] > t else 0
        return LoadSnapshot(
            ahead_ms=max(self.free_at - t, 0.0),
            waiting_nodes=sum(k for q in self.queues.values() for _, k in q),
            running_nodes=running,
            variants={
                v: VariantLoad(queued_nodes=sum(k for _, k in q)) for v, q in self.queues.items()
            },
            max_batch_nodes=self.max_batch,
            current=current,
        )


def _simulate(
    choose: Callable[[LoadSnapshot], Selection | str], interval_ms: float, nodes: int
) -> tuple[list[str], _Device]:
    device, current, choices = _Device(CROSS), None, []
    for i in range(200):
        t = i * interval_ms
        device.run_until(t)
        snap = device.snapshot(t, current)
        sel = choose(snap)
        if isinstance(sel, Selection):
            assert _within_margin_of_best_fixed(sel, snap, nodes, 0.1)
            sel = sel.variant_id
        choices.append(current := sel)
        device.queues[sel].append((t, nodes))
    device.run_until(math.inf)
    return choices, device


@pytest.mark.parametrize(
    ("nodes", "interval_ms"),
    [(1, 3.0), (1, 0.3), (16, 1.0), (16, 0.3), (16, 0.1), (64, 3.0), (64, 1.0), (64, 0.3)],
)
def test_router_never_loses_to_a_fixed_choice_under_steady_load(
    nodes: int, interval_ms: float
) -> None:
    # 200 same-size requests at a constant rate on a simulated device. The router's mean
    # latency stays within the tie margin of the better fixed variant, its stream switches lanes
    # at most once (from the accurate variant while idle to the one that sustains the load), and
    # batches are not split: it runs no more batches than that fixed variant does.
    def router(snap: LoadSnapshot) -> Selection:
        return select_variant(RequestSpec(nodes, 2.0), CROSS, snap, tie_margin=0.1)

    choices, routed = _simulate(router, interval_ms, nodes)

    def fixed_choice(variant_id: str) -> Callable[[LoadSnapshot], str]:
        return lambda snap: variant_id

    fixed = {
        c.variant_id: _simulate(fixed_choice(c.variant_id), interval_ms, nodes)[1] for c in CROSS
    }
    best_id, best = min(fixed.items(), key=lambda kv: statistics.mean(kv[1].latencies))
    assert statistics.mean(routed.latencies) <= 1.1 * statistics.mean(best.latencies)
    assert sum(a != b for a, b in zip(choices, choices[1:], strict=False)) <= 1
    assert choices[-1] == best_id
    assert len(routed.batches) <= len(best.batches) + 1


def test_admitting_tolerances_are_exactly_where_the_rule_admits() -> None:
    import random

    from gnnaas.policy import admitting_tolerances

    rng = random.Random(0)
    curve = ServiceCurve.from_points({1: 1.0, 1024: 10.0})
    for trial in range(50):
        best = "v0"
        cands = [Candidate(best, 90.0, curve, PairedDiff(0.0, 0.0, 0.0, True, best))]
        for i in range(1, 6):
            diff = -rng.uniform(0.0, 8.0)
            half = rng.uniform(0.05, 3.0)
            lo, hi = diff - half, min(diff + half * rng.uniform(0.5, 1.5), 0.0)
            cands.append(
                Candidate(f"v{i}", 90.0 + diff, curve, PairedDiff(diff, lo, hi, False, best))
            )
        found = admitting_tolerances(cands)
        assert set(found) == {c.variant_id for c in cands}, trial
        for c in cands:
            at = found[c.variant_id]
            assert c.variant_id in {x.variant_id for x in candidates_within(cands, at)}
            if at > 0:  # and not a hair below
                below = {x.variant_id for x in candidates_within(cands, max(at - 1e-3, 0.0))}
                assert c.variant_id not in below, (trial, c, at)


def test_curves_are_compared_from_one_node_across_bends_up_to_twice_their_last_points() -> None:
    """Where two curves are compared: from one node (curves whose first point is above it are
    linear below it too), across the sizes where an extrapolation reaches zero (a prediction
    bends there), and up to twice the last point, past which a stream is not kept unread."""
    a = ServiceCurve((8, 64), (1.0, 4.0))
    b = ServiceCurve((8, 64), (1.5, 6.0))
    assert at_most_everywhere(a, b) == (True, True)
    crossing = ServiceCurve((8, 64), (0.9, 1.0))  # under `a` at 8 and 64, over it at 1 node
    assert crossing.predict(1) > a.predict(1)
    assert at_most_everywhere(crossing, a)[0] is False
    # Past twice the last point the comparison says nothing: `faster` is under `b` up to 128
    # nodes but grows faster and crosses it near 280, so a stream on it is kept without reading
    # the load only while batches are capped at 128.
    faster = ServiceCurve((8, 64), (0.24, 5.0))
    assert at_most_everywhere(faster, b)[0] and faster.predict(400) > b.predict(400)
    pair = [Candidate("faster", 80.0, faster), Candidate("b", 80.0, b)]
    for cap, kept in ((128, True), (1024, False)):
        snap = LoadSnapshot(
            waiting_nodes=300,
            running_nodes=300,
            variants={"faster": VariantLoad(room_nodes=1000)},
            max_batch_nodes=cap,
            current="faster",
        )
        got = DecisionTable(pair).decide(RequestSpec(1, 0.0), snap, now=0.0)
        assert math.isnan(got.predicted_ms) is kept
        assert got.variant_id == plain_rule(RequestSpec(1, 0.0), pair, snap, 0.0)[0]
        assert got.variant_id == ("faster" if kept else "b")
    # A prediction is never negative: `steep`'s extrapolation reaches zero at 5 nodes and stays
    # there, under `flat` (3 ms at 5 nodes) although above it at every point of both.
    flat, steep = ServiceCurve((8, 16), (6.0, 14.0)), ServiceCurve((8, 16), (6.0, 54.0))
    assert (flat.predict(5), steep.predict(5)) == (3.0, 0.0)
    assert at_most_everywhere(flat, steep)[0] is False
    # ...and a decision does not keep a stream on `flat` at 10 % for a batch of 5 nodes.
    cands = [Candidate("flat", 80.0, flat), Candidate("steep", 80.0, steep)]
    snap = LoadSnapshot(
        waiting_nodes=4,
        running_nodes=4,
        variants={"flat": VariantLoad(room_nodes=100)},
        current="flat",
    )
    request = RequestSpec(1, 0.0)
    got = DecisionTable(cands, tie_margin=0.1).decide(request, snap, now=0.0)
    assert got.variant_id == plain_rule(request, cands, snap, 0.1)[0] == "steep"


def test_fastest_everywhere_needs_the_smallest_time_at_every_size() -> None:
    cands = _candidates()
    assert fastest_everywhere(cands) == {"sage-lasso-8x"}
    assert fastest_everywhere(cands[:2]) == {"sage-lasso-2x"}
    # Faster for one node, slower for large batches: no one is fastest everywhere.
    crossing = Candidate("sage-random-8x", 80.0, ServiceCurve((1, 64, 1024), (0.5, 2.0, 40.0)))
    assert fastest_everywhere([*cands, crossing]) == frozenset()
    same = Candidate("sage-random-2x", 84.0, ServiceCurve((1, 1024), (1.0, 18.0)))
    assert fastest_everywhere([*cands, same]) == {"sage-lasso-8x", "sage-random-2x"}


def test_a_busy_stream_on_the_fastest_everywhere_is_kept_whatever_the_load() -> None:
    """What lets a decision skip reading the load of such a stream: the plain rule picks it for
    any load, and the table keeps it without predicting anything."""
    cands = _candidates()
    fastest = next(iter(fastest_everywhere(cands)))
    for waiting in (0, 1, 7, 100, 5000):
        for running in (0, 3, 900):
            for ahead in (0.0, 0.5, 40.0):
                for margin in (0.0, 0.1, 0.5):
                    snap = LoadSnapshot(
                        ahead_ms=ahead,
                        waiting_nodes=waiting,
                        running_nodes=running or (0 if waiting else 1),
                        variants={c.variant_id: VariantLoad(slowdown=1.3) for c in cands},
                        max_batch_nodes=1024,
                        current=fastest,
                    )
                    table = DecisionTable(cands, tie_margin=margin)
                    for nodes in (1, 64, 2000):
                        request = RequestSpec(nodes, 50.0, None)
                        assert plain_rule(request, cands, snap, margin)[0] == fastest
                        kept = table.decide(request, snap, now=0.0)
                        assert kept.variant_id == fastest and math.isnan(kept.predicted_ms)


class _NoSnapshot(LoadSnapshot):
    """A busy load a decision may read only through ``current``, ``idle`` and ``room``."""

    def snapshot(self, variants: object = None) -> LoadSnapshot:
        raise AssertionError("the decision measured the load")


def test_a_stream_within_the_tie_margin_everywhere_is_kept_without_reading_the_load() -> None:
    """Curves that cross (the lighter variant faster up to 64 nodes and from 1024, the
    quantized one 2 % faster at 256): no variant is fastest everywhere, but a stream on the
    lighter one stays within a 10 % tie band of the smallest prediction under any load, so the
    table keeps it without measuring; with no margin, or a stream on the other, it measures."""
    sizes = (1, 64, 256, 1024)
    light = Candidate("sage-greedy-4x-h128", 80.0, ServiceCurve(sizes, (1.0, 2.7, 6.2, 13.4)))
    quant = Candidate("sage-greedy-4x-int8", 80.0, ServiceCurve(sizes, (1.3, 3.0, 6.1, 13.8)))
    cands = [light, quant]
    assert fastest_everywhere(cands) == frozenset()
    assert fastest_everywhere(cands, 0.1) == {light.variant_id}
    request = RequestSpec(1, 0.0)
    busy = {c.variant_id: VariantLoad(slowdown=1.0, room_nodes=100) for c in cands}
    kept = DecisionTable(cands, tie_margin=0.1).decide(
        request,
        _NoSnapshot(
            running_nodes=300, variants=busy, max_batch_nodes=1024, current=light.variant_id
        ),
        now=0.0,
    )
    assert kept.variant_id == light.variant_id and math.isnan(kept.predicted_ms)
    for margin, current in ((0.0, light.variant_id), (0.1, quant.variant_id)):
        load = _NoSnapshot(running_nodes=300, variants=busy, max_batch_nodes=1024, current=current)
        with pytest.raises(AssertionError, match="measured"):
            DecisionTable(cands, tie_margin=margin).decide(request, load, now=0.0)


def test_the_kept_stream_decides_as_the_plain_rule_on_random_crossing_curves() -> None:
    """The shortcut is a memo, not another rule: on crossing curves and loads as the router
    measures them (one slowdown for every computed lane, the same work ahead), a table that
    keeps a stream without reading the load chooses what the rule read plainly chooses; also
    for curves whose points start above one node or fall at the end (their extrapolations bend
    at zero), for a variant exactly at the edge of the tie band, and for no work ahead."""
    rng = random.Random(37)
    kept = 0
    for trial in range(400):
        sizes = rng.choice(((1, 4, 16, 64, 256, 1024), (8, 64, 512), (16, 32)))
        base = [rng.uniform(0.3, 2.0) * s**0.6 + rng.uniform(0.0, 1.0) for s in sizes]
        if rng.random() < 0.2:  # a last point below the one before: the curve falls beyond it
            base[-1] = base[-2] * rng.uniform(0.3, 0.95)
        curves = [
            ServiceCurve(sizes, tuple(t * rng.uniform(0.9, 1.15) for t in base))
            for _ in range(rng.randint(2, 4))
        ]
        margin = rng.choice((0.0, 0.05, 0.1, 0.2))
        if margin and rng.random() < 0.3:  # one variant exactly at the band's edge
            curves[0] = curves[1].scaled(1.0 + margin)
        cands = [Candidate(f"v{i}", 90.0 - i * 0.3, c) for i, c in enumerate(curves)]
        table = DecisionTable(cands, tie_margin=margin)
        for _ in range(10):
            current = rng.choice(cands).variant_id
            slowdown = rng.uniform(0.5, 20.0)
            snap = LoadSnapshot(
                ahead_ms=rng.choice((0.0, -1.0, rng.uniform(0.0, 50.0))),
                waiting_nodes=rng.choice((0, rng.randint(0, 2000))),
                running_nodes=rng.choice((1, rng.randint(1, 1024))),
                variants={
                    c.variant_id: VariantLoad(slowdown=slowdown, room_nodes=rng.randint(0, 500))
                    for c in cands
                    if c.variant_id == current or rng.random() < 0.5
                },
                max_batch_nodes=rng.choice((64, 1024)),
                current=current,
                slowdown=slowdown,
            )
            request = RequestSpec(rng.choice((1, 3, 8, 64, 700)), 5.0)
            got = table.decide(request, snap, now=0.0)
            assert got.variant_id == plain_rule(request, cands, snap, margin)[0], (trial, snap)
            kept += math.isnan(got.predicted_ms)
    assert kept > 100  # the shortcut was taken often enough to be tested


def _loads(cands: list[Candidate]) -> list[LoadSnapshot]:
    """Idle, busy and backlogged snapshots, with slow, full and kept lanes among them."""
    ids = [c.variant_id for c in cands]
    out = [LoadSnapshot(max_batch_nodes=1024), LoadSnapshot(slowdown=1.7, current=ids[0])]
    for ahead, waiting, running in ((0.0, 0, 1), (2.0, 30, 0), (9.0, 700, 1024), (0.5, 5, 64)):
        for current in (None, *ids):
            for busy in ({}, {ids[-1]: VariantLoad(slowdown=2.5, room_nodes=3)}):
                out.append(
                    LoadSnapshot(
                        ahead_ms=ahead,
                        waiting_nodes=waiting,
                        running_nodes=running,
                        variants=busy,
                        max_batch_nodes=1024,
                        current=current,
                        slowdown=1.2,
                    )
                )
    return out


@pytest.mark.parametrize("lookup", [False, True])
@pytest.mark.parametrize("margin", [0.0, 0.1, 0.5])
def test_the_tables_memoized_paths_decide_as_the_plain_rule(margin: float, lookup: bool) -> None:
    # One table deciding many requests (its memo filled as it goes: admissible sets, idle
    # choices, profiled times, kept streams) against the rule read plainly on every load; with
    # a precomputed variant, idle loads whose lookups run at another slowdown are added.
    cands = [*_candidates(), Candidate("sage-random-8x", 84.0, ServiceCurve((1, 1024), (0.5, 40)))]
    lookups = frozenset()
    loads = _loads(cands)
    if lookup:
        exact = Candidate("sage-full-1x@exact", 89.0, ServiceCurve((1, 1024), (0.6, 9.0)))
        cands, lookups = [*cands, exact], frozenset({exact.variant_id})
        loads += [
            LoadSnapshot(slowdown=s, lookup_slowdown=lk, max_batch_nodes=1024)
            for s, lk in ((1.0, 6.0), (3.0, 0.5), (2.0, 2.0))
        ]
    table = DecisionTable(cands, lookups=lookups, tie_margin=margin)
    for _ in range(2):  # the second pass reads every memo
        for snap in loads:
            for tol in (None, 0.0, 1.0, 5.0, 50.0):
                for nodes in (1, 4, 64, 2000):
                    for slo in (None, 0.3, 6.0):
                        request = RequestSpec(nodes, tol, slo)
                        got = table.decide(request, snap, now=0.0)
                        want, want_ms = plain_rule(request, cands, snap, margin, lookups=lookups)
                        if math.isnan(got.predicted_ms):  # kept without reading the load
                            admitted = table.admissible(request.effective_tolerance)
                            kept_stream = got.variant_id == snap.current and snap.busy
                            assert len(admitted) == 1 or kept_stream
                            assert got.variant_id == want, (snap, request)
                            continue
                        assert (got.variant_id, got.predicted_ms) == (
                            want,
                            pytest.approx(want_ms),
                        ), (snap, request)


def test_a_deadline_is_a_target_at_the_time_of_the_decision() -> None:
    table = DecisionTable(_candidates(), tie_margin=0.1)
    request = RequestSpec(1, deadline_at=10.0)  # the clock's seconds
    assert request.effective_tolerance == math.inf  # a deadline alone admits every variant
    assert request.left_ms(9.9975) == pytest.approx(2.5)
    # 2.5 ms left at 9.9975 s: the most accurate predicted to meet it is 2x (2 ms).
    sel = table.decide(request, LoadSnapshot(), now=9.9975)
    assert (sel.variant_id, sel.meets_slo) == ("sage-lasso-2x", True)
    # passed: none meets it, the fastest is named and marked as missing it
    late = table.decide(request, LoadSnapshot(), now=10.5)
    assert (late.variant_id, late.meets_slo) == ("sage-lasso-8x", False)
    with pytest.raises(ValueError, match="deadline_at must be finite"):
        RequestSpec(1, deadline_at=math.inf)


def test_computed_only_leaves_the_lookups_out() -> None:
    cands = [*_candidates(), Candidate("sage-full-1x@exact", 90.0, ServiceCurve((1,), (0.1,)))]
    table = DecisionTable(cands, lookups=frozenset({"sage-full-1x@exact"}), tie_margin=0.1)
    request = RequestSpec(1, 0.0)
    assert table.decide(request, LoadSnapshot(), now=0.0).variant_id == "sage-full-1x@exact"
    assert (
        table.decide(request, LoadSnapshot(), now=0.0, computed_only=True).variant_id
        == "sage-full-1x"
    )
    # a lookup is predicted at its own slowdown
    slow_lookup = LoadSnapshot(lookup_slowdown=100.0, ahead_ms=1.0)
    assert table.decide(request, slow_lookup, now=0.0).variant_id == "sage-full-1x"
    assert table.admissible(0.0) == table.admissible(0.0)  # computed once


# -- the frontier: dominated candidates ---------------------------------------------------------


def _paired_candidate(
    name: str, accuracy: float, lo: float, hi: float, curve: ServiceCurve
) -> Candidate:
    diff = accuracy - 90.0
    return Candidate(name, accuracy, curve, PairedDiff(diff, lo, hi, lo <= 0 <= hi, "best"))


def test_dominated_needs_admissible_accurate_and_faster_everywhere() -> None:
    slow = ServiceCurve((1, 64, 1024), (1.0, 8.0, 100.0))
    fast = slow.scaled(0.5)
    crossing = ServiceCurve((1, 64, 1024), (0.4, 8.5, 40.0))  # faster except at 64 nodes
    cands = [
        _paired_candidate("best", 90.0, 0.0, 0.0, slow),
        _paired_candidate("twin", 89.8, -0.5, 0.1, fast),  # admissible at 0.5, fast
        _paired_candidate("slow-twin", 89.8, -0.5, 0.1, slow),  # as twin, slower: dominated
        _paired_candidate("wide", 89.9, -2.5, 1.0, fast.scaled(0.5)),  # faster, but admitted
        _paired_candidate("cross", 89.0, -1.5, -0.5, crossing),  # only later (1.5)
        _paired_candidate("worse", 88.0, -2.5, -1.5, slow.scaled(0.8)),  # twin beats it
    ]
    out = policy.dominated(cands)
    assert out["slow-twin"] in {"best", "twin"}  # best: as fast, more accurate, listed first
    assert "best" not in out  # the reference of the paired differences is kept
    assert "wide" not in out  # faster than everything, but admitted at a larger tolerance
    assert "cross" not in out  # no one is faster at every size
    assert out["worse"] in {"twin", "wide"}  # twin: admitted earlier, more accurate, faster
    tolerances = policy.admitting_tolerances(cands)
    for loser, winner in out.items():
        assert tolerances[winner] <= tolerances[loser]
    # dropping them changes no choice, whatever the tolerance and request size
    frontier = [c for c in cands if c.variant_id not in out]
    for tolerance in (0.0, 0.5, 1.0, 1.5, 2.5, 5.0):
        for n in (1, 64, 1024):
            request = RequestSpec(n, tolerance=tolerance)
            assert (
                select_variant(request, cands, tie_margin=0.1).variant_id
                == select_variant(request, frontier, tie_margin=0.1).variant_id
            )


def test_equal_candidates_keep_the_first_and_lookups_neither_dominate_nor_are_dominated() -> None:
    curve = ServiceCurve((1, 64), (1.0, 4.0))
    a = Candidate("a", 80.0, curve)
    b = Candidate("b", 80.0, curve)
    assert policy.dominated([a, b]) == {"b": "a"}
    lookup = Candidate("a@exact", 80.0, curve.scaled(0.1))
    assert policy.dominated([a, lookup], lookups=frozenset({"a@exact"})) == {}
    # A lookup's speed is learned apart from the computed ones': a faster curve does not
    # dominate it either.
    slow_lookup = Candidate("b@exact", 79.0, curve.scaled(2.0))
    assert policy.dominated([a, slow_lookup], lookups=frozenset({"b@exact"})) == {}
    assert policy.dominated([a, slow_lookup]) == {"b@exact": "a"}
    assert policy.dominated([a]) == {}
