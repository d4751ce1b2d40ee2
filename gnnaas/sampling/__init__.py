"""Vectorized k-hop neighbor sampling into PyG-style bipartite blocks.

:class:`NeighborSampler` (``neighbor.py``) has PyG ``NeighborLoader`` semantics, in torch ops only;
its :class:`SampledSubgraph` holds one :class:`Block` per layer (``subgraph.py``). ``hashing.py``
has the counter-based hash behind its draws. :class:`DepthSampler` (``depth.py``) is the serving
sampler, built by the runtime (:meth:`gnnaas.runtime.RuntimeGraph.sampler`) for the server, the
profiler and evaluation alike.
"""

from gnnaas.sampling.depth import DepthSampler
from gnnaas.sampling.neighbor import NeighborSampler
from gnnaas.sampling.subgraph import Block, SampledSubgraph

__all__ = [
    "Block",
    "DepthSampler",
    "NeighborSampler",
    "SampledSubgraph",
]
