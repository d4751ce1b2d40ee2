"""Inference: the one sample → gather → copy → forward → copy-back routine.

The server's executor, the profiler and evaluation during generation share
:class:`InferencePath` (``path.py``), so profiled figures are those of the served pipeline;
``scores.py`` turns its outputs into per-node score parts. Below variants and profiling in the
layer order (data → sampling → models → inference → variants → profiling → serving).
"""

from gnnaas.inference.path import InferencePath, PathOutput, Sampler, StageTimes
from gnnaas.inference.scores import metric, score_parts

__all__ = ["InferencePath", "PathOutput", "Sampler", "StageTimes", "metric", "score_parts"]
