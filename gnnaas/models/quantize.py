"""Static int8 quantization of a model's linear layers, for CPU inference.

An ``int8`` variant is stored as its fp32 weights plus one input range per linear layer, and
quantized when it is loaded. :func:`calibrate_int8` runs the fp32 model over a few sampled
batches and records the range of every linear layer's input (a JSON-ready mapping for the
variant's manifest); :func:`quantize_int8` then returns an inference-only copy of the model whose
linear layers (every ``torch.nn.Linear`` and ``torch_geometric.nn.dense.linear.Linear``:
``SAGEConv``'s ``lin_l`` and ``lin_r``, the ``Linear`` layers of the GIN MLPs) are int8:

- weights: int8, symmetric, one scale per output channel (as fast as one scale per tensor, and
  closer to fp32 when channels differ in range);
- activations: quantized with the layer's fixed scale and zero point, derived from its
  calibrated range, inside torch's quantized ``linear_with_input_q_dq_qweight_dq_output_fp32``
  kernel (float32 in, float32 out); products accumulate in int32. Aggregation, ReLU and everything
  between the linear layers stays float32.

Why static: a scale chosen per call from the whole input (dynamic quantization) makes a node's
int8 output move with the other rows of its batch. With a fixed scale, quantization is
elementwise and accumulation integer, so a row's output is the same alone or in any batch, and
the served answers keep the contract of :class:`~gnnaas.sampling.DepthSampler`: a node's class
does not depend on its batch-mates, its logits only up to the float32 summation order of the
aggregation before a layer.

The range: the full observed ``[min, max]`` of the layer's input over the calibration batches,
widened to contain 0 (so that 0, e.g. every ReLU zero, is exact), mapped onto 7 bits,
``0..127``, as torch's own x86 observers do (``reduce_range``): on CPUs without VNNI, fbgemm adds
pairs of ``uint8 × int8`` products in saturating int16, which full 8-bit activations overflow.
The kernel does not clip an input above the calibrated maximum: it takes the codes ``128..255``
(up to about twice the maximum of a range that starts at 0, as after a ReLU), where that
saturation can return; an input below the minimum clips to it. Calibrate on batches like the
served ones: the nodes' sampled neighborhoods with the variant's fanouts (GIN's sums grow with
the number of neighbors). A percentile clip of the range was tried on trained models and kept
accuracy no better than the full range (figures in the commit that introduced calibration).

A ``Linear → BatchNorm1d`` pair inside a ``Sequential`` (GIN's MLP) becomes one linear layer
first: in eval mode the batch norm is a fixed affine map per channel, folded into the linear's
weight and bias (exact up to rounding); the folded layer reads the same input as the ``Linear``,
whose calibrated range it uses.

Speed: the int8 kernel multiplies faster than fp32 once a layer sees a few dozen rows; on a
handful of rows, or a narrow output such as the classes, its fixed cost can make it slower than
fp32. Aggregation, sampling and gathering are unchanged, so a request gains less than its linear
layers do. Profile both precisions of a variant and let the policy choose.

Why these torch operators: torchao's int8 layers rely on ``torch.compile`` and are much slower in
eager mode on the CPU, and gnnaas serves eager models. torch 2.13 deprecates the quantized tensor
creation functions that packing a weight needs; the warning is silenced only around quantization
(:func:`_packing`).

Example:
    >>> model = build_model("sage", 500, 256, 7).eval()  # doctest: +SKIP
    >>> ranges = calibrate_int8(model, [(x[sub.n_id], sub.blocks)])  # doctest: +SKIP
    >>> quantize_int8(model, ranges)  # doctest: +SKIP
    SAGE(500, 256, 7, num_layers=2, dropout=0.5, precision='int8')
"""

from __future__ import annotations

import copy
import functools
import itertools
import math
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor
from torch_geometric.nn.dense.linear import Linear as PyGLinear

from gnnaas.errors import ConfigError
from gnnaas.models.base import GNN

if TYPE_CHECKING:
    from gnnaas.sampling import Block

__all__ = ["PRECISIONS", "calibrate_int8", "int8_available", "model_bytes", "quantize_int8"]

PRECISIONS = ("fp32", "int8")
"""Precisions of a model's linear layers (:attr:`gnnaas.models.GNN.precision`): ``fp32`` as
trained and stored, ``int8`` as :func:`quantize_int8` returns it."""

_ENGINES = ("x86", "fbgemm", "onednn")
"""torch's quantized engines with x86 int8 kernels, preferred first (qnnpack is for ARM)."""

_LINEARS = (torch.nn.Linear, PyGLinear)
"""The float linear layers :func:`quantize_int8` replaces."""

_INPUT_QMAX = 127
"""Largest activation code of the calibrated range (7 bits, see the module docstring)."""

