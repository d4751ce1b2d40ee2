"""GIN (Xu et al., 2019) with a two-layer MLP per layer."""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor
from torch_geometric.nn import GINConv

from gnnaas.models.base import GNN, Arch

__all__ = ["GIN", "gin_aggregation", "gin_update"]


def gin_aggregation(conv: GINConv) -> str | None:
    """``"sum"`` for a ``GINConv`` that sums its neighbors, else ``None`` (see
    :meth:`gnnaas.models.GNN.aggregation`)."""
    return "sum" if conv.aggr == "add" else None


def gin_update(conv: GINConv, agg: Tensor, x_dst: Tensor) -> Tensor:
    """``nn((1 + eps) * x_dst + agg)``: ``GINConv``'s output without its message-passing dispatch
    (``agg`` is summed into in place)."""
    agg += (1 + conv.eps) * x_dst
    return cast(Tensor, conv.nn(agg))


class GIN(GNN):
    r"""Graph Isomorphism Network: every layer is :math:`\mathbf{x}'_i =
    \mathrm{MLP}\big((1 + \epsilon)\, \mathbf{x}_i + \sum_{j \in \mathcal{N}(i)} \mathbf{x}_j\big)`
    (PyG's ``GINConv``, :math:`\epsilon = 0`) with the MLP
    ``Linear(in, hidden) → BatchNorm1d(hidden) → ReLU → Linear(hidden, out)``.

    The batch norm keeps the sum aggregation's scale (which grows with the degree) stable across
    mini-batches; in eval mode it uses its running statistics, so a node's output does not depend
    on the other nodes of its batch.

    Args:
        in_channels (int): number of input features ``F``.
        hidden_channels (int): width of the hidden layers (and of every MLP's hidden layer).
        out_channels (int): number of classes ``C``.
        num_layers (int, optional): number of layers. (default: ``2``)
        dropout (float, optional): dropout after each hidden activation. (default: ``0.5``)

    Shapes:
        - **input:** ``x`` :math:`(N, F)` with ``adjs`` a list of blocks or an ``edge_index``
          :math:`(2, E)` (see :class:`~gnnaas.models.GNN`).
        - **output:** :math:`(B, C)` for blocks (the seeds), :math:`(N, C)` for a full graph.

    Example:
        >>> GIN(1433, 256, 7)
        GIN(1433, 256, 7, num_layers=2, dropout=0.5)
    """

    arch = Arch.GIN

    def init_conv(self, in_channels: int, out_channels: int) -> GINConv:
        mlp = torch.nn.Sequential(
            torch.nn.Linear(in_channels, self.hidden_channels),
            torch.nn.BatchNorm1d(self.hidden_channels),
            torch.nn.ReLU(),
            torch.nn.Linear(self.hidden_channels, out_channels),
        )
        return GINConv(mlp, train_eps=False)

    def aggregation(self, layer: int) -> str | None:
        return gin_aggregation(cast(GINConv, self.convs[layer]))

    def update(self, layer: int, agg: Tensor, x_dst: Tensor) -> Tensor:
        return gin_update(cast(GINConv, self.convs[layer]), agg, x_dst)

    def first_layer_weights(self) -> list[Tensor]:
        """The weight of the first ``Linear`` of the first layer's MLP.

        Returns:
            list[Tensor]: ``[weight]``, ``[hidden_channels, in_channels]``.
        """
        mlp = cast(torch.nn.Sequential, cast(GINConv, self.convs[0]).nn)
        first = cast(torch.nn.Linear, mlp[0])
        return [first.weight]
