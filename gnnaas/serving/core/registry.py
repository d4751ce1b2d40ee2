"""The variant registry: every servable dataset with its graph store, variants and profiles.

Built once at start-up (:meth:`VariantRegistry.load`) from the variant repository and the profiles
folder, or from in-memory objects (:meth:`VariantRegistry.from_objects`, for tests and benchmarks).
Free of FastAPI types. Whatever cannot be served is kept as a *note* with its reason instead of
stopping the server: a corrupt variant is skipped, a variant without a profile is loaded but not
routed to (it can still be pinned with ``X-Variant``); ``/readyz`` shows the notes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor

from gnnaas.errors import ArtifactError, ConfigError
from gnnaas.serving.core.attach import plan_feature_caches, precomputed_answers
from gnnaas.serving.core.policy import Candidate, dominated
from gnnaas.serving.core.profiles import VariantProfile, profile_of, read_profile_tables

if TYPE_CHECKING:
    from gnnaas.inference.executor import Sampler
    from gnnaas.inference.lookup import PrecomputedAnswers
    from gnnaas.serving.core.live import LiveState
from gnnaas.serving.core.settings import Settings

__all__ = [
    "ServedDataset",
    "ServingVariant",
    "Store",
    "VariantRegistry",
    "consistent_sampler_factory",
]

_log = logging.getLogger(__name__)


class Store(Protocol):
    """What serving needs from a graph store (``gnnaas.data.GraphStore`` fits)."""

    name: str
    rowptr: Tensor
    col: Tensor
    num_classes: int
    multi_label: bool

    @property
    def num_nodes(self) -> int:
        """Number of nodes."""
        ...

    @property
    def num_features(self) -> int:
        """Number of feature columns."""
        ...

    def feature_subset(self, keep: Tensor | Sequence[int]) -> Tensor:
        """The contiguous ``x[:, keep]`` (cached by the store)."""
        ...


# ``(store, fanouts)``, plus ``live=`` (a :class:`~gnnaas.data.live.LiveGraph`) for a live graph.
SamplerFactory = Callable[..., "Sampler"]


@dataclass(eq=False)
class ServingVariant:
    """One loaded variant.

    Args:
        dataset (str): dataset name.
        variant_id (str): e.g. ``sage-lasso-4x``.
        arch (str): ``sage`` or ``gin``.
        ranking (str): ``full``, ``random``, ``greedy`` or ``lasso``.
        prune (int): prune factor.
        kept_features (Tensor): ``[F_kept]`` int64 feature columns the model reads.
        fanouts (tuple[int, ...]): neighbor fanouts, PyG order.
        model (torch.nn.Module): the model in ``eval()`` mode.
        profile (VariantProfile, optional): ``None`` when not profiled (not routed to).
        not_routed (str, optional): why the variant is not routed to. (default: ``None``)
        answers (PrecomputedAnswers, optional): a precomputed variant's tables and staleness
            (``<base>@exact``); ``None`` for a trained variant. (default: ``None``)
        hidden_channels (int, optional): the model's hidden width. (default: ``None``)
        precision (str, optional): ``fp32`` or ``int8``. (default: ``"fp32"``)
        base (str, optional): the variant it derives from. (default: ``None``)
        cache_nodes (Tensor, optional): ``[K]`` node ids whose pruned feature rows the executor
            keeps on the device (:class:`~gnnaas.inference.FeatureCache`; planned by
            :meth:`VariantRegistry.load` from ``GNNAAS_FEATURE_CACHE_MB`` on CUDA). (default:
            ``None``: no cache)
    """

    dataset: str
    variant_id: str
    arch: str
    ranking: str
    prune: int
    kept_features: Tensor
    fanouts: tuple[int, ...]
    model: torch.nn.Module
    profile: VariantProfile | None = None
    not_routed: str | None = None
    answers: PrecomputedAnswers | None = None
    hidden_channels: int | None = None
    precision: str = "fp32"
    base: str | None = None
    cache_nodes: Tensor | None = None

    def __post_init__(self) -> None:
        if self.profile is None and self.not_routed is None:
            self.not_routed = "no profile"

    @property
    def features_kept(self) -> int:
        """Number of kept feature columns."""
        return int(self.kept_features.numel())

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
    """A dataset the router serves: its store, its variants and their samplers."""

    name: str
    store: Store
    variants: dict[str, ServingVariant]
    sampler_factory: SamplerFactory
    candidates: tuple[Candidate, ...] = ()
    live: LiveState | None = None
    dominated_by: dict[str, str] = field(default_factory=dict)
    routable_candidates: tuple[Candidate, ...] = ()
    precomputed: frozenset[str] = field(default=frozenset(), init=False)  # answered by lookup
    covered: frozenset[str] = field(default=frozenset(), init=False)  # ...every node, for good
    _samplers: dict[tuple[int, ...], Sampler] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.refresh()

    def refresh(self) -> None:
        """Recomputes :attr:`candidates` from the variants' profiles: the routable variants
        that no other dominates (:func:`~gnnaas.serving.core.policy.dominated`; the others are in
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
        n = int(self.store.num_nodes)
        self.covered = (
            frozenset(v for v in lookups if self.variants[v].answers.covers(n))  # type: ignore[union-attr]
            if self.live is None
            else frozenset()
        )
        self.routable_candidates = tuple(routable)
        self.dominated_by = dominated(routable, lookups=lookups)
        self.candidates = tuple(c for c in routable if c.variant_id not in self.dominated_by)

    @property
    def num_nodes(self) -> int:
        """Number of nodes of the graph (now, for a live graph)."""
        if self.live is not None:
            return self.live.graph.num_nodes
        return int(self.store.num_nodes)

    @property
    def graph_version(self) -> int:
        """Version of the live graph (0 for a graph that takes no writes)."""
        return 0 if self.live is None else self.live.graph.version

    def features(self, kept: Tensor) -> Tensor:
        """A variant's feature rows: the store's pruned copy, or the live graph's buffer."""
        if self.live is not None:
            return self.live.graph.features(kept)
        return self.store.feature_subset(kept)

    def sampler(self, fanouts: tuple[int, ...]) -> Sampler:
        """The consistent serving sampler for ``fanouts``, built once and shared by variants."""
        if fanouts not in self._samplers:
            if self.live is None:
                self._samplers[fanouts] = self.sampler_factory(self.store, fanouts)
            else:
                self._samplers[fanouts] = self.sampler_factory(
                    self.store, fanouts, live=self.live.graph
                )
        return self._samplers[fanouts]

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


def consistent_sampler_factory(seed: int = 0, mode: str = "depth") -> SamplerFactory:
    """Builds the serving sampler of a store for given fanouts.

    The sampler is :func:`gnnaas.sampling.serving_sampler`, the one the profiler measures with
    (``gnnaas profile`` uses the same defaults, seed ``0`` and ``depth``).

    Args:
        seed (int, optional): key of the hashed draws. (default: ``0``)
        mode (str, optional): ``depth``: :class:`~gnnaas.sampling.DepthSampler`, a node's
            answer never depends on its batch-mates; ``shared``:
            ``NeighborSampler(consistent=True)``, a little faster, answers can drift slightly
            when batch-mates are neighbors. (default: ``depth``)
    """
    if mode not in ("depth", "shared"):
        raise ValueError(f"sampler mode must be 'depth' or 'shared' (got {mode!r})")

    def build(store: Store, fanouts: tuple[int, ...], live: Any = None) -> Sampler:
        from gnnaas.sampling import DepthSampler, serving_sampler

        if live is not None:  # the live graph's base and overlay (depth mode only)
            return DepthSampler(live.rowptr, live.col, fanouts, seed=seed, live=live)
        return serving_sampler(store.rowptr, store.col, fanouts, seed=seed, mode=mode)

    return build


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
        stores: Mapping[str, Store] | Iterable[Store],
        variants: Iterable[ServingVariant],
        *,
        sampler_factory: SamplerFactory | None = None,
        notes: Iterable[str] = (),
        device: str | torch.device = "cpu",
    ) -> VariantRegistry:
        """A registry of in-memory stores and variants (tests, benchmarks).

        Args:
            stores (Mapping[str, Store] | Iterable[Store]): graph stores, by dataset name.
            variants (Iterable[ServingVariant]): variants; ``variant.dataset`` names their store.
            sampler_factory (SamplerFactory, optional): ``(store, fanouts) -> sampler``; by default
                the serving :class:`~gnnaas.sampling.DepthSampler`. (default: ``None``)
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
        factory = sampler_factory or consistent_sampler_factory()
        served = [
            ServedDataset(name, by_name[name], dict(sorted(vs.items())), factory)
            for name, vs in grouped.items()
            if vs
        ]
        return cls(served, notes, device=device)

    @classmethod
    def load(cls, settings: Settings, *, strict: bool = False) -> VariantRegistry:
        """Loads every dataset with variants and profiles (or only ``settings.datasets``).

        Graph stores come from :func:`gnnaas.data.load_dataset`, weights from the variant
        repository with their checksums verified. Corrupt variants are skipped with a note.

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
        from gnnaas.data import load_dataset
        from gnnaas.inference.settings import execution_settings
        from gnnaas.utils import resolve_device
        from gnnaas.variants.repository import VariantRepository

        device = resolve_device(settings.device)
        variants_dir, profiles_dir = Path(settings.variants_dir), Path(settings.profiles_dir)
        prepare = (
            "pass --variants/--profiles (or GNNAAS_VARIANTS_DIR/GNNAAS_PROFILES_DIR) where "
            "`gnnaas generate` and `gnnaas profile` wrote them (relative paths are taken from the "
            "current directory), or create them with `gnnaas prepare --dataset <name>`"
        )
        if not variants_dir.is_dir():
            raise ConfigError(
                f"variants folder '{variants_dir}' ({variants_dir.resolve()}) does not exist; "
                f"{prepare}"
            )
        repo = VariantRepository(variants_dir)
        explicit = settings.datasets is not None
        names = settings.datasets or sorted(
            p.name for p in variants_dir.iterdir() if p.is_dir() and not p.name.startswith(".")
        )
        notes: list[str] = []
        served: list[ServedDataset] = []
        factory = consistent_sampler_factory(settings.seed, settings.sampling)
        # The settings this server will time batches under (its threads once the router starts).
        current = {
            **execution_settings(device, inline_max_nodes=settings.inline_max_nodes),
            "threads": settings.torch_threads,
        }
        for name in names:
            manifests = repo.list(name)
            unreadable = _unlisted_variants(repo, variants_dir / name, manifests)
            if unreadable and strict:
                raise ArtifactError(f"variant {name}/{unreadable[0][0]}: {unreadable[0][1]}")
            notes.extend(f"variant {name}/{v} skipped: {exc}" for v, exc in unreadable)
            problem = None
            if not manifests:
                problem = (
                    f"no variants in {variants_dir / name}; run `gnnaas prepare --dataset {name}`"
                )
            elif not (profiles_dir / name / "profiles.csv").is_file():
                problem = (
                    f"no profiles.csv in {profiles_dir / name}; "
                    f"run `gnnaas profile --dataset {name}`"
                )
            if problem is not None:
                if explicit:
                    raise ConfigError(f"cannot serve dataset {name!r}: {problem}")
                notes.append(f"dataset {name} skipped: {problem}")
                continue
            _log.info("dataset %s: loading its graph and %d variants", name, len(manifests))
            try:
                store = load_dataset(
                    name, settings.data_root, seed=manifests[0].seed, cache_dir=settings.cache_dir
                )
            except (ConfigError, ArtifactError, OSError) as exc:
                if strict:
                    raise ArtifactError(
                        f"dataset {name}: its graph could not be loaded ({exc})"
                    ) from exc
                if explicit:
                    raise
                notes.append(f"dataset {name} skipped: its graph could not be loaded ({exc})")
                _log.warning("skipping dataset %s: %s", name, exc)
                continue
            first_note = len(notes)
            try:
                profiles, curves, profile_notes = read_profile_tables(
                    profiles_dir / name, settings.profile_split, strict=strict
                )
            except ArtifactError as exc:
                raise ArtifactError(f"dataset {name}: {exc}") from exc
            notes.extend(f"dataset {name}: {n}" for n in profile_notes)
            variants: list[ServingVariant] = []
            for m in manifests:
                try:
                    if m.num_features != store.num_features:
                        raise ArtifactError(
                            f"it was trained on {m.num_features} features, the dataset has "
                            f"{store.num_features}; regenerate with `gnnaas generate --dataset "
                            f"{name} --force`"
                        )
                    loaded = repo.load(name, m.variant_id, device=device)
                except ArtifactError as exc:
                    if strict:
                        raise ArtifactError(f"variant {name}/{m.variant_id}: {exc}") from exc
                    notes.append(f"variant {name}/{m.variant_id} skipped: {exc}")
                    _log.warning("skipping variant %s/%s: %s", name, m.variant_id, exc)
                    continue
                profile, reason = profile_of(
                    m.variant_id,
                    profiles,
                    curves,
                    settings.profile_split,
                    sampling=settings.sampling,
                    sampler_seed=settings.seed,
                    settings=current,
                    dataset=name,
                )
                if profile is not None and profile.settings_mismatch and not settings.retime_curves:
                    profile, reason = (
                        None,
                        (
                            "its service curve was measured under other settings ("
                            + ", ".join(profile.settings_mismatch)
                            + f"); run `gnnaas profile --dataset {name}` with the server's "
                            "settings, or let the server re-time it "
                            "(GNNAAS_RETIME_CURVES=1, the default)"
                        ),
                    )
                profiled = str(profile.summary.get("date", "")) if profile is not None else ""
                if _iso_utc(profiled) and _iso_utc(m.created) and profiled < m.created:
                    # The profile is another model's (a regenerated or replaced variant): its
                    # accuracy would break the tolerance promise, so the policy does not use it.
                    profile, reason = (
                        None,
                        (
                            "its profile predates the variant (it was regenerated since it was "
                            f"profiled); run `gnnaas profile --dataset {name}`"
                        ),
                    )
                answers = None
                if m.precomputed is not None and reason is None:
                    answers, reason = precomputed_answers(repo, m, store, settings)
                variants.append(
                    ServingVariant(
                        dataset=name,
                        variant_id=m.variant_id,
                        arch=m.arch,
                        ranking=m.ranking,
                        prune=m.prune,
                        kept_features=torch.as_tensor(m.kept_features, dtype=torch.long),
                        fanouts=tuple(m.fanouts),
                        model=loaded.model,
                        profile=profile,
                        not_routed=reason,
                        answers=answers,
                        hidden_channels=m.hidden_channels,
                        precision=m.precision,
                        base=None if m.base is None else m.base["variant"],
                    )
                )
                if reason is not None:
                    _log.warning("variant %s/%s not routed: %s", name, m.variant_id, reason)
            if not any(v.routable for v in variants):
                why = notes[first_note:] + _collapsed(
                    [(v.variant_id, str(v.not_routed)) for v in variants]
                )
                problem = (
                    f"no variant could be loaded with a profile ({'; '.join(why)}); "
                    f"run `gnnaas prepare --dataset {name}`"
                )
                if explicit:
                    raise ConfigError(f"cannot serve dataset {name!r}: {problem}")
                notes.append(f"dataset {name} skipped: {problem}")
                continue
            if settings.shared_store_dir is not None:
                from gnnaas.data.shared import share_store

                share_store(store, (v.kept_features for v in variants), settings.shared_store_dir)
            state = None
            if settings.state_dir is not None:
                from gnnaas.serving.core.live import LiveState

                # A graph this process has open is reused (a reload keeps its writes and lock).
                state = LiveState.open(store, settings.state_dir)
            served.append(
                ServedDataset(name, store, {v.variant_id: v for v in variants}, factory, live=state)
            )
            _log.info("dataset %s: %d variants loaded", name, len(variants))
        if not served:
            detail = "; ".join(notes) or f"no dataset folders in '{variants_dir}'"
            raise ConfigError(f"nothing to serve ({detail}); {prepare}")
        if settings.feature_cache_mb > 0 and device.type == "cuda":
            plan_feature_caches(served, settings)
        return cls(served, notes, device=device)


def _unlisted_variants(
    repo: Any, folder: Path, listed: Sequence[Any]
) -> list[tuple[str, ArtifactError]]:
    """Why each variant folder the repository's listing skipped cannot be read.

    ``VariantRepository.list`` skips a folder whose manifest is unreadable with a warning only;
    reading that manifest again gives the reason for a note (or a failed reload).
    """
    if not folder.is_dir():
        return []
    known = {m.variant_id for m in listed}
    errors: list[tuple[str, ArtifactError]] = []
    for child in sorted(folder.iterdir()):
        if child.name.startswith(".") or not child.is_dir() or child.name in known:
            continue
        try:
            repo.manifest(folder.name, child.name)
        except (ArtifactError, ConfigError) as exc:
            errors.append((child.name, ArtifactError(str(exc))))
    return errors


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
