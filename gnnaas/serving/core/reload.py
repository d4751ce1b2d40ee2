"""Reloading the served set without downtime (``POST /v1/admin/reload`` and ``SIGHUP``).

:class:`Reloader` rereads the folders the server was started with (its ``loader``; never a path
given in a request) in a worker thread, strictly
(:meth:`VariantRegistry.load(strict=True) <gnnaas.serving.core.registry.VariantRegistry.load>`), and
hands the new registry to :meth:`Router.reload <gnnaas.serving.core.router.Router.reload>`, which
builds and warms the new lanes off to the side, swaps them in on the event loop and drains the old
ones.
Requests keep being served by the previous set throughout, and a request accepted by it is
finished by it.

Reloads are serialized by a lock: a second one waits for the running one, then runs itself, so
every caller gets a reload that started after it asked (it sees the files as they were then, or
newer). A reload that fails leaves the previous set served and raises :class:`ReloadError`
naming the cause; the log has it too. Plain Python, free of FastAPI types.

Example:
    >>> load = functools.partial(VariantRegistry.load, settings, strict=True)  # doctest: +SKIP
    >>> reloader = Reloader(router, load)  # doctest: +SKIP
    >>> (await reloader.reload()).generation  # doctest: +SKIP
    2
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gnnaas.errors import GnnaasError, OverloadedError
from gnnaas.serving.core.registry import ServingVariant, VariantRegistry
from gnnaas.serving.core.router import Router

__all__ = ["RegistryLoader", "ReloadError", "ReloadSummary", "Reloader", "summarize"]

_log = logging.getLogger(__name__)

RegistryLoader = Callable[[], VariantRegistry]
"""Builds the registry to serve from the server's own folders (blocking; runs in a thread)."""


class ReloadError(GnnaasError):
    """A reload that failed; the previous set is still served.

    Args:
        message (str): what failed and why, for the caller and the log.
        generation (int): the generation still served.
        internal (bool, optional): an unexpected error (not a bad file): ``message`` names only
            its type, the log has the traceback. (default: ``False``)
    """

    def __init__(self, message: str, generation: int, *, internal: bool = False) -> None:
        super().__init__(message)
        self.generation = generation
        self.internal = internal


@dataclass(frozen=True)
class ReloadSummary:
    """What a successful reload changed.

    Args:
        generation (int): the generation served now (1 at start, +1 per reload).
        trigger (str): what asked for it (``api``, ``SIGHUP``).
        datasets (tuple[str, ...]): datasets served now.
        variants (int): variants loaded now.
        datasets_added (tuple[str, ...]): datasets served now and not before.
        datasets_removed (tuple[str, ...]): datasets no longer served.
        variants_added (tuple[str, ...]): ``<dataset>/<variant>`` loaded now and not before.
        variants_removed (tuple[str, ...]): ``<dataset>/<variant>`` no longer loaded.
        variants_reprofiled (tuple[str, ...]): kept variants whose profile (or routability)
            changed.
        notes (tuple[str, ...]): what the new set skips, and why (as ``/readyz`` shows).
        duration_ms (float): from the request to the old lanes drained.
    """

    generation: int
    trigger: str
    datasets: tuple[str, ...]
    variants: int
    datasets_added: tuple[str, ...]
    datasets_removed: tuple[str, ...]
    variants_added: tuple[str, ...]
    variants_removed: tuple[str, ...]
    variants_reprofiled: tuple[str, ...]
    notes: tuple[str, ...]
    duration_ms: float

    def describe(self) -> str:
        """One log line."""
        return (
            f"generation {self.generation}, {len(self.datasets)} datasets, {self.variants} "
            f"variants ({len(self.variants_added)} added, {len(self.variants_removed)} removed, "
            f"{len(self.variants_reprofiled)} re-profiled) in {self.duration_ms:.0f} ms"
        )


def _variants(registry: VariantRegistry) -> dict[str, ServingVariant]:
    return {
        f"{d.name}/{v.variant_id}": v
        for d in registry.datasets.values()
        for v in d.variants.values()
    }


def _profile_key(variant: ServingVariant) -> tuple[Any, ...]:
    """What the router knows of a variant's profile, comparable across loads (no NaN)."""
    p = variant.profile
    if p is None:
        return (None, variant.not_routed)
    return (p.accuracy, p.test_accuracy, p.service, p.summary, variant.not_routed)


