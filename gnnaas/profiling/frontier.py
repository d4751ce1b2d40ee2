"""The router's view of a dataset's profiles: its candidates, the frontier, and its picks.

The report says which variant a request gets, so it asks the router's own code instead of
restating its rule: :func:`read_router_view` builds the candidates exactly as the server does
(:func:`gnnaas.profiling.profiles.read_profile_tables` and
:func:`~gnnaas.profiling.profiles.profile_of`, then :class:`gnnaas.policy.Candidate`, the
precomputed ``<base>@exact`` variants being lookups), drops the variants another dominates
(:func:`gnnaas.policy.dominated`) and :func:`tolerance_table` asks the router's decision
(:meth:`gnnaas.policy.DecisionTable.decide` on an idle load) for each tolerance and request
size. One rule, one answer: the report cannot pick another variant than the router, and a change
to the policy changes the report with it.

Example:
    >>> view = read_router_view("profiles/Cora")  # doctest: +SKIP
    >>> tolerance_table(view)[["tolerance", "num_nodes", "variant"]]  # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from gnnaas.errors import ArtifactError
from gnnaas.policy import TIE_MARGIN
from gnnaas.typing import PathType

if TYPE_CHECKING:
    from gnnaas.policy import Candidate, Selection

__all__ = [
    "REQUEST_SIZES",
    "TOLERANCES",
    "RouterView",
    "frontier_table",
    "read_router_view",
    "router_view",
    "tolerance_table",
]

TOLERANCES: tuple[float, ...] = (0.0, 1.0, 2.0, 5.0)
"""Accuracy tolerances (points) of the tolerance table and plot."""
REQUEST_SIZES: tuple[int, ...] = (1, 64)
"""Request sizes (target nodes) at which the report asks the router for its pick."""


@dataclass(frozen=True)
class RouterView:
    """A dataset's variants as the router sees them.

    Args:
        candidates (tuple[Candidate, ...]): the routable variants, in ``profiles.csv`` order.
        dominated_by (Mapping[str, str], optional): dominated id → an id that dominates it
            (:func:`gnnaas.policy.dominated`). (default: none)
        lookups (frozenset[str], optional): the precomputed variants. (default: none)
        not_routed (Mapping[str, str], optional): profiled variants the router would not route
            to, with the reason. (default: none)
    """

    candidates: tuple[Candidate, ...]
    dominated_by: Mapping[str, str] = field(default_factory=dict)
    lookups: frozenset[str] = frozenset()
    not_routed: Mapping[str, str] = field(default_factory=dict)

    @property
    def frontier(self) -> tuple[Candidate, ...]:
        """The candidates no other dominates: the ones a request is decided among."""
        return tuple(c for c in self.candidates if c.variant_id not in self.dominated_by)


def router_view(
    candidates: Sequence[Candidate],
    *,
    lookups: frozenset[str] = frozenset(),
    not_routed: Mapping[str, str] | None = None,
) -> RouterView:
    """The view of ``candidates``, with the dominated ones found as the server finds them.

    Args:
        candidates (Sequence[Candidate]): the routable variants.
        lookups (frozenset[str], optional): ids of precomputed variants. (default: none)
        not_routed (Mapping[str, str], optional): variants left out, with why. (default: none)

    Returns:
        RouterView: the candidates and :func:`gnnaas.policy.dominated` of them.
    """
    from gnnaas.policy import dominated

    return RouterView(
        tuple(candidates),
        dominated(candidates, lookups=lookups),
        lookups,
        dict(not_routed or {}),
    )


def read_router_view(profiles_dir: PathType, split: str = "val") -> RouterView:
    """The candidates the server builds from ``profiles.csv`` and ``service_times.csv``.

    The server's own readers (:mod:`gnnaas.profiling.profiles`) turn each variant's ``split`` row
    and service curve into a :class:`~gnnaas.policy.Candidate`, so the report routes
    on what the router routes on. The server's sampler and execution settings are not known
    here: a curve is taken as measured.

    Args:
        profiles_dir (str or PathLike): ``profiles/<dataset>``.
        split (str, optional): the profile split the router ranks by. (default: ``"val"``)

    Returns:
        RouterView: the routable variants; those without a service curve are in ``not_routed``.

    Raises:
        ArtifactError: ``profiles.csv`` is missing or unreadable.
    """
    from gnnaas.policy import Candidate
    from gnnaas.profiling.profiles import profile_of, read_profile_tables
    from gnnaas.variants.manifest import EXACT_SUFFIX

    folder = Path(profiles_dir)
    profiles, curves, notes = read_profile_tables(folder, split)
    if profiles is None:
        raise ArtifactError(notes[0] if notes else f"no profiles.csv in {folder}")
    candidates, not_routed = [], {}
    ids = profiles.loc[profiles["split"] == split, "variant"].drop_duplicates()
    for variant_id in ids:
        profile, reason = profile_of(variant_id, profiles, curves, split, dataset=folder.name)
        if profile is None:
            not_routed[variant_id] = reason or "no profile"
            continue
        candidates.append(Candidate(variant_id, profile.accuracy, profile.service, profile.paired))
    lookups = frozenset(c.variant_id for c in candidates if c.variant_id.endswith(EXACT_SUFFIX))
    return router_view(candidates, lookups=lookups, not_routed=not_routed)


def frontier_table(view: RouterView, sizes: Sequence[int] = REQUEST_SIZES) -> pd.DataFrame:
    """Per routable variant: where the router's rule admits it, its speed, what dominates it.

    Args:
        view (RouterView): the router's candidates.
        sizes (Sequence[int], optional): request sizes (nodes) to predict service times at.
            (default: :data:`REQUEST_SIZES`)

    Returns:
        pandas.DataFrame: ``variant, accuracy, admitted_from`` (the smallest tolerance that
        admits it, :func:`gnnaas.policy.admitting_tolerances`), ``service_ms_<n>`` per
        size (its predicted service time, idle), ``on_frontier``, ``dominated_by`` (empty on the
        frontier) and ``lookup``, in the candidates' order.
    """
    from gnnaas.policy import admitting_tolerances

    admitted_from = admitting_tolerances(view.candidates)
    rows = []
    for c in view.candidates:
        row: dict[str, Any] = {
            "variant": c.variant_id,
            "accuracy": c.accuracy,
            "admitted_from": admitted_from.get(c.variant_id, math.nan),
        }
        row.update({f"service_ms_{n}": c.service.predict_batched(n) for n in sizes})
        row["on_frontier"] = c.variant_id not in view.dominated_by
        row["dominated_by"] = view.dominated_by.get(c.variant_id, "")
        row["lookup"] = c.variant_id in view.lookups
        rows.append(row)
    columns = ["variant", "accuracy", "admitted_from", *(f"service_ms_{n}" for n in sizes)]
    return pd.DataFrame(rows, columns=[*columns, "on_frontier", "dominated_by", "lookup"])


def _baseline(frontier: Sequence[Candidate]) -> Candidate:
    """The most accurate candidate: the one the paired differences are taken against, else the
    first of the highest accuracy."""
    from gnnaas.policy import paired_comparable

    if paired_comparable(frontier):
        best = frontier[0].paired.best_variant if frontier[0].paired is not None else None
        for c in frontier:
            if c.variant_id == best:
                return c
    top = max(c.accuracy for c in frontier)
    return next(c for c in frontier if c.accuracy == top)


def tolerance_table(
    view: RouterView,
    tolerances: Sequence[float] = TOLERANCES,
    sizes: Sequence[int] = REQUEST_SIZES,
    *,
    tie_margin: float = TIE_MARGIN,
    test: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The variant an idle router picks per tolerance and request size, and its test loss.

    The pick is the router's own decision (:meth:`gnnaas.policy.DecisionTable.decide`) on the
    candidates it routes among (the frontier of :func:`read_router_view`) with nothing queued:
    the report applies the router's rule instead of a copy of it, so it names the variant the
    router serves (one rule, one answer). Under load the router ranks by predicted completion
    with the queued work and may move to a faster admissible variant.

    Admission is :func:`gnnaas.policy.candidates_within`: the paired rule of
    :func:`gnnaas.policy.admissible` when every frontier variant has a paired difference against
    the same best variant (``rule`` = ``paired interval``), else the point rule ``loss <= N``
    (``point estimate``).

    Args:
        view (RouterView): the router's candidates (:func:`read_router_view`).
        tolerances (Sequence[float], optional): in accuracy points. (default: :data:`TOLERANCES`)
        sizes (Sequence[int], optional): request sizes in target nodes.
            (default: :data:`REQUEST_SIZES`)
        tie_margin (float, optional): the router's ``GNNAAS_TIE_MARGIN``.
            (default: :data:`gnnaas.policy.TIE_MARGIN`, the server's ``GNNAAS_TIE_MARGIN``)
        test (pandas.DataFrame, optional): the test rows of ``profiles.csv``, to measure each
            pick's test loss.

    Returns:
        pandas.DataFrame: per tolerance and size (``tolerance``, ``num_nodes``): the
        ``baseline`` (most accurate variant) with ``baseline_accuracy`` and ``baseline_ms`` (its
        predicted time at that size), the pick (``variant``, ``accuracy``, ``predicted_ms``),
        ``relative_time`` (pick / baseline), ``fastest`` (the fastest admissible variant, which
        the tie margin may pass over for a more accurate one), ``admissible`` (how many frontier
        variants the tolerance admits), ``rule``, the validation loss ``val_loss`` with
        ``val_loss_lo``/``val_loss_hi``; with ``test``: ``test_loss`` (baseline's test accuracy
        minus the pick's), ``test_best`` (the test split's most accurate variant),
        ``test_loss_vs_best`` with its paired interval ``test_loss_lo``/``test_loss_hi`` (NaN
        unless the test rows carry paired columns against that variant).

    Raises:
        ValueError: ``view`` has no candidates.
    """
    from gnnaas.policy import DecisionTable, LoadSnapshot, RequestSpec, paired_comparable

    frontier = view.frontier
    if not frontier:
        raise ValueError("tolerance_table: no routable variants (got none)")
    idle = LoadSnapshot()
    router = DecisionTable(frontier, lookups=view.lookups, tie_margin=tie_margin)
    fastest_first = DecisionTable(frontier, lookups=view.lookups, tie_margin=0.0)
    by_id = {c.variant_id: c for c in frontier}
    base = _baseline(frontier)
    paired = paired_comparable(frontier)
    test_acc, test_best = _test_accuracies(test)
    rows = []
    for tol in tolerances:
        for n in sizes:
            request = RequestSpec(int(n), tolerance=float(tol))
            chosen = router.decide(request, idle, now=0.0)
            fastest = fastest_first.decide(request, idle, now=0.0)
            pick = by_id[chosen.variant_id]
            row = _pick_row(float(tol), int(n), base, pick, chosen, fastest, paired=paired)
            if test is not None:
                row.update(
                    _test_losses(test, test_acc, test_best, base.variant_id, pick.variant_id)
                )
            rows.append(row)
    return pd.DataFrame(rows)


