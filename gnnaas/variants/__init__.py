"""Variants: feature rankings, training, generation pipeline and the variant repository."""

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
from gnnaas.variants.repository import (
    FULL_RANKING,
    MANIFEST_FORMAT,
    LoadedVariant,
    Manifest,
    VariantRepository,
    VariantSpec,
    library_versions,
)
from gnnaas.variants.training import TrainConfig, TrainResult, evaluate, train_model

__all__ = [
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
