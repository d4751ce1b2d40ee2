"""Variant generation: train the 1× model, rank features, train the pruned variants.

For each architecture, :func:`generate_variants` trains (or reuses) the full-feature 1× model,
ranks the input features with every requested ranking, then trains one variant per prune factor
``k`` on the top ``num_features // k`` features, all with the same ``TrainConfig``, and saves each
one in a :class:`VariantRepository`. Variants whose stored manifest already matches the request are
skipped unless ``force`` is set, so a second run does no training. What is trained and what is
skipped is decided for every architecture before any training starts (:class:`_ArchPlan`), so the
plan knows how many models it trains; with ``progress`` on, each model's epochs are shown as they
finish and a plan that may take long says so after its first epoch
(:class:`gnnaas.variants.progress.PlanProgress`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import torch

from gnnaas.errors import ConfigError
from gnnaas.typing import Device
from gnnaas.variants.manifest import (
    FULL_RANKING,
    MANIFEST_FORMAT,
    Manifest,
    VariantSpec,
    library_versions,
)
from gnnaas.variants.master import warm_start_state
from gnnaas.variants.ranking import Ranking, rank_features
from gnnaas.variants.repository import VariantRepository

if TYPE_CHECKING:
    from gnnaas.data import GraphStore
    from gnnaas.models import GNN, Arch
    from gnnaas.variants.progress import PlanProgress
    from gnnaas.variants.training import EpochReport, TrainConfig, TrainResult

__all__ = ["GenerateRow", "generate_variants"]

_log = logging.getLogger(__name__)

_T = TypeVar("_T", bound=Hashable)

# rankings computed from the trained 1× model: their variants are stale when it is retrained
_MODEL_RANKINGS = frozenset({Ranking.GREEDY.value, Ranking.LASSO.value})


@dataclass(frozen=True)
class GenerateRow:
    """One line of the ``gnnaas generate`` summary.

    Args:
        variant_id (str): e.g. ``sage-lasso-4x``.
        features_kept (int): input features the variant keeps.
        val_acc (float): validation accuracy in [0, 1] (from training, or from the stored manifest).
        train_time_s (float): training time in seconds (stored value when skipped).
        status (str): ``"trained"``, ``"skipped"`` (an existing variant matched the request),
            ``"user"`` (the user's master model, kept as it is), ``"distilled"`` (a narrower
            model taught by ``base``) or ``"derived"`` (``base``'s weights with other fanouts
            or precision).
        base (str, optional): the variant a derived one comes from. (default: ``""``)
    """

    variant_id: str
    features_kept: int
    val_acc: float
    train_time_s: float
    status: Literal["trained", "skipped", "user", "distilled", "derived"]
    base: str = ""


def generate_variants(
    store: GraphStore,
    repo: VariantRepository,
    *,
    archs: Iterable[str | Arch] = ("sage", "gin"),
    rankings: Iterable[str | Ranking] = ("random", "greedy", "lasso"),
    prunes: Iterable[int] = (1, 2, 4, 8),
    config: TrainConfig | None = None,
    device: Device = "cpu",
    force: bool = False,
    progress: bool = False,
    warm_start: bool = False,
    axes: Iterable[str] = ("features",),
    near: float | None = None,
    width_divisors: Sequence[int] | None = None,
    fanout_sets: Sequence[Sequence[int]] | None = None,
    sampler_seed: int = 0,
) -> list[GenerateRow]:
    """Generates the variants of ``store`` for every arch × ranking × prune factor, then the
    variants of the other ``axes`` (:func:`gnnaas.variants.axes.derive_variants`).

    All names and factors are checked before any training. The 1× model (``<arch>-full-1x``) is
    always trained or reused, since every ranking but ``random`` derives from it; when it is
    (re)trained, the greedy and lasso variants are retrained too.

    A 1× model the user brought (origin ``user``, see :mod:`gnnaas.variants.master`) is the
    master: it is never retrained (not even with ``force``), and its arch's pruned variants take
    its layout, hidden width, layers and fanouts instead of ``config``'s.

    Args:
        store (GraphStore): the dataset.
        repo (VariantRepository): where variants are read and written.
        archs (Iterable[str | Arch], optional): architectures. (default: ``("sage", "gin")``)
        rankings (Iterable[str | Ranking], optional): rankings.
            (default: ``("random", "greedy", "lasso")``)
        prunes (Iterable[int], optional): prune factors ``k >= 1``; ``k = 1`` is the shared 1×
            model. (default: ``(1, 2, 4, 8)``)
        config (TrainConfig, optional): hyper-parameters of every variant.
            (default: ``TrainConfig()``)
        device (str or torch.device, optional): where to train. (default: ``cpu``)
        force (bool, optional): retrain variants that already exist. (default: ``False``)
        progress (bool, optional): show a progress bar over variants, each model's epochs as
            they finish, and after the plan's first epoch an estimate of its training time when
            it may take long (:mod:`gnnaas.variants.progress`). (default: ``False``)
        warm_start (bool, optional): initialize each pruned variant from the 1× model's weights
            restricted to its kept features (:func:`gnnaas.variants.master.warm_start_state`)
            instead of at random. (default: ``False``)
        axes (Iterable[str], optional): among :data:`gnnaas.variants.axes.AXES`; ``features``
            (the trained variants) always. (default: ``("features",)``)
        near (float, optional): see :func:`~gnnaas.variants.axes.derive_variants`.
        width_divisors (Sequence[int], optional): likewise.
        fanout_sets (Sequence[Sequence[int]], optional): likewise.
        sampler_seed (int, optional): the serving sampler's seed. (default: ``0``)

    Returns:
        list[GenerateRow]: one row per variant, per arch: the 1× model, then each ranking's
        variants in the order of ``prunes``; then the derived variants.

    Raises:
        ConfigError: an unknown arch or ranking, a prune factor below 1 or above the number of
            features, or an empty list.
    """
    from gnnaas.variants.training import TrainConfig

    config = TrainConfig() if config is None else config
    axes = tuple(axes)
    arch_names, ranking_names, pruned = _checked_grid(store, archs, rankings, prunes)
    plans = [
        _plan_arch(store, repo, arch, ranking_names, pruned, config, force=force)
        for arch in arch_names
    ]
    rows, shown = _train_features(
        store, repo, plans, axes, width_divisors, config, device, progress, warm_start
    )
    rows += _derive(
        store, repo, config, arch_names, axes=axes, near=near, width_divisors=width_divisors,
        fanout_sets=fanout_sets, sampler_seed=sampler_seed, device=device, force=force,
        progress=progress, shown=shown,
    )  # fmt: skip
    return rows


def _checked_grid(
    store: GraphStore,
    archs: Iterable[str | Arch],
    rankings: Iterable[str | Ranking],
    prunes: Iterable[int],
) -> tuple[list[str], list[str], list[int]]:
    """The architectures, rankings and pruned factors (``k > 1``) of a plan, each checked and
    once, before any training (:func:`generate_variants`)."""
    arch_names = _unique(VariantSpec(store.name, a, FULL_RANKING, 1).arch for a in archs)
    ranking_names = _unique(Ranking.parse(r).value for r in rankings)
    factors = _check_prunes(prunes, store.num_features)
    if not arch_names:
        raise ConfigError("no architecture given; pass at least one, e.g. --arch sage")
    pruned = [k for k in factors if k > 1]
    if pruned and not ranking_names:
        raise ConfigError("no ranking given; pass at least one, e.g. --ranking lasso")
    return arch_names, ranking_names, pruned


def _train_features(
    store: GraphStore,
    repo: VariantRepository,
    plans: Sequence[_ArchPlan],
    axes: Sequence[str],
    width_divisors: Sequence[int] | None,
    config: TrainConfig,
    device: Device,
    progress: bool,
    warm_start: bool,
) -> tuple[list[GenerateRow], PlanProgress | None]:
    """The trained variants (the ``features`` axis) of each architecture's plan: its 1× model,
    then its pruned ones, on a bar over them; and the plan's progress, which the derived axes go
    on reporting to (``None`` without ``progress``)."""
    from tqdm import tqdm

    total = sum(1 + len(plan.pruned) for plan in plans)
    rows: list[GenerateRow] = []
    with tqdm(
        total=total, disable=not progress, desc=f"{store.name} variants", unit="variant"
    ) as bar:
        shown = _plan_progress(bar, plans, axes, width_divisors, config) if progress else None
        for plan in plans:
            bar.set_postfix_str(plan.full_spec.variant_id)
            full = _full_model(store, repo, plan, device=device, shown=shown)
            rows.append(full.row)
            bar.update(1)
            rows += _generate_pruned(
                store, repo, plan, full.model, device=device, bar=bar,
                warm_start=warm_start, shown=shown,
            )  # fmt: skip
    return rows, shown


@dataclass(frozen=True)
class _ArchPlan:
    """What a run does for one architecture's trained variants, decided before any training.

    Args:
        full_spec (VariantSpec): its 1× model.
        master (Manifest, optional): the user's 1× model (never retrained), else ``None``.
        config (TrainConfig): the configuration its variants train with: the request's, or the
            layout of the user's master model.
        train_full (bool): the 1× model is (re)trained.
        pruned (tuple[tuple[VariantSpec, bool], ...]): each pruned variant, ranking by ranking,
            and whether it is (re)trained (else an existing one matches).
    """

    full_spec: VariantSpec
    master: Manifest | None
    config: TrainConfig
    train_full: bool
    pruned: tuple[tuple[VariantSpec, bool], ...]

    @property
    def to_train(self) -> int:
        """Models this plan trains."""
        return int(self.train_full) + sum(trains for _, trains in self.pruned)


def _plan_arch(
    store: GraphStore,
    repo: VariantRepository,
    arch: str,
    ranking_names: Sequence[str],
    pruned: Sequence[int],
    config: TrainConfig,
    *,
    force: bool,
) -> _ArchPlan:
    """Which of ``arch``'s trained variants the run trains: those missing or not matching the
    request, all with ``force``, and the greedy and lasso ones when the 1× model is retrained
    (they are ranked from it); never the user's master model."""
    num_features = store.num_features
    full_spec = VariantSpec(store.name, arch, FULL_RANKING, 1)
    master = _user_master(repo, full_spec)
    if master is not None:  # its pruned variants take its layout
        config = replace(
            config,
            family=master.family,
            hidden_channels=master.hidden_channels,
            num_layers=master.num_layers,
            fanouts=tuple(master.fanouts),
        )
        train_full = False
    else:
        train_full = force or not repo.matches(full_spec, config, num_features=num_features)
    specs = []
    for ranking in ranking_names:
        stale = train_full and ranking in _MODEL_RANKINGS
        for k in pruned:
            spec = VariantSpec(store.name, arch, ranking, k)
            trains = force or stale or not repo.matches(spec, config, num_features=num_features)
            specs.append((spec, trains))
    return _ArchPlan(full_spec, master, config, train_full, tuple(specs))


