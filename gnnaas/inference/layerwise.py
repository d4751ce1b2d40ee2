"""Exact layer-wise inference over the whole graph.

A sampled forward recomputes a node's hidden state once for every request (and every batch-mate)
that reaches it, and sees only a sample of its neighbors. The layer-wise pass (PyG's
``inference`` pattern, on the store's CSR) computes every node's state of layer ``l`` once, over
*all* its in-neighbors, from the whole graph's states of layer ``l - 1``, in chunks of target
nodes: each chunk's aggregation is the product of its CSR slice (entries 1, or ``1 / degree`` for
a mean) with the previous layer's states, then the layer's own update
(:meth:`gnnaas.models.GNN.update`; PyG's convolution on the chunk's edges for a layer that has
none). The result is the full-graph forward's (``model(x, edge_index)``) up to floating-point
summation order.

Memory (stated by :func:`peak_bytes`): the input features (already held by the store), one
layer's states and the next's (``N × width`` float32 each), and one chunk's work: its aggregation
``chunk × width`` plus its CSR slice (two int64 and one float32 per edge). ``chunk_size`` bounds
the last term; the states are the floor.

Every layer is parallel over chunks with one barrier per layer: :func:`layer_chunk` computes one
chunk from the previous states and is what the Ray pass (:mod:`gnnaas.inference.ray_layerwise`)
runs as a task.

Shapes:
    - **input:** ``features`` ``[N, F_kept]``, ``rowptr`` ``[N + 1]``, ``col`` ``[E]`` (in-edges,
      messages flow ``col[e] → target``).
    - **output:** ``logits`` ``[N, C]``; ``embeddings`` ``[N, H]`` (the input of the last layer).

Example:
    >>> out = layerwise_inference(model, x, store.rowptr, store.col)  # doctest: +SKIP
    >>> out.logits.shape  # doctest: +SKIP
    torch.Size([2708, 7])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor
from torch_geometric.nn.conv import MessagePassing

from gnnaas.models.base import GNN

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "LayerwiseOutput",
    "check_inputs",
    "layer_chunk",
    "layerwise_inference",
    "peak_bytes",
]

DEFAULT_CHUNK_SIZE = 16_384
"""Target nodes per chunk (``gnnaas infer --chunk-size``)."""

Progress = Callable[[int], None]
"""Called with the number of target nodes a finished chunk covered."""


@dataclass(frozen=True)
class LayerwiseOutput:
    """What :func:`layerwise_inference` returns.

    Args:
        logits (Tensor): ``[N, C]`` the last layer's outputs, on the host.
        embeddings (Tensor | None): ``[N, H]`` the input of the last layer (after the previous
            layer's activation), when asked for.
    """

    logits: Tensor
    embeddings: Tensor | None


def layer_widths(model: GNN) -> list[int]:
    """Output width of every layer of ``model`` (hidden widths, then the classes)."""
    return [model.hidden_channels] * (model.num_layers - 1) + [model.out_channels]


def peak_bytes(model: GNN, num_nodes: int, num_edges: int, chunk_size: int) -> int:
    """Memory the pass needs beyond the input features: the largest pair of consecutive layer
    states (input and output, float32; the features count as the first input but are the
    store's), the embeddings when kept (at most one more state), and one chunk's aggregation and
    CSR slice at the graph's mean degree.

    Args:
        model (GNN): the model.
        num_nodes (int): ``N``.
        num_edges (int): ``E``.
        chunk_size (int): target nodes per chunk.
    """
    widths = layer_widths(model)
    states = max(
        (widths[i - 1] if i > 0 else 0) + widths[i] for i in range(len(widths))
    )  # the features are not counted: the store already holds them
    chunk = min(chunk_size, max(num_nodes, 1))
    chunk_edges = num_edges * chunk // max(num_nodes, 1)
    widest = max([model.in_channels, *widths])
    return 4 * num_nodes * (states + model.hidden_channels) + chunk * 4 * widest + chunk_edges * 20


def layer_chunk(
    model: GNN, layer: int, x: Tensor, rowptr: Tensor, col: Tensor, start: int, stop: int
) -> Tensor:
    """Layer ``layer`` of ``model`` for target nodes ``[start, stop)``, with every in-neighbor.

    Args:
        model (GNN): the model in eval mode.
        layer (int): the layer's index.
        x (Tensor): ``[N, F]`` every node's input to the layer.
        rowptr (Tensor): ``[N + 1]`` int64 CSR pointers over in-edges.
        col (Tensor): ``[E]`` int64 in-neighbors.
        start (int): first target.
        stop (int): one past the last target.

    Returns:
        Tensor: ``[stop - start, F_l]`` the layer's output after its activation (none for the
        last layer).
    """
    lo, hi = int(rowptr[start]), int(rowptr[stop])
    crow = rowptr[start : stop + 1] - lo  # [B + 1]
    src = col[lo:hi]  # [E_c]
    x_dst = x[start:stop]
    aggr = model.aggregation(layer)
    if aggr is not None:
        cap = model.exact_cap(layer)
        if aggr == "mean":
            degree = crow.diff()
            values = degree.clamp(min=1).to(x.dtype).reciprocal().repeat_interleave(degree)
        elif cap is not None:  # a sum over full neighborhoods, at the trained sums' scale
            degree = crow.diff()
            per_dst = degree.clamp(max=cap).to(x.dtype) / degree.clamp(min=1).to(x.dtype)
            values = per_dst.repeat_interleave(degree)
        else:
            values = x.new_ones(src.numel())
        adjacency = torch.sparse_csr_tensor(
            crow, src, values, size=(stop - start, x.size(0)), check_invariants=False
        )
        out = model.update(layer, adjacency @ x, x_dst)  # [B, F_l]
    else:  # a convolution without a fused update: PyG's message passing on the chunk's edges
        degree = crow.diff()
        dst = torch.arange(stop - start).repeat_interleave(degree)
        conv = cast(MessagePassing, model.convs[layer])
        out = conv((x, x_dst), torch.stack([src, dst]), size=(x.size(0), stop - start))
    if layer < model.num_layers - 1:
        out = torch.relu(out)
    return out


def check_inputs(features: Tensor, rowptr: Tensor, chunk_size: int) -> int:
    """The node count of a layer-wise pass, after checking its inputs agree.

    Raises:
        ValueError: ``chunk_size`` < 1, or the CSR does not match the features.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 (got {chunk_size})")
    n = int(features.size(0))
    if rowptr.numel() != n + 1:
        raise ValueError(
            f"the CSR has {rowptr.numel() - 1} nodes but the features {n} rows; "
            "pass the graph and features of one dataset"
        )
    return n


def layerwise_inference(
    model: GNN,
    features: Tensor,
    rowptr: Tensor,
    col: Tensor,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    embeddings: bool = False,
    progress: Progress | None = None,
) -> LayerwiseOutput:
    """Every node's output of ``model`` with full neighborhoods, one layer at a time.

    Args:
        model (GNN): the variant's model (put in eval mode here).
        features (Tensor): ``[N, F_kept]`` the variant's input features (host).
        rowptr (Tensor): ``[N + 1]`` int64 CSR pointers over in-edges.
        col (Tensor): ``[E]`` int64 in-neighbors.
        chunk_size (int, optional): target nodes per chunk. (default: :data:`DEFAULT_CHUNK_SIZE`)
        embeddings (bool, optional): also keep the last layer's input. (default: ``False``)
        progress (Progress, optional): called after each chunk with its node count (the pass
            covers ``N × num_layers`` in all). (default: ``None``)

    Returns:
        LayerwiseOutput: ``logits [N, C]`` and, when asked for, ``embeddings [N, H]``.

    Raises:
        ValueError: ``chunk_size`` < 1, or the CSR does not match the features.
    """
    n = check_inputs(features, rowptr, chunk_size)
    model.eval()
    x, kept = features, None
    with torch.inference_mode():
        for layer, width in enumerate(layer_widths(model)):
            if embeddings and layer == model.num_layers - 1:
                kept = x
            out = torch.empty((n, width), dtype=features.dtype)  # [N, F_l]
            for start in range(0, n, chunk_size):
                stop = min(start + chunk_size, n)
                out[start:stop] = layer_chunk(model, layer, x, rowptr, col, start, stop)
                if progress is not None:
                    progress(stop - start)
            x = out
    return LayerwiseOutput(x, kept)
