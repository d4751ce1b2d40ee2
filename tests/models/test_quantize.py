"""int8 copies of the models: calibrated, close to fp32 on every path, a node's answer independent
of its batch-mates, inference only, the input untouched."""

from __future__ import annotations

import json

import pytest
import torch
from torch import Tensor
from torch_geometric.nn.dense.linear import Linear as PyGLinear

import gnnaas.models.quantize as quantize
from gnnaas.errors import ConfigError
from gnnaas.inference import InferencePath
from gnnaas.inference.layerwise import layerwise_inference
from gnnaas.models import (
    GNN,
    PRECISIONS,
    build_model,
    calibrate_int8,
    int8_available,
    model_bytes,
    quantize_int8,
)
from gnnaas.sampling import Block, DepthSampler, NeighborSampler

_UNAVAILABLE = quantize._unavailable_reason()
needs_int8 = pytest.mark.skipif(
    _UNAVAILABLE is not None, reason=f"int8 cannot run here: {_UNAVAILABLE}"
)

MODELS = [("gnnaas", "sage"), ("gnnaas", "gin"), ("pyg", "sage"), ("pyg", "gin")]
IN, HIDDEN, OUT = 12, 32, 4

# a tiny directed graph (row 0 source, row 1 target): a 6-cycle, two chords and a pendant node 6
EDGE_INDEX = torch.tensor(
    [
        [0, 1, 2, 3, 4, 5, 1, 2, 3, 0, 4, 6, 2],
        [1, 2, 3, 4, 5, 0, 0, 1, 2, 3, 1, 2, 6],
    ]
)
NUM_NODES = 7


def _csr(edge_index: Tensor, num_nodes: int) -> tuple[Tensor, Tensor]:
    """``(rowptr, col)`` over in-edges: the in-neighbors of ``i`` are ``col[rowptr[i]:...]``."""
    order = torch.argsort(edge_index[1], stable=True)
    rowptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
    rowptr[1:] = torch.bincount(edge_index[1], minlength=num_nodes).cumsum(0)
    return rowptr, edge_index[0, order]


def _random_graph(num_nodes: int = 300) -> tuple[Tensor, Tensor, Tensor]:
    """``(x, rowptr, col)`` of a random graph with ten in-edges per node on average."""
    g = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, num_nodes, (2, 10 * num_nodes), generator=g)
    return torch.randn(num_nodes, IN, generator=g), *_csr(edge_index, num_nodes)


def _model(family: str, arch: str, num_layers: int = 2) -> GNN:
    """An untrained fp32 model in eval mode, with non-trivial batch-norm statistics."""
    torch.manual_seed(0)
    model = build_model(arch, IN, HIDDEN, OUT, num_layers=num_layers, family=family)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("running_mean"):
                buf.uniform_(-0.5, 0.5)
            elif name.endswith("running_var"):
                buf.uniform_(0.5, 2.0)
    return model.eval()


def _batches(
    x: Tensor, rowptr: Tensor, col: Tensor, fanouts: tuple[int, ...], batch_size: int = 64
) -> list[tuple[Tensor, list[Block]]]:
    """Sampled calibration batches covering every node of the graph, as the server samples."""
    sampler = DepthSampler(rowptr, col, fanouts)
    num_nodes = rowptr.numel() - 1
    subs = [sampler.sample(s) for s in torch.arange(num_nodes).split(batch_size)]
    return [(x[sub.n_id], list(sub.blocks)) for sub in subs]


def _int8(model: GNN, x: Tensor, rowptr: Tensor, col: Tensor, fanouts: tuple[int, ...]) -> GNN:
    """``model`` quantized with ranges calibrated on sampled batches of the graph."""
    return quantize_int8(model, calibrate_int8(model, _batches(x, rowptr, col, fanouts)))


def _tiny_int8(model: GNN, x: Tensor) -> GNN:
    """``model`` quantized with ranges calibrated on the tiny graph, every neighbor kept."""
    return _int8(model, x, *_csr(EDGE_INDEX, NUM_NODES), (-1,) * model.num_layers)


