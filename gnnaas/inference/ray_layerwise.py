"""Exact layer-wise inference over the whole graph as Ray tasks.

The pass of :func:`~gnnaas.inference.layerwise.layerwise_inference`, spread over a Ray cluster
for graphs whose layer states exceed one machine: the nodes are split into ``P`` contiguous
ranges (*partitions*), and every layer runs one Ray task per partition, with one barrier per
layer (the driver waits for all of a layer's tasks before it submits the next layer's).

A layer's states never pass through the driver: each partition's ``[B_p, F_l]`` block stays in
Ray's object store as one ``ObjectRef``, and a task receives only the blocks of the partitions
its targets' in-neighbors fall in (:attr:`PartitionInput.reads`, computed once by the driver from
the CSR). The task gathers the rows it needs from them into a compact input (its own rows first,
then the other partitions' needed rows; the CSR slice's neighbor ids are remapped to these rows
once, up front) and runs :func:`~gnnaas.inference.layerwise.layer_chunk` over its targets in
chunks of ``chunk_size``. The model and every partition's remapped CSR slice are put into the
object store once and reused by every layer.

Memory per task: its compact input (its own rows plus the distinct out-of-partition in-neighbors,
at most ``N`` rows), its output and one chunk's work; on the driver, only the final outputs.

Only this module imports Ray (the ``[ray]`` extra), and only when
:func:`ray_layerwise_inference` runs: ``import gnnaas.inference`` never loads it.

Shapes:
    - **input:** ``features`` ``[N, F_kept]``, ``rowptr`` ``[N + 1]``, ``col`` ``[E]`` (in-edges,
      messages flow ``col[e] → target``).
    - **output:** ``logits`` ``[N, C]``; ``embeddings`` ``[N, H]`` (the input of the last layer).

Example:
    >>> out = ray_layerwise_inference(  # doctest: +SKIP
    ...     model, x, store.rowptr, store.col, partitions=8
    ... )
    >>> out.logits.shape  # doctest: +SKIP
    torch.Size([2708, 7])
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gnnaas.errors import ConfigError
from gnnaas.inference.layerwise import (
    DEFAULT_CHUNK_SIZE,
    LayerwiseOutput,
    Progress,
    check_inputs,
    layer_chunk,
    layer_widths,
    layerwise_inference,
)
from gnnaas.models.base import GNN

__all__ = [
    "PartitionInput",
    "partition_bounds",
    "partition_input",
    "ray_layerwise_inference",
]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartitionInput:
    """What one partition's task needs besides the states: which partitions it reads, which of
    their rows, and its CSR slice with neighbor ids remapped to the compact input's rows.

    The compact input (:meth:`gather`) holds the partition's own rows ``[0, B)`` (its targets,
    and its in-neighbors that fall inside it), then, partition by partition in :attr:`reads`
    order, the rows of the other partitions that are in-neighbors of its targets.

    Args:
        start (int): first target node.
        stop (int): one past the last target node (``B = stop - start``).
        reads (tuple[int, ...]): the partitions whose states the task receives: its own first,
            then the others its targets' in-neighbors fall in, ascending.
        rows (tuple[Tensor, ...]): for each of ``reads[1:]``, the int64 rows (local to that
            partition, ascending) the task gathers.
        rowptr (Tensor): ``[M + 1]`` int64 CSR pointers over the compact input's ``M`` rows;
            only the first ``B`` (the targets) have in-edges.
        col (Tensor): ``[E_p]`` int64 in-neighbors as rows of the compact input.
    """

    start: int
    stop: int
    reads: tuple[int, ...]
    rows: tuple[Tensor, ...]
    rowptr: Tensor
    col: Tensor

    def gather(self, own: Tensor, others: tuple[Tensor, ...]) -> Tensor:
        """The compact input from the states of the partitions in :attr:`reads`.

        Args:
            own (Tensor): ``[B, F]`` the partition's own states.
            others (tuple[Tensor, ...]): the states of ``reads[1:]``, in that order.

        Returns:
            Tensor: ``[M, F]`` the rows :attr:`col` indexes.
        """
        if len(others) != len(self.rows):
            raise ValueError(
                f"PartitionInput.gather expects the states of {len(self.rows)} other "
                f"partitions (got {len(others)})"
            )
        if not others:
            return own
        gathered = (x.index_select(0, r) for x, r in zip(others, self.rows, strict=True))
        return torch.cat([own, *gathered])  # [M, F]


def partition_bounds(num_nodes: int, partitions: int) -> Tensor:
    """Boundaries of ``partitions`` contiguous node ranges of near-equal size.

    Never more ranges than nodes, so that none is empty (one range for an empty graph).

    Args:
        num_nodes (int): ``N``.
        partitions (int): the ranges wanted (>= 1).

    Returns:
        Tensor: ``[P + 1]`` int64, ``P = min(partitions, max(N, 1))``; partition ``p`` is
        ``[bounds[p], bounds[p + 1])``.

    Example:
        >>> partition_bounds(10, 3).tolist()
        [0, 3, 6, 10]
    """
    if partitions < 1:
        raise ValueError(f"partition_bounds expects partitions >= 1 (got {partitions})")
    count = min(partitions, max(num_nodes, 1))
    return torch.arange(count + 1, dtype=torch.int64) * num_nodes // count


def partition_input(bounds: Tensor, rowptr: Tensor, col: Tensor, part: int) -> PartitionInput:
    """The partitions partition ``part`` reads and its remapped CSR slice.

    Args:
        bounds (Tensor): ``[P + 1]`` from :func:`partition_bounds`.
        rowptr (Tensor): ``[N + 1]`` int64 CSR pointers over in-edges.
        col (Tensor): ``[E]`` int64 in-neighbors.
        part (int): the partition.

    Returns:
        PartitionInput: its reads, gathered rows and local CSR (fresh tensors, none a view of
        the graph's, so that putting them into the object store copies only them).

    Example:
        >>> rowptr, col = torch.tensor([0, 1, 2, 3, 3]), torch.tensor([3, 0, 1])
        >>> partition_input(torch.tensor([0, 2, 4]), rowptr, col, 0).reads
        (0, 1)
    """
    start, stop = int(bounds[part]), int(bounds[part + 1])
    lo, hi = int(rowptr[start]), int(rowptr[stop])
    src = col[lo:hi]  # [E_p] global ids
    inside = (src >= start) & (src < stop)
    outside = torch.unique(src[~inside])  # [K] sorted global ids of the other partitions' rows
    owner = torch.searchsorted(bounds, outside, right=True) - 1  # [K] their partitions
    others, counts = torch.unique_consecutive(owner, return_counts=True)  # owner is sorted
    local = outside - bounds[owner]  # [K] rows within their partitions
    num_targets = stop - start
    remapped = torch.where(
        inside, src - start, num_targets + torch.searchsorted(outside, src)
    )  # [E_p] rows of the compact input (the outside ids are found in `outside`)
    crow = rowptr[start : stop + 1] - lo  # [B + 1]
    padding = crow.new_full((outside.numel(),), hi - lo)  # the gathered rows have no in-edges
    return PartitionInput(
        start=start,
        stop=stop,
        reads=(part, *(int(p) for p in others.tolist())),
        rows=tuple(r.clone() for r in torch.split(local, counts.tolist())),
        rowptr=torch.cat([crow, padding]),
        col=remapped,
    )


def _run_partition(
    model: GNN, layer: int, chunk_size: int, part: PartitionInput, own: Tensor, *others: Tensor
) -> Tensor:
    """One partition's output of layer ``layer`` (the Ray task's body).

    Args:
        model (GNN): the model in eval mode.
        layer (int): the layer's index.
        chunk_size (int): target nodes per chunk.
        part (PartitionInput): the partition's reads and CSR.
        own (Tensor): ``[B, F]`` its own states of the previous layer.
        *others (Tensor): the previous layer's states of ``part.reads[1:]``.

    Returns:
        Tensor: ``[B, F_l]`` the layer's output for the partition's targets.
    """
    num_targets = part.stop - part.start
    with torch.inference_mode():
        x = part.gather(own, others)  # [M, F]
        out = torch.empty((num_targets, layer_widths(model)[layer]), dtype=own.dtype)
        for start in range(0, num_targets, chunk_size):
            stop = min(start + chunk_size, num_targets)
            out[start:stop] = layer_chunk(model, layer, x, part.rowptr, part.col, start, stop)
    return out


def _import_ray() -> Any:
    """Ray, or a :class:`~gnnaas.errors.ConfigError` saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            f"ray layer-wise inference needs Ray ({exc}); "
            "install the [ray] extra: pip install 'gnnaas[ray]'"
        ) from None
    return ray


