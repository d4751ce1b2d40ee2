"""A generation of the served set: the registry, its lanes and its decision tables, as one.

The router serves one :class:`Generation` at a time and a reload swaps the next one in with one
assignment (:mod:`gnnaas.serving.core.router`), so a request sees one registry, the lanes of that
registry and the decision tables of its candidates, never a mix. :func:`build_generation` makes
one off to the side: each variant's executor from the runtime, its lane, a warm-up forward per
lane when the settings say so, the curves measured under other execution settings re-timed
(:mod:`.retime`), and then, from the final candidates, one
:class:`~gnnaas.policy.DecisionTable` per dataset.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gnnaas.inference.executor import ExecRequest
from gnnaas.policy import DecisionTable
from gnnaas.serving.core.clock import MONOTONIC, Clock
from gnnaas.serving.core.lane import Handler, Lane
from gnnaas.serving.core.looplag import ComputeTime
from gnnaas.serving.core.metrics import ServingMetrics
from gnnaas.serving.core.registry import ServedDataset, ServingVariant, VariantRegistry
from gnnaas.serving.core.settings import Settings
from gnnaas.serving.core.slowdown import Slowdown

__all__ = [
    "ExecutorFactory",
    "Generation",
    "build_generation",
    "decision_tables",
    "default_executor_factory",
]

_log = logging.getLogger(__name__)

ExecutorFactory = Callable[[ServedDataset, ServingVariant], Handler]
"""Builds the blocking batch handler of one variant (default: the runtime's executor)."""


def default_executor_factory(device: Any) -> ExecutorFactory:
    """Each variant's executor on ``device``, as the runtime builds it
    (:meth:`gnnaas.runtime.RuntimeVariant.executor`: with its device feature cache when it has
    planned ``cache_nodes``)."""

    def build(dataset: ServedDataset, variant: ServingVariant) -> Handler:
        return variant.executor(dataset.graph, device)

    return build


@dataclass(eq=False)
class Generation:
    """One served set.

    Args:
        number (int): its generation (1 at start-up, +1 per reload).
        registry (VariantRegistry): the datasets and variants.
        lanes (dict): ``(dataset, variant) -> Lane``.
        tables (dict): ``ServedDataset -> DecisionTable`` of the datasets with candidates (keyed
            by the dataset itself: a dataset of another generation finds none).
        current (dict, optional): ``dataset -> (variant, time)`` of its stream: its last
            routed request's variant, and when it was routed (the router's clock). (default:
            empty)
    """

    number: int
    registry: VariantRegistry
    lanes: dict[tuple[str, str], Lane]
    tables: dict[ServedDataset, DecisionTable]
    current: dict[str, tuple[str, float]] = field(default_factory=dict)


def decision_tables(
    registry: VariantRegistry, settings: Settings
) -> dict[ServedDataset, DecisionTable]:
    """One decision table per dataset with candidates (its frontier)."""
    return {
        ds: DecisionTable(
            ds.candidates,
            lookups=ds.precomputed,
            tie_margin=settings.tie_margin,
        )
        for ds in registry.datasets.values()
        if ds.candidates
    }


async def build_generation(
    number: int,
    registry: VariantRegistry,
    factory: ExecutorFactory,
    settings: Settings,
    metrics: ServingMetrics,
    *,
    slowdown: Slowdown,
    gate: asyncio.Semaphore | None,
    serving: bool,
    clock: Clock = MONOTONIC,
    busy: set[Lane] | None = None,
    computing: ComputeTime | None = None,
) -> Generation:
    """The generation of ``registry`` (batchers not started), warmed up and re-timed; its
    lanes join ``busy`` while they have work and tell ``computing`` when each batch runs
    (:class:`~gnnaas.serving.core.lane.Lane`).

    Re-timing runs on this (the event loop's) thread at start-up, when nothing is served yet, as
    the server runs small batches; while ``serving`` (a reload) in a worker thread, beside the
    current set's traffic (the figures are then a little noisier). On an error the lanes built
    so far are released and the error is raised, with a note naming the variant.
    """
    lanes: dict[tuple[str, str], Lane] = {}
    try:
        for ds in registry.datasets.values():
            for v in ds.variants.values():
                try:
                    handler = await asyncio.to_thread(factory, ds, v)
                except Exception as exc:
                    exc.add_note(f"while building variant {ds.name}/{v.variant_id}")
                    raise
                lanes[(ds.name, v.variant_id)] = Lane(
                    ds,
                    v,
                    handler,
                    settings,
                    metrics,
                    slowdown=slowdown,
                    gate=gate,
                    clock=clock,
                    busy=busy,
                    computing=computing,
                )
        if settings.warmup:
            await _warm_up(lanes, gate)
        await _retime(registry, lanes, settings, serving=serving)
    except Exception:
        await discard(lanes)
        raise
    return Generation(number, registry, lanes, decision_tables(registry, settings))


async def _warm_up(lanes: dict[tuple[str, str], Lane], gate: asyncio.Semaphore | None) -> None:
    """One forward per lane, each taking the device gate like a batch."""
    _log.info("warming up %d variants (one forward each)", len(lanes))
    for (ds_name, v_id), lane in lanes.items():
        warm = [ExecRequest(torch.zeros(1, dtype=torch.long), output="proba")]
        try:
            async with gate or contextlib.nullcontext():
                await asyncio.to_thread(lane.handler, warm)
        except Exception as exc:
            exc.add_note(f"while warming up variant {ds_name}/{v_id}")
            raise


async def _retime(
    registry: VariantRegistry,
    lanes: dict[tuple[str, str], Lane],
    settings: Settings,
    *,
    serving: bool,
) -> None:
    """Re-times the curves measured under other execution settings (:mod:`.retime`)."""
    from gnnaas.inference.settings import execution_settings
    from gnnaas.serving.core.retime import needs_retime, retime_curves

    for ds in [ds for ds in registry.datasets.values() if needs_retime(ds)]:
        current = execution_settings(registry.device, inline_max_nodes=settings.inline_max_nodes)
        handlers = {v: lane.handler for (d, v), lane in lanes.items() if d == ds.name}
        if serving:
            await asyncio.to_thread(retime_curves, ds, handlers, settings, current)
        else:
            retime_curves(ds, handlers, settings, current)


async def discard(lanes: dict[tuple[str, str], Lane]) -> None:
    """Releases lanes that never went live (their batchers have no task to drain)."""
    for lane in lanes.values():
        await lane.batcher.stop(0.0)
