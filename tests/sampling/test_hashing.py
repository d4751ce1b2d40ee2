"""Counter-based hashing: exact 32-bit arithmetic in int64 ops, pure functions of their inputs."""

from __future__ import annotations

import pytest
import torch

from gnnaas.sampling.hashing import MASK32, fmix32, hop_key, mul32, node_draws


def _fmix32_reference(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & MASK32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & MASK32
    return h ^ (h >> 16)


EDGE_VALUES = [0, 1, 2, 0x7FFFFFFF, 0x80000000, 0xDEADBEEF, MASK32]


def test_fmix32_matches_murmur3() -> None:
    g = torch.Generator().manual_seed(0)
    h = torch.cat([torch.tensor(EDGE_VALUES), torch.randint(0, 1 << 32, (2000,), generator=g)])
    assert fmix32(h).tolist() == [_fmix32_reference(v) for v in h.tolist()]
    assert fmix32(torch.tensor([1])).item() == 0x514E28B7  # murmur3's fmix32(1)


@pytest.mark.parametrize("c", [0, 1, 12345, 0x7FFFFFFF, 0x80000000, 0x85EBCA6B, MASK32])
def test_mul32_is_exact(c: int) -> None:
    g = torch.Generator().manual_seed(1)
    h = torch.cat([torch.tensor(EDGE_VALUES), torch.randint(0, 1 << 32, (500,), generator=g)])
    assert mul32(h, c).tolist() == [(v * c) & MASK32 for v in h.tolist()]


def test_fmix32_does_not_modify_its_input() -> None:
    h = torch.tensor(EDGE_VALUES)
    before = h.clone()
    fmix32(h)
    assert torch.equal(h, before)


def test_hop_key_is_a_deterministic_32_bit_key() -> None:
    keys = {hop_key(seed, hop) for seed in (0, 1, -1, 2**40) for hop in range(4)}
    assert len(keys) == 16 and all(0 <= k <= MASK32 for k in keys)
    assert hop_key(3, 1) == hop_key(3, 1)


def test_node_draws_depend_only_on_node_key_and_index() -> None:
    nodes = torch.tensor([5, 0, 2**32 - 1, 17])
    draws = node_draws(nodes, key=123, num_draws=6)
    assert draws.shape == (6, 4) and draws.dtype == torch.int64
    assert int(draws.min()) >= 0 and int(draws.max()) <= MASK32
    alone = node_draws(torch.tensor([17]), key=123, num_draws=6)
    assert torch.equal(alone[:, 0], draws[:, 3])  # batch-mates do not matter
    assert torch.equal(node_draws(nodes, 123, 3), draws[:3])  # prefix-stable in the index
    assert not torch.equal(node_draws(nodes, 124, 6), draws)
    assert draws[:, 0].unique().numel() == 6  # distinct draws of one node


def test_node_draws_are_uniform_bits() -> None:
    draws = node_draws(torch.arange(20_000), key=7, num_draws=4)
    bits = (draws.unsqueeze(-1) >> torch.arange(32)) & 1  # [4, N, 32]
    freq = bits.double().mean(dim=(0, 1))
    assert float((freq - 0.5).abs().max()) < 0.01
