"""Vectorized k-hop neighbor sampling into PyG-style bipartite blocks.

:class:`NeighborSampler` (``neighbor.py``) has PyG ``NeighborLoader`` semantics, in torch ops only;
its :class:`SampledSubgraph` holds one :class:`Block` per layer (``subgraph.py``). ``hashing.py``
has the counter-based hash behind its draws.
"""

from gnnaas.sampling.neighbor import NeighborSampler
from gnnaas.sampling.subgraph import Block, SampledSubgraph

__all__ = ["Block", "NeighborSampler", "SampledSubgraph"]