def _assert_near(int8: Tensor, fp32: Tensor, fraction: float = 0.1) -> None:
    """int8 outputs within ``fraction`` of the fp32 outputs' scale (their largest magnitude)."""
    assert int8.shape == fp32.shape and int8.dtype == torch.float32
    scale = float(fp32.abs().max())
    error = float((int8 - fp32).abs().max())
    assert error <= fraction * scale, f"max |int8 - fp32| = {error:.4g}, scale {scale:.4g}"


@needs_int8
@pytest.mark.parametrize(("family", "arch"), MODELS)
def test_int8_logits_are_close_to_fp32_and_agree_on_the_class(family: str, arch: str) -> None:
    x, rowptr, col = _random_graph()
    edge_index = torch.stack([col, torch.repeat_interleave(rowptr.diff())])
    model = _model(family, arch)
    # every neighbor, as the full graph's forward: GIN's sums grow with the number of neighbors
    int8 = _int8(model, x, rowptr, col, (-1, -1))
    with torch.no_grad():
        fp32_logits = model(x, edge_index)
    int8_logits = int8(x, edge_index)  # outside inference mode too: nothing asks for gradients
    _assert_near(int8_logits, fp32_logits, fraction=0.05)
    agree = (int8_logits.argmax(1) == fp32_logits.argmax(1)).float().mean()
    assert agree >= 0.9


@needs_int8
@pytest.mark.parametrize(("family", "arch"), MODELS)
def test_a_nodes_int8_answer_does_not_depend_on_its_batch(family: str, arch: str) -> None:
    # The contract of the serving sampler, kept at int8: the same node, alone or with
    # batch-mates, gets the same logits and embeddings (up to float32 summation order, the
    # tolerance of fp32) and the same class.
    x, rowptr, col = _random_graph()
    model = _model(family, arch)
    int8 = _int8(model, x, rowptr, col, (5, 3))
    path = InferencePath(int8, x, DepthSampler(rowptr, col, (5, 3)))
    nodes = torch.tensor([3, 41, 97, 150, 299])
    batch = path.predict(torch.cat([nodes, torch.arange(0, 300, 7)]), embed=True)
    assert batch.embeddings is not None
    scale = float(batch.logits.abs().max())
    for i, node in enumerate(nodes.tolist()):
        alone = path.predict(torch.tensor([node]), embed=True)
        assert alone.embeddings is not None
        torch.testing.assert_close(alone.logits[0], batch.logits[i], rtol=1e-5, atol=1e-5 * scale)
        torch.testing.assert_close(
            alone.embeddings[0], batch.embeddings[i], rtol=1e-5, atol=1e-5 * scale
        )
        assert int(alone.logits[0].argmax()) == int(batch.logits[i].argmax())


@needs_int8
@pytest.mark.parametrize(("family", "arch"), MODELS)
def test_every_linear_layer_is_int8_and_batch_norm_is_folded(family: str, arch: str) -> None:
    int8 = _tiny_int8(_model(family, arch), torch.randn(NUM_NODES, IN))
    modules = list(int8.modules())
    assert not any(isinstance(m, torch.nn.Linear | PyGLinear) for m in modules)
    assert not any(isinstance(m, torch.nn.BatchNorm1d) for m in modules)
    linears_per_layer = 2  # SAGE: lin_l and lin_r; GIN: the MLP's two
    assert sum(isinstance(m, quantize._Int8Linear) for m in modules) == 2 * linears_per_layer


def test_folding_batch_norm_into_the_linear_is_exact() -> None:
    torch.manual_seed(0)
    for bias in (True, False):
        linear = torch.nn.Linear(IN, HIDDEN, bias=bias)
        norm = torch.nn.BatchNorm1d(HIDDEN)
        assert norm.running_mean is not None and norm.running_var is not None
        with torch.no_grad():
            norm.running_mean.uniform_(-1, 1)
            norm.running_var.uniform_(0.5, 2)
            norm.weight.uniform_(0.5, 2)
            norm.bias.uniform_(-1, 1)
        norm.eval()
        weight, folded_bias = quantize._fold_batch_norm(linear.weight, linear.bias, norm)
        x = torch.randn(20, IN)
        with torch.no_grad():
            torch.testing.assert_close(x @ weight.t() + folded_bias, norm(linear(x)))


