"""Analytical performance model of sampled GNN inference (docs/architecture.md §5).

For a batch of ``t`` target nodes, an ``L``-layer GNN with per-layer fanouts ``s_1..s_L`` and
channel sizes ``f_0..f_L``, a fraction ``c`` of unique nodes among the ``t·∏ s_k`` sampled ones
(about 1 at most; the profiler counts every node of the sample, inner hops included, so tiny
batches can exceed 1 slightly), ``b`` bytes per value, a feature-movement bandwidth ``BW``
(bytes/s) and a compute rate ``OPS`` (op/s)::

    N_0    = c · t · ∏_k s_k                                   input nodes
    T_comm = N_0 · f_0 · b / BW  +  t · f_L · b / BW            input gather/copy + output copy
    T_comp = Σ_l c · t · ∏_{k>l} s_k · (s_l·f_{l-1} + f_{l-1}·f_l + f_l) / OPS

Indices follow the *layer* order of the reference study: layer 1 is the first layer applied (it
reads the outermost hop) and ``s_l`` is the number of neighbors layer ``l`` aggregates, so the
destination nodes of layer ``l`` are the ``t · ∏_{k>l} s_k`` nodes of hop ``L - l``. PyG (and the
variant manifests) list fanouts in *hop* order, seeds first: ``fanouts=(25, 10)`` means layer 2
(the last) aggregates 25 neighbors and layer 1 aggregates 10, i.e. ``s = fanouts[::-1]``. Every
function here takes PyG-order fanouts and does that reversal itself.

Per destination node a layer costs ``s_l·f_{l-1}`` (aggregation), ``f_{l-1}·f_l`` (the dense
transform, one multiply-add counted as one op) and ``f_l`` (activation), so ``OPS`` is in
multiply-adds per second; :func:`calibrate` measures it in the same unit.

The reference example (t=1024, L=2, s=(25, 25), f=(128, 128, 128), c=0.5, b=4, BW=30e9,
OPS=0.7e12) gives 5.461 ms input transfer, 0.0175 ms output transfer and 0.3749 ms compute: the
compute figure needs every ``f_l`` (input, hidden and output) equal to 128, with layer 1 over
``c·t·s_2 = 12,800`` destination nodes and layer 2 over ``c·t = 512``.

Example:
    >>> est = estimate(1024, (25, 25), (128, 128, 128), unique_frac=0.5, bw=30e9, ops=0.7e12)
    >>> round(est.input_comm_ms, 2), round(est.comp_ms, 3), round(est.output_comm_ms, 3)
    (5.46, 0.375, 0.017)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from gnnaas.typing import Device

__all__ = [
    "Calibration",
    "PerfEstimate",
    "calibrate",
    "comm_time_ms",
    "comp_time_ms",
    "estimate",
    "input_nodes",
]

_BYTES_FLOAT32 = 4


@dataclass(frozen=True)
class Calibration:
    """Measured rates of the running machine, in the units of the analytical model.

    Args:
        bw (float): feature movement bandwidth in bytes/s (row gather + host→device copy).
        ops (float): dense compute rate in multiply-adds/s.
        device (str): the device measured.
    """

    bw: float
    ops: float
    device: str


@dataclass(frozen=True)
class PerfEstimate:
    """Predicted times of one batch, in milliseconds.

    Args:
        input_comm_ms (float): gathering and copying the input features of the sampled nodes.
        output_comm_ms (float): copying the outputs of the targets back.
        comp_ms (float): the forward pass.
        num_input_nodes (float): ``N_0``, the predicted number of unique input nodes.
    """

    input_comm_ms: float
    output_comm_ms: float
    comp_ms: float
    num_input_nodes: float

    @property
    def comm_ms(self) -> float:
        """Input plus output transfer time (ms)."""
        return self.input_comm_ms + self.output_comm_ms


def _layer_fanouts(fanouts: Sequence[int]) -> list[int]:
    """PyG hop-order fanouts → the study's layer-order ``s_1..s_L``."""
    if len(fanouts) == 0:
        raise ValueError("perfmodel: fanouts must name at least one layer (got ())")
    for s in fanouts:
        if int(s) < 1:
            raise ValueError(
                f"perfmodel: fanouts must be >= 1 (got {tuple(fanouts)}); replace -1 ('all "
                "neighbors') by the graph's maximum degree to bound the neighborhood"
            )
    return [int(s) for s in reversed(fanouts)]