_MIN_SCALE = float(torch.finfo(torch.float32).eps)
"""Smallest quantization scale, as torch's observers use: a layer whose calibrated input was all
zeros gets it instead of a zero scale."""


def _input_quantization(low: float, high: float) -> tuple[float, int]:
    """``(scale, zero_point)`` mapping ``[min(low, 0), max(high, 0)]`` onto ``0.._INPUT_QMAX``."""
    low, high = min(low, 0.0), max(high, 0.0)
    scale = max((high - low) / _INPUT_QMAX, _MIN_SCALE)
    zero_point = min(max(round(-low / scale), 0), _INPUT_QMAX)
    return scale, zero_point


class _Int8Linear(torch.nn.Module):
    """``x @ weight.T + bias`` with int8 weights and a fixed input quantization (build it under
    :func:`_packing`).

    Args:
        weight (Tensor): ``[out, in]`` float32 weight, quantized per output channel.
        bias (Tensor, optional): ``[out]`` float32 bias, kept in float32.
        input_range (tuple[float, float]): the calibrated ``(min, max)`` of the input.
    """

    def __init__(
        self, weight: Tensor, bias: Tensor | None, input_range: tuple[float, float]
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.has_bias = bias is not None
        self.input_range = input_range
        self.input_scale, self.input_zero_point = _input_quantization(*input_range)
        weight = weight.detach().float()
        # symmetric in -127..127: no -128 code, whose products are the first to saturate
        scales = (weight.abs().amax(1).double() / 127).clamp_(min=_MIN_SCALE)  # [out]
        zero_points = torch.zeros(self.out_features, dtype=torch.int64)
        qweight = torch.quantize_per_channel(weight, scales, zero_points, 0, torch.qint8)
        bias = None if bias is None else bias.detach().float().contiguous()
        self._packed = torch.ops.quantized.linear_prepack(qweight, bias)
        # registered though dir(torch.ops.quantized) does not list it; resolved once, not per call
        self._op = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32.default

    @property
    def nbytes(self) -> int:
        """Bytes of the layer's values at their precision: 1 per weight, 4 per output channel's
        scale and per bias entry (fbgemm's packed layout keeps more next to them)."""
        return self.out_features * (self.in_features + 4 + (4 if self.has_bias else 0))

    def forward(self, x: Tensor) -> Tensor:
        return cast(Tensor, self._op(x, self.input_scale, self.input_zero_point, self._packed))

    def extra_repr(self) -> str:
        low, high = self.input_range
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.has_bias}, input_range=({low:.4g}, {high:.4g})"
        )


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
        # creators, which packing an int8 weight needs; gnnaas keeps these kernels because
        # torchao's eager CPU path is much slower (see the module docstring). torch warns once
        # per process, so silencing it here keeps it out of every later call.
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


@functools.cache
def _unavailable_reason() -> str | None:
    """Why static int8 linear layers cannot run here, or ``None`` when they can."""
    supported = torch.backends.quantized.supported_engines
    if not any(engine in supported for engine in _ENGINES):
        return (
            f"torch {torch.__version__} offers the quantized engines {supported}, none of "
            f"{', '.join(_ENGINES)} (an x86 CPU build of torch has them)"
        )
    x = torch.arange(8.0).view(2, 4)
    try:
        with _packing(), torch.inference_mode():
            out = _Int8Linear(torch.eye(4), torch.zeros(4), (0.0, 8.0))(x)
    except Exception as error:  # whatever fails, int8 cannot serve on this machine
        return f"an int8 linear layer fails on this CPU ({type(error).__name__}: {error})"
    if not torch.allclose(out, x, atol=0.1):
        return "an int8 linear layer gives wrong results on this CPU"
    return None


