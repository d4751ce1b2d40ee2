"""Splits: seeded, stratified 60/20/20, and the dataset's own split when it trains on ≥ 10%."""

from __future__ import annotations

import torch

from gnnaas.data import choose_split, stratified_split


def _labels() -> torch.Tensor:
    return torch.cat([torch.full((n,), c) for c, n in enumerate([500, 300, 150, 50])])


def test_stratified_split_is_disjoint_complete_and_stratified() -> None:
    y = _labels()
    train, val, test = stratified_split(y, seed=3)
    assert (train.numel(), val.numel(), test.numel()) == (600, 200, 200)
    allidx = torch.cat([train, val, test])
    assert torch.equal(allidx.sort().values, torch.arange(1000))
    for part, share in ((train, 0.6), (val, 0.2), (test, 0.2)):
        assert torch.equal(part, part.sort().values) and part.dtype == torch.long
        counts = torch.bincount(y[part], minlength=4)
        assert torch.equal(counts, (torch.tensor([500, 300, 150, 50]) * share).round().long())


def test_stratified_split_is_seeded() -> None:
    y = _labels()
    a, b = stratified_split(y, seed=0), stratified_split(y, seed=0)
    c = stratified_split(y, seed=1)
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])


def test_stratified_split_multi_label_uses_first_label() -> None:
    y = torch.zeros(100, 5)
    y[:50, 1] = 1
    y[50:, 3] = 1
    y[:, 4] = 1
    train, val, test = stratified_split(y, seed=0)
    assert (train.numel(), val.numel(), test.numel()) == (60, 20, 20)
    assert int((train < 50).sum()) == 30


def test_choose_split_keeps_own_split_from_ten_percent() -> None:
    y = _labels()
    own = (torch.arange(100), torch.arange(100, 200), torch.arange(200, 1000))
    train, val, test = choose_split(y, own, seed=0)
    assert torch.equal(train, own[0]) and torch.equal(test, own[2])
    small = (torch.arange(99), torch.arange(100, 200), torch.arange(200, 1000))
    train, _, _ = choose_split(y, small, seed=0)
    assert train.numel() == 600
    assert choose_split(y, None, seed=0)[0].numel() == 600