def _wait(ray: Any, refs: list[Any], sizes: list[int], progress: Progress | None) -> None:
    """The layer's barrier: returns once every task of ``refs`` has finished (or failed; a failure
    surfaces where its output is read), calling ``progress`` with each one's node count. The
    outputs stay where they were computed (``fetch_local=False``)."""
    if progress is None:
        ray.wait(refs, num_returns=len(refs), fetch_local=False)
        return
    size_of = dict(zip(refs, sizes, strict=True))
    pending = refs
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, fetch_local=False)
        for ref in ready:
            progress(size_of[ref])


def ray_layerwise_inference(
    model: GNN,
    features: Tensor,
    rowptr: Tensor,
    col: Tensor,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    partitions: int | None = None,
    embeddings: bool = False,
    progress: Progress | None = None,
    address: str | None = None,
) -> LayerwiseOutput:
    """Every node's output of ``model`` with full neighborhoods, one layer at a time, on Ray.

    The result equals :func:`~gnnaas.inference.layerwise.layerwise_inference`'s up to
    floating-point summation order. A Ray already initialized in this process is used as is;
    otherwise the function joins ``address`` or starts a local Ray (all CPUs, no dashboard), and
    shuts down only a Ray it started.

    Args:
        model (GNN): the variant's model (put in eval mode here; it travels to the workers
            through the object store, once).
        features (Tensor): ``[N, F_kept]`` the variant's input features (host).
        rowptr (Tensor): ``[N + 1]`` int64 CSR pointers over in-edges.
        col (Tensor): ``[E]`` int64 in-neighbors.
        chunk_size (int, optional): target nodes per chunk within a task.
            (default: :data:`~gnnaas.inference.layerwise.DEFAULT_CHUNK_SIZE`)
        partitions (int, optional): contiguous node ranges, one task each per layer; at most
            ``N`` are used. (default: ``None``: the cluster's CPUs)
        embeddings (bool, optional): also return the last layer's input. (default: ``False``)
        progress (Progress, optional): called on the driver after each task with its node count
            (the pass covers ``N × num_layers`` in all). (default: ``None``)
        address (str, optional): the Ray cluster to join when none is initialized
            (``ray start --head`` prints it). (default: ``None``: a local Ray)

    Returns:
        LayerwiseOutput: ``logits [N, C]`` and, when asked for, ``embeddings [N, H]``, on the
        host.

    Raises:
        ValueError: ``chunk_size`` or ``partitions`` < 1, or the CSR does not match the features.
        ConfigError: Ray is not installed.
    """
    n = check_inputs(features, rowptr, chunk_size)
    if partitions is not None and partitions < 1:
        raise ValueError(f"partitions must be >= 1 (got {partitions})")
    ray = _import_ray()
    if n == 0:  # nothing to distribute
        return layerwise_inference(model, features, rowptr, col, embeddings=embeddings)
    started = not ray.is_initialized()
    if started:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    try:
        if partitions is None:
            partitions = max(1, int(ray.cluster_resources().get("CPU", 1)))
        return _run(ray, model, features, rowptr, col, chunk_size, partitions, embeddings, progress)
    finally:
        if started:
            ray.shutdown()


