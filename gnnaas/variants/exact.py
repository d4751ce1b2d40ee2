"""Exact whole-graph inference of a variant (``gnnaas infer``) and precomputed variants
(``gnnaas precompute``).

:func:`exact_pass` runs a stored variant over every node with full neighborhoods
(:mod:`gnnaas.inference.layerwise`, or its Ray form for ``backend="ray"``) on the dataset's graph,
or on its live graph as the state folder holds it now, and scores the result against the sampled
pass the server runs (the variant's own fanouts, :class:`~gnnaas.inference.InferencePath`) on the
validation and test nodes. :func:`write_parquet` writes one row per node (``node``,
``prediction``, optionally ``embedding``) with the variant, the graph version and a sha256 of the
outputs in the file's metadata; :func:`precompute` stores the answers as the variant
``<base>@exact`` in the repository, which the profiler and the router treat like any other.

Example:
    >>> run = exact_pass(store, repo, "sage-lasso-8x", embeddings=True)  # doctest: +SKIP
    >>> write_parquet(run, "cora.parquet")  # doctest: +SKIP
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gnnaas.errors import ArtifactError, ConfigError
from gnnaas.inference import metric, score_parts
from gnnaas.inference.layerwise import (
    DEFAULT_CHUNK_SIZE,
    LayerwiseOutput,
    layerwise_inference,
    peak_bytes,
)
from gnnaas.variants.manifest import EXACT_SUFFIX, Manifest
from gnnaas.variants.repository import VariantRepository
from gnnaas.variants.training import evaluate_path

__all__ = ["ExactRun", "exact_pass", "precompute", "write_parquet"]

BACKENDS = ("local", "ray")
"""Where :func:`exact_pass` runs the layer-wise pass: this process, or Ray tasks."""


@dataclass
class ExactRun:
    """One exact pass of a variant over the whole graph.

    Args:
        manifest (Manifest): the variant's manifest.
        logits (Tensor): ``[N, C]`` every node's exact output.
        embeddings (Tensor | None): ``[N, H]`` the last layer's inputs, when asked for.
        graph_version (int): version of the graph (0 without a live graph).
        num_edges (int): edges of the graph.
        seconds (float): wall time of the pass.
        peak_bytes (int): memory the pass needs beyond the features
            (:func:`~gnnaas.inference.layerwise.peak_bytes`).
        accuracy (dict): per split (``val``, ``test``), ``exact`` and ``sampled`` accuracy in %.
    """

    manifest: Manifest
    logits: Tensor
    embeddings: Tensor | None
    graph_version: int
    num_edges: int
    seconds: float
    peak_bytes: int
    accuracy: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def num_nodes(self) -> int:
        """Nodes answered."""
        return int(self.logits.size(0))

    def predictions(self) -> np.ndarray:
        """Class ids ``[N]`` (multi-label: ``[N, C]`` 0/1)."""
        if self.manifest.multi_label:  # the variant's dataset's
            return (self.logits > 0).to(torch.int8).numpy()
        return self.logits.argmax(dim=-1).numpy()

    def checksum(self) -> str:
        """sha256 of the predictions and embeddings as written (their raw bytes, in order)."""
        digest = hashlib.sha256(np.ascontiguousarray(self.predictions()).tobytes())
        if self.embeddings is not None:
            digest.update(self.embeddings.contiguous().numpy().tobytes())
        return digest.hexdigest()


def _graph(store: Any, state_dir: Path | str | None) -> tuple[Tensor, Tensor, Tensor, int]:
    """``(rowptr, col, x, version)`` of the dataset, or of its live graph now."""
    if state_dir is None:
        return store.rowptr, store.col, store.x, 0
    from gnnaas.data.live import read_live, state_folder

    if not state_folder(state_dir, store.name).is_dir():
        raise ConfigError(f"no live state of {store.name} under {state_dir} (nothing was written)")
    graph = read_live(store, state_dir)
    rowptr, col = graph.merged_csr()
    return rowptr, col, graph.features()[: graph.num_nodes], graph.version


def _sampled_accuracy(
    store: Any,
    graph: tuple[Tensor, Tensor],
    model: torch.nn.Module,
    features: Tensor,
    manifest: Manifest,
    nodes: Tensor,
) -> float:
    """Accuracy in % of the served sampled pass (the variant's fanouts) on ``nodes``."""
    from gnnaas.runtime import sampled_path

    path = sampled_path(model, features, graph[0], graph[1], manifest.fanouts)
    return 100.0 * evaluate_path(path, store.y, nodes, 1024)


def exact_pass(
    store: Any,
    repo: VariantRepository,
    variant_id: str,
    *,
    state_dir: Path | str | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    embeddings: bool = False,
    backend: str = "local",
    address: str | None = None,
    compare: bool = True,
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
) -> ExactRun:
    """Runs variant ``variant_id`` of ``store`` over every node with full neighborhoods.

    Args:
        store (GraphStore): the dataset.
        repo (VariantRepository): where the variant is.
        variant_id (str): a trained variant (not a precomputed one).
        state_dir (Path | str, optional): the server's ``--state-dir``: run on the live graph as
            it is now (read only, beside a running server). (default: ``None``)
        chunk_size (int, optional): target nodes per chunk. (default: 16,384)
        embeddings (bool, optional): keep the last hidden layer too. (default: ``False``)
        backend (str, optional): ``local`` (this process) or ``ray`` (Ray tasks over node
            ranges, one barrier per layer). (default: ``"local"``)
        address (str, optional): the Ray cluster to join (``backend="ray"``). (default: ``None``)
        compare (bool, optional): score the exact and the sampled pass on the validation and test
            nodes (``accuracy``). (default: ``True``)
        progress (Callable[[int], None], optional): called with each finished chunk's node
            count: ``N`` per layer, layer after layer (one barrier per layer), ``N ×
            num_layers`` in all. (default: ``None``)
        on_start (Callable[[int, int], None], optional): called once the graph is read, before
            the first chunk, with its node count ``N`` (a live graph's may differ from the
            dataset's) and the variant's layers (a progress bar's totals). (default: ``None``)

    Raises:
        ConfigError: a precomputed variant, an unknown backend, or no live state.
        ArtifactError: the variant cannot be loaded or does not fit the dataset.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}; choose {' or '.join(BACKENDS)}")
    manifest, model = _trained_variant(store, repo, variant_id)
    rowptr, col, x, version = _graph(store, state_dir)
    keep = torch.as_tensor(manifest.kept_features, dtype=torch.long)
    features = x.index_select(1, keep) if state_dir is not None else store.feature_subset(keep)
    need = peak_bytes(model, features.size(0), col.numel(), chunk_size)
    start = time.perf_counter()
    infer: Callable[..., LayerwiseOutput] = layerwise_inference
    if backend == "ray":
        from gnnaas.inference.ray_layerwise import ray_layerwise_inference

        infer = functools.partial(ray_layerwise_inference, address=address)
    if on_start is not None:
        on_start(int(rowptr.numel() - 1), manifest.num_layers)
    kwargs = {"chunk_size": chunk_size, "embeddings": embeddings, "progress": progress}
    out = infer(model, features, rowptr, col, **kwargs)
    seconds = time.perf_counter() - start
    run = ExactRun(
        manifest,
        out.logits,
        out.embeddings,
        version,
        int(col.numel()),
        seconds,
        need,
    )
    if compare:
        for split, nodes in (("val", store.val_idx), ("test", store.test_idx)):
            if nodes.numel():
                run.accuracy[split] = _accuracies(
                    store, (rowptr, col), model, features, manifest, out.logits, nodes
                )
    return run


def _trained_variant(store: Any, repo: VariantRepository, variant_id: str) -> tuple[Any, Any]:
    """``(manifest, model)`` of a trained variant of ``store`` (a precomputed one, or one
    trained on other features, is refused)."""
    if variant_id.endswith(EXACT_SUFFIX):
        raise ConfigError(
            f"{variant_id} is already precomputed; name its base variant "
            f"{variant_id[: -len(EXACT_SUFFIX)]}"
        )
    loaded = repo.load(store.name, variant_id)
    manifest = loaded.manifest
    if manifest.num_features != store.num_features:
        raise ArtifactError(
            f"variant {variant_id} was trained on {manifest.num_features} features, "
            f"{store.name} has {store.num_features}"
        )
    return manifest, loaded.model


def _accuracies(
    store: Any,
    graph: tuple[torch.Tensor, torch.Tensor],
    model: Any,
    features: torch.Tensor,
    manifest: Any,
    logits: torch.Tensor,
    nodes: torch.Tensor,
) -> dict[str, float]:
    """The exact pass's accuracy on ``nodes`` (from its ``logits``) and the sampled pass's."""
    num, den = score_parts(logits[nodes], store.y[nodes])
    return {
        "exact": 100.0 * metric(num, den),
        "sampled": _sampled_accuracy(store, graph, model, features, manifest, nodes),
    }


def write_parquet(run: ExactRun, path: Path | str) -> Path:
    """Writes one row per node, atomically (a temporary file renamed into place).

    Columns: ``node`` (int64), ``prediction`` (class id; multi-label: a list of 0/1),
    ``embedding`` (list of float32, when the run kept them). The file's metadata: ``dataset``,
    ``variant``, ``graph_version``, ``num_nodes``, ``sha256`` (:meth:`ExactRun.checksum`),
    ``gnnaas_version``.

    Returns:
        Path: the file written.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    import gnnaas

    path = Path(path)
    if path.suffix != ".parquet":
        raise ConfigError(f"--out must name a .parquet file (got {str(path)!r})")
    pred = run.predictions()
    columns: dict[str, Any] = {"node": pa.array(np.arange(run.num_nodes, dtype=np.int64))}
    if pred.ndim == 2:
        columns["prediction"] = pa.FixedSizeListArray.from_arrays(
            pa.array(pred.reshape(-1)), pred.shape[1]
        )
    else:
        columns["prediction"] = pa.array(pred.astype(np.int64))
    if run.embeddings is not None:
        emb = run.embeddings.contiguous().numpy().astype(np.float32, copy=False)
        columns["embedding"] = pa.FixedSizeListArray.from_arrays(
            pa.array(emb.reshape(-1)), emb.shape[1]
        )
    table = pa.table(columns)
    table = table.replace_schema_metadata(
        {
            "dataset": run.manifest.dataset,
            "variant": run.manifest.variant_id,
            "graph_version": str(run.graph_version),
            "num_nodes": str(run.num_nodes),
            "sha256": run.checksum(),
            "gnnaas_version": gnnaas.__version__,
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        pq.write_table(table, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def precompute(repo: VariantRepository, run: ExactRun) -> Manifest:
    """Stores an exact run (with embeddings) as the variant ``<base>@exact``.

    The folder holds the base variant's weights (stale nodes are computed with them), a manifest
    with ``fanouts`` all ``-1`` and ``precomputed`` set, and ``answers.safetensors``. It needs a
    profile before the router uses it: ``gnnaas profile --dataset D --only <base>@exact``.

    Returns:
        Manifest: the precomputed variant's manifest as written.

    Raises:
        ValueError: the run has no embeddings.
    """
    if run.embeddings is None:
        raise ValueError("precompute needs a run with embeddings (exact_pass(embeddings=True))")
    base = run.manifest
    loaded = repo.load(base.dataset, base.variant_id)
    manifest = replace(
        base,
        variant_id=base.variant_id + EXACT_SUFFIX,
        fanouts=[-1] * base.num_layers,
        created=_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        precomputed={
            "base": base.variant_id,
            "graph_version": run.graph_version,
            "num_nodes": run.num_nodes,
            "num_edges": run.num_edges,
            "embedding_dim": int(run.embeddings.size(1)),
            "seconds": round(run.seconds, 3),
            "accuracy": run.accuracy,
        },
    )
    answers = {"logits": run.logits.contiguous(), "embeddings": run.embeddings.contiguous()}
    return repo.save(manifest, loaded.model, answers=answers)