@pytest.mark.parametrize(("family", "arch"), MODELS)
def test_calibration_records_each_linear_layers_input_range(family: str, arch: str) -> None:
    model = _model(family, arch)
    kinds = [type(m) for m in model.modules()]
    x, rowptr, col = _random_graph()
    batches = _batches(x, rowptr, col, (5, 3), batch_size=100)
    ranges = calibrate_int8(model, batches)
    assert list(ranges) == quantize._linear_names(model)
    if arch == "sage":  # lin_r of the first layer reads the features of its targets as they are
        targets = torch.cat([x[: blocks[0].size[1]] for x, blocks in batches])
        assert ranges["convs.0.lin_r"] == [float(targets.min()), float(targets.max())]
    for name, (low, high) in ranges.items():
        assert type(low) is float and type(high) is float and low <= high, name
        if not name.startswith("convs.0."):
            assert low >= 0.0, name  # after a ReLU
    # a calibrated model is left as it was: no hooks, its own modules
    assert [type(m) for m in model.modules()] == kinds
    assert not any(m._forward_pre_hooks for m in model.modules())


@needs_int8
@pytest.mark.parametrize(("family", "arch"), MODELS)
def test_ranges_round_trip_through_json(family: str, arch: str) -> None:
    model = _model(family, arch)
    x = torch.randn(NUM_NODES, IN)
    ranges = calibrate_int8(model, [(x, EDGE_INDEX)])  # a full graph calibrates too
    loaded = json.loads(json.dumps(ranges))
    assert loaded == ranges
    with torch.inference_mode():
        torch.testing.assert_close(
            quantize_int8(model, loaded)(x, EDGE_INDEX),
            quantize_int8(model, ranges)(x, EDGE_INDEX),
            rtol=0,
            atol=0,
        )


@needs_int8
def test_a_missing_unknown_or_malformed_range_raises() -> None:
    model = _model("gnnaas", "gin")
    ranges = calibrate_int8(model, [(torch.randn(NUM_NODES, IN), EDGE_INDEX)])
    missing = {k: v for k, v in ranges.items() if k != "convs.1.nn.3"}
    with pytest.raises(ValueError, match="no input range for linear layer 'convs.1.nn.3'"):
        quantize_int8(model, missing)
    with pytest.raises(ValueError, match="model does not have \\(got \\['convs.2.nn.0'\\]\\)"):
        quantize_int8(model, {**ranges, "convs.2.nn.0": [0.0, 1.0]})
    for bad in ([1.0], [2.0, 1.0], [0.0, float("nan")], "01", [0.0, True]):
        with pytest.raises(ValueError, match="range of 'convs.0.nn.0' as \\[min, max\\]"):
            quantize_int8(model, {**ranges, "convs.0.nn.0": bad})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="ranges as a mapping .* \\(got list\\)"):
        quantize_int8(model, list(ranges.values()))  # type: ignore[arg-type]


def test_calibration_without_batches_raises() -> None:
    with pytest.raises(ValueError, match="at least one \\(x, adjs\\) batch \\(got none\\)"):
        calibrate_int8(_model("gnnaas", "sage"), [])
    with pytest.raises(TypeError, match="calibrate_int8 expects a gnnaas GNN \\(got Linear\\)"):
        calibrate_int8(torch.nn.Linear(2, 2), [])  # type: ignore[arg-type]


def test_input_quantization_keeps_zero_exact_and_guards_a_zero_range() -> None:
    assert quantize._input_quantization(-1.0, 1.0) == (2.0 / 127, 64)
    assert quantize._input_quantization(2.0, 5.0) == (5.0 / 127, 0)  # widened down to 0
    assert quantize._input_quantization(-5.0, -2.0) == (5.0 / 127, 127)  # widened up to 0
    scale, zero_point = quantize._input_quantization(0.0, 0.0)
    assert scale > 0.0 and zero_point == 0


