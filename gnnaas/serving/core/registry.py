"""The variant registry: every servable dataset with its graph, variants and profiles.

Built once per generation (at start-up and on each reload, :meth:`VariantRegistry.load`) from the
variant repository and the profiles folder, or from in-memory objects
(:meth:`VariantRegistry.from_objects`, for tests and benchmarks). Variants are opened by the
runtime (:func:`gnnaas.runtime.open_variant` on a :class:`~gnnaas.runtime.RuntimeGraph`), as the
profiler opens them; what this module adds is the serving view: each variant's profile
(:func:`gnnaas.profiling.profiles.profile_of`) and whether the router may route to it. Free of
FastAPI types. Whatever cannot be served is kept as a *note* with its reason instead of stopping
the server: a corrupt variant is skipped, a variant without a profile is loaded but not routed to
(it can still be pinned with ``X-Variant``), a dataset folder without variants or profiles yet is
left out, and so is one whose variants all lack a current profile; ``/readyz`` shows the notes. A
dataset the server was asked for that cannot be served stops the start-up with the reason instead:
one named in ``settings.datasets``, and, without names, one with variants and profiles whose graph
cannot be loaded (a data root or an imported store missing). A server that started without it
would report ready to a load balancer while refusing every request for it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gnnaas.errors import ArtifactError, ConfigError
from gnnaas.policy import Candidate, dominated
from gnnaas.profiling.profiles import VariantProfile, profile_of, read_profile_tables
from gnnaas.runtime import (
    SAMPLER,
    CacheDemand,
    RuntimeGraph,
    RuntimeVariant,
    open_variant,
    plan_feature_caches,
)
from gnnaas.runtime.graph import GraphSource
from gnnaas.serving.core.settings import Settings

if TYPE_CHECKING:
    from gnnaas.inference.path import Sampler
    from gnnaas.serving.core.live import LiveState

__all__ = ["ServedDataset", "ServingVariant", "VariantRegistry", "plan_caches"]

_log = logging.getLogger(__name__)

_PREPARE = (
    "pass --variants/--profiles (or GNNAAS_VARIANTS_DIR/GNNAAS_PROFILES_DIR) where "
    "`gnnaas generate` and `gnnaas profile` wrote them (relative paths are taken from the "
    "current directory), or create them with `gnnaas prepare --dataset <name>`"
)


@dataclass(eq=False)
class ServingVariant(RuntimeVariant):
    """One loaded variant as the router sees it: a :class:`~gnnaas.runtime.RuntimeVariant`
    with its profile.

    Args:
        profile (VariantProfile, optional): ``None`` when not profiled (not routed to).
            (default: ``None``)
        not_routed (str, optional): why the variant is not routed to. (default: ``None``)

    The other fields are :class:`~gnnaas.runtime.RuntimeVariant`'s.
    """

    profile: VariantProfile | None = None
    not_routed: str | None = None

    def __post_init__(self) -> None:
        if self.not_routed is None:
            self.not_routed = self.problem
        if self.profile is None and self.not_routed is None:
            self.not_routed = "no profile"

    @property
    def routable(self) -> bool:
        """Whether the policy may choose this variant."""
        return self.profile is not None and self.not_routed is None

    @property
    def accuracy(self) -> float | None:
        """Profiled validation accuracy in percent, ``None`` without a profile."""
        return None if self.profile is None else self.profile.accuracy

    def describe(self) -> dict[str, Any]:
        """The ``variant`` object of a predict response."""
        return {
            "id": self.variant_id,
            "arch": self.arch,
            "ranking": self.ranking,
            "prune": self.prune,
            "features_kept": self.features_kept,
            "accuracy": self.accuracy,
        }


@dataclass(eq=False)
class ServedDataset:
    """A dataset the router serves: its graph, its variants and what the policy routes among.

    ``candidates`` (the frontier), ``routable_candidates``, ``dominated_by``, ``precomputed`` and
    ``covered`` are derived from the variants' profiles by :meth:`refresh`.
    """

    graph: RuntimeGraph
    variants: dict[str, ServingVariant]
    candidates: tuple[Candidate, ...] = field(default=(), init=False)
    routable_candidates: tuple[Candidate, ...] = field(default=(), init=False)
    dominated_by: dict[str, str] = field(default_factory=dict, init=False)
    precomputed: frozenset[str] = field(default=frozenset(), init=False)  # answered by lookup
    covered: frozenset[str] = field(default=frozenset(), init=False)  # ...every node, for good

    def __post_init__(self) -> None:
        self.refresh()

    def refresh(self) -> None:
        """Recomputes the candidates from the variants' profiles: the routable variants that no
        other dominates (:func:`~gnnaas.policy.dominated`; the others are in
        :attr:`dominated_by`, profiled and shown but never considered per request)."""
        routable = [
            Candidate(v.variant_id, v.profile.accuracy, v.profile.service, v.profile.paired)
            for v in self.variants.values()
            if v.routable and v.profile is not None
        ]
        lookups = frozenset(v.variant_id for v in self.variants.values() if v.answers is not None)
        self.precomputed = lookups
        # A graph that takes no writes keeps its node count: a lookup covering it once always
        # does (a live graph's lookups are checked per request).
        n = self.num_nodes
        self.covered = (
            frozenset(v for v in lookups if self.variants[v].answers.covers(n))  # type: ignore[union-attr]
            if self.live is None
            else frozenset()
        )
        self.routable_candidates = tuple(routable)
        self.dominated_by = dominated(routable, lookups=lookups)
        self.candidates = tuple(c for c in routable if c.variant_id not in self.dominated_by)

    @functools.cached_property
    def name(self) -> str:
        """The dataset's name (read on every decision: kept once)."""
        return self.graph.name

    @property
    def store(self) -> GraphSource:
        """The dataset's graph store."""
        return self.graph.store

    @property
    def live(self) -> LiveState | None:
        """The live graph's state (``serve --state-dir``), ``None`` for a graph without writes."""
        return self.graph.live  # type: ignore[no-any-return]

    @property
    def num_nodes(self) -> int:
        """Number of nodes of the graph (now, for a live graph)."""
        return self.graph.num_nodes

    @property
    def graph_version(self) -> int:
        """Version of the live graph (0 for a graph that takes no writes)."""
        return self.graph.version

    def info(self) -> dict[str, Any]:
        """Summary for ``GET /v1/datasets``."""
        return {
            "name": self.name,
            "num_nodes": self.num_nodes,
            "num_features": int(self.store.num_features),
            "num_classes": int(self.store.num_classes),
            "multi_label": bool(self.store.multi_label),
            "variants": len(self.variants),
            "routable": len(self.candidates) + len(self.dominated_by),
            "frontier": len(self.candidates),
            "graph_version": self.graph_version,
            "live": self.live is not None,
        }


