"""What the sampler returns: per-layer bipartite blocks and the sampled subgraph."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from gnnaas.typing import Device

__all__ = ["Block", "SampledSubgraph"]


@dataclass(frozen=True, eq=False)
class Block:
    r"""One bipartite message-passing layer in local ids, ready for a PyG convolution.

    Args:
        edge_index (Tensor): ``[2, E_l]`` int64; row 0 the source (neighbor) in ``[0, size[0])``,
            row 1 the target in ``[0, size[1])``. Messages flow source -> target. The blocks of
            one sample share one buffer: ``blocks[l]`` (``l > 0``) is a column prefix of
            ``blocks[0]``, a view whose two rows are each contiguous.
        size (tuple[int, int]): ``(num_src, num_dst)``; the targets are the first ``num_dst``
            sources, so a layer runs as ``conv((x, x[:size[1]]), edge_index, size=size)``.

    Shapes:
        - **edge_index:** :math:`(2, E_l)`
        - **layer input / output:** :math:`(\text{size}[0], F)` -> :math:`(\text{size}[1], F')`
    """

    edge_index: Tensor
    size: tuple[int, int]

    @property
    def num_edges(self) -> int:
        """Number of edges of the block."""
        return int(self.edge_index.size(1))

    def to(self, device: Device, non_blocking: bool = False) -> Block:
        """Returns the block with ``edge_index`` on ``device``."""
        return Block(self.edge_index.to(device, non_blocking=non_blocking), self.size)

    def __repr__(self) -> str:
        return f"Block(edge_index=[2, {self.num_edges}], size={self.size})"


@dataclass(eq=False)
class SampledSubgraph:
    """The k-hop sample of a batch of seeds.

    Args:
        n_id (Tensor): ``[N_s]`` int64 global ids of the sampled nodes, seeds first
            (``n_id[:batch_size]`` are the seeds, in the order given), then the nodes of each hop
            in order of discovery. Row ``i`` of the layer-0 input is node ``n_id[i]``.
        batch_size (int): number of seeds.
        blocks (list[Block]): one per layer, forward order: ``blocks[0]`` feeds the first layer
            (outermost hop, ``size[0] == N_s``); ``blocks[-1].size[1] == batch_size``.
        num_sampled_nodes (list[int]): PyG-style counts: ``[batch_size, new at hop 0, ...]``
            (``len(fanouts) + 1`` entries summing to ``N_s``).

    Shapes:
        - **n_id:** :math:`(N_s,)`
        - **blocks[l].edge_index:** :math:`(2, E_l)`, with :math:`E_0` all sampled edges
    """

    n_id: Tensor
    batch_size: int
    blocks: list[Block]
    num_sampled_nodes: list[int] = field(default_factory=list)

    @property
    def num_nodes(self) -> int:
        """Number of sampled nodes ``N_s`` (seeds included)."""
        return int(self.n_id.numel())

    @property
    def num_sampled_edges(self) -> int:
        """Number of sampled edges over all hops (the edges of ``blocks[0]``)."""
        return self.blocks[0].num_edges if self.blocks else 0

    def to(self, device: Device, non_blocking: bool = False) -> SampledSubgraph:
        """Returns the sample with ``n_id`` and every block on ``device``."""
        return SampledSubgraph(
            self.n_id.to(device, non_blocking=non_blocking),
            self.batch_size,
            [b.to(device, non_blocking=non_blocking) for b in self.blocks],
            list(self.num_sampled_nodes),
        )

    def __repr__(self) -> str:
        return (
            f"SampledSubgraph(n_id=[{self.num_nodes}], batch_size={self.batch_size}, "
            f"num_sampled_edges={self.num_sampled_edges}, blocks={self.blocks})"
        )