@needs_int8
def test_a_layer_calibrated_on_zeros_runs() -> None:
    with quantize._packing():
        linear = quantize._Int8Linear(torch.randn(3, 4), torch.tensor([1.0, 2.0, 3.0]), (0.0, 0.0))
    with torch.inference_mode():
        torch.testing.assert_close(linear(torch.zeros(2, 4)), torch.tensor([[1.0, 2.0, 3.0]] * 2))


@needs_int8
@pytest.mark.parametrize(("family", "arch"), MODELS)
@pytest.mark.parametrize("num_layers", [1, 2, 3])
def test_fused_blocks_pyg_blocks_and_full_graph_agree(
    family: str, arch: str, num_layers: int
) -> None:
    # Fixed input scales: paths that batch rows differently agree up to float32 summation order
    # (which can move an input across a quantization step), not only to a few steps.
    rowptr, col = _csr(EDGE_INDEX, NUM_NODES)
    sampler = NeighborSampler(rowptr, col, (-1,) * num_layers)
    x = torch.randn(NUM_NODES, IN)
    int8 = _tiny_int8(_model(family, arch, num_layers), x)
    seeds = torch.tensor([4, 0, 6])
    sub = sampler.sample(seeds, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        full = int8(x, EDGE_INDEX)[seeds]
        fused_emb, fused = int8(x[sub.n_id], sub.blocks, embed=True)
        convs = int8(x[sub.n_id], sub.blocks, pyg_convs=True)
        full_emb, _ = int8(x, EDGE_INDEX, embed=True)
    _assert_near(fused, full, fraction=0.02)
    _assert_near(convs, fused, fraction=0.02)
    width = HIDDEN if num_layers > 1 else IN
    assert fused_emb.shape == (3, width)
    _assert_near(fused_emb, full_emb[seeds], fraction=0.02)


@needs_int8
@pytest.mark.parametrize(("family", "arch"), MODELS)
def test_layerwise_inference_runs_int8(family: str, arch: str) -> None:
    rowptr, col = _csr(EDGE_INDEX, NUM_NODES)
    model = _model(family, arch)
    x = torch.randn(NUM_NODES, IN)
    int8 = _tiny_int8(model, x)
    out = layerwise_inference(int8, x, rowptr, col, chunk_size=3, embeddings=True)
    assert out.embeddings is not None and out.embeddings.shape == (NUM_NODES, HIDDEN)
    with torch.inference_mode():
        _assert_near(out.logits, int8(x, EDGE_INDEX), fraction=0.02)
        _assert_near(out.logits, model(x, EDGE_INDEX))
    assert not int8.training


@needs_int8
@pytest.mark.parametrize(("family", "arch"), MODELS)
def test_inference_path_serves_int8(family: str, arch: str) -> None:
    rowptr, col = _csr(EDGE_INDEX, NUM_NODES)
    model = _model(family, arch)
    x = torch.randn(NUM_NODES, IN)
    fp32_path = InferencePath(model, x, DepthSampler(rowptr, col, (-1, -1)))
    int8_path = InferencePath(_tiny_int8(model, x), x, DepthSampler(rowptr, col, (-1, -1)))
    nodes = torch.tensor([5, 1, 5, 3])
    fp32_out, int8_out = fp32_path.predict(nodes, embed=True), int8_path.predict(nodes, embed=True)
    assert int8_out.embeddings is not None and fp32_out.embeddings is not None
    assert int8_out.logits.shape == (4, OUT) and int8_out.embeddings.shape == (4, HIDDEN)
    _assert_near(int8_out.logits, fp32_out.logits)
    _assert_near(int8_out.embeddings, fp32_out.embeddings)
    torch.testing.assert_close(int8_out.logits[0], int8_out.logits[2])  # one row per node


@needs_int8
@pytest.mark.parametrize(("family", "arch"), MODELS)
def test_model_bytes_counts_int8_weights_as_one_byte(family: str, arch: str) -> None:
    model = _model(family, arch)
    tensors = [*model.parameters(), *model.buffers()]
    assert model_bytes(model) == sum(t.numel() * t.element_size() for t in tensors)
    int8 = _tiny_int8(model, torch.randn(NUM_NODES, IN))
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear | PyGLinear)]
    expected = 0
    for m in linears:
        out_features, in_features = m.weight.shape
        bias = m.bias is not None or arch == "gin"  # GIN's folded batch norm adds a bias
        expected += out_features * (in_features + 4 + (4 if bias else 0))
    # besides them, only GINConv's eps (a float32 buffer per layer): batch norms are folded away
    expected += 4 * model.num_layers if arch == "gin" else 0
    assert model_bytes(int8) == expected
    assert model_bytes(torch.nn.Linear(4, 2)) == 40