def _pick_row(
    tol: float,
    n: int,
    base: Candidate,
    pick: Candidate,
    chosen: Selection,
    fastest: Selection,
    *,
    paired: bool,
) -> dict[str, Any]:
    """One row of :func:`tolerance_table`, without the test columns: the baseline and the pick
    at tolerance ``tol`` and ``n`` nodes, idle (their times as profiled)."""
    base_ms = base.service.predict_batched(n)
    pick_ms = pick.service.predict_batched(n)
    loss_lo = loss_hi = math.nan
    if paired and pick.paired is not None:
        loss_lo, loss_hi = -pick.paired.hi, -pick.paired.lo
    return {
        "tolerance": tol,
        "num_nodes": n,
        "baseline": base.variant_id,
        "baseline_accuracy": base.accuracy,
        "baseline_ms": base_ms,
        "variant": pick.variant_id,
        "accuracy": pick.accuracy,
        "predicted_ms": pick_ms,
        "relative_time": pick_ms / base_ms if base_ms > 0 else math.nan,
        "fastest": fastest.variant_id,
        "admissible": len(chosen.considered),
        "rule": "paired interval" if paired else "point estimate",
        "val_loss": base.accuracy - pick.accuracy,
        "val_loss_lo": loss_lo,
        "val_loss_hi": loss_hi,
    }


