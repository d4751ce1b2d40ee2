"""Re-timing service curves measured under other execution settings.

A profile's service curve holds for the settings it was measured under (threads, inline
threshold, device, versions: :mod:`gnnaas.inference.settings`). When a
server's differ, routing on the old curve would be silently wrong in shape, which the router's
device-wide slowdown, common to every variant, cannot fix for one variant (a curve measured with
two threads and served with one is slower at large batches and not at small ones). So before
such a variant is routed the server times its curve again with its own batch handler, as the
profiler does (:class:`gnnaas.profiling.curves.CurveTimer`, fewer runs), and replaces the curve;
``GET /v1/datasets/{d}/variants`` then shows ``retimed: true`` and the server's settings in the
profile.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping

from gnnaas.policy import ServiceCurve
from gnnaas.profiling.curves import CurveTimer, Handler, service_sizes
from gnnaas.serving.core.registry import ServedDataset
from gnnaas.serving.core.settings import Settings

__all__ = ["RETIME_MIN_TIME_S", "RETIME_RUNS", "needs_retime", "retime_curves"]

_log = logging.getLogger(__name__)

RETIME_RUNS = 3
"""Least timed runs per batch size when a server re-times a curve."""
RETIME_MIN_TIME_S = 0.4
"""A re-timed curve's small batches run for a quarter of this per variant."""


def needs_retime(dataset: ServedDataset) -> list[str]:
    """Ids of ``dataset``'s routable variants whose curve was measured under other settings."""
    return [
        v.variant_id
        for v in dataset.variants.values()
        if v.routable and v.profile is not None and v.profile.settings_mismatch
    ]


def retime_curves(
    dataset: ServedDataset,
    handlers: Mapping[str, Handler],
    settings: Settings,
    current: Mapping[str, object],
) -> list[str]:
    """Times the curves of ``dataset``'s variants in :func:`needs_retime` with their handlers
    and puts them in their profiles (then the dataset's candidates are recomputed).

    Args:
        dataset (ServedDataset): the dataset (its variants' profiles are replaced).
        handlers (Mapping[str, Handler]): each variant's batch handler, as served.
        settings (Settings): the server's settings (batch cap, inline threshold).
        current (Mapping[str, object]): the execution settings the curves are timed under
            (shown in the profile afterwards).

    Returns:
        list[str]: the re-timed variant ids.
    """
    wanted = [v for v in needs_retime(dataset) if v in handlers]
    if not wanted:
        return []
    example = dataset.variants[wanted[0]].profile
    assert example is not None  # needs_retime lists profiled variants only
    _log.warning(
        "dataset %s: re-timing the service curves of %d variants measured under other settings "
        "(%s); run `gnnaas profile --dataset %s` with this server's settings to skip this",
        dataset.name,
        len(wanted),
        ", ".join(example.settings_mismatch),
        dataset.name,
    )
    start = time.perf_counter()
    with CurveTimer(max(dataset.num_nodes, 1), inline_max_nodes=settings.inline_max_nodes) as t:
        rows = t.curves(
            {v: handlers[v] for v in wanted},
            service_sizes(settings.max_batch_nodes),
            service_runs=RETIME_RUNS,
            min_time_s=RETIME_MIN_TIME_S,
        )
    by_variant: dict[str, list[dict[str, object]]] = {}
    for row in rows:
        variant_id = str(row.pop("variant"))
        by_variant.setdefault(variant_id, []).append({**row, **current})
    for variant_id, points in by_variant.items():
        variant = dataset.variants[variant_id]
        profile = variant.profile
        assert profile is not None
        curve = ServiceCurve.from_points(
            {int(p["batch_size"]): float(p["e2e_ms"]) for p in points}  # type: ignore[arg-type]
        )
        summary = {**profile.summary, "service_times": points}
        summary.update({k: v for k, v in current.items() if k in summary})
        variant.profile = dataclasses.replace(
            profile, service=curve, summary=summary, settings_mismatch=(), retimed=True
        )
    dataset.refresh()
    _log.info(
        "dataset %s: re-timed %d curves in %.1f s",
        dataset.name,
        len(wanted),
        time.perf_counter() - start,
    )
    return wanted
