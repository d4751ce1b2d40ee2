"""SAGE and GIN from ``torch_geometric.nn`` convolutions; one forward for blocks and graphs."""

from gnnaas.models.base import FAMILIES, GNN, Arch, build_model
from gnnaas.models.gin import GIN
from gnnaas.models.sage import SAGE

__all__ = ["Arch", "FAMILIES", "GIN", "GNN", "SAGE", "build_model"]
