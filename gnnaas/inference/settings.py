"""The execution settings that shape a service curve, recorded with profiles and checked at load.

A profiled batch time holds only for the settings it was measured under: torch's intra-op
threads, the fused forward (:attr:`gnnaas.models.GNN.fused_eval`), the compiled sampler
(:func:`gnnaas.sampling.fastpath.available`), the inline threshold (batches run on the
calling thread), the device, and the torch and gnnaas versions. The profiler writes
:func:`execution_settings` into every row of ``service_times.csv``; the server compares them
with its own (:func:`settings_mismatch`) and never routes on a curve measured under others
without re-timing it. :func:`apply_execution_settings` sets the two process-wide switches (fused
forward, compiled sampler) from a command's or the server's settings when it starts; nothing reads
them from the environment at import.

Example:
    >>> recorded = {"threads": 2, "device": "cpu"}
    >>> settings_mismatch(recorded, {"threads": 1, "device": "cpu"})
    ['threads 2 (here 1)']
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from gnnaas.typing import Device

__all__ = [
    "SETTING_COLUMNS",
    "apply_execution_settings",
    "device_name",
    "execution_settings",
    "settings_mismatch",
]

SETTING_COLUMNS: tuple[str, ...] = (
    "threads",
    "fused_forward",
    "fast_sampler",
    "inline_max_nodes",
    "device",
    "torch_version",
    "gnnaas_version",
)
"""The settings recorded with every service curve point, in file order."""


def apply_execution_settings(*, fused_forward: bool, fast_sampler: bool) -> None:
    """Sets this process's switches of the forward pass and the sampler, which
    :func:`execution_settings` then reports: :attr:`GNN.fused_eval
    <gnnaas.models.GNN.fused_eval>` (the class default; an instance may still override it) and
    :func:`gnnaas.sampling.fastpath.configure`.

    A command or the server calls it when it starts, with its settings' ``fused_forward`` and
    ``fast_sampler`` (:class:`gnnaas.config.SharedSettings`: ``GNNAAS_FUSED_FORWARD``,
    ``GNNAAS_FAST_SAMPLER``).

    Args:
        fused_forward (bool): eval-mode forwards on blocks run the fused layers.
        fast_sampler (bool): CPU batches may take the compiled sampler (when numba is there).
    """
    from gnnaas.models import GNN
    from gnnaas.sampling import fastpath

    GNN.fused_eval = bool(fused_forward)
    fastpath.configure(fast_sampler)


def device_name(device: Device) -> str:
    """``cpu``, or ``cuda:<n> (<card>)`` for a GPU."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return dev.type
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"


def execution_settings(device: Device, *, inline_max_nodes: int) -> dict[str, Any]:
    """The settings of this process that shape batch times (:data:`SETTING_COLUMNS`).

    Args:
        device (str | torch.device): where forward passes run.
        inline_max_nodes (int): batches of at most this many nodes run on the calling thread.

    Returns:
        dict[str, Any]: one value per column; flags as 0/1.
    """
    import gnnaas
    from gnnaas.models import GNN
    from gnnaas.sampling import fastpath

    return {
        "threads": int(torch.get_num_threads()),
        "fused_forward": int(bool(GNN.fused_eval)),
        "fast_sampler": int(bool(fastpath.available())),
        "inline_max_nodes": int(inline_max_nodes),
        "device": device_name(device),
        "torch_version": str(torch.__version__),
        "gnnaas_version": str(gnnaas.__version__),
    }


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    return str(a) == str(b)


def settings_mismatch(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """How ``recorded`` settings differ from ``current`` ones, one phrase each (empty when the
    same). A setting ``recorded`` lacks (an older profile) differs.

    Example:
        >>> settings_mismatch({"threads": 1}, {"threads": 1, "device": "cpu"})
        ['device not recorded (here cpu)']
    """
    out = []
    for key, value in current.items():
        if _missing(recorded.get(key)):
            out.append(f"{key} not recorded (here {value})")
        elif not _same(recorded[key], value):
            shown = recorded[key]
            if isinstance(shown, float) and shown.is_integer():
                shown = int(shown)
            out.append(f"{key} {shown} (here {value})")
    return out