def summarize(
    old: VariantRegistry,
    new: VariantRegistry,
    *,
    generation: int,
    trigger: str,
    duration_ms: float,
) -> ReloadSummary:
    """The changes from ``old`` to ``new``."""
    before, after = _variants(old), _variants(new)
    kept = before.keys() & after.keys()
    return ReloadSummary(
        generation=generation,
        trigger=trigger,
        datasets=tuple(new.datasets),
        variants=len(after),
        datasets_added=tuple(sorted(new.datasets.keys() - old.datasets.keys())),
        datasets_removed=tuple(sorted(old.datasets.keys() - new.datasets.keys())),
        variants_added=tuple(sorted(after.keys() - before.keys())),
        variants_removed=tuple(sorted(before.keys() - after.keys())),
        variants_reprofiled=tuple(
            sorted(k for k in kept if _profile_key(before[k]) != _profile_key(after[k]))
        ),
        notes=tuple(new.notes),
        duration_ms=duration_ms,
    )


class Reloader:
    """Serialized, failure-safe reloads of a :class:`Router`.

    Args:
        router (Router): the started router whose set is replaced.
        loader (RegistryLoader): builds the new registry from the server's folders.
        after_swap (Callable[[], None], optional): called on the event loop once a reload has
            drained the previous set (the app releases its memory there). (default: ``None``)
    """

    def __init__(
        self,
        router: Router,
        loader: RegistryLoader,
        *,
        after_swap: Callable[[], None] | None = None,
    ) -> None:
        self.router = router
        self._loader = loader
        self._after_swap = after_swap
        self._lock = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()
        self.last: ReloadSummary | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(generation={self.router.generation})"

    async def reload(self, trigger: str = "api") -> ReloadSummary:
        """Reloads now, or after the reload already running.

        Args:
            trigger (str, optional): what asked, for the summary and the log. (default: ``api``)

        Returns:
            ReloadSummary: what changed.

        Raises:
            ReloadError: the new set could not be loaded, built or warmed up; the old one stays.
            OverloadedError: the server is starting or shutting down.
        """
        async with self._lock:
            return await self._reload(trigger)

    async def _reload(self, trigger: str) -> ReloadSummary:
        start = time.perf_counter()
        router = self.router
        if not router.started or router.stopping:
            raise OverloadedError("the server is starting or shutting down; reload later")
        old, serving = router.registry, router.generation
        stage = "loading variants, profiles and datasets"
        try:
            registry = await asyncio.to_thread(self._loader)
            stage = "building and warming up the new variants"
            generation = await router.reload(registry)
        except OverloadedError:
            raise
        except Exception as exc:
            router.metrics.reloaded("failed")
            raise self._failed(exc, trigger, stage, serving) from exc
        if self._after_swap is not None:
            self._after_swap()
        summary = summarize(
            old,
            registry,
            generation=generation,
            trigger=trigger,
            duration_ms=(time.perf_counter() - start) * 1e3,
        )
        router.metrics.reloaded("ok")
        self.last = summary
        _log.info("reload (%s) done: %s", trigger, summary.describe())
        for name in summary.variants_added:
            _log.info("reload (%s): variant %s added", trigger, name)
        for name in summary.variants_removed:
            _log.info("reload (%s): variant %s removed", trigger, name)
        return summary

    @staticmethod
    def _failed(exc: Exception, trigger: str, stage: str, serving: int) -> ReloadError:
        notes = getattr(exc, "__notes__", None)
        if notes:  # e.g. "while warming up variant toy/sage-full-1x"
            stage = str(notes[-1]).removeprefix("while ")
        if isinstance(exc, GnnaasError | OSError):
            # A file the reload found but could not use: the message names it and the fix.
            _log.error(
                "reload (%s) failed while %s; still serving generation %d: %s",
                trigger,
                stage,
                serving,
                exc,
            )
            return ReloadError(
                f"reload failed while {stage}; still serving generation {serving}: {exc}", serving
            )
        _log.error(
            "reload (%s) failed while %s; still serving generation %d",
            trigger,
            stage,
            serving,
            exc_info=exc,
        )
        return ReloadError(
            f"reload failed while {stage} (unexpected {type(exc).__name__}); still serving "
            f"generation {serving}",
            serving,
            internal=True,
        )

    def on_signal(self) -> asyncio.Task[None]:
        """The ``SIGHUP`` handler (call on the event loop): reloads in the background.

        The outcome goes to the log. Returns the task (tests await it).
        """
        task = asyncio.get_running_loop().create_task(self._logged("SIGHUP"))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _logged(self, trigger: str) -> None:
        try:
            await self.reload(trigger)
        except ReloadError:
            pass  # logged with its cause
        except OverloadedError as exc:
            _log.warning("reload (%s) not done: %s", trigger, exc)

    async def close(self) -> None:
        """Cancels background reloads (at shutdown); the served set is left as it is."""
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
