"""The GNN base class shared by SAGE and GIN and the :class:`Arch` choice.

A :class:`GNN` is a stack of ``num_layers`` PyG message-passing convolutions with ReLU and dropout
between them. Subclasses differ only in :meth:`GNN.init_conv` (which convolution a layer uses)
and :meth:`GNN.first_layer_weights` (the weights that multiply the raw input features, for feature
ranking).

One :meth:`GNN.forward` serves both ways of running a model:

- sampled: ``adjs`` is a list of bipartite blocks (``gnnaas.sampling.Block``), outermost hop
  first; layer ``l`` maps the ``size[0]`` source rows of block ``l`` to its ``size[1]`` target
  rows, which are the first ``size[1]`` sources. The output has one row per seed.
- full graph: ``adjs`` is an ``edge_index`` ``[2, E]`` and every layer runs on all nodes.

On blocks, a layer has two implementations of one computation, chosen by the mode: training runs
PyG's convolution (autograd through PyG's layers), eval-mode inference runs
:meth:`GNN.fused_layer`, the same aggregation and update in a few tensor operations (on a served
request's small blocks PyG's per-call Python costs more than the arithmetic). They agree up to
floating-point summation order; ``forward(..., pyg_convs=True)`` runs PyG's convolutions in eval
mode too, the reference the fused layers are checked against (``tests/models/test_gnn.py``) and
the path :func:`~gnnaas.models.calibrate_int8` observes every linear layer on.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, ClassVar, Literal, Self, cast, overload

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn.conv import MessagePassing

from gnnaas.errors import ConfigError

if TYPE_CHECKING:
    from gnnaas.sampling import Block

__all__ = ["FAMILIES", "SPARSE_MIN_ELEMENTS", "Arch", "GNN", "aggregate_neighbors"]


FAMILIES = ("gnnaas", "pyg")
"""Layer layouts :func:`~gnnaas.models.build_model` builds (see its ``family`` argument)."""


# torch notes once per process that CSR tensors are "beta"; gnnaas uses only their product with
# a dense matrix, which is stable, and a server log need not carry the notice.
warnings.filterwarnings(
    "ignore", message="Sparse CSR tensor support is in beta state", category=UserWarning
)

SPARSE_MIN_ELEMENTS = 1 << 20
"""Blocks whose messages (edges × features) number at least this many are summed as a sparse
CSR product instead of gathered into an ``[E, F]`` message tensor."""


def aggregate_neighbors(
    x: Tensor, block: Block, *, mean: bool = False, cap: int | None = None
) -> Tensor:
    """Sum (or mean) over each target's in-neighbors in ``block``: ``[num_dst, F]``, zero rows for
    targets without neighbors, as PyG's ``sum`` and ``mean`` aggregations compute them.

    Small blocks (a served request's) gather the messages and ``index_add_`` them: the fewest
    operators (PyG's ``torch_geometric.utils.scatter`` does the same sum, count and divide with
    more Python per call, which a one-seed block notices; ``benchmarks/results/latency.md``,
    "Forward of a sampled batch", measures the fused layers this is part of). Large blocks
    multiply a CSR adjacency (entries 1, or 1 / degree for the mean) by ``x`` instead, which never
    materializes the ``[E, F]`` messages: for a wide model over many sampled edges they are a
    large tensor allocated fresh per layer, whose pages fault in, where the product reads ``x``
    once.

    Args:
        x (Tensor): ``[num_src, F]`` source rows.
        block (Block): the bipartite block; ``edge_index[0]`` sources, ``edge_index[1]`` targets.
        mean (bool, optional): divide by each target's in-degree. (default: ``False``)
        cap (int, optional): for a sum, scale each target's sum by ``min(count, cap) / count``
            (``count`` its neighbors in the block): the sum over all of a node's neighbors
            brought to the magnitude of a sum over ``cap`` sampled ones (see
            :attr:`GNN.train_fanouts`). (default: ``None``: plain sums)
    """
    src, dst = block.edge_index[0], block.edge_index[1]
    num_dst, width = int(block.size[1]), x.size(1)
    scaled = cap is not None and not mean
    if src.numel() * width < SPARSE_MIN_ELEMENTS:
        out = x.new_zeros((num_dst, width)).index_add_(0, dst, x.index_select(0, src))
        if not mean and not scaled:
            return out
        # index_add_, not bincount: no device->host sync on CUDA
        degree = out.new_zeros(num_dst).index_add_(0, dst, out.new_ones(dst.numel()))
        if scaled:
            return out.mul_((degree.clamp(max=cap) / degree.clamp(min=1)).unsqueeze(1))
        return out.div_(degree.clamp_(min=1).unsqueeze(1))
    order = torch.argsort(dst, stable=True)
    counts = torch.bincount(dst, minlength=num_dst)
    crow = dst.new_zeros(num_dst + 1)
    crow[1:] = counts.cumsum(0)
    if mean:
        values = counts.clamp(min=1).to(x.dtype).reciprocal()[dst[order]]
    elif scaled:
        per_dst = counts.clamp(max=cap).to(x.dtype) / counts.clamp(min=1).to(x.dtype)
        values = per_dst[dst[order]]
    else:
        values = x.new_ones(src.numel())
    adjacency = torch.sparse_csr_tensor(
        crow,
        src[order],
        values,
        size=(num_dst, x.size(0)),
        check_invariants=False,  # built sorted and in range by construction
    )
    return adjacency @ x  # [num_dst, F]


class Arch(StrEnum):
    """A model architecture; accepts plain strings in any case (``Arch("SAGE") is Arch.SAGE``)."""

    SAGE = "sage"
    GIN = "gin"

    @classmethod
    def _missing_(cls, value: object) -> Arch | None:
        if isinstance(value, str):
            name = value.strip().lower()
            for member in cls:
                if member.value == name:
                    return member
        return None

    @classmethod
    def parse(cls, value: str | Arch) -> Arch:
        """Returns the architecture named ``value``.

        Raises:
            ConfigError: ``value`` names no architecture; the message lists the choices.

        Example:
            >>> Arch.parse("GIN")
            <Arch.GIN: 'gin'>
        """
        try:
            return cls(value)
        except ValueError:
            raise ConfigError(f"unknown arch {str(value)!r}; choose sage or gin") from None


class GNN(torch.nn.Module):
    r"""Base of the gnnaas models: ``num_layers`` convolutions, ReLU and dropout between them.

    Args:
        in_channels (int): number of input features ``F`` (the kept features of a variant).
        hidden_channels (int): width of the hidden layers.
        out_channels (int): number of classes ``C``.
        num_layers (int, optional): number of convolutions (= hops). (default: ``2``)
        dropout (float, optional): dropout probability after each hidden activation.
            (default: ``0.5``)

    Shapes:
        - **input:** node features ``x`` :math:`(|\mathcal{V}_s|, F)` with ``adjs`` a list of
          ``num_layers`` blocks (sampled; ``|V_s| = blocks[0].size[0]``), or node features
          :math:`(|\mathcal{V}|, F)` with ``adjs`` an ``edge_index`` :math:`(2, |\mathcal{E}|)`
          (full graph).
        - **output:** logits :math:`(B, C)` with ``B = blocks[-1].size[1]`` (the seeds), or
          :math:`(|\mathcal{V}|, C)` on the full graph.
        - **embedding** (``forward(..., embed=True)``): :math:`(B, H)` or
          :math:`(|\mathcal{V}|, H)` with ``H = hidden_channels`` (``in_channels`` for a
          one-layer model).
    """

    arch: ClassVar[Arch]
    precision: str = "fp32"
    """The precision of the linear layers, one of :data:`gnnaas.models.PRECISIONS`: ``"int8"``
    on the inference-only copies :func:`~gnnaas.models.quantize_int8` returns (their
    :meth:`train` refuses training mode)."""
    train_fanouts: tuple[int, ...] | None = None
    """The fanouts (PyG order) the weights were trained with, when known (set when a
    gnnaas-trained variant is loaded). A sum aggregation (GIN) learned the scale of sums over at
    most that many sampled neighbors (its batch norm's statistics too); run over more neighbors,
    as an exact pass over full neighborhoods does, each target's sum is scaled down to that
    magnitude, ``sum · min(count, cap) / count``: the expected sum of the sampled neighbors it
    was trained on. Sampled with the training fanouts or fewer, no sum is scaled."""
    sum_caps: tuple[int | None, ...] | None = None
    """Per layer, the cap of :func:`aggregate_neighbors` on sampled blocks (set by
    :meth:`configure_fanouts`: only for layers sampled with more neighbors than trained)."""

    def __init__(
        self,
        in_channels: int,
        hidden_channels: int,
        out_channels: int,
        num_layers: int = 2,
        dropout: float = 0.5,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        for arg, value in (
            ("in_channels", in_channels),
            ("hidden_channels", hidden_channels),
            ("out_channels", out_channels),
            ("num_layers", num_layers),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} expects {arg} to be an integer >= 1 (got {value!r})")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"{name} expects dropout in [0, 1) (got {dropout!r})")
        self.in_channels = in_channels
        self.hidden_channels = hidden_channels
        self.out_channels = out_channels
        self.num_layers = num_layers
        self.dropout = float(dropout)

        dims = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.convs = torch.nn.ModuleList(
            self.init_conv(dims[i], dims[i + 1]) for i in range(num_layers)
        )

    def exact_cap(self, layer: int) -> int | None:
        """The training fanout a sum over layer ``layer``'s full neighborhoods is scaled to
        (:attr:`train_fanouts`), or ``None`` (a mean, or no recorded training fanouts)."""
        if self.train_fanouts is None or self.aggregation(layer) != "sum":
            return None
        cap = int(self.train_fanouts[self.num_layers - 1 - layer])  # PyG order: seeds' hop first
        return cap if cap > 0 else None

    def configure_fanouts(self, fanouts: Sequence[int] | None) -> None:
        """Sets :attr:`sum_caps` for sampling with ``fanouts`` (PyG order; ``-1`` keeps all):
        a layer whose sampled neighbors may exceed its training fanout gets that cap.

        Args:
            fanouts (Sequence[int], optional): the sampler's fanouts; ``None`` clears the caps.
        """
        caps: list[int | None] = []
        for layer in range(self.num_layers):
            cap = self.exact_cap(layer)
            served = None if fanouts is None else int(fanouts[self.num_layers - 1 - layer])
            binding = cap is not None and served is not None and not 0 < served <= cap
            caps.append(cap if binding else None)
        self.sum_caps = tuple(caps) if any(c is not None for c in caps) else None

    def init_conv(self, in_channels: int, out_channels: int) -> MessagePassing:
        """Builds the convolution of one layer (the hook subclasses implement).

        Args:
            in_channels (int): input width of the layer.
            out_channels (int): output width of the layer.

        Returns:
            MessagePassing: a PyG convolution taking ``(x_src, x_dst)`` pairs or a plain ``x``.
        """
        raise NotImplementedError

    def first_layer_weights(self) -> list[Tensor]:
        """The first-layer weight matrices that multiply the raw input features.

        Returns:
            list[Tensor]: each ``[hidden_channels, in_channels]`` (``[out_channels, in_channels]``
            for a one-layer model), live parameters (detach before editing).
        """
        raise NotImplementedError

    def train(self, mode: bool = True) -> Self:
        """Sets training (``mode=True``) or eval mode, as :meth:`torch.nn.Module.train`.

        Raises:
            ValueError: ``mode`` is true on a model whose :attr:`precision` is not ``fp32``
                (quantized linear layers have no gradients to train).
        """
        if mode and self.precision != "fp32":
            raise ValueError(
                f"{type(self).__name__}.train: a model of precision {self.precision!r} is for "
                "inference only (got mode=True); train the fp32 model, then quantize it again"
            )
        return super().train(mode)

    def reset_parameters(self) -> None:
        """Re-initializes every convolution."""
        for conv in self.convs:
            cast(MessagePassing, conv).reset_parameters()

    @overload
    def forward(
        self,
        x: Tensor,
        adjs: Tensor | Sequence[Block],
        *,
        embed: Literal[False] = ...,
        pyg_convs: bool = ...,
    ) -> Tensor: ...

    @overload
    def forward(
        self,
        x: Tensor,
        adjs: Tensor | Sequence[Block],
        *,
        embed: Literal[True],
        pyg_convs: bool = ...,
    ) -> tuple[Tensor, Tensor]: ...

    @overload
    def forward(
        self, x: Tensor, adjs: Tensor | Sequence[Block], *, embed: bool, pyg_convs: bool = ...
    ) -> Tensor | tuple[Tensor, Tensor]: ...

    def forward(
        self,
        x: Tensor,
        adjs: Tensor | Sequence[Block],
        *,
        embed: bool = False,
        pyg_convs: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Runs the model on sampled blocks or on a full graph.

        Args:
            x (Tensor): ``[N, F]`` input features of the sampled nodes (``n_id`` order, seeds
                first) or of every node.
            adjs (Tensor | Sequence[Block]): ``num_layers`` blocks, outermost hop first, or a
                full-graph ``edge_index`` ``[2, E]``.
            embed (bool, optional): also return the targets' embeddings: the input of the last
                convolution (after the previous layer's ReLU; dropout too in training mode),
                restricted to the seeds for blocks. For a one-layer model that is the input
                features ``x`` themselves (a view of them). (default: ``False``)
            pyg_convs (bool, optional): on blocks in eval mode, run PyG's convolutions instead
                of the fused layers (:meth:`fused_layer`), as training does: the reference to
                compare the fused layers with. A model whose sums are scaled (:attr:`sum_caps`)
                still runs the fused layers, as PyG's convolutions sum plainly.
                (default: ``False``)

        Returns:
            Tensor | tuple[Tensor, Tensor]: ``[B, C]`` logits of the seeds, or ``[N, C]`` on the
            full graph; with ``embed``, the pair ``(embedding, logits)``, ``embedding``
            ``[B, hidden_channels]`` or ``[N, hidden_channels]``.
        """
        if isinstance(adjs, Tensor):
            for i, conv in enumerate(self.convs):
                h = x  # the last convolution's input once the loop ends
                x = conv(x, adjs)  # [N, F_l]
                x = self._between(x, i)
            return (h, x) if embed else x
        if len(adjs) != self.num_layers:
            raise ValueError(
                f"{type(self).__name__}.forward expects {self.num_layers} blocks "
                f"(got {len(adjs)}); sample with one fanout per layer"
            )
        # Scaled sums (sum_caps) exist in the fused layers only: PyG's convolutions sum plainly.
        fused = not self.training and (not pyg_convs or self.sum_caps is not None)
        for i, (conv, block) in enumerate(zip(self.convs, adjs, strict=True)):
            h = x
            out = self.fused_layer(i, x, block) if fused else None
            if out is None:
                size = (int(block.size[0]), int(block.size[1]))
                x_dst = x[: size[1]]  # targets are the first num_dst sources
                out = conv((x, x_dst), block.edge_index, size=size)  # [num_dst, F_l]
            x = self._between(out, i)
        if embed:
            return h[: int(adjs[-1].size[1])], x  # [B, H]: the seeds are the first targets
        return x

    def fused_layer(self, layer: int, x: Tensor, block: Block) -> Tensor | None:
        """Layer ``layer`` on a sampled block in eval mode, in a few fused tensor operations.

        The layer's neighbor aggregation (:meth:`aggregation`, :func:`aggregate_neighbors`) then
        its :meth:`update`: the convolution's output up to floating-point summation order;
        ``None`` (a convolution these do not compute) falls back to the PyG convolution. On the
        small blocks of a served request, PyG's message passing costs more in Python (argument
        inspection, message/aggregate/update hooks) than in arithmetic, which the fused layer
        saves (``benchmarks/results/latency.md`` measures both).

        Args:
            layer (int): the layer's index.
            x (Tensor): ``[num_src, F]`` the block's source rows; the first ``num_dst`` are its
                targets.
            block (Block): the layer's bipartite block.
        """
        aggr = self.aggregation(layer)
        if aggr is None:
            return None
        cap = None if self.sum_caps is None else self.sum_caps[layer]
        agg = aggregate_neighbors(x, block, mean=aggr == "mean", cap=cap)  # [num_dst, F]
        return self.update(layer, agg, x[: int(block.size[1])])

    def aggregation(self, layer: int) -> str | None:
        """How layer ``layer`` aggregates its in-neighbors when :meth:`update` computes the rest
        of it: ``"sum"`` or ``"mean"``; ``None`` when only the PyG convolution runs it.

        The fused sampled layer (:meth:`fused_layer`) and the exact layer-wise pass
        (:mod:`gnnaas.inference.layerwise`) aggregate in their own way (a block's messages, a
        CSR slice of the whole graph) and share the update.
        """
        return None

    def update(self, layer: int, agg: Tensor, x_dst: Tensor) -> Tensor:
        """Layer ``layer``'s output from its targets' aggregated neighbors and own rows.

        Args:
            layer (int): the layer's index (one whose :meth:`aggregation` is not ``None``).
            agg (Tensor): ``[num_dst, F]`` the aggregated in-neighbors.
            x_dst (Tensor): ``[num_dst, F]`` the targets' own rows.

        Returns:
            Tensor: ``[num_dst, F_l]`` the convolution's output (before the activation).
        """
        raise NotImplementedError(f"{type(self).__name__} layer {layer} has no fused update")

    def _between(self, x: Tensor, layer: int) -> Tensor:
        if layer == self.num_layers - 1:
            return x
        x = F.relu(x)
        # dropout is the identity in eval mode: no call on the request path
        return F.dropout(x, p=self.dropout, training=True) if self.training else x

    def __repr__(self) -> str:
        precision = "" if self.precision == "fp32" else f", precision={self.precision!r}"
        return (
            f"{type(self).__name__}({self.in_channels}, {self.hidden_channels}, "
            f"{self.out_channels}, num_layers={self.num_layers}, dropout={self.dropout}"
            f"{precision})"
        )
