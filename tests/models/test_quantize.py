"""int8 copies of the models: close to fp32 on every path, inference only, the input untouched."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor
from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear
from torch_geometric.nn.dense.linear import Linear as PyGLinear

import gnnaas.models.quantize as quantize
from gnnaas.errors import ConfigError
from gnnaas.inference import InferencePath
from gnnaas.inference.layerwise import layerwise_inference
from gnnaas.models import GNN, PRECISIONS, build_model, int8_available, quantize_int8
from gnnaas.sampling import DepthSampler, NeighborSampler

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


def _assert_near(int8: Tensor, fp32: Tensor, fraction: float = 0.1) -> None:
    """int8 outputs within ``fraction`` of the fp32 outputs' scale (their largest magnitude)."""
    assert int8.shape == fp32.shape and int8.dtype == torch.float32
    scale = float(fp32.abs().max())
    error = float((int8 - fp32).abs().max())
    assert error <= fraction * scale, f"max |int8 - fp32| = {error:.4g}, scale {scale:.4g}"


@needs_int8
@pytest.mark.parametrize(("family", "arch"), MODELS)
def test_int8_logits_are_close_to_fp32_and_agree_on_the_class(family: str, arch: str) -> None:
    g = torch.Generator().manual_seed(0)
    num_nodes = 300
    edge_index = torch.randint(0, num_nodes, (2, 3000), generator=g)
    x = torch.randn(num_nodes, IN, generator=g)
    model = _model(family, arch)
    int8 = quantize_int8(model)
    with torch.no_grad():
        fp32_logits = model(x, edge_index)
    int8_logits = int8(x, edge_index)  # outside inference mode too: nothing asks for gradients
    _assert_near(int8_logits, fp32_logits)
    agree = (int8_logits.argmax(1) == fp32_logits.argmax(1)).float().mean()
    assert agree >= 0.9


@needs_int8
@pytest.mark.parametrize(("family", "arch"), MODELS)
def test_every_linear_layer_is_int8_and_batch_norm_is_folded(family: str, arch: str) -> None:
    int8 = quantize_int8(_model(family, arch))
    modules = list(int8.modules())
    assert not any(isinstance(m, torch.nn.Linear | PyGLinear) for m in modules)
    assert not any(isinstance(m, torch.nn.BatchNorm1d) for m in modules)
    linears_per_layer = 2  # SAGE: lin_l and lin_r; GIN: the MLP's two
    assert sum(isinstance(m, DynamicInt8Linear) for m in modules) == 2 * linears_per_layer


def test_folding_batch_norm_into_the_linear_is_exact() -> None:
    torch.manual_seed(0)
    for bias in (True, False):
        linear = torch.nn.Linear(IN, HIDDEN, bias=bias)
        norm = torch.nn.BatchNorm1d(HIDDEN)
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


@needs_int8
@pytest.mark.parametrize(("family", "arch"), MODELS)
@pytest.mark.parametrize("num_layers", [1, 2, 3])
def test_fused_blocks_pyg_blocks_and_full_graph_agree(
    family: str, arch: str, num_layers: int
) -> None:
    # Activations are quantized per call from the batch's own range, so paths that batch rows
    # differently agree up to a few quantization steps, not to float rounding.
    rowptr, col = _csr(EDGE_INDEX, NUM_NODES)
    sampler = NeighborSampler(rowptr, col, (-1,) * num_layers)
    int8 = quantize_int8(_model(family, arch, num_layers))
    x = torch.randn(NUM_NODES, IN)
    seeds = torch.tensor([4, 0, 6])
    sub = sampler.sample(seeds, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        full = int8(x, EDGE_INDEX)[seeds]
        int8.fused_eval = True
        fused_emb, fused = int8(x[sub.n_id], sub.blocks, embed=True)
        int8.fused_eval = False
        convs = int8(x[sub.n_id], sub.blocks)
        full_emb, _ = int8(x, EDGE_INDEX, embed=True)
    _assert_near(fused, full)
    _assert_near(convs, fused, fraction=0.05)
    width = HIDDEN if num_layers > 1 else IN
    assert fused_emb.shape == (3, width)
    _assert_near(fused_emb, full_emb[seeds])


@needs_int8
@pytest.mark.parametrize(("family", "arch"), MODELS)
def test_layerwise_inference_runs_int8(family: str, arch: str) -> None:
    rowptr, col = _csr(EDGE_INDEX, NUM_NODES)
    model = _model(family, arch)
    int8 = quantize_int8(model)
    x = torch.randn(NUM_NODES, IN)
    out = layerwise_inference(int8, x, rowptr, col, chunk_size=3, embeddings=True)
    assert out.embeddings is not None and out.embeddings.shape == (NUM_NODES, HIDDEN)
    with torch.inference_mode():
        _assert_near(out.logits, int8(x, EDGE_INDEX))
        _assert_near(out.logits, model(x, EDGE_INDEX))
    assert not int8.training


@needs_int8
@pytest.mark.parametrize(("family", "arch"), MODELS)
def test_inference_path_serves_int8(family: str, arch: str) -> None:
    rowptr, col = _csr(EDGE_INDEX, NUM_NODES)
    model = _model(family, arch)
    x = torch.randn(NUM_NODES, IN)
    fp32_path = InferencePath(model, x, DepthSampler(rowptr, col, (-1, -1)))
    int8_path = InferencePath(quantize_int8(model), x, DepthSampler(rowptr, col, (-1, -1)))
    nodes = torch.tensor([5, 1, 5, 3])
    fp32_out, int8_out = fp32_path.predict(nodes, embed=True), int8_path.predict(nodes, embed=True)
    assert int8_out.embeddings is not None and fp32_out.embeddings is not None
    assert int8_out.logits.shape == (4, OUT) and int8_out.embeddings.shape == (4, HIDDEN)
    _assert_near(int8_out.logits, fp32_out.logits)
    _assert_near(int8_out.embeddings, fp32_out.embeddings)
    torch.testing.assert_close(int8_out.logits[0], int8_out.logits[2])  # one row per node


@needs_int8
@pytest.mark.parametrize(("family", "arch"), MODELS)
def test_the_input_model_is_unchanged(family: str, arch: str) -> None:
    model = _model(family, arch)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    kinds = [type(m) for m in model.modules()]
    x = torch.randn(NUM_NODES, IN)
    with torch.no_grad():
        expected = model(x, EDGE_INDEX)
    quantize_int8(model)
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
    int8 = quantize_int8(model)
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
        quantize_int8(int8)


@needs_int8
def test_quantizing_a_model_in_training_mode_raises() -> None:
    model = _model("gnnaas", "gin").train()
    with pytest.raises(ValueError, match="eval mode \\(got training mode\\); call model.eval"):
        quantize_int8(model)


def test_quantizing_something_else_raises() -> None:
    with pytest.raises(TypeError, match="expects a gnnaas GNN \\(got Linear\\)"):
        quantize_int8(torch.nn.Linear(2, 2))  # type: ignore[arg-type]


def test_unavailable_int8_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quantize, "_unavailable_reason", lambda: "no x86 quantized engine")
    assert not int8_available()
    with pytest.raises(ConfigError, match="int8 precision is not available: no x86 quantized"):
        quantize_int8(_model("gnnaas", "sage"))


def test_fp32_is_the_default_precision() -> None:
    assert PRECISIONS == ("fp32", "int8")
    assert GNN.precision == "fp32" and _model("gnnaas", "sage").precision == "fp32"