def _plan_progress(
    bar: Any,
    plans: Sequence[_ArchPlan],
    axes: Sequence[str],
    width_divisors: Sequence[int] | None,
    config: TrainConfig,
) -> PlanProgress:
    """The plan's epoch reporter: the models it trains, the distilled widths included (those of
    an architecture whose trained variants change: the others' are found stored)."""
    from gnnaas.variants.axes import DEFAULT_WIDTH_DIVISORS, distilled_widths
    from gnnaas.variants.progress import PlanProgress

    models = sum(plan.to_train for plan in plans)
    if "width" in set(axes):
        divisors = DEFAULT_WIDTH_DIVISORS if width_divisors is None else width_divisors
        models += sum(
            len(distilled_widths(plan.config.hidden_channels, divisors))
            for plan in plans
            if plan.to_train
        )
    return PlanProgress(bar, models=models, config=config)


@dataclass(frozen=True)
class _FullModel:
    """An arch's 1× model as :func:`generate_variants` found or made it.

    Args:
        row (GenerateRow): its summary line.
        model (GNN, optional): the model when it was trained here, else ``None`` (loaded from the
            repository only if a pruned variant needs it).
    """

    row: GenerateRow
    model: GNN | None


def _full_model(
    store: GraphStore,
    repo: VariantRepository,
    plan: _ArchPlan,
    *,
    device: Device,
    shown: PlanProgress | None,
) -> _FullModel:
    """The user's master model, the stored 1× model matching the request, or a new one."""
    num_features = store.num_features
    if plan.master is not None:  # never retrained
        return _FullModel(_skipped_row(plan.master, status="user"), None)
    if not plan.train_full:
        row = _skipped_row(repo.manifest(store.name, plan.full_spec.variant_id))
        return _FullModel(row, None)
    keep_all = torch.arange(num_features, dtype=torch.int64)
    result = _train(store, plan.full_spec, plan.config, keep_all, device, shown=shown)
    _save(repo, store, plan.full_spec, plan.config, keep_all, result)
    return _FullModel(_trained_row(plan.full_spec, num_features, result), result.model)