def _test_accuracies(test: pd.DataFrame | None) -> tuple[pd.Series | None, str | None]:
    """Test accuracy by variant, and the test split's most accurate variant: the one its paired
    columns are taken against when they name one, else the first of the highest accuracy."""
    if test is None or test.empty:
        return None, None
    acc = test.drop_duplicates("variant").set_index("variant")["accuracy"]
    named = test["best_variant"].dropna().unique() if "best_variant" in test.columns else []
    if len(named) == 1 and str(named[0]) in acc.index:
        return acc, str(named[0])
    return acc, str(acc.idxmax())


def _test_losses(
    test: pd.DataFrame,
    test_acc: pd.Series | None,
    test_best: str | None,
    baseline: str,
    pick: str,
) -> dict[str, Any]:
    nan = math.nan
    if test_acc is None or pick not in test_acc.index:
        return {
            "test_loss": nan,
            "test_best": test_best,
            "test_loss_vs_best": nan,
            "test_loss_lo": nan,
            "test_loss_hi": nan,
        }
    acc = float(test_acc[pick])
    base_acc = float(test_acc[baseline]) if baseline in test_acc.index else nan
    best_acc = float(test_acc[test_best]) if test_best is not None else nan
    loss_lo = loss_hi = nan
    row = test[test["variant"] == pick].iloc[0]
    if "best_variant" in test.columns and row.get("best_variant") == test_best:
        loss_lo = -float(row.get("diff_best_hi", nan))
        loss_hi = -float(row.get("diff_best_lo", nan))
    return {
        "test_loss": base_acc - acc,
        "test_best": test_best,
        "test_loss_vs_best": best_acc - acc,
        "test_loss_lo": loss_lo,
        "test_loss_hi": loss_hi,
    }
