"""Variants: feature rankings, training, generation pipeline and the variant repository.

Names resolve lazily (PEP 562): ``from gnnaas.variants import VariantRepository`` imports only
``repository.py`` and the ``manifest.py`` it reads, so the server never loads training code it
does not run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gnnaas._lazy import attach

if TYPE_CHECKING:
    from gnnaas.variants.manifest import (
        FULL_RANKING,
        MANIFEST_FORMAT,
        Manifest,
        VariantSpec,
        library_versions,
    )
    from gnnaas.variants.pipeline import GenerateRow, generate_variants
    from gnnaas.variants.ranking import (
        Ranking,
        first_layer_terms,
        greedy_ranking,
        greedy_scores,
        lasso_ranking,
        random_ranking,
        rank_features,
    )
    from gnnaas.variants.repository import LoadedVariant, VariantRepository
    from gnnaas.variants.training import (
        EpochReport,
        TrainConfig,
        TrainResult,
        evaluate,
        train_model,
    )

_SOURCES = {
    "manifest": ("FULL_RANKING", "MANIFEST_FORMAT", "Manifest", "VariantSpec", "library_versions"),
    "pipeline": ("GenerateRow", "generate_variants"),
    "ranking": (
        "Ranking",
        "first_layer_terms",
        "greedy_ranking",
        "greedy_scores",
        "lasso_ranking",
        "random_ranking",
        "rank_features",
    ),
    "repository": ("LoadedVariant", "VariantRepository"),
    "training": ("EpochReport", "TrainConfig", "TrainResult", "evaluate", "train_model"),
}

__all__ = [
    "EpochReport",
    "FULL_RANKING",
    "GenerateRow",
    "LoadedVariant",
    "MANIFEST_FORMAT",
    "Manifest",
    "Ranking",
    "TrainConfig",
    "TrainResult",
    "VariantRepository",
    "VariantSpec",
    "evaluate",
    "first_layer_terms",
    "generate_variants",
    "greedy_ranking",
    "greedy_scores",
    "lasso_ranking",
    "library_versions",
    "random_ranking",
    "rank_features",
    "train_model",
]


__getattr__, __dir__, _MODULE_OF = attach(__name__, _SOURCES)