def int8_available() -> bool:
    """Whether this torch build and CPU run the int8 linear layers of :func:`quantize_int8`.

    True when torch has an x86 quantized engine (``x86``, ``fbgemm`` or ``onednn``) and a tiny
    int8 linear layer (fixed input quantization, float32 output) runs and computes its product;
    the answer is cached for the process.

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


def _foldable(norm: torch.nn.Module, out_features: int) -> bool:
    """Whether ``norm``, right after a linear layer, is a batch norm to fold into it."""
    return (
        isinstance(norm, torch.nn.BatchNorm1d)
        and norm.running_mean is not None  # else eval mode normalizes by the batch
        and norm.running_var is not None
        and norm.num_features == out_features
    )


def _quantize_children(
    module: torch.nn.Module, prefix: str, ranges: Mapping[str, tuple[float, float]]
) -> None:
    """Replaces every float linear layer under ``module`` by an int8 one, in place, folding the
    batch norm that directly follows a linear layer in a ``Sequential``. ``prefix`` is
    ``module``'s name in the fp32 model (``""`` or ending with a dot): ``ranges`` is keyed by
    those names, which the folded batch norms' removal renumbers, so they are read first."""
    folded = []
    if isinstance(module, torch.nn.Sequential):
        for i in range(len(module) - 1):
            linear, norm = _linear_weights(module[i]), module[i + 1]
            if linear is not None and _foldable(norm, linear[0].size(0)):
                weight, bias = _fold_batch_norm(*linear, cast(torch.nn.BatchNorm1d, norm))
                module[i] = _Int8Linear(weight, bias, ranges[f"{prefix}{i}"])
                folded.append(i + 1)
    for name, child in list(module.named_children()):
        linear = _linear_weights(child)
        if linear is not None:
            setattr(module, name, _Int8Linear(*linear, ranges[prefix + name]))
        elif not isinstance(child, _Int8Linear):
            _quantize_children(child, f"{prefix}{name}.", ranges)
    for i in reversed(folded):
        del cast(torch.nn.Sequential, module)[i]


def _linear_names(model: torch.nn.Module) -> list[str]:
    """Names of the float linear layers under ``model``, the keys of its calibrated ranges."""
    return [name for name, m in model.named_modules() if isinstance(m, _LINEARS)]


def _check_model(model: object, caller: str) -> GNN:
    if not isinstance(model, GNN):
        raise TypeError(f"{caller} expects a gnnaas GNN (got {type(model).__name__})")
    if model.precision != "fp32":
        raise ValueError(f"{caller} expects an fp32 model (got precision {model.precision!r})")
    return model


def calibrate_int8(
    model: GNN, batches: Iterable[tuple[Tensor, Tensor | Sequence[Block]]]
) -> dict[str, list[float]]:
    """The input range of every linear layer :func:`quantize_int8` replaces, over ``batches``.

    Runs a copy of the fp32 model in eval mode on each ``(x, adjs)`` pair, as
    ``model(x, adjs)`` takes it (sampled features and blocks, or a full graph's features and
    ``edge_index``), through PyG's convolutions so that every linear layer is called as a module,
    and keeps the smallest and largest value each layer's input took (no clipping: see the module
    docstring). ``model`` itself is not changed.

    Args:
        model (GNN): an fp32 model, on the device the batches are on.
        batches (Iterable[tuple[Tensor, Tensor | Sequence[Block]]]): at least one batch; for a
            served variant, its sampled subgraphs of some training nodes with its fanouts.

    Returns:
        dict[str, list[float]]: layer name (the fp32 model's module name, e.g.
        ``"convs.0.lin_l"``) → ``[min, max]`` as plain floats, ready for ``json.dumps``.

    Raises:
        TypeError: ``model`` is not a :class:`~gnnaas.models.GNN`.
        ValueError: ``model`` is already quantized, ``batches`` is empty, or a layer saw no
            input or a value that is not finite.

    Example:
        >>> sub = DepthSampler(store.rowptr, store.col, (25, 10)).sample(seeds)  # doctest: +SKIP
        >>> calibrate_int8(model, [(store.x[sub.n_id], sub.blocks)])  # doctest: +SKIP
        {'convs.0.lin_l': [0.0, 1.0], 'convs.0.lin_r': [0.0, 1.0], ...}
    """
    model = _check_model(model, "calibrate_int8")
    work = copy.deepcopy(model).eval()
    observed: dict[str, tuple[Tensor, Tensor]] = {}

    def observe(name: str, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        x = cast(Tensor, args[0]).detach()
        if x.numel() == 0:
            return
        low, high = torch.aminmax(x)  # no host sync here: the ranges are read once at the end
        if name in observed:
            seen_low, seen_high = observed[name]
            low, high = torch.minimum(seen_low, low), torch.maximum(seen_high, high)
        observed[name] = (low, high)

    names = _linear_names(work)
    modules = dict(work.named_modules())
    for name in names:
        modules[name].register_forward_pre_hook(functools.partial(observe, name))
    count = 0
    with torch.inference_mode():
        for x, adjs in batches:
            # PyG's convolutions: the fused SAGE update multiplies by lin_l.weight without a call
            work(x, adjs, pyg_convs=True)
            count += 1
    if count == 0:
        raise ValueError("calibrate_int8 expects at least one (x, adjs) batch (got none)")
    ranges: dict[str, list[float]] = {}
    for name in names:
        if name not in observed:
            raise ValueError(
                f"calibrate_int8: linear layer {name!r} saw no input in {count} batches; "
                "calibrate on batches with nodes"
            )
        low, high = (float(v) for v in observed[name])
        if not (math.isfinite(low) and math.isfinite(high)):
            raise ValueError(
                f"calibrate_int8: linear layer {name!r} saw non-finite inputs "
                f"(got range [{low}, {high}]); check the features and the weights"
            )
        ranges[name] = [low, high]
    return ranges


def _parse_ranges(
    ranges: Mapping[str, Sequence[float]], names: list[str]
) -> dict[str, tuple[float, float]]:
    """``ranges`` checked against the model's linear layers ``names``, as float pairs."""
    if not isinstance(ranges, Mapping):
        raise TypeError(
            f"quantize_int8 expects ranges as a mapping layer name -> [min, max] "
            f"(got {type(ranges).__name__}); see calibrate_int8"
        )
    parsed: dict[str, tuple[float, float]] = {}
    for name in names:
        if name not in ranges:
            raise ValueError(
                f"quantize_int8: no input range for linear layer {name!r} (ranges has "
                f"{sorted(ranges)}); calibrate this model with calibrate_int8"
            )
        value = ranges[name]
        pair = tuple(value) if isinstance(value, Sequence) and not isinstance(value, str) else ()
        if (
            len(pair) != 2
            or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in pair)
            or not all(math.isfinite(v) for v in pair)
            or pair[0] > pair[1]
        ):
            raise ValueError(
                f"quantize_int8 expects the range of {name!r} as [min, max], two finite "
                f"numbers with min <= max (got {value!r})"
            )
        parsed[name] = (float(pair[0]), float(pair[1]))
    unknown = sorted(set(ranges) - set(names))
    if unknown:
        raise ValueError(
            f"quantize_int8: ranges name layers the model does not have (got {unknown}); "
            "were they calibrated on another model?"
        )
    return parsed


