"""Dynamic int8 quantization of a model's linear layers, for CPU inference.

An ``int8`` variant is stored as its fp32 weights and quantized when it is loaded:
:func:`quantize_int8` returns an inference-only copy of the model whose linear layers (every
``torch.nn.Linear`` and ``torch_geometric.nn.dense.linear.Linear``: ``SAGEConv``'s ``lin_l`` and
``lin_r``, the ``Linear`` layers of the GIN MLPs) are ``torch.ao.nn.quantized.dynamic.Linear``:

- weights: int8, symmetric, one scale per output channel (as fast as one scale per tensor, and
  closer to fp32 when channels differ in range);
- activations: quantized to 8 bits on every call with one scale from the range of the whole
  input (dynamic), so no calibration data is needed, but a node's int8 output moves by a few
  quantization steps with the other rows of its batch (fp32 outputs do not: see
  :class:`~gnnaas.sampling.DepthSampler`);
- products accumulate in int32 and come out as float32; aggregation, ReLU and everything
  between the linear layers stays float32.

A ``Linear → BatchNorm1d`` pair inside a ``Sequential`` (GIN's MLP) becomes one linear layer
first: in eval mode the batch norm is a fixed affine map per channel, folded into the linear's
weight and bias (exact up to rounding), which leaves one operator less per layer.

Speed: the int8 kernel (fbgemm, torch's ``x86`` quantized engine) multiplies faster than fp32
once a layer sees a few dozen rows, but each call pays a fixed cost (quantizing its input,
packing the activation matrix), so a layer with a handful of rows, or a narrow output such as
the classes, is slower than in fp32: a request for a single seed gains nothing (GIN, thanks to
the folded batch norm) or loses a little (SAGE, two int8 calls per layer). Aggregation, sampling
and gathering are unchanged, so a request gains less than its linear layers do. Profile both
precisions of a variant and let the policy choose.

Why ``torch.ao``: torchao's int8 layers rely on ``torch.compile`` and are much slower in eager
mode on the CPU, and gnnaas serves eager models. torch 2.13 deprecates the quantized tensor
creation functions that ``torch.ao`` uses to quantize the weights; the warning is silenced only
around quantization (:func:`_packing`).

Example:
    >>> model = build_model("sage", 500, 256, 7).eval()  # doctest: +SKIP
    >>> quantize_int8(model)  # doctest: +SKIP
    SAGE(500, 256, 7, num_layers=2, dropout=0.5, precision='int8')
"""

from __future__ import annotations

import copy
import functools
import itertools
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import torch
from torch import Tensor
from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear
from torch.ao.quantization import per_channel_dynamic_qconfig
from torch_geometric.nn.dense.linear import Linear as PyGLinear

from gnnaas.errors import ConfigError
from gnnaas.models.base import GNN

__all__ = ["PRECISIONS", "int8_available", "quantize_int8"]

PRECISIONS = ("fp32", "int8")
"""Precisions of a model's linear layers (:attr:`gnnaas.models.GNN.precision`): ``fp32`` as
trained and stored, ``int8`` as :func:`quantize_int8` returns it."""

_ENGINES = ("x86", "fbgemm", "onednn")
"""torch's quantized engines with x86 int8 kernels, preferred first (qnnpack is for ARM)."""

_LINEARS = (torch.nn.Linear, PyGLinear)
"""The float linear layers :func:`quantize_int8` replaces."""


class _Int8Linear(DynamicInt8Linear):
    """``torch.ao``'s dynamic int8 linear layer with a shorter ``forward``.

    The same kernel call as the parent's for qint8 weights (activations in the reduced 7-bit
    range, as torch quantizes them for fbgemm), without its per-call dtype and version checks
    and keyword dispatch: Python time that matters on a served request's few rows, where the
    layer's arithmetic is small.
    """

    def forward(self, x: Tensor) -> Tensor:
        packed = self._packed_params._packed_params
        return cast(Tensor, torch.ops.quantized.linear_dynamic.default(x, packed, True))


