"""Exact whole-graph inference of trained variants: as accurate as the sampled pass it replaces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from gnnaas.variants.exact import exact_pass
from gnnaas.variants.pipeline import generate_variants
from gnnaas.variants.repository import VariantRepository
from gnnaas.variants.training import TrainConfig


def test_gin_exact_is_within_a_point_of_its_sampled_accuracy_on_cora(
    cora: Any, tmp_path: Path
) -> None:
    """GIN's batch norm learned the scale of sums over at most its training fanouts; the exact
    pass scales its full-neighborhood sums to that (``GNN.train_fanouts``), so an ``@exact``
    GIN is as accurate as the sampled one it replaces (unscaled, it lost points)."""
    repo = VariantRepository(tmp_path)
    config = TrainConfig(hidden_channels=128, max_epochs=60, patience=10)
    generate_variants(cora, repo, archs=["gin"], prunes=[1], config=config)
    run = exact_pass(cora, repo, "gin-full-1x")
    for split in ("val", "test"):
        accuracy = run.accuracy[split]
        assert abs(accuracy["exact"] - accuracy["sampled"]) <= 1.0, (split, accuracy)
    model = repo.load(cora.name, "gin-full-1x").model
    assert model.train_fanouts == (25, 10)
    # without the scaling the sums grow with the degree: the answers differ
    model.train_fanouts = None
    from gnnaas.inference.layerwise import layerwise_inference

    plain = layerwise_inference(model, cora.x, cora.rowptr, cora.col).logits
    assert not torch.equal(plain.argmax(-1), run.logits.argmax(-1))