def _derive(
    store: GraphStore,
    repo: VariantRepository,
    config: TrainConfig,
    archs: Sequence[str],
    *,
    axes: Sequence[str],
    near: float | None,
    width_divisors: Sequence[int] | None,
    fanout_sets: Sequence[Sequence[int]] | None,
    sampler_seed: int,
    device: Device,
    force: bool,
    progress: bool,
    shown: PlanProgress | None,
) -> list[GenerateRow]:
    """The derived variants' rows (:func:`gnnaas.variants.axes.derive_variants`), with a bar
    (and the distillations' epochs on it)."""
    from tqdm import tqdm

    from gnnaas.variants.axes import DEFAULT_NEAR, DEFAULT_WIDTH_DIVISORS, derive_variants

    if set(axes) <= {"features"}:
        return []
    with tqdm(desc=f"{store.name} derived", unit="variant", disable=not progress) as bar:
        if shown is not None:
            shown.use(bar)

        def started(variant_id: str) -> None:
            bar.set_postfix_str(variant_id)
            bar.update(1)
            if shown is not None:
                shown.start(variant_id)

        derived = derive_variants(
            store,
            repo,
            config,
            archs=archs,
            axes=axes,
            near=DEFAULT_NEAR if near is None else near,
            width_divisors=DEFAULT_WIDTH_DIVISORS if width_divisors is None else width_divisors,
            fanout_sets=fanout_sets,
            sampler_seed=sampler_seed,
            device=device,
            force=force,
            on_variant=started,
            on_epoch=None if shown is None else shown.epoch,
        )
    return [
        GenerateRow(
            variant_id=r.variant_id,
            features_kept=r.features_kept,
            val_acc=r.val_acc,
            train_time_s=r.seconds,
            status="skipped" if r.status == "skipped" else r.status,  # type: ignore[arg-type]
            base=r.base,
        )
        for r in derived
    ]


