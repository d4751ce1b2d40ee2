"""Building a model by name: the architectures of each layer layout (family).

Apart from :mod:`gnnaas.models.base` so that the base class does not import its subclasses.
"""

from __future__ import annotations

from gnnaas.errors import ConfigError
from gnnaas.models.base import GNN, Arch
from gnnaas.models.gin import GIN
from gnnaas.models.pyg import PyGGIN, PyGSAGE
from gnnaas.models.sage import SAGE

__all__ = ["build_model"]

_FAMILIES: dict[str, dict[Arch, type[GNN]]] = {
    "gnnaas": {Arch.SAGE: SAGE, Arch.GIN: GIN},
    "pyg": {Arch.SAGE: PyGSAGE, Arch.GIN: PyGGIN},
}


def build_model(
    arch: str | Arch,
    in_channels: int,
    hidden_channels: int,
    out_channels: int,
    num_layers: int = 2,
    dropout: float = 0.5,
    family: str = "gnnaas",
) -> GNN:
    """Builds an untrained model of architecture ``arch``.

    Args:
        arch (str | Arch): ``sage`` or ``gin`` (any case).
        in_channels (int): number of input features.
        hidden_channels (int): width of the hidden layers.
        out_channels (int): number of classes.
        num_layers (int, optional): number of convolutions. (default: ``2``)
        dropout (float, optional): dropout between layers. (default: ``0.5``)
        family (str, optional): the layer layout: ``gnnaas`` (:class:`~gnnaas.models.SAGE`,
            :class:`~gnnaas.models.GIN`) or ``pyg``, that of PyG's own ``GraphSAGE`` and ``GIN``
            models (:mod:`gnnaas.models.pyg`), for variants of a user's PyG model.
            (default: ``"gnnaas"``)

    Returns:
        GNN: a model of that architecture and layout.

    Raises:
        ConfigError: ``arch`` is not an architecture or ``family`` not a layout.

    Example:
        >>> build_model("sage", 1433, 256, 7)
        SAGE(1433, 256, 7, num_layers=2, dropout=0.5)
    """
    if family not in _FAMILIES:
        raise ConfigError(f"unknown model family {family!r}; choose {' or '.join(_FAMILIES)}")
    return _FAMILIES[family][Arch.parse(arch)](
        in_channels, hidden_channels, out_channels, num_layers=num_layers, dropout=dropout
    )