@contextmanager
def _packing() -> Iterator[None]:
    """Quantizes and packs weights for an x86 engine, without torch's deprecation warning.

    The engine that packs a weight is the one whose kernel multiplies by it later, so when the
    current engine is not an x86 one (e.g. qnnpack was chosen), the first supported one of
    :data:`_ENGINES` is set for the block and restored after it.
    """
    current = torch.backends.quantized.engine
    supported = torch.backends.quantized.supported_engines
    engine = current if current in _ENGINES else next(e for e in _ENGINES if e in supported)
    with warnings.catch_warnings():
        # torch 2.13 deprecates torch.quantize_per_channel and the other quantized tensor
        # creators, which torch.ao's dynamic Linear uses to quantize its weight; gnnaas keeps
        # torch.ao because torchao's eager CPU path is much slower (see the module docstring).
        # torch warns once per process, so silencing it here keeps it out of every later call.
        warnings.filterwarnings(
            "ignore",
            message=r"torch\.quantize_per_tensor, torch\.quantize_per_channel",
            category=UserWarning,
        )
        if engine == current:
            yield
            return
        torch.backends.quantized.engine = engine
        try:
            yield
        finally:
            torch.backends.quantized.engine = current


def _int8_linear(weight: Tensor, bias: Tensor | None) -> _Int8Linear:
    """A dynamic int8 linear layer computing ``x @ weight.T + bias`` (call under
    :func:`_packing`).

    Args:
        weight (Tensor): ``[out, in]`` float32 weight.
        bias (Tensor, optional): ``[out]`` float32 bias.
    """
    out_features, in_features = weight.shape
    # on the meta device: no initialization of weights that are replaced at once
    linear = torch.nn.Linear(in_features, out_features, bias=bias is not None, device="meta")
    linear.weight = torch.nn.Parameter(weight.detach(), requires_grad=False)
    if bias is not None:
        linear.bias = torch.nn.Parameter(bias.detach(), requires_grad=False)
    # what from_float reads: int8 weights, symmetric, one scale per output channel
    linear.qconfig = per_channel_dynamic_qconfig  # type: ignore[assignment]
    quantized = _Int8Linear.from_float(linear)  # type: ignore[no-untyped-call]
    return cast(_Int8Linear, quantized)


@functools.cache
def _unavailable_reason() -> str | None:
    """Why dynamic int8 linear layers cannot run here, or ``None`` when they can."""
    supported = torch.backends.quantized.supported_engines
    if not any(engine in supported for engine in _ENGINES):
        return (
            f"torch {torch.__version__} offers the quantized engines {supported}, none of "
            f"{', '.join(_ENGINES)} (an x86 CPU build of torch has them)"
        )
    try:
        with _packing(), torch.inference_mode():
            linear = _int8_linear(torch.eye(4), torch.zeros(4))
            out = linear(torch.arange(8.0).view(2, 4))
    except Exception as error:  # whatever fails, int8 cannot serve on this machine
        return f"a dynamic int8 linear layer fails on this CPU ({type(error).__name__}: {error})"
    if not torch.allclose(out, torch.arange(8.0).view(2, 4), atol=0.1):
        return "a dynamic int8 linear layer gives wrong results on this CPU"
    return None


def int8_available() -> bool:
    """Whether this torch build and CPU run dynamic int8 linear layers (:func:`quantize_int8`).

    True when torch has an x86 quantized engine (``x86``, ``fbgemm`` or ``onednn``) and a tiny
    int8 linear layer runs and computes its product; the answer is cached for the process.

    Example:
        >>> int8_available()  # doctest: +SKIP
        True
    """
    return _unavailable_reason() is None


def _linear_weights(module: torch.nn.Module) -> tuple[Tensor, Tensor | None] | None:
    """``(weight [out, in], bias [out] or None)`` of a float linear layer; ``None`` for any other
    module.

    Raises:
        ValueError: the layer has no weight yet (lazy) or a weight that is not float32.
    """
    if not isinstance(module, _LINEARS):
        return None
    weight, bias = cast(Tensor, module.weight), cast(Tensor | None, module.bias)
    if torch.nn.parameter.is_lazy(weight):
        raise ValueError(
            f"quantize_int8: a {type(module).__name__} has no weight yet (lazy in_channels); "
            "run the fp32 model once to initialize it, then quantize"
        )
    if weight.dtype != torch.float32:
        raise ValueError(
            f"quantize_int8 expects float32 weights (got {weight.dtype} in a "
            f"{type(module).__name__}); call model.float() first"
        )
    return weight, bias


