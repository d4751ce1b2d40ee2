"""The layer layouts of PyG's own ``GraphSAGE`` and ``GIN`` models, run by the gnnaas forward.

A user who trained ``torch_geometric.nn.models.GraphSAGE`` or ``GIN`` (the classes a PyG user
trains) brings its ``state_dict``; the classes here have the same modules under the same keys
(``convs.<i>...``), so that state dict loads with ``strict=True``, and run it through
:meth:`gnnaas.models.GNN.forward` (sampled blocks or a full graph), which does what PyG's
``BasicGNN.forward`` does for ``norm=None``, ``jk=None``, ``act="relu"``: every layer but the last
is followed by ReLU and dropout.

- ``GraphSAGE``: ``SAGEConv(in, out)`` per layer (mean aggregation, root weight): the layout of
  :class:`~gnnaas.models.SAGE`, so this family's SAGE *is* that class.
- ``GIN``: ``GINConv(MLP([in, out, out]))`` per layer, the MLP without normalization
  (``lins.0 → ReLU → lins.1``): unlike :class:`~gnnaas.models.GIN`, whose MLP is
  ``Linear(in, hidden) → BatchNorm1d → ReLU → Linear(hidden, out)``.

Pruned variants of a user's model are trained in the same family, so every variant of the
dataset loads and runs the same way.
"""

from __future__ import annotations

from typing import cast

from torch import Tensor
from torch_geometric.nn import MLP, GINConv

from gnnaas.models.base import GNN, Arch
from gnnaas.models.gin import gin_aggregation, gin_update
from gnnaas.models.sage import SAGE

__all__ = ["PYG_CLASSES", "PyGGIN", "PyGSAGE"]


class PyGSAGE(SAGE):
    """PyG ``GraphSAGE`` (``norm=None``, ``jk=None``): the layout of :class:`~gnnaas.models.SAGE`.

    Example:
        >>> PyGSAGE(1433, 64, 7)
        PyGSAGE(1433, 64, 7, num_layers=2, dropout=0.5)
    """


class PyGGIN(GNN):
    """PyG ``GIN`` (``norm=None``, ``jk=None``): ``GINConv(MLP([in, out, out]))`` per layer.

    Args:
        in_channels (int): number of input features ``F``.
        hidden_channels (int): width of the hidden layers.
        out_channels (int): number of classes ``C``.
        num_layers (int, optional): number of layers. (default: ``2``)
        dropout (float, optional): dropout after each hidden activation. (default: ``0.5``)

    Example:
        >>> PyGGIN(1433, 64, 7)
        PyGGIN(1433, 64, 7, num_layers=2, dropout=0.5)
    """

    arch = Arch.GIN

    def init_conv(self, in_channels: int, out_channels: int) -> GINConv:
        mlp = MLP([in_channels, out_channels, out_channels], act="relu", norm=None)
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
        mlp = cast(MLP, cast(GINConv, self.convs[0]).nn)
        return [cast(Tensor, mlp.lins[0].weight)]


PYG_CLASSES: dict[str, type[GNN]] = {"GraphSAGE": PyGSAGE, "GIN": PyGGIN}
"""PyG model class name → the gnnaas class with its layout."""
