"""A precomputed variant's answers on the graph they are served on.

A precomputed variant (``<base>@exact``, ``gnnaas precompute``) holds one row per node of the
graph it was computed on, at that graph's version. :func:`open_answers` is the one rule of when
those rows answer for the graph a server serves (or a profiler measures):

- a graph that takes no writes (the dataset as loaded, or a snapshot of a live graph that
  ``gnnaas profile --state-dir`` measures) must be the graph they were computed on: the same
  version and as many nodes;
- a live graph (``serve --state-dir``) may have moved on since: the nodes a write reached
  within the model's ``k`` hops since their version are *stale* (:class:`~gnnaas.data.live.
  Staleness`) and computed instead. The staleness joins the graph's trackers first, then the
  log's writes after the answers' version are marked: a write committed meanwhile is marked by the
  writer, one before is in the log, none is missed. Answers of a newer graph, or a log compacted
  past their version, cannot be used.

When they cannot be used, the reason names the commands that make the variant servable again.
"""

from __future__ import annotations

from typing import Any

from gnnaas.inference.lookup import PrecomputedAnswers
from gnnaas.runtime.graph import RuntimeGraph

__all__ = ["open_answers"]


def _redo(manifest: Any, graph: RuntimeGraph) -> str:
    """The commands that make a precomputed variant's answers fit ``graph`` again."""
    live = "" if graph.state_dir is None else f" --state-dir {graph.state_dir}"
    return (
        f"run `gnnaas precompute --dataset {graph.name} --variant "
        f"{manifest.precomputed['base']}{live}`, then "
        f"`gnnaas profile --dataset {graph.name} --only {manifest.variant_id}{live}`"
    )


def open_answers(
    repo: Any, manifest: Any, graph: RuntimeGraph
) -> tuple[PrecomputedAnswers | None, str | None]:
    """A precomputed variant's tables for ``graph``, or why they do not answer for it.

    Args:
        repo (VariantRepository): where the variant is (``load_answers``).
        manifest (Manifest): the variant's manifest (``precomputed`` set).
        graph (RuntimeGraph): the graph it is to answer for.

    Returns:
        tuple: the answers (with their staleness on a live graph) and ``None``, or ``None`` and
        the reason (module docstring).

    Raises:
        ArtifactError: the answer tables cannot be read.
    """
    info = manifest.precomputed
    tables = repo.load_answers(manifest)
    answers = PrecomputedAnswers(
        tables["logits"], tables.get("embeddings"), int(info["graph_version"])
    )
    if graph.live is None:
        if answers.graph_version != graph.version or answers.num_nodes != graph.num_nodes:
            where = "a live graph" if answers.graph_version else "the graph as loaded"
            return None, (
                f"its answers are of {where} at version {answers.graph_version} "
                f"({answers.num_nodes} nodes), the graph here is at version {graph.version} "
                f"({graph.num_nodes} nodes); serve or profile with the --state-dir it was "
                f"computed on, or {_redo(manifest, graph)}"
            )
        return answers, None
    return _track_staleness(answers, manifest, graph)


def _track_staleness(
    answers: PrecomputedAnswers, manifest: Any, graph: RuntimeGraph
) -> tuple[PrecomputedAnswers | None, str | None]:
    """``answers`` on a live graph, with the nodes written since their version marked stale."""
    from gnnaas.data.live import Staleness, writes_since

    live = graph.live.graph
    if answers.graph_version > live.version or answers.num_nodes > live.num_nodes:
        redo = _redo(manifest, graph)
        return None, f"its answers are of a newer graph than the one served; {redo}"
    staleness = Staleness(live, manifest.num_layers, answers.num_nodes)
    graph.live.trackers.add(staleness)
    writes = writes_since(graph.store, graph.state_dir, answers.graph_version)
    if writes is None:
        graph.live.trackers.discard(staleness)
        return None, (
            f"the graph was compacted after version {answers.graph_version}; "
            f"{_redo(manifest, graph)}"
        )
    staleness.mark(writes)
    answers.staleness = staleness
    return answers, None