def _check(batch_size: int, unique_frac: float, bw: float | None, ops: float | None) -> None:
    if batch_size < 1:
        raise ValueError(f"perfmodel: batch_size must be >= 1 (got {batch_size})")
    if not (unique_frac > 0.0 and math.isfinite(unique_frac)):
        raise ValueError(f"perfmodel: unique_frac must be > 0 (got {unique_frac})")
    for name, rate in (("bw", bw), ("ops", ops)):
        if rate is not None and not (rate > 0 and math.isfinite(rate)):
            raise ValueError(f"perfmodel: {name} must be a positive finite rate (got {rate})")


def input_nodes(batch_size: int, fanouts: Sequence[int], unique_frac: float = 1.0) -> float:
    """Predicted unique input nodes ``N_0 = c·t·∏ s_k``.

    Args:
        batch_size (int): ``t``, the number of target nodes.
        fanouts (Sequence[int]): neighbors per hop, PyG order.
        unique_frac (float, optional): ``c``. (default: ``1.0``)

    Returns:
        float: ``N_0``.
    """
    _check(batch_size, unique_frac, None, None)
    return unique_frac * batch_size * math.prod(_layer_fanouts(fanouts))


def comm_time_ms(
    batch_size: int,
    fanouts: Sequence[int],
    in_channels: int,
    out_channels: int,
    *,
    unique_frac: float,
    bw: float,
    bytes_per_value: int = _BYTES_FLOAT32,
) -> tuple[float, float]:
    """Input and output transfer times ``(T_in, T_out)`` in ms.

    Args:
        batch_size (int): ``t``.
        fanouts (Sequence[int]): neighbors per hop, PyG order.
        in_channels (int): ``f_0``, the features kept by the variant.
        out_channels (int): ``f_L``, the output width (classes).
        unique_frac (float): ``c``.
        bw (float): bytes/s.
        bytes_per_value (int, optional): ``b``. (default: ``4``)

    Returns:
        tuple[float, float]: input and output transfer times (ms).
    """
    _check(batch_size, unique_frac, bw, None)
    n0 = input_nodes(batch_size, fanouts, unique_frac)
    t_in = n0 * in_channels * bytes_per_value / bw
    t_out = batch_size * out_channels * bytes_per_value / bw
    return 1e3 * t_in, 1e3 * t_out


def comp_time_ms(
    batch_size: int,
    fanouts: Sequence[int],
    channels: Sequence[int],
    *,
    unique_frac: float,
    ops: float,
) -> float:
    """Forward-pass time ``T_comp`` in ms.

    Args:
        batch_size (int): ``t``.
        fanouts (Sequence[int]): neighbors per hop, PyG order (``L`` entries).
        channels (Sequence[int]): ``f_0..f_L`` (``L + 1`` entries: input, hidden..., output).
        unique_frac (float): ``c``.
        ops (float): multiply-adds/s.

    Returns:
        float: the predicted compute time (ms).
    """
    _check(batch_size, unique_frac, None, ops)
    s = _layer_fanouts(fanouts)
    f = [int(v) for v in channels]
    if len(f) != len(s) + 1:
        raise ValueError(
            f"perfmodel: channels must have len(fanouts) + 1 entries f_0..f_L "
            f"(got {len(f)} channels for {len(s)} layers)"
        )
    total = 0.0
    for layer in range(1, len(s) + 1):  # study's 1-based layer index l
        dst = unique_frac * batch_size * math.prod(s[layer:])  # ∏_{k>l} s_k
        f_in, f_out, s_l = f[layer - 1], f[layer], s[layer - 1]
        total += dst * (s_l * f_in + f_in * f_out + f_out)
    return 1e3 * total / ops


