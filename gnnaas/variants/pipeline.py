"""Variant generation: train the 1× model, rank features, train the pruned variants.

For each architecture, :func:`generate_variants` trains (or reuses) the full-feature 1× model,
ranks the input features with every requested ranking, then trains one variant per prune factor
``k`` on the top ``num_features // k`` features, all with the same ``TrainConfig``, and saves each
one in a :class:`VariantRepository`. Variants whose stored manifest already matches the request are
skipped unless ``force`` is set, so a second run does no training.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable, Iterable, Sequence
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
    from gnnaas.variants.training import TrainConfig, TrainResult

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
        progress (bool, optional): show a progress bar over variants. (default: ``False``)
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
    from tqdm import tqdm

    from gnnaas.variants.training import TrainConfig

    config = TrainConfig() if config is None else config
    num_features = store.num_features
    arch_names = _unique(VariantSpec(store.name, a, FULL_RANKING, 1).arch for a in archs)
    ranking_names = _unique(Ranking.parse(r).value for r in rankings)
    factors = _check_prunes(prunes, num_features)
    if not arch_names:
        raise ConfigError("no architecture given; pass at least one, e.g. --arch sage")
    pruned = [k for k in factors if k > 1]
    if pruned and not ranking_names:
        raise ConfigError("no ranking given; pass at least one, e.g. --ranking lasso")

    total = len(arch_names) * (1 + len(ranking_names) * len(pruned))
    rows: list[GenerateRow] = []
    desc = f"{store.name} variants"
    with tqdm(total=total, disable=not progress, desc=desc, unit="variant") as bar:
        for arch in arch_names:
            full_spec = VariantSpec(store.name, arch, FULL_RANKING, 1)
            bar.set_postfix_str(full_spec.variant_id)
            full = _full_model(store, repo, full_spec, config, device=device, force=force)
            rows.append(full.row)
            bar.update(1)
            rows += _generate_pruned(
                store,
                repo,
                full_spec,
                full.model,
                ranking_names,
                pruned,
                full.config,
                device=device,
                force=force,
                full_fresh=full.fresh,
                bar=bar,
                warm_start=warm_start,
            )
    rows += _derive(
        store,
        repo,
        config,
        arch_names,
        axes=tuple(axes),
        near=near,
        width_divisors=width_divisors,
        fanout_sets=fanout_sets,
        sampler_seed=sampler_seed,
        device=device,
        force=force,
        progress=progress,
    )
    return rows


@dataclass(frozen=True)
class _FullModel:
    """An arch's 1× model as :func:`generate_variants` found or made it.

    Args:
        row (GenerateRow): its summary line.
        model (GNN, optional): the model when it was trained here, else ``None`` (loaded from the
            repository only if a pruned variant needs it).
        config (TrainConfig): the configuration its pruned variants train with: the request's,
            or the layout of the user's master model.
        fresh (bool): it was (re)trained by this run, so the variants ranked from it are stale.
    """

    row: GenerateRow
    model: GNN | None
    config: TrainConfig
    fresh: bool


def _full_model(
    store: GraphStore,
    repo: VariantRepository,
    full_spec: VariantSpec,
    config: TrainConfig,
    *,
    device: Device,
    force: bool,
) -> _FullModel:
    """The user's master model, the stored 1× model matching ``config``, or a new one."""
    num_features = store.num_features
    master = _user_master(repo, full_spec)
    if master is not None:  # never retrained; its pruned variants take its layout
        arch_config = replace(
            config,
            family=master.family,
            hidden_channels=master.hidden_channels,
            num_layers=master.num_layers,
            fanouts=tuple(master.fanouts),
        )
        return _FullModel(_skipped_row(master, status="user"), None, arch_config, fresh=False)
    if not force and repo.matches(full_spec, config, num_features=num_features):
        row = _skipped_row(repo.manifest(store.name, full_spec.variant_id))
        return _FullModel(row, None, config, fresh=False)
    keep_all = torch.arange(num_features, dtype=torch.int64)
    result = _train(store, full_spec, config, keep_all, device)
    _save(repo, store, full_spec, config, keep_all, result)
    return _FullModel(_trained_row(full_spec, num_features, result), result.model, config, True)


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
) -> list[GenerateRow]:
    """The derived variants' rows (:func:`gnnaas.variants.axes.derive_variants`), with a bar."""
    from tqdm import tqdm

    from gnnaas.variants.axes import DEFAULT_NEAR, DEFAULT_WIDTH_DIVISORS, derive_variants

    if set(axes) <= {"features"}:
        return []
    with tqdm(desc=f"{store.name} derived", unit="variant", disable=not progress) as bar:

        def started(variant_id: str) -> None:
            bar.set_postfix_str(variant_id)
            bar.update(1)

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
    full_spec: VariantSpec,
    full_model: GNN | None,
    ranking_names: Sequence[str],
    pruned: Sequence[int],
    config: TrainConfig,
    *,
    device: Device,
    force: bool,
    full_fresh: bool,
    bar: Any,
    warm_start: bool,
) -> list[GenerateRow]:
    """Trains (or skips) one arch's pruned variants; loads the 1× model only when needed."""
    num_features = store.num_features
    arch = full_spec.arch
    rows: list[GenerateRow] = []
    for ranking in ranking_names:
        order: torch.Tensor | None = None
        stale = full_fresh and ranking in _MODEL_RANKINGS
        for k in pruned:
            spec = VariantSpec(store.name, arch, ranking, k)
            bar.set_postfix_str(spec.variant_id)
            if not force and not stale and repo.matches(spec, config, num_features=num_features):
                rows.append(_skipped_row(repo.manifest(store.name, spec.variant_id)))
                bar.update(1)
                continue
            if full_model is None:  # ranks and warm starts come from it
                full_model = repo.load(store.name, full_spec.variant_id).model
            if order is None:
                start = time.perf_counter()
                order = rank_features(ranking, full_model, store, seed=config.seed)
                _log.info(
                    "ranking: %s arch: %s features: %d time_s: %.3f",
                    ranking,
                    arch,
                    num_features,
                    time.perf_counter() - start,
                )
            keep = order[: num_features // k].sort().values  # ascending ids: cache-friendly gather
            init = warm_start_state(full_model, keep) if warm_start else None
            result = _train(store, spec, config, keep, device, init_state=init)
            _save(repo, store, spec, config, keep, result)
            rows.append(_trained_row(spec, keep.numel(), result))
            bar.update(1)
    return rows


def _train(
    store: GraphStore,
    spec: VariantSpec,
    config: TrainConfig,
    keep: torch.Tensor,
    device: Device,
    *,
    init_state: dict[str, torch.Tensor] | None = None,
) -> TrainResult:
    from gnnaas.variants.training import train_model

    full = keep.numel() == store.num_features
    result = train_model(
        store,
        spec.arch,
        config,
        keep=None if full else keep,
        device=device,
        progress=False,
        init_state=init_state,
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
