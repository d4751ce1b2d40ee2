"""A whole PyG ``Data`` saved as safetensors, for ``gnnaas import NAME --from-pyg FILE``.

The file holds tensors ``x`` ``[N, F]``, ``edge_index`` ``[2, E]``, ``y`` and optionally
``train_mask``/``val_mask``/``test_mask`` (others, e.g. ``edge_attr``, are ignored). It is read with
safetensors, never unpickled, and checked like separate files (:mod:`gnnaas.data.readers`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gnnaas.data.readers import (
    SPLIT_NAMES,
    SourceFile,
    check_split_parts,
    features_from_array,
    labels_from_array,
)

__all__ = ["read_pyg"]


def _numpy(tensor: Any) -> np.ndarray:
    import torch

    if tensor.dtype in (torch.bfloat16, torch.float16):
        tensor = tensor.float()  # numpy has no bfloat16
    return tensor.numpy()


def read_pyg(file: SourceFile, multi_label: bool) -> dict[str, Any]:
    """A PyG ``Data`` saved as safetensors (never a pickle).

    Returns:
        dict: ``x`` ``[N, F]`` float32, ``src`` and ``dst`` int64, ``y`` and ``num_classes`` as
        :func:`read_labels` gives them, and ``split`` (train, val, test ids) or :obj:`None`.
    """
    from safetensors import safe_open

    hint = (
        "save the Data's tensors with safetensors.torch.save_file({'x': data.x, "
        "'edge_index': data.edge_index, 'y': data.y}, FILE)"
    )
    wanted = ("x", "edge_index", "y", "train_mask", "val_mask", "test_mask")
    try:
        with safe_open(str(file.path), framework="pt") as f:
            keys = set(f.keys())
            tensors = {k: f.get_tensor(k) for k in wanted if k in keys}
    except Exception as exc:  # safetensors raises its own error types for a foreign file
        raise file.fail(f"cannot read it as safetensors ({exc}); {hint}") from None
    for key in ("x", "edge_index", "y"):
        if key not in tensors:
            found = ", ".join(sorted(keys)) or "none"
            raise file.fail(f"no tensor '{key}' (found: {found}); {hint}")
    x = features_from_array(file, _numpy(tensors.pop("x")), "x: ")
    n = x.shape[0]
    edge_index = tensors.pop("edge_index")
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise file.fail(f"edge_index: shape {list(edge_index.shape)}; it must be [2, E]")
    if edge_index.dtype.is_floating_point or edge_index.dtype.is_complex:
        raise file.fail(f"edge_index: dtype {edge_index.dtype}; node ids must be integers")
    ids = edge_index.long().numpy()
    for row, what in ((0, "source"), (1, "target")):
        bad = (ids[row] < 0) | (ids[row] >= n)
        if bad.any():
            e = int(np.flatnonzero(bad)[0])
            raise file.fail(
                f"edge_index[{row}, {e}]: {what} {int(ids[row, e])} is outside [0, {n}); "
                f"x has {n} rows, one per node"
            )
    y, num_classes = labels_from_array(file, _numpy(tensors.pop("y")), n, multi_label, "y: ")
    split = None
    masks = {k: tensors[f"{k}_mask"] for k in SPLIT_NAMES if f"{k}_mask" in tensors}
    if masks:
        if len(masks) < 3:
            absent = [f"{k}_mask" for k in SPLIT_NAMES if k not in masks]
            raise file.fail(f"no tensor {absent[0]}; give train_mask, val_mask and test_mask")
        parts = {}
        for key, mask in masks.items():
            if mask.dim() != 1 or mask.numel() != n or mask.dtype.is_floating_point:
                raise file.fail(
                    f"{key}_mask: shape {list(mask.shape)}, dtype {mask.dtype}; it must be an "
                    f"[{n}] bool mask"
                )
            parts[key] = mask.bool().nonzero().view(-1).numpy()
        split = check_split_parts(file, parts, n, positions=False)
    return {
        "x": x,
        "src": ids[0],
        "dst": ids[1],
        "y": y,
        "num_classes": num_classes,
        "split": split,
    }