class VariantRegistry:
    """Loaded datasets, variants and profiles, plus the reasons for what is not served.

    Args:
        datasets (Iterable[ServedDataset]): the datasets to serve.
        notes (Iterable[str], optional): reasons for skipped datasets or variants. (default: ``()``)
        device (str | torch.device, optional): where forward passes run. (default: ``"cpu"``)
    """

    def __init__(
        self,
        datasets: Iterable[ServedDataset],
        notes: Iterable[str] = (),
        *,
        device: str | torch.device = "cpu",
    ) -> None:
        self.datasets: dict[str, ServedDataset] = {d.name: d for d in datasets}
        self.notes: list[str] = list(notes)
        self.device = torch.device(device)
        self._folded = {name.lower(): d for name, d in self.datasets.items()}

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}: {len(d.variants)}" for n, d in self.datasets.items())
        return f"{type(self).__name__}({{{parts}}}, device={self.device})"

    def get(self, name: str) -> ServedDataset | None:
        """The dataset called ``name`` (exact, else case-insensitive), or ``None``."""
        return self.datasets.get(name) or self._folded.get(name.lower())

    def not_ready_reasons(self) -> list[str]:
        """Why the registry cannot serve (empty when it can)."""
        if not self.datasets:
            return ["no dataset loaded"] + self.notes
        return [
            f"dataset {d.name}: no routable variant (every variant lacks a profile); "
            f"run `gnnaas profile --dataset {d.name}`"
            for d in self.datasets.values()
            if not d.candidates
        ]

    def not_routed(self) -> dict[str, str]:
        """``{"<dataset>/<variant>": reason}`` for loaded variants the policy never chooses."""
        return {
            f"{d.name}/{v.variant_id}": v.not_routed
            for d in self.datasets.values()
            for v in d.variants.values()
            if v.not_routed is not None
        }

    # -- construction ----------------------------------------------------------------------------

    @classmethod
    def from_objects(
        cls,
        stores: Mapping[str, GraphSource] | Iterable[GraphSource],
        variants: Iterable[ServingVariant],
        *,
        sampler_factory: Callable[[Any, tuple[int, ...]], Sampler] | None = None,
        notes: Iterable[str] = (),
        device: str | torch.device = "cpu",
    ) -> VariantRegistry:
        """A registry of in-memory stores and variants (tests, benchmarks).

        Args:
            stores (Mapping[str, GraphSource] | Iterable[GraphSource]): graph stores, by name.
            variants (Iterable[ServingVariant]): variants; ``variant.dataset`` names their store.
            sampler_factory (Callable, optional): ``(store, fanouts) -> sampler``; by default
                the serving sampler (:meth:`gnnaas.runtime.RuntimeGraph.sampler`).
                (default: ``None``)
            notes (Iterable[str], optional): extra readiness notes. (default: ``()``)
            device (str | torch.device, optional): where forward passes run. (default: ``"cpu"``)

        Raises:
            ValueError: a variant names a dataset without a store, or a variant id repeats.
        """
        by_name = dict(stores) if isinstance(stores, Mapping) else {s.name: s for s in stores}
        grouped: dict[str, dict[str, ServingVariant]] = {name: {} for name in by_name}
        for v in variants:
            if v.dataset not in grouped:
                raise ValueError(
                    f"variant {v.variant_id} names dataset {v.dataset!r}, which has no store "
                    f"(stores: {sorted(grouped)})"
                )
            if v.variant_id in grouped[v.dataset]:
                raise ValueError(f"variant {v.dataset}/{v.variant_id} is given twice")
            grouped[v.dataset][v.variant_id] = v
        served = []
        for name, vs in grouped.items():
            if not vs:
                continue
            store = by_name[name]
            factory = (
                None
                if sampler_factory is None
                else (lambda fanouts, s=store: sampler_factory(s, fanouts))
            )
            graph = RuntimeGraph(store, sampler_factory=factory)
            served.append(ServedDataset(graph, dict(sorted(vs.items()))))
        return cls(served, notes, device=device)

    @classmethod
    def load(cls, settings: Settings, *, strict: bool = False) -> VariantRegistry:
        """Loads every dataset with variants and profiles (or only ``settings.datasets``).

        Graph stores come from :func:`gnnaas.data.load_dataset`, variants from the runtime
        (:func:`gnnaas.runtime.open_variant`: weights with their checksums verified). Corrupt
        variants are skipped with a note.

        Args:
            settings (Settings): the folders, device and sampler.
            strict (bool, optional): what a reload uses: whatever is there but cannot be read (a
                variant's manifest or weights, a profile table, a dataset's graph) raises instead
                of becoming a note, so that a reload keeps the previous set rather than silently
                serving less. What is missing (no variants yet, no profiles yet) is still a note.
                (default: ``False``)

        Raises:
            ConfigError: the variants folder is missing, a dataset named in ``settings.datasets``
                has no variants or profiles, or nothing at all can be served.
            ArtifactError: ``strict`` and a variant, profile table or graph cannot be read.
        """
        return _Loader(settings, strict).load()


