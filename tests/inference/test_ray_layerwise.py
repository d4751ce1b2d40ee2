"""Layer-wise inference on Ray equals the one-process pass; each task reads only the partitions
its targets' in-neighbors fall in."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch
from test_layerwise import NUM_CLASSES, _hand_made, _model, _random

from gnnaas.errors import ConfigError
from gnnaas.inference.layerwise import layerwise_inference
from gnnaas.inference.ray_layerwise import (
    partition_bounds,
    partition_input,
    ray_layerwise_inference,
)

# 0 ← 1, 0 ← 5 | 1 ← 0 | 2 ← 2 | 3 ← 1, 3 ← 4 | 4: none | 5 ← 0, 5 ← 3 ; partitions [0, 2),
# [2, 4), [4, 6): partition 0 reads 2, partition 1 reads 0 and 2, partition 2 reads 0 and 1.
ROWPTR = torch.tensor([0, 2, 3, 4, 6, 6, 8])
COL = torch.tensor([1, 5, 0, 2, 1, 4, 0, 3])


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A local Ray (2 CPUs, no dashboard) for this module, or the session's when one runs;
    skipped when the ``[ray]`` extra is not installed."""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def test_bounds_split_the_nodes_into_non_empty_ranges() -> None:
    assert partition_bounds(10, 3).tolist() == [0, 3, 6, 10]
    assert partition_bounds(4, 4).tolist() == [0, 1, 2, 3, 4]
    assert partition_bounds(3, 8).tolist() == [0, 1, 2, 3]  # never an empty range
    assert partition_bounds(0, 2).tolist() == [0, 0]
    with pytest.raises(ValueError, match="partitions >= 1"):
        partition_bounds(5, 0)


@pytest.mark.parametrize(
    ("part", "reads", "rows"),
    [(0, (0, 2), [[1]]), (1, (1, 0, 2), [[1], [0]]), (2, (2, 0, 1), [[0], [1]])],
)
def test_a_partition_reads_only_its_in_neighbors_partitions(
    part: int, reads: tuple[int, ...], rows: list[list[int]]
) -> None:
    bounds = partition_bounds(6, 3)
    spec = partition_input(bounds, ROWPTR, COL, part)
    assert spec.reads == reads
    assert [r.tolist() for r in spec.rows] == rows
    # the compact input's rows, gathered from node ids, hold each target's in-neighbors in order
    x = torch.arange(6).unsqueeze(1)  # [N, 1] every node's id as its state
    own = x[spec.start : spec.stop]
    local = spec.gather(own, tuple(x[int(bounds[p]) : int(bounds[p + 1])] for p in reads[1:]))
    lo, hi = int(ROWPTR[spec.start]), int(ROWPTR[spec.stop])
    assert local[spec.col, 0].tolist() == COL[lo:hi].tolist()
    assert spec.rowptr.numel() == local.size(0) + 1
    assert (
        spec.rowptr[: spec.stop - spec.start + 1].tolist()
        == (ROWPTR[spec.start : spec.stop + 1] - lo).tolist()
    )


def test_a_single_partition_reads_only_itself() -> None:
    spec = partition_input(partition_bounds(6, 1), ROWPTR, COL, 0)
    assert spec.reads == (0,)
    assert spec.rows == ()
    assert spec.col.tolist() == COL.tolist()


def test_more_partitions_than_nodes_on_a_ray_it_starts_and_stops() -> None:
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("a Ray runs already in this process")
    store, model = _hand_made(), _model("sage")
    seen: list[int] = []
    out = ray_layerwise_inference(
        model, store.x, store.rowptr, store.col, partitions=10, progress=seen.append
    )
    assert not ray.is_initialized()  # it started that Ray, so it stopped it
    expected = layerwise_inference(model, store.x, store.rowptr, store.col)
    torch.testing.assert_close(out.logits, expected.logits, atol=1e-5, rtol=1e-5)
    assert out.embeddings is None
    assert seen == [1] * (2 * store.num_nodes)  # one task per node and layer


@pytest.mark.parametrize(
    ("arch", "family", "layers"), [("sage", "gnnaas", 3), ("gin", "gnnaas", 2), ("gin", "pyg", 2)]
)
def test_equals_the_one_process_pass(local_ray: None, arch: str, family: str, layers: int) -> None:
    store, model = _random(), _model(arch, family, layers)
    expected = layerwise_inference(model, store.x, store.rowptr, store.col, embeddings=True)
    seen: list[int] = []
    out = ray_layerwise_inference(
        model,
        store.x,
        store.rowptr,
        store.col,
        chunk_size=16,
        partitions=3,
        embeddings=True,
        progress=seen.append,
    )
    assert out.logits.shape == (store.num_nodes, NUM_CLASSES)
    torch.testing.assert_close(out.logits, expected.logits, atol=1e-5, rtol=1e-5)
    assert out.embeddings is not None and expected.embeddings is not None
    torch.testing.assert_close(out.embeddings, expected.embeddings, atol=1e-5, rtol=1e-5)
    assert sorted(seen) == sorted([67, 67, 66] * layers)  # one call per task


def test_the_clusters_cpus_by_default(local_ray: None) -> None:
    store, model = _hand_made(), _model("gin")
    out = ray_layerwise_inference(model, store.x, store.rowptr, store.col, chunk_size=1)
    expected = layerwise_inference(model, store.x, store.rowptr, store.col)
    torch.testing.assert_close(out.logits, expected.logits, atol=1e-5, rtol=1e-5)


def test_bad_arguments_are_refused() -> None:
    store, model = _hand_made(), _model("sage")
    with pytest.raises(ValueError, match="chunk_size"):
        ray_layerwise_inference(model, store.x, store.rowptr, store.col, chunk_size=0)
    with pytest.raises(ValueError, match="partitions"):
        ray_layerwise_inference(model, store.x, store.rowptr, store.col, partitions=0)
    with pytest.raises(ValueError, match="nodes but the features"):
        ray_layerwise_inference(model, store.x[:-1], store.rowptr, store.col)


def test_without_ray_the_error_says_to_install_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    store = _hand_made()
    with pytest.raises(ConfigError, match=r"install the \[ray\] extra"):
        ray_layerwise_inference(_model("sage"), store.x, store.rowptr, store.col)


def test_importing_the_module_does_not_import_ray() -> None:
    code = (
        "import json, sys; import gnnaas.inference, gnnaas.inference.ray_layerwise; "
        "print(json.dumps('ray' in sys.modules))"
    )
    answer = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert answer.returncode == 0, answer.stderr
    assert json.loads(answer.stdout) is False
