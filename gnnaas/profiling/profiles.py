"""Profiles as the router reads them: validation accuracy and service time by batch size.

Profiles written with accuracy intervals (:mod:`gnnaas.profiling.uncertainty`) also give each
variant its 95% accuracy interval and its paired difference to the most accurate variant
(:class:`~gnnaas.policy.PairedDiff`); older tables without those columns still
load, and the policy then admits by point accuracy.

Reads ``profiles/<dataset>/profiles.csv`` and ``service_times.csv`` through
:mod:`gnnaas.profiling.table` at start-up and on each reload; nothing here runs per request. At
start-up a missing or bad table never raises: the affected variants get a reason instead, and are
not routed to. A reload reads strictly: a table that is there but bad fails the reload.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gnnaas.errors import ArtifactError
from gnnaas.inference.settings import settings_mismatch
from gnnaas.policy import PairedDiff, ServiceCurve

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["VariantProfile", "profile_of", "read_profile_tables"]

# Profile columns shown by GET /v1/datasets/{dataset}/variants, in this order.
_PROFILE_SUMMARY = (
    "batch_size", "accuracy", "accuracy_std", "accuracy_lo", "accuracy_hi", "best_variant",
    "diff_best", "diff_best_lo", "diff_best_hi", "tie_best", "sample_ms", "comm_ms", "comp_ms",
    "latency_ms", "latency_p95_ms", "latency_p99_ms", "e2e_ms", "comm_comp", "size_kb", "mem_mb",
    "unique_frac", "device", "threads", "date",
)  # fmt: skip


@dataclass(frozen=True)
class VariantProfile:
    """What the router knows about a variant from its profiles.

    Args:
        accuracy (float): validation accuracy in percent (the profile split's ``accuracy``).
        service (ServiceCurve): end-to-end service time (``e2e_ms``) by batch size.
        test_accuracy (float, optional): test accuracy in percent. (default: ``None``)
        summary (dict, optional): profile columns shown by the variants endpoint. (default: ``{}``)
        accuracy_lo (float, optional): lower end of the accuracy's 95% interval.
            (default: ``None``: profiles written before intervals existed)
        accuracy_hi (float, optional): upper end of that interval. (default: ``None``)
        paired (PairedDiff, optional): paired difference to the split's most accurate variant
            (``diff_best``, ``diff_best_lo``, ``diff_best_hi``, ``tie_best``, ``best_variant``);
            the policy admits by it when every candidate has one. (default: ``None``)
        settings_mismatch (tuple[str, ...], optional): how the execution settings its service
            curve was measured under differ from the server's (empty: the same). A server
            re-times such a curve before routing on it, or does not route the variant.
            (default: ``()``)
        retimed (bool, optional): the curve was re-timed by this server. (default: ``False``)
    """

    accuracy: float
    service: ServiceCurve
    test_accuracy: float | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    accuracy_lo: float | None = None
    accuracy_hi: float | None = None
    paired: PairedDiff | None = None
    settings_mismatch: tuple[str, ...] = ()
    retimed: bool = False


def _clean(value: Any) -> Any:
    """A JSON-safe Python scalar (NaN → None, numpy → Python)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _number(row: Mapping[str, Any], column: str) -> float | None:
    """``row[column]`` as a finite float; ``None`` when absent, empty or not a number."""
    try:
        value = float(_clean(row.get(column)))
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _flag(value: Any) -> bool:
    """A ``tie_best`` cell (bool, 0/1 or ``"True"``/``"False"`` text) as a bool."""
    value = _clean(value)
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value) if value is not None else False


def _paired(row: Mapping[str, Any]) -> PairedDiff | None:
    """The row's paired difference to the best variant; ``None`` without (finite) ``diff_best``."""
    diff = _number(row, "diff_best")
    if diff is None:
        return None
    lo, hi = _number(row, "diff_best_lo"), _number(row, "diff_best_hi")
    best = _clean(row.get("best_variant"))
    return PairedDiff(
        diff_best=diff,
        lo=math.nan if lo is None else lo,
        hi=math.nan if hi is None else hi,
        tie_best=_flag(row.get("tie_best")),
        best_variant=None if best in (None, "") else str(best),
    )


