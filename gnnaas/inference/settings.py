"""The execution settings that shape a service curve, recorded with profiles and checked at load.

A profiled batch time holds only for the settings it was measured under: torch's intra-op
threads, the inline threshold (batches run on the calling thread), the device, and the torch and
gnnaas versions. The profiler writes :func:`execution_settings` into every row of
``service_times.csv``; the server compares them with its own (:func:`settings_mismatch`) and
never routes on a curve measured under others without re-timing it. Only the current settings
are compared: a column an older file still carries (``fused_forward`` and ``fast_sampler``
recorded switches that no longer exist) is ignored.

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
    "device_name",
    "execution_settings",
    "settings_mismatch",
]

SETTING_COLUMNS: tuple[str, ...] = (
    "threads",
    "inline_max_nodes",
    "device",
    "torch_version",
    "gnnaas_version",
)
"""The settings recorded with every service curve point, in file order."""


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
        dict[str, Any]: one value per column.
    """
    import gnnaas

    return {
        "threads": int(torch.get_num_threads()),
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
    same). Only the keys of ``current`` are compared: a setting ``recorded`` lacks (an older
    profile) differs, one only ``recorded`` holds (a column an older file still carries) is
    ignored.

    Example:
        >>> settings_mismatch({"threads": 1}, {"threads": 1, "device": "cpu"})
        ['device not recorded (here cpu)']
        >>> settings_mismatch({"threads": 1, "fused_forward": 0}, {"threads": 1})
        []
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
