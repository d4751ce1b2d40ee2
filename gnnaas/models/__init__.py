"""SAGE and GIN from ``torch_geometric.nn`` convolutions; one forward for blocks and graphs; int8
copies for CPU inference."""

from gnnaas.models.base import FAMILIES, GNN, Arch
from gnnaas.models.build import build_model
from gnnaas.models.gin import GIN
from gnnaas.models.quantize import (
    PRECISIONS,
    calibrate_int8,
    int8_available,
    model_bytes,
    quantize_int8,
)
from gnnaas.models.sage import SAGE

__all__ = [
    "Arch",
    "FAMILIES",
    "GIN",
    "GNN",
    "PRECISIONS",
    "SAGE",
    "build_model",
    "calibrate_int8",
    "int8_available",
    "model_bytes",
    "quantize_int8",
]