class _Loader:
    """One :meth:`VariantRegistry.load`: the folders read dataset by dataset, notes kept."""

    def __init__(self, settings: Settings, strict: bool) -> None:
        from gnnaas.inference.settings import execution_settings
        from gnnaas.utils import resolve_device
        from gnnaas.variants.repository import VariantRepository

        self.settings, self.strict = settings, strict
        self.device = resolve_device(settings.device)
        self.variants_dir = Path(settings.variants_dir)
        self.profiles_dir = Path(settings.profiles_dir)
        if not self.variants_dir.is_dir():
            raise ConfigError(
                f"variants folder '{self.variants_dir}' ({self.variants_dir.resolve()}) does not "
                f"exist; {_PREPARE}"
            )
        self.repo = VariantRepository(self.variants_dir)
        self.explicit = settings.datasets is not None
        self.notes: list[str] = []
        # The settings this server will time batches under (its threads once the router starts).
        self.current = {
            **execution_settings(self.device, inline_max_nodes=settings.inline_max_nodes),
            "threads": settings.torch_threads,
        }

    def load(self) -> VariantRegistry:
        names = self.settings.datasets or sorted(
            p.name for p in self.variants_dir.iterdir() if p.is_dir() and not p.name.startswith(".")
        )
        served = [ds for ds in map(self.dataset, names) if ds is not None]
        if not served:
            detail = "; ".join(self.notes) or f"no dataset folders in '{self.variants_dir}'"
            raise ConfigError(f"nothing to serve ({detail}); {_PREPARE}")
        if self.settings.feature_cache_mb > 0 and self.device.type == "cuda":
            plan_caches(served, self.settings)
        return VariantRegistry(served, self.notes, device=self.device)

    def _skip(self, name: str, problem: str, *, prepared: bool = False) -> None:
        """A dataset that cannot be served: an error when asked for by name, or when it was
        ``prepared`` (it has variants and profiles, and only its graph failed: serving every
        such dataset is what a server started without names is asked), else a note."""
        if self.explicit:
            raise ConfigError(f"cannot serve dataset {name!r}: {problem}")
        if prepared:
            raise ConfigError(
                f"cannot serve dataset {name!r}, which has variants and profiles: {problem}; "
                "fix that, or name the datasets to serve with --dataset (GNNAAS_DATASETS)"
            )
        self.notes.append(f"dataset {name} skipped: {problem}")

    def dataset(self, name: str) -> ServedDataset | None:
        """One dataset with its variants, or ``None`` (and a note) when it cannot be served."""
        manifests, unreadable = self.repo.scan(name)
        if unreadable and self.strict:
            raise ArtifactError(f"variant {name}/{unreadable[0][0]}: {unreadable[0][1]}")
        for variant_id, reason in unreadable:
            self.notes.append(f"variant {name}/{variant_id} skipped: {reason}")
            _log.warning("skipping variant %s/%s: %s", name, variant_id, reason)
        if not manifests:
            where = self.variants_dir / name
            self._skip(name, f"no variants in {where}; run `gnnaas prepare --dataset {name}`")
            return None
        if not (self.profiles_dir / name / "profiles.csv").is_file():
            where = self.profiles_dir / name
            self._skip(name, f"no profiles.csv in {where}; run `gnnaas profile --dataset {name}`")
            return None
        _log.info("dataset %s: loading its graph and %d variants", name, len(manifests))
        held = self._held(name)
        graph = self._graph(name, manifests[0].seed)
        if graph is None:
            return None
        served = None
        try:
            served = self._served(graph, manifests)
        finally:  # a live state this load opened for a dataset it does not serve is let go
            if served is None and graph.live is not None and not held:
                graph.live.close()
        return served

    def _held(self, name: str) -> bool:
        """Whether this process already holds the dataset's live state (a reload's)."""
        if self.settings.state_dir is None:
            return False
        from gnnaas.serving.core.live import LiveState

        return LiveState.is_open(name, self.settings.state_dir)

    def _served(self, graph: RuntimeGraph, manifests: Sequence[Any]) -> ServedDataset | None:
        """The dataset on ``graph`` with the variants that could be opened, or ``None`` (and a
        note) when none is routable."""
        name = graph.name
        first_note = len(self.notes)
        variants = self._variants(graph, manifests)
        if not any(v.routable for v in variants):
            why = self.notes[first_note:] + _collapsed(
                [(v.variant_id, str(v.not_routed)) for v in variants]
            )
            self._skip(
                name,
                f"no variant could be loaded with a profile ({'; '.join(why)}); "
                f"run `gnnaas prepare --dataset {name}`",
            )
            return None
        if self.settings.shared_store_dir is not None:
            from gnnaas.data.shared import share_store

            kept = (v.kept_features for v in variants)
            share_store(graph.store, kept, self.settings.shared_store_dir)
        _log.info("dataset %s: %d variants loaded", name, len(variants))
        return ServedDataset(graph, {v.variant_id: v for v in variants})

    def _graph(self, name: str, seed: int) -> RuntimeGraph | None:
        """The dataset's graph (its live graph with ``state_dir``), or ``None`` with a note."""
        from gnnaas.data import load_dataset

        settings = self.settings
        try:
            store = load_dataset(name, settings.data_root, seed=seed, cache_dir=settings.cache_dir)
        except (ConfigError, ArtifactError, OSError) as exc:
            if self.strict:
                why = f"dataset {name}: its graph could not be loaded ({exc})"
                raise ArtifactError(why) from exc
            if self.explicit:
                raise
            self._skip(name, f"its graph could not be loaded ({exc})", prepared=True)
            return None
        live = None
        if settings.state_dir is not None:
            from gnnaas.serving.core.live import LiveState

            # A graph this process has open is reused (a reload keeps its writes and lock).
            live = LiveState.open(store, settings.state_dir)
        return RuntimeGraph(store, seed=settings.seed, live=live, state_dir=settings.state_dir)

    def _variants(self, graph: RuntimeGraph, manifests: Sequence[Any]) -> list[ServingVariant]:
        """The dataset's variants that could be opened, each with its profile or why it is not
        routed (the others become notes, or raise on a strict load)."""
        name = graph.name
        try:
            profiles, curves, profile_notes = read_profile_tables(
                self.profiles_dir / name, self.settings.profile_split, strict=self.strict
            )
        except ArtifactError as exc:
            raise ArtifactError(f"dataset {name}: {exc}") from exc
        self.notes.extend(f"dataset {name}: {n}" for n in profile_notes)
        variants = []
        for m in manifests:
            try:
                opened = open_variant(self.repo, m, graph, device=self.device)
            except ArtifactError as exc:
                if self.strict:
                    raise ArtifactError(f"variant {name}/{m.variant_id}: {exc}") from exc
                self.notes.append(f"variant {name}/{m.variant_id} skipped: {exc}")
                _log.warning("skipping variant %s/%s: %s", name, m.variant_id, exc)
                continue
            profile, reason = self._profile(m, profiles, curves, name)
            fields = {f.name: getattr(opened, f.name) for f in dataclasses.fields(opened)}
            variant = ServingVariant(**fields, profile=profile, not_routed=reason)
            if variant.not_routed is not None:
                _log.warning("variant %s/%s not routed: %s", name, m.variant_id, variant.not_routed)
            variants.append(variant)
        return variants

    def _profile(
        self, manifest: Any, profiles: Any, curves: Any, name: str
    ) -> tuple[VariantProfile | None, str | None]:
        """The variant's profile as the router may use it, or ``None`` and why not."""
        settings = self.settings
        profile, reason = profile_of(
            manifest.variant_id,
            profiles,
            curves,
            settings.profile_split,
            sampling=SAMPLER,
            sampler_seed=settings.seed,
            settings=self.current,
            dataset=name,
        )
        if profile is None:
            return None, reason
        if profile.settings_mismatch and not settings.retime_curves:
            return None, (
                "its service curve was measured under other settings ("
                + ", ".join(profile.settings_mismatch)
                + f"); run `gnnaas profile --dataset {name}` with the server's settings, or let "
                "the server re-time it (GNNAAS_RETIME_CURVES=1, the default)"
            )
        profiled = str(profile.summary.get("date", ""))
        if _iso_utc(profiled) and _iso_utc(manifest.created) and profiled < manifest.created:
            # The profile is another model's (a regenerated or replaced variant): its accuracy
            # would break the tolerance promise, so the policy does not use it.
            return None, (
                "its profile predates the variant (it was regenerated since it was profiled); "
                f"run `gnnaas profile --dataset {name}`"
            )
        return profile, None