def _run(
    ray: Any,
    model: GNN,
    features: Tensor,
    rowptr: Tensor,
    col: Tensor,
    chunk_size: int,
    partitions: int,
    embeddings: bool,
    progress: Progress | None,
) -> LayerwiseOutput:
    """The pass on an initialized Ray (see :func:`ray_layerwise_inference`)."""
    bounds = partition_bounds(int(features.size(0)), partitions)
    count = bounds.numel() - 1
    sizes = bounds.diff().tolist()
    inputs = [partition_input(bounds, rowptr, col, p) for p in range(count)]
    _log.debug(
        "ray layer-wise: %d partitions, %d reads per task on average",
        count,
        sum(len(i.reads) for i in inputs) / count,
    )
    model.eval()
    task = ray.remote(num_cpus=1)(_run_partition)
    model_ref = ray.put(model)
    input_refs = [ray.put(i) for i in inputs]
    # clones: a view would pickle its whole storage, i.e. every partition the full features
    states = [ray.put(features[int(bounds[p]) : int(bounds[p + 1])].clone()) for p in range(count)]
    kept: list[Any] | None = None
    for layer in range(model.num_layers):
        if embeddings and layer == model.num_layers - 1:
            kept = states
        states = [
            task.remote(model_ref, layer, chunk_size, input_refs[p], *(states[q] for q in i.reads))
            for p, i in enumerate(inputs)
        ]
        _wait(ray, states, sizes, progress)
    logits = torch.cat(ray.get(states))  # [N, C]
    return LayerwiseOutput(logits, torch.cat(ray.get(kept)) if kept is not None else None)
