"""Type aliases shared across gnnaas."""

from __future__ import annotations

from os import PathLike
from typing import TypeAlias

import torch

__all__ = ["Device", "PathType"]

PathType: TypeAlias = str | PathLike[str]
Device: TypeAlias = str | torch.device