@needs_int8
@pytest.mark.parametrize(("family", "arch"), MODELS)
def test_the_input_model_is_unchanged(family: str, arch: str) -> None:
    model = _model(family, arch)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    kinds = [type(m) for m in model.modules()]
    x = torch.randn(NUM_NODES, IN)
    with torch.no_grad():
        expected = model(x, EDGE_INDEX)
    _tiny_int8(model, x)
    assert model.precision == "fp32" and not model.training
    assert [type(m) for m in model.modules()] == kinds
    after = model.state_dict()
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert torch.equal(after[key], value), key
    assert all(p.requires_grad for p in model.parameters())
    with torch.no_grad():
        torch.testing.assert_close(model(x, EDGE_INDEX), expected)
    model.train()  # still trainable


@needs_int8
@pytest.mark.parametrize(("family", "arch"), MODELS)
def test_int8_models_are_inference_only(family: str, arch: str) -> None:
    model = _model(family, arch)
    int8 = _tiny_int8(model, torch.randn(NUM_NODES, IN))
    assert (model.precision, int8.precision) == ("fp32", "int8")
    assert int8.precision in PRECISIONS and type(int8) is type(model)
    assert repr(int8) == repr(model)[:-1] + ", precision='int8')"
    assert not int8.training
    assert not any(p.requires_grad for p in int8.parameters())
    with pytest.raises(ValueError, match="precision 'int8' is for inference only"):
        int8.train()
    assert not int8.training
    int8.eval()  # allowed: eval mode is where it lives
    with pytest.raises(ValueError, match="expects an fp32 model \\(got precision 'int8'\\)"):
        quantize_int8(int8, {})
    with pytest.raises(ValueError, match="expects an fp32 model \\(got precision 'int8'\\)"):
        calibrate_int8(int8, [])


@needs_int8
def test_quantizing_a_model_in_training_mode_raises() -> None:
    model = _model("gnnaas", "gin")
    ranges = calibrate_int8(model, [(torch.randn(NUM_NODES, IN), EDGE_INDEX)])
    with pytest.raises(ValueError, match="eval mode \\(got training mode\\); call model.eval"):
        quantize_int8(model.train(), ranges)


def test_quantizing_something_else_raises() -> None:
    with pytest.raises(TypeError, match="expects a gnnaas GNN \\(got Linear\\)"):
        quantize_int8(torch.nn.Linear(2, 2), {})  # type: ignore[arg-type]


def test_unavailable_int8_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model("gnnaas", "sage")
    ranges = calibrate_int8(model, [(torch.randn(NUM_NODES, IN), EDGE_INDEX)])
    monkeypatch.setattr(quantize, "_unavailable_reason", lambda: "no x86 quantized engine")
    assert not int8_available()
    with pytest.raises(ConfigError, match="int8 precision is not available: no x86 quantized"):
        quantize_int8(model, ranges)


def test_fp32_is_the_default_precision() -> None:
    assert PRECISIONS == ("fp32", "int8")
    assert GNN.precision == "fp32" and _model("gnnaas", "sage").precision == "fp32"