def _fold_batch_norm(
    weight: Tensor, bias: Tensor | None, norm: torch.nn.BatchNorm1d
) -> tuple[Tensor, Tensor]:
    """The weight and bias of ``norm(x @ weight.T + bias)`` as one linear layer, with the batch
    norm's running statistics (the caller checks it keeps them), computed in float64."""
    mean = cast(Tensor, norm.running_mean).double()  # [out]
    var = cast(Tensor, norm.running_var).double()
    scale = torch.rsqrt(var + norm.eps)  # [out]
    if norm.weight is not None:
        scale = scale * norm.weight.double()
    shift = -mean if bias is None else bias.double() - mean
    shift = shift * scale
    if norm.bias is not None:
        shift = shift + norm.bias.double()
    return (weight.double() * scale.unsqueeze(1)).float(), shift.float()


def _quantize_children(module: torch.nn.Module) -> None:
    """Replaces every float linear layer under ``module`` by a dynamic int8 one, in place,
    folding the batch norm that directly follows a linear layer in a ``Sequential``."""
    if isinstance(module, torch.nn.Sequential):
        i = 0
        while i < len(module) - 1:
            linear, norm = _linear_weights(module[i]), module[i + 1]
            if (
                linear is not None
                and isinstance(norm, torch.nn.BatchNorm1d)
                and norm.running_mean is not None  # else eval mode normalizes by the batch
                and norm.running_var is not None
                and norm.num_features == linear[0].size(0)
            ):
                module[i] = _int8_linear(*_fold_batch_norm(*linear, norm))
                del module[i + 1]  # renumbers the layers after it
            i += 1
    for name, child in list(module.named_children()):
        linear = _linear_weights(child)
        if linear is not None:
            setattr(module, name, _int8_linear(*linear))
        elif not isinstance(child, DynamicInt8Linear):
            _quantize_children(child)


def quantize_int8(model: GNN) -> GNN:
    """An inference-only copy of ``model`` with dynamic int8 linear layers (see the module
    docstring); ``model`` itself is left unchanged.

    The copy runs every path of the fp32 model (sampled blocks, fused or through PyG's
    convolutions, a full-graph ``edge_index``, :func:`gnnaas.inference.layerwise_inference`,
    ``embed=True``) on the CPU, has :attr:`~gnnaas.models.GNN.precision` ``"int8"``, stays in
    eval mode (its ``train()`` raises) and has no trainable parameters. It is not meant to be
    saved: store the fp32 weights and quantize them again when loading.

    Args:
        model (GNN): an fp32 model in eval mode, on the CPU.

    Returns:
        GNN: the quantized copy, of ``model``'s class, in eval mode.

    Raises:
        TypeError: ``model`` is not a :class:`~gnnaas.models.GNN`.
        ValueError: ``model`` is in training mode, already quantized, not on the CPU, or not
            float32.
        ConfigError: this torch build or CPU cannot run int8 layers (:func:`int8_available`);
            the message says what is missing.

    Example:
        >>> int8 = quantize_int8(build_model("gin", 500, 256, 7).eval())  # doctest: +SKIP
        >>> int8.precision, int8.training  # doctest: +SKIP
        ('int8', False)
    """
    if not isinstance(model, GNN):
        raise TypeError(f"quantize_int8 expects a gnnaas GNN (got {type(model).__name__})")
    if model.precision != "fp32":
        raise ValueError(f"quantize_int8 expects an fp32 model (got precision {model.precision!r})")
    if model.training:
        raise ValueError(
            "quantize_int8 expects a model in eval mode (got training mode); call model.eval() "
            "first: batch-norm statistics are folded into the weights as they stand"
        )
    devices = {t.device.type for t in itertools.chain(model.parameters(), model.buffers())}
    if devices - {"cpu"}:
        raise ValueError(
            f"quantize_int8 runs int8 layers on the CPU (got a model on {sorted(devices)}); "
            "quantize model.cpu()"
        )
    reason = _unavailable_reason()
    if reason is not None:
        raise ConfigError(f"int8 precision is not available: {reason}; serve fp32 variants")
    with _packing(), torch.no_grad():
        quantized = copy.deepcopy(model)
        _quantize_children(quantized)
    quantized.requires_grad_(False)
    quantized.precision = "int8"
    return quantized