def plan_caches(served: Sequence[ServedDataset], settings: Settings) -> None:
    """Sets ``cache_nodes`` of every trained variant of the graphs that take no writes: one
    budget of ``settings.feature_cache_mb`` over them all
    (:func:`gnnaas.runtime.plan_feature_caches`). :meth:`VariantRegistry.load` calls it on CUDA,
    where a device feature cache saves copies."""
    demands = []
    for ds in served:
        if ds.live is not None:
            _log.info("dataset %s: live graph, no feature cache (its rows change)", ds.name)
            continue
        folder = Path(settings.profiles_dir) / ds.name
        for v in ds.variants.values():
            if v.answers is None:  # a lookup reads no features
                row_bytes = v.features_kept * ds.graph.features(v.kept_features).element_size()
                key = (ds.name, v.variant_id)
                demands.append(CacheDemand(key, ds.graph, folder, v.fanouts, row_bytes))
    budget = int(settings.feature_cache_mb * 2**20)
    for key, nodes in plan_feature_caches(demands, budget).items():
        name, variant_id = key  # type: ignore[misc]
        variant = next(d for d in served if d.name == name).variants[variant_id]
        variant.cache_nodes = nodes
        _log.info("variant %s/%s: %d nodes' features cached", name, variant_id, nodes.numel())


def _collapsed(reasons: Sequence[tuple[str, str]]) -> list[str]:
    """``variant: reason`` phrases, one per distinct reason: variants that share one are
    counted and the first few named, so twenty variants with one problem make one sentence."""
    by_reason: dict[str, list[str]] = {}
    for variant_id, reason in reasons:
        by_reason.setdefault(reason, []).append(variant_id)
    out = []
    for reason, ids in by_reason.items():
        if len(ids) == 1:
            out.append(f"{ids[0]}: {reason}")
        else:
            named = ", ".join(ids[:3]) + (", ..." if len(ids) > 3 else "")
            out.append(f"{len(ids)} variants ({named}): {reason}")
    return out


def _iso_utc(text: str) -> bool:
    """Whether ``text`` is a ``YYYY-MM-DDTHH:MM:SSZ`` stamp (these compare as strings)."""
    return len(text) == 20 and text[10] == "T" and text.endswith("Z")