def estimate(
    batch_size: int,
    fanouts: Sequence[int],
    channels: Sequence[int],
    *,
    unique_frac: float,
    bw: float,
    ops: float,
    bytes_per_value: int = _BYTES_FLOAT32,
) -> PerfEstimate:
    """All predicted times of one batch.

    Args:
        batch_size (int): ``t``.
        fanouts (Sequence[int]): neighbors per hop, PyG order.
        channels (Sequence[int]): ``f_0..f_L``.
        unique_frac (float): ``c``.
        bw (float): bytes/s.
        ops (float): multiply-adds/s.
        bytes_per_value (int, optional): ``b``. (default: ``4``)

    Returns:
        PerfEstimate: input/output transfer and compute times (ms).

    Example:
        >>> est = estimate(1024, (25, 10), (358, 256, 7), unique_frac=0.3, bw=5e9, ops=5e10)
        >>> round(est.comp_ms, 1)
        14.7
    """
    t_in, t_out = comm_time_ms(
        batch_size,
        fanouts,
        channels[0],
        channels[-1],
        unique_frac=unique_frac,
        bw=bw,
        bytes_per_value=bytes_per_value,
    )
    return PerfEstimate(
        input_comm_ms=t_in,
        output_comm_ms=t_out,
        comp_ms=comp_time_ms(batch_size, fanouts, channels, unique_frac=unique_frac, ops=ops),
        num_input_nodes=input_nodes(batch_size, fanouts, unique_frac),
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # intended: clock only finished work


def _best_rate(work: float, fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """``work`` divided by the best time of ``repeats`` calls of ``fn`` (after one warm-up).

    The best, not the median: a rate is what the machine can do, and on shared cores the slower
    calls measure the other work.
    """
    fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return work / max(min(times), 1e-9)


def calibrate(
    device: Device = "cpu",
    *,
    num_rows: int = 65_536,
    row_width: int = 128,
    gather_rows: int = 32_768,
    matmul_size: int = 512,
    repeats: int = 7,
    seed: int = 0,
) -> Calibration:
    """Measures ``BW`` and ``OPS`` on the running machine (well under a second on a laptop CPU).

    ``BW`` is the throughput of the profiler's own input path: gathering random rows of a
    float32 host matrix and copying them to ``device`` (pinned, non-blocking on CUDA; the copy is
    a no-op on the CPU), in bytes of gathered features per second. ``OPS`` is the rate of a dense
    ``[n, n] @ [n, n]`` float32 matmul on ``device`` in multiply-adds per second (``n³``/time),
    the unit in which the model counts ``f_{l-1}·f_l``.

    Args:
        device (str or torch.device, optional): where the model runs. (default: ``"cpu"``)
        num_rows (int, optional): rows of the host matrix (default 32 MiB). (default: ``65536``)
        row_width (int, optional): floats per row. (default: ``128``)
        gather_rows (int, optional): rows gathered per measurement. (default: ``32768``)
        matmul_size (int, optional): ``n`` of the matmul. (default: ``512``)
        repeats (int, optional): timed repetitions; the fastest counts. (default: ``7``)
        seed (int, optional): seed of the gathered row ids. (default: ``0``)

    Returns:
        Calibration: ``bw`` (bytes/s), ``ops`` (multiply-adds/s) and the device.
    """
    dev = torch.device(device)
    if min(num_rows, row_width, gather_rows, matmul_size, repeats) < 1:
        raise ValueError("calibrate: sizes and repeats must be >= 1")
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(num_rows, row_width, generator=gen)
    idx = torch.randint(0, num_rows, (gather_rows,), generator=gen)
    pin = dev.type == "cuda"

    def _move() -> None:
        rows = x.index_select(0, idx)
        if pin:
            rows = rows.pin_memory()
        rows.to(dev, non_blocking=True)

    bw = _best_rate(gather_rows * row_width * _BYTES_FLOAT32, _move, dev, repeats)

    a = torch.rand(matmul_size, matmul_size, generator=gen).to(dev)
    b = torch.rand(matmul_size, matmul_size, generator=gen).to(dev)
    ops = _best_rate(float(matmul_size) ** 3, lambda: torch.mm(a, b), dev, repeats)
    return Calibration(bw=bw, ops=ops, device=str(dev))
