"""GraphSAGE (Hamilton et al., 2017) with mean aggregation."""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor
from torch_geometric.nn import SAGEConv

from gnnaas.models.base import GNN, Arch

__all__ = ["SAGE"]


class SAGE(GNN):
    r"""GraphSAGE: every layer is :math:`\mathbf{x}'_i = \mathbf{W}_r \mathbf{x}_i +
    \mathbf{W}_l \cdot \mathrm{mean}_{j \in \mathcal{N}(i)} \mathbf{x}_j` (PyG's ``SAGEConv``).

    Args:
        in_channels (int): number of input features ``F``.
        hidden_channels (int): width of the hidden layers.
        out_channels (int): number of classes ``C``.
        num_layers (int, optional): number of layers. (default: ``2``)
        dropout (float, optional): dropout after each hidden activation. (default: ``0.5``)

    Shapes:
        - **input:** ``x`` :math:`(N, F)` with ``adjs`` a list of blocks or an ``edge_index``
          :math:`(2, E)` (see :class:`~gnnaas.models.GNN`).
        - **output:** :math:`(B, C)` for blocks (the seeds), :math:`(N, C)` for a full graph.

    Example:
        >>> SAGE(1433, 256, 7)
        SAGE(1433, 256, 7, num_layers=2, dropout=0.5)
    """

    arch = Arch.SAGE

    def init_conv(self, in_channels: int, out_channels: int) -> SAGEConv:
        return SAGEConv(in_channels, out_channels, aggr="mean")

    def aggregation(self, layer: int) -> str | None:
        """``"mean"`` for ``SAGEConv``'s layout here (mean aggregation, root weight, no
        projection or normalization), else ``None``."""
        conv = cast(SAGEConv, self.convs[layer])
        if conv.project or conv.normalize or not conv.root_weight or conv.aggr != "mean":
            return None  # not the layout update() computes: PyG's convolution runs it
        return "mean"

    def update(self, layer: int, agg: Tensor, x_dst: Tensor) -> Tensor:
        """``lin_l(agg) + lin_r(x_dst)``: ``SAGEConv``'s output without its dispatch."""
        conv = cast(SAGEConv, self.convs[layer])
        if self.precision != "fp32":
            # quantized linears hold packed weights, not a float matrix to addmm: call them
            return cast(Tensor, conv.lin_l(agg)).add_(conv.lin_r(x_dst))  # [num_dst, F_l]
        weight, bias = conv.lin_l.weight, conv.lin_l.bias
        out = agg @ weight.t() if bias is None else torch.addmm(bias, agg, weight.t())
        return out.addmm_(x_dst, conv.lin_r.weight.t())  # [num_dst, F_l]

    def first_layer_weights(self) -> list[Tensor]:
        """The neighbor (``lin_l``) and root (``lin_r``) weights of the first layer.

        Returns:
            list[Tensor]: ``[lin_l.weight, lin_r.weight]``, each ``[hidden_channels, in_channels]``.
        """
        conv = cast(SAGEConv, self.convs[0])
        return [conv.lin_l.weight, conv.lin_r.weight]