def _generate_pruned(
    store: GraphStore,
    repo: VariantRepository,
    plan: _ArchPlan,
    full_model: GNN | None,
    *,
    device: Device,
    bar: Any,
    warm_start: bool,
    shown: PlanProgress | None,
) -> list[GenerateRow]:
    """Trains (or skips) one arch's pruned variants as ``plan`` says; loads the 1× model only
    when needed."""
    num_features = store.num_features
    rows: list[GenerateRow] = []
    orders: dict[str, torch.Tensor] = {}  # each ranking's feature order, computed once
    for spec, trains in plan.pruned:
        bar.set_postfix_str(spec.variant_id)
        if not trains:
            rows.append(_skipped_row(repo.manifest(store.name, spec.variant_id)))
            bar.update(1)
            continue
        if full_model is None:  # ranks and warm starts come from it
            full_model = repo.load(store.name, plan.full_spec.variant_id).model
        if spec.ranking not in orders:
            orders[spec.ranking] = _rank(store, full_model, spec, plan.config.seed)
        keep = orders[spec.ranking][: num_features // spec.prune].sort().values  # ascending ids
        init = warm_start_state(full_model, keep) if warm_start else None
        result = _train(store, spec, plan.config, keep, device, init_state=init, shown=shown)
        _save(repo, store, spec, plan.config, keep, result)
        rows.append(_trained_row(spec, keep.numel(), result))
        bar.update(1)
    return rows


def _rank(store: GraphStore, full_model: GNN, spec: VariantSpec, seed: int) -> torch.Tensor:
    """The features of ``store``, most useful first by ``spec``'s ranking of ``full_model``."""
    start = time.perf_counter()
    order = rank_features(spec.ranking, full_model, store, seed=seed)
    _log.info(
        "ranking: %s arch: %s features: %d time_s: %.3f",
        spec.ranking,
        spec.arch,
        store.num_features,
        time.perf_counter() - start,
    )
    return order


def _train(
    store: GraphStore,
    spec: VariantSpec,
    config: TrainConfig,
    keep: torch.Tensor,
    device: Device,
    *,
    init_state: dict[str, torch.Tensor] | None = None,
    shown: PlanProgress | None = None,
) -> TrainResult:
    from gnnaas.variants.training import train_model

    full = keep.numel() == store.num_features
    on_epoch: Callable[[EpochReport], None] | None = None
    if shown is not None:
        shown.start(spec.variant_id)
        on_epoch = shown.epoch
    result = train_model(
        store,
        spec.arch,
        config,
        keep=None if full else keep,
        device=device,
        progress=False,
        init_state=init_state,
        on_epoch=on_epoch,
    )
    _log.info(
        "variant: %s features: %d val_acc: %.4f test_acc: %.4f epochs: %d train_time_s: %.2f",
        spec.variant_id,
        keep.numel(),
        result.val_acc,
        result.test_acc,
        result.epochs,
        result.train_time_s,
    )
    return result


def _save(
    repo: VariantRepository,
    store: GraphStore,
    spec: VariantSpec,
    config: TrainConfig,
    keep: torch.Tensor,
    result: TrainResult,
) -> Manifest:
    manifest = Manifest(
        format=MANIFEST_FORMAT,
        dataset=store.name,
        variant_id=spec.variant_id,
        arch=spec.arch,
        ranking=spec.ranking,
        prune=spec.prune,
        num_features=store.num_features,
        kept_features=[int(i) for i in keep.tolist()],
        in_channels=keep.numel(),
        hidden_channels=config.hidden_channels,
        out_channels=store.num_classes,
        num_layers=config.num_layers,
        dropout=float(config.dropout),
        fanouts=[int(s) for s in config.fanouts],
        multi_label=store.multi_label,
        metrics={
            "val_acc": float(result.val_acc),
            "test_acc": float(result.test_acc),
            "train_time_s": float(result.train_time_s),
            "epochs": int(result.epochs),
        },
        seed=config.seed,
        versions=library_versions(),
        family=config.family,
    )
    return repo.save(manifest, result.model)


def _trained_row(spec: VariantSpec, features_kept: int, result: TrainResult) -> GenerateRow:
    return GenerateRow(
        variant_id=spec.variant_id,
        features_kept=features_kept,
        val_acc=float(result.val_acc),
        train_time_s=float(result.train_time_s),
        status="trained",
    )


def _skipped_row(manifest: Manifest, status: Literal["skipped", "user"] = "skipped") -> GenerateRow:
    return GenerateRow(
        variant_id=manifest.variant_id,
        features_kept=manifest.in_channels,
        val_acc=float(manifest.metrics.get("val_acc", float("nan"))),
        train_time_s=float(manifest.metrics.get("train_time_s", 0.0)),
        status=status,
    )


def _user_master(repo: VariantRepository, full_spec: VariantSpec) -> Manifest | None:
    """The stored, intact 1× manifest of ``full_spec`` when the user brought it, else ``None``."""
    from gnnaas.errors import ArtifactError

    try:
        manifest = repo.verify(full_spec.dataset, full_spec.variant_id)
    except ArtifactError:
        return None
    return manifest if manifest.origin == "user" else None


def _unique(items: Iterable[_T]) -> list[_T]:
    return list(dict.fromkeys(items))


def _check_prunes(prunes: Iterable[int], num_features: int) -> list[int]:
    factors: list[int] = []
    for k in prunes:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(
                f"prune factors must be integers >= 1 (got {k!r}); e.g. --prune 1 2 4 8"
            )
        if k > num_features:
            raise ConfigError(
                f"prune factor {k} exceeds the dataset's {num_features} features (a variant keeps "
                f"num_features // k >= 1 of them); use --prune values <= {num_features}"
            )
        factors.append(k)
    factors = _unique(factors)
    if not factors:
        raise ConfigError("no prune factor given; pass at least one, e.g. --prune 1 2 4 8")
    return factors