def quantize_int8(model: GNN, ranges: Mapping[str, Sequence[float]]) -> GNN:
    """An inference-only copy of ``model`` with int8 linear layers whose inputs are quantized
    with the fixed ranges of :func:`calibrate_int8` (see the module docstring); ``model`` itself
    is left unchanged.

    The copy runs every path of the fp32 model (sampled blocks, fused or through PyG's
    convolutions, a full-graph ``edge_index``,
    :func:`gnnaas.inference.layerwise.layerwise_inference`, ``embed=True``) on the CPU, has
    :attr:`~gnnaas.models.GNN.precision` ``"int8"``, stays in eval mode (its ``train()`` raises)
    and has no trainable parameters. Each int8 layer's output
    row depends on its input row only, never on the other rows of the batch. It is not meant to
    be saved: store the fp32 weights and the ranges, and quantize again when loading.

    Args:
        model (GNN): an fp32 model in eval mode, on the CPU.
        ranges (Mapping[str, Sequence[float]]): ``[min, max]`` of every linear layer's input,
            keyed by its name in ``model``, as :func:`calibrate_int8` returns them (or as read
            back from JSON).

    Returns:
        GNN: the quantized copy, of ``model``'s class, in eval mode.

    Raises:
        TypeError: ``model`` is not a :class:`~gnnaas.models.GNN`, or ``ranges`` not a mapping.
        ValueError: ``model`` is in training mode, already quantized, not on the CPU, or not
            float32; ``ranges`` lacks a layer of ``model``, names one it does not have, or holds
            a value that is not ``[min, max]``.
        ConfigError: this torch build or CPU cannot run int8 layers (:func:`int8_available`);
            the message says what is missing.

    Example:
        >>> int8 = quantize_int8(model, calibrate_int8(model, batches))  # doctest: +SKIP
        >>> int8.precision, int8.training  # doctest: +SKIP
        ('int8', False)
    """
    model = _check_model(model, "quantize_int8")
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
    parsed = _parse_ranges(ranges, _linear_names(model))
    reason = _unavailable_reason()
    if reason is not None:
        raise ConfigError(f"int8 precision is not available: {reason}; serve fp32 variants")
    with _packing(), torch.no_grad():
        quantized = copy.deepcopy(model)
        _quantize_children(quantized, "", parsed)
    quantized.requires_grad_(False)
    quantized.precision = "int8"
    return quantized


def model_bytes(model: torch.nn.Module) -> int:
    """Bytes of ``model``'s values at the precision it holds them in: every parameter and buffer
    at its element size, and an int8 linear layer of :func:`quantize_int8` as 1 byte per weight
    plus its float32 bias and per-channel scales (a variant's reported size; the process holds
    more, e.g. fbgemm's packed copy of each int8 weight).

    Args:
        model (torch.nn.Module): any module, fp32 or quantized.

    Returns:
        int: the size in bytes; a tensor shared by several modules counts once.

    Example:
        >>> model_bytes(torch.nn.Linear(4, 2))
        40
    """
    tensors = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    return size + sum(m.nbytes for m in model.modules() if isinstance(m, _Int8Linear))
