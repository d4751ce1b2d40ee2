"""The runtime: from a variant's files and the execution settings to what runs its batches.

One layer between the variant repository and everything that runs a variant (docs/architecture.md
§2): the server, the profiler, evaluation during generation, the exact pass and the benchmarks get
their samplers, feature caches, precomputed answers and executors here, so what is profiled is
what is served by construction, not by two copies kept in step.

- :mod:`~gnnaas.runtime.graph`: :class:`RuntimeGraph`, a dataset's graph (or live graph) with its
  pruned features and serving samplers, the one place a sampler is built;
- :mod:`~gnnaas.runtime.answers`: :func:`open_answers`, when a precomputed variant's rows answer
  for a graph;
- :mod:`~gnnaas.runtime.caches`: the device feature cache of each variant under one budget;
- :mod:`~gnnaas.runtime.variant`: :func:`open_variant` (files → :class:`RuntimeVariant`) and
  :meth:`RuntimeVariant.executor`, the one place an executor is built.

The runtime reads the variant repository through its methods (``scan``, ``load``,
``load_answers``) and imports nothing above it: variants, profiling and serving import it.
"""

from gnnaas.runtime.answers import open_answers
from gnnaas.runtime.caches import CacheDemand, NodeRanking, plan_feature_caches
from gnnaas.runtime.graph import SAMPLER, RuntimeGraph, sampled_path, training_sampler
from gnnaas.runtime.variant import RuntimeVariant, check_manifest, open_variant, served_size_kb

__all__ = [
    "SAMPLER",
    "CacheDemand",
    "NodeRanking",
    "RuntimeGraph",
    "RuntimeVariant",
    "check_manifest",
    "open_answers",
    "open_variant",
    "plan_feature_caches",
    "sampled_path",
    "served_size_kb",
    "training_sampler",
]
