"""Moved: the serving sampler lives in :mod:`gnnaas.sampling.depth` (kept as a re-export)."""

from gnnaas.sampling.depth import DepthSampler

__all__ = ["DepthSampler"]
