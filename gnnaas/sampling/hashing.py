"""Counter-based hashing in plain torch int64 ops: draws that are pure functions of their inputs.

Consistent sampling (serving) needs, for every node, random-looking draws that depend only on
(node id, hop, seed, draw index), never on which other nodes share the batch. A counter-based hash
gives exactly that: ``draw = mix(node, key(seed, hop), i)``.

Every value here is a 32-bit unsigned integer held in an ``int64`` tensor, and every intermediate
stays in ``(-2**63, 2**63)``: a 32-bit constant is used as its signed twin (congruent mod
``2**32``), so a product never overflows, and values are masked back to ``[0, 2**32)`` before any
right shift, which thus never sees a negative number. The same code therefore gives
bit-identical results on every device and backend (CPU, CUDA), whatever their overflow behaviour.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["MASK32", "fmix32", "hop_key", "mul32", "node_draws"]

MASK32 = 0xFFFFFFFF
_MASK64 = 0xFFFFFFFFFFFFFFFF
_GOLDEN32 = 0x9E3779B9  # 2**32 / phi: a Weyl step that visits all 2**32 values
_GOLDEN64 = 0x9E3779B97F4A7C15
_FMIX_C1 = 0x85EBCA6B  # murmur3 fmix32 constants
_FMIX_C2 = 0xC2B2AE35


def mul32(h: Tensor, c: int) -> Tensor:
    """Returns ``(h * c) mod 2**32`` without int64 overflow.

    ``c`` is replaced by its signed 32-bit twin (``c - 2**32`` when ``c >= 2**31``), which is
    congruent mod ``2**32``; then ``|h * c| < 2**63`` and masking the two's-complement product
    with ``2**32 - 1`` gives the residue.

    Args:
        h (Tensor): int64 values in ``[0, 2**32)``.
        c (int): a constant in ``[0, 2**32)``.

    Returns:
        Tensor: int64 values in ``[0, 2**32)``, same shape as ``h``.

    Shapes:
        - **input:** ``h`` of any shape.
        - **output:** the shape of ``h``.
    """
    signed = c - (1 << 32) if c >= 1 << 31 else c
    return (h * signed).bitwise_and_(MASK32)


def fmix32(h: Tensor) -> Tensor:
    """The murmur3 32-bit finalizer: a bijection of ``[0, 2**32)`` with full avalanche.

    Args:
        h (Tensor): int64 values in ``[0, 2**32)``; not modified.

    Returns:
        Tensor: int64 values in ``[0, 2**32)``.

    Shapes:
        - **input:** ``h`` of any shape.
        - **output:** the shape of ``h``.

    Example:
        >>> fmix32(torch.tensor([0, 1])).tolist()
        [0, 1364076727]
    """
    h = h ^ (h >> 16)
    h = mul32(h, _FMIX_C1)
    h ^= h >> 13
    h = mul32(h, _FMIX_C2)
    h ^= h >> 16
    return h


def _splitmix64(x: int) -> int:
    # Python ints: exact arithmetic, masked to 64 bits.
    x = (x + _GOLDEN64) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def hop_key(seed: int, hop: int) -> int:
    """A 32-bit key derived from the sampler seed and the hop index.

    Args:
        seed (int): the sampler seed (any Python int, taken mod ``2**64``).
        hop (int): the hop index, ``0`` for the seeds' own neighbors.

    Returns:
        int: a key in ``[0, 2**32)``.
    """
    return _splitmix64(_splitmix64(seed & _MASK64) ^ (hop & _MASK64)) & MASK32


def node_draws(nodes: Tensor, key: int, num_draws: int) -> Tensor:
    r"""Uniform 32-bit draws that are a pure function of (node id, key, draw index).

    ``draws[i, r] = fmix32((fmix32(fmix32(nodes[r] ^ key)) + i * golden) mod 2**32)``: the node
    id is mixed with the key once per node, then a Weyl sequence over the draw index goes through
    the finalizer, so the ``num_draws`` draws of a node are distinct inputs to a bijection.

    Args:
        nodes (Tensor): int64 node ids in ``[0, 2**32)``.
        key (int): a key in ``[0, 2**32)`` (see :func:`hop_key`).
        num_draws (int): draws per node.

    Returns:
        Tensor: int64 values in ``[0, 2**32)``.

    Shapes:
        - **input:** ``nodes`` :math:`(M,)`.
        - **output:** :math:`(\text{num\_draws}, M)`, draw-major.
    """
    base = fmix32(fmix32(nodes ^ key))  # [M]
    steps = torch.arange(num_draws, dtype=torch.int64, device=nodes.device).mul_(_GOLDEN32)
    h = (steps.unsqueeze(1) + base).bitwise_and_(MASK32)  # [num_draws, M]
    return fmix32(h)
