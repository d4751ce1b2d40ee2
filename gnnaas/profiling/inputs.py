"""What a profile run starts from: the variants to profile, checked against the dataset.

The helpers :func:`~gnnaas.profiling.profiler.profile_dataset` calls before it measures anything:
the repository's folders it could not list and why (:func:`unlisted_variants`), a variant's fit to
the dataset (:func:`check_manifest`) and a precomputed variant's answer tables
(:func:`precomputed_answers`), the served weights' size (:func:`served_size_kb`), the rows and
curves that ``profile --only`` keeps from the existing files (:func:`kept_profiles`), and the
device feature caches the server would build (:func:`planned_caches`). Kept apart from the
measurement (:mod:`gnnaas.profiling.measurement`): these read files and check them, and time
nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from gnnaas.errors import ArtifactError, ConfigError
from gnnaas.inference.lookup import PrecomputedAnswers
from gnnaas.profiling.table import read_profiles, read_service_times

if TYPE_CHECKING:
    from gnnaas.data import GraphStore
    from gnnaas.variants.manifest import Manifest
    from gnnaas.variants.repository import VariantRepository

__all__ = [
    "check_manifest",
    "kept_profiles",
    "planned_caches",
    "precomputed_answers",
    "served_size_kb",
    "unlisted_variants",
]

_log = logging.getLogger(__name__)


def check_manifest(manifest: Manifest, store: GraphStore) -> None:
    """Raises :class:`ArtifactError` when a variant does not fit the dataset: another feature
    count, kept feature ids beyond it, or another number of classes."""
    if manifest.num_features != store.num_features:
        raise ArtifactError(
            f"variant {manifest.variant_id} was trained on {manifest.num_features} features but "
            f"{store.name} has {store.num_features}; regenerate with "
            f"`gnnaas generate --dataset {store.name} --force`"
        )
    if manifest.kept_features and max(manifest.kept_features) >= store.num_features:
        raise ArtifactError(
            f"variant {manifest.variant_id} keeps feature ids beyond {store.num_features}; "
            f"regenerate with `gnnaas generate --dataset {store.name} --force`"
        )
    if manifest.out_channels != store.num_classes:
        raise ArtifactError(
            f"variant {manifest.variant_id} predicts {manifest.out_channels} classes but "
            f"{store.name} has {store.num_classes}; regenerate the variant"
        )


def kept_profiles(
    folder: Path, manifests: Sequence[Manifest], only: set[str]
) -> tuple[dict[str, dict[str, dict[str, Any]]], list[dict[str, Any]]]:
    """For ``profile --only``: the existing rows and curves of every variant not in ``only``.

    Returns:
        tuple: ``{variant: {split: row}}`` and the service-curve rows of those variants.
    """
    listed = {m.variant_id for m in manifests}
    unknown = sorted(only - listed)
    if unknown:
        raise ArtifactError(
            f"--only names variants that are not in the repository: {', '.join(unknown)}"
        )
    try:
        frame, curves = read_profiles(folder), read_service_times(folder)
    except ArtifactError as exc:
        raise ArtifactError(
            f"--only needs existing profiles to keep ({exc}); profile every variant first"
        ) from None
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    for record in frame.to_dict("records"):
        rows.setdefault(str(record["variant"]), {})[str(record["split"])] = record
    others = listed - only
    missing = sorted(v for v in others if set(rows.get(v, {})) != {"val", "test"})
    if missing:
        raise ArtifactError(
            f"--only keeps the other variants' profiles, but {', '.join(missing)} "
            "have none; profile every variant first"
        )
    kept_curves = [r for r in curves.to_dict("records") if r["variant"] in others]
    return {v: rows[v] for v in others}, kept_curves


def precomputed_answers(
    repo: VariantRepository, manifest: Manifest, store: GraphStore
) -> PrecomputedAnswers | None:
    """A precomputed variant's tables (``None`` for a trained variant), checked against the
    dataset: one row per node."""
    if manifest.precomputed is None:
        return None
    tables = repo.load_answers(manifest)
    answered, version = tables["logits"].size(0), int(manifest.precomputed["graph_version"])
    if answered != store.num_nodes:
        redo = (
            f"`gnnaas precompute --dataset {store.name} --variant "
            f"{manifest.precomputed['base']}` (with the server's --state-dir for a live graph)"
        )
        if version > 0:  # the answers of a live graph: profile on that graph
            raise ArtifactError(
                f"its answers cover {answered} nodes, those of the live graph at version "
                f"{version}, and {store.name} as profiled here has {store.num_nodes}; profile "
                f"it with --state-dir (the server's) to time it on the live graph, or run {redo} "
                "again"
            )
        raise ArtifactError(
            f"its answers cover {answered} nodes, {store.name} as profiled here has "
            f"{store.num_nodes}; run {redo} again"
        )
    return PrecomputedAnswers(
        tables["logits"], tables.get("embeddings"), manifest.precomputed["graph_version"]
    )


def served_size_kb(model: torch.nn.Module, stored_kb: float) -> float:
    """The served weights' size: the stored files', or for an int8 model its parameters and
    buffers as it holds them (1-byte weights in its quantized linear layers)."""
    if getattr(model, "precision", "fp32") != "int8":
        return stored_kb
    from gnnaas.models import model_bytes

    return model_bytes(model) / 1024


def planned_caches(
    store: GraphStore,
    manifests: Sequence[Manifest],
    folder: Path,
    budget_mb: float,
    *,
    sampler_seed: int,
    sampling: str,
) -> dict[str, Tensor]:
    """The node ids each trained variant would keep on the device if the server served this
    dataset alone with ``budget_mb`` (equal traffic shares)."""
    from gnnaas.profiling.cachebudget import assign_cache_nodes
    from gnnaas.profiling.cacheplan import degree_ranking, read_cache_ranking

    rankings: dict[tuple[int, ...], Any] = {}
    entries = {}
    for m in manifests:
        if m.precomputed is not None:
            continue  # answers are looked up: no feature is read
        fanouts = tuple(int(f) for f in m.fanouts)
        if fanouts not in rankings:
            ranking, source = read_cache_ranking(
                folder,
                fanouts,
                num_nodes=store.num_nodes,
                num_edges=store.num_edges,
                sampler_seed=sampler_seed,
                sampling=sampling,
            )
            if ranking is None:
                _log.info("feature cache, fanouts %s: by neighbor count (%s)", fanouts, source)
                ranking = degree_ranking(store.col, store.num_nodes)
            rankings[fanouts] = ranking
        entries[m.variant_id] = (rankings[fanouts], m.in_channels * store.x.element_size())
    return assign_cache_nodes(int(budget_mb * 2**20), entries)


def unlisted_variants(
    repo: VariantRepository, dataset: str, listed: set[str]
) -> list[tuple[str, str]]:
    """Folders the repository skipped when listing (unreadable manifests), with the reason."""
    folder = Path(repo.root) / dataset
    if not folder.is_dir():
        return []
    skipped = []
    for child in sorted(folder.iterdir()):
        if child.name.startswith(".") or not child.is_dir() or child.name in listed:
            continue
        try:
            repo.manifest(dataset, child.name)
            reason = "not listed by the repository"
        except (ArtifactError, ConfigError) as exc:
            reason = str(exc)
        skipped.append((child.name, reason))
    return skipped