def read_profile_tables(
    folder: Path, split: str, *, strict: bool = False
) -> tuple[pd.DataFrame | None, dict[str, list[dict[str, Any]]], list[str]]:
    """Both tables of one dataset; a missing or bad table becomes a note.

    Args:
        folder (Path): ``profiles/<dataset>``.
        split (str): the profile split the router ranks by.
        strict (bool, optional): raise for a table that exists but cannot be read (a reload
            refuses it); a missing table is still a note. (default: ``False``)

    Raises:
        ArtifactError: ``strict`` and a table is there but unreadable or malformed.
    """
    from gnnaas.profiling.table import (
        PROFILES_FILE,
        SERVICE_TIMES_FILE,
        read_profiles,
        read_service_times,
    )

    notes: list[str] = []
    profiles = None
    curves: dict[str, list[dict[str, Any]]] = {}
    try:
        profiles = read_profiles(folder)
    except ArtifactError as exc:
        if strict and (Path(folder) / PROFILES_FILE).exists():
            raise
        notes.append(str(exc))
    try:
        service = read_service_times(folder)
        for row in service.to_dict("records"):
            curves.setdefault(str(row["variant"]), []).append(
                {k: _clean(v) for k, v in row.items() if k != "variant"}
            )
    except ArtifactError as exc:
        if strict and (Path(folder) / SERVICE_TIMES_FILE).exists():
            raise
        notes.append(str(exc))
    return profiles, curves, notes


def profile_of(
    variant_id: str,
    profiles: pd.DataFrame | None,
    curves: Mapping[str, list[dict[str, Any]]],
    split: str,
    *,
    sampling: str | None = None,
    sampler_seed: int | None = None,
    settings: Mapping[str, Any] | None = None,
    dataset: str = "<dataset>",
) -> tuple[VariantProfile | None, str | None]:
    """The variant's profile, or ``None`` and why it is not routed to.

    With ``sampling``/``sampler_seed`` (the server's serving sampler), a service curve measured
    with another sampler is refused: its times and answers are those of another pipeline. With
    ``settings`` (the server's :func:`~gnnaas.inference.settings.execution_settings`), a curve
    measured under other settings gets them in :attr:`VariantProfile.settings_mismatch`.
    """
    hint = f"run `gnnaas profile --dataset {dataset} --only {variant_id}` (or profile them all)"
    for point in curves.get(variant_id, []):
        measured_with = (point.get("sampling"), point.get("sampler_seed"))
        if sampling is not None and measured_with != (sampling, sampler_seed):
            return None, (
                f"its service curve was measured with sampling={measured_with[0]} "
                f"seed={measured_with[1]}, the server samples with sampling={sampling} "
                f"seed={sampler_seed}; {hint} with the server's GNNAAS_SEED"
            )
    if profiles is None:
        return None, f"no readable profiles.csv; {hint}"
    rows = profiles[profiles["variant"] == variant_id]
    by_split = {str(r["split"]): r for r in rows.to_dict("records")}
    if split not in by_split:
        return None, f"no '{split}' row in profiles.csv; {hint}"
    row = by_split[split]
    accuracy = _clean(row["accuracy"])
    if accuracy is None:
        return None, f"its '{split}' accuracy in profiles.csv is not a number; {hint}"
    points = {
        int(p["batch_size"]): p["e2e_ms"]
        for p in curves.get(variant_id, [])
        if p.get("e2e_ms") is not None
    }
    if not points:
        return None, f"no rows in service_times.csv; {hint}"
    try:
        curve = ServiceCurve.from_points(points)
    except ValueError as exc:
        return None, f"bad service times ({exc}); {hint}"
    test = by_split.get("test")
    summary = {k: _clean(row[k]) for k in _PROFILE_SUMMARY if k in row}
    summary["split"] = split
    paired = _paired(row)
    if "tie_best" in summary:
        summary["tie_best"] = None if paired is None else paired.tie_best
    summary["service_times"] = sorted(curves[variant_id], key=lambda p: p["batch_size"])
    mismatch: list[str] = []
    if settings is not None:
        for point in curves[variant_id]:
            mismatch = settings_mismatch(point, settings)
            if mismatch:
                break
    return (
        VariantProfile(
            accuracy=float(accuracy),
            service=curve,
            test_accuracy=None if test is None else _clean(test["accuracy"]),
            summary=summary,
            accuracy_lo=_number(row, "accuracy_lo"),
            accuracy_hi=_number(row, "accuracy_hi"),
            paired=paired,
            settings_mismatch=tuple(mismatch),
        ),
        None,
    )
