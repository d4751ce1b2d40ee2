"""What a served variant gets beside its weights when the registry loads it.

:meth:`~gnnaas.serving.core.registry.VariantRegistry.load` reads the profiles and the weights;
these two steps attach the rest, each with its own sources: a precomputed variant's answer tables
(with the nodes a live graph's writes have made stale since) and, on a GPU, each trained
variant's share of the device feature cache (docs/architecture.md §5).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gnnaas.serving.core.settings import Settings

if TYPE_CHECKING:
    from gnnaas.inference.lookup import PrecomputedAnswers
    from gnnaas.serving.core.registry import ServedDataset

__all__ = ["plan_feature_caches", "precomputed_answers"]

_log = logging.getLogger(__name__)


def plan_feature_caches(served: Sequence[ServedDataset], settings: Settings) -> None:
    """Sets ``cache_nodes`` of every trained variant of frozen graphs: one budget of
    ``settings.feature_cache_mb`` over them all, equal traffic shares (none is known at
    start-up), nodes in the planned order beside the profiles, else by neighbor count."""
    from gnnaas.profiling.cachebudget import assign_cache_nodes
    from gnnaas.profiling.cacheplan import degree_ranking, read_cache_ranking

    entries: dict[tuple[str, str], tuple[Any, int]] = {}
    for ds in served:
        if ds.live is not None:
            _log.info("dataset %s: live graph, no feature cache (its rows change)", ds.name)
            continue
        rankings: dict[tuple[int, ...], Any] = {}
        for v in ds.variants.values():
            if v.answers is not None:
                continue  # a lookup reads no features
            if v.fanouts not in rankings:
                ranking, source = read_cache_ranking(
                    Path(settings.profiles_dir) / ds.name,
                    v.fanouts,
                    num_nodes=ds.num_nodes,
                    num_edges=int(ds.store.col.numel()),
                    sampler_seed=settings.seed,
                    sampling=settings.sampling,
                )
                if ranking is None:
                    ranking = degree_ranking(ds.store.col, ds.num_nodes)
                    source = f"neighbor counts ({source})"
                _log.info(
                    "dataset %s, fanouts %s: caching order from %s", ds.name, v.fanouts, source
                )
                rankings[v.fanouts] = ranking
            row_bytes = v.features_kept * ds.features(v.kept_features).element_size()
            entries[(ds.name, v.variant_id)] = (rankings[v.fanouts], row_bytes)
    budget = int(settings.feature_cache_mb * 2**20)
    for (name, variant_id), nodes in assign_cache_nodes(budget, entries).items():
        variant = next(d for d in served if d.name == name).variants[variant_id]
        variant.cache_nodes = nodes
        _log.info("variant %s/%s: %d nodes' features cached", name, variant_id, nodes.numel())


def precomputed_answers(
    repo: Any, manifest: Any, store: Any, settings: Settings
) -> tuple[PrecomputedAnswers | None, str | None]:
    """A precomputed variant's tables with the nodes the graph's writes since made stale, or
    why it is not routed (answers of another graph, or writes that are no longer in the log).

    On a live graph its :class:`~gnnaas.data.live.Staleness` joins the graph's trackers first,
    then the log's writes after the precomputed version are marked: a write committed meanwhile
    is marked by the writer, one before is in the log, none is missed.
    """
    from gnnaas.inference.lookup import PrecomputedAnswers

    info = manifest.precomputed
    # The commands that make it routable again; on a live graph both read the state folder.
    live = "" if settings.state_dir is None else f" --state-dir {settings.state_dir}"
    redo = (
        f"run `gnnaas precompute --dataset {store.name} --variant {info['base']}{live}`, then "
        f"`gnnaas profile --dataset {store.name} --only {manifest.variant_id}{live}`"
    )
    tables = repo.load_answers(manifest)
    answers = PrecomputedAnswers(
        tables["logits"], tables.get("embeddings"), int(info["graph_version"])
    )
    if settings.state_dir is None:
        if answers.graph_version != 0 or answers.num_nodes != store.num_nodes:
            return None, (
                f"its answers are of the live graph at version {answers.graph_version} "
                f"({answers.num_nodes} nodes); serve with --state-dir, or {redo}"
            )
        return answers, None
    from gnnaas.data.live import Staleness, writes_since
    from gnnaas.serving.core.live import LiveState

    state = LiveState.open(store, settings.state_dir)
    graph = state.graph
    if answers.graph_version > graph.version or answers.num_nodes > graph.num_nodes:
        return None, f"its answers are of a newer graph than the one served; {redo}"
    staleness = Staleness(graph, manifest.num_layers, answers.num_nodes)
    state.trackers.add(staleness)
    writes = writes_since(store, settings.state_dir, answers.graph_version)
    if writes is None:
        state.trackers.discard(staleness)
        return None, f"the graph was compacted after version {answers.graph_version}; {redo}"
    staleness.mark(writes)
    answers.staleness = staleness
    return answers, None
