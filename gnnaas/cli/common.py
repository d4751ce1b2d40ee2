"""What the command modules share: progress lines, tables, configuration defaults, option helpers.

Package-internal: the command modules (:mod:`gnnaas.cli.data`, ...) import these names; nothing
here imports torch at module level, so ``gnnaas --help`` stays fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

__all__ = [
    "_PROFILES_HELP",
    "_VARIANTS_HELP",
    "_add_data_args",
    "_add_epochs",
    "_add_quiet",
    "_add_served_folders",
    "_device",
    "_env_default",
    "_load",
    "_positive_int",
    "_print_table",
    "_profiles_dir",
    "_profiling_pipeline",
    "_progress",
    "_quiet",
    "_say",
    "_serving_pipeline",
    "_start",
    "_variants_dir",
]


def _quiet(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "quiet", False))


def _progress(args: argparse.Namespace) -> bool:
    """Whether library functions draw progress bars."""
    return not _quiet(args)


def _say(args: argparse.Namespace, message: str) -> None:
    """One progress line on stderr (a phase starts), unless ``--quiet``."""
    if not _quiet(args):
        print(f"{args.command}: {message}", file=sys.stderr, flush=True)


def _start(args: argparse.Namespace, message: str | None = None) -> None:
    """Says ``message`` first, then applies ``--threads`` (importing torch takes seconds)."""
    if message is not None:
        _say(args, message)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)


def _env_default(value: str | None, env: str, default: str) -> str:
    """``value`` when given on the command line, else ``$env``, else ``default``."""
    if value is not None:
        return value
    return os.environ.get(env) or default


def _device(args: argparse.Namespace) -> str:
    return _env_default(args.device, "GNNAAS_DEVICE", "auto")


def _variants_dir(value: str | None) -> str:
    return _env_default(value, "GNNAAS_VARIANTS_DIR", "variants")


def _profiles_dir(value: str | None) -> str:
    return _env_default(value, "GNNAAS_PROFILES_DIR", "profiles")


def _serving_pipeline() -> dict[str, Any]:
    """The server's sampler, batch cap and inline threshold from the environment
    (``GNNAAS_SAMPLING``, ``GNNAAS_SEED``, ``GNNAAS_MAX_BATCH_NODES``,
    ``GNNAAS_INLINE_MAX_NODES``), so profiles measure the pipeline served."""
    from gnnaas.serving.core.settings import Settings

    settings = Settings()
    return {
        "sampling": settings.sampling,
        "sampler_seed": settings.seed,
        "max_batch_nodes": settings.max_batch_nodes,
        "inline_max_nodes": settings.inline_max_nodes,
        "threads": settings.torch_threads,
    }


def _profiling_pipeline(args: argparse.Namespace, device: Any) -> dict[str, Any]:
    """:func:`_serving_pipeline` with ``--threads`` (when given) instead of the server's
    ``GNNAAS_TORCH_THREADS`` (profiles are timed with the threads they will be served with),
    plus the feature cache the server builds on ``device`` (``GNNAAS_FEATURE_CACHE_MB``, on
    CUDA only)."""
    from gnnaas.serving.core.settings import Settings

    pipeline = _serving_pipeline()
    if args.threads is not None:
        pipeline["threads"] = args.threads
    pipeline["feature_cache_mb"] = Settings().feature_cache_mb if device.type == "cuda" else 0.0
    return pipeline


def _print_table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> None:
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for i, row in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))


def _load(args: argparse.Namespace) -> Any:
    """The dataset's graph store; ``load_dataset`` falls back to ``$GNNAAS_DATA``."""
    from gnnaas.data import load_dataset

    return load_dataset(args.dataset, args.data_root, seed=args.seed)


# ----------------------------------------------------------------------------------------------
# options


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 (got {text!r})") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 (got {text!r})")
    return value


def _add_quiet(p: argparse.ArgumentParser) -> None:
    # SUPPRESS: `gnnaas -q CMD` and `gnnaas CMD -q` both work, neither resets the other.
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=argparse.SUPPRESS,
        help="no progress lines or bars on stderr (results and errors are still printed)",
    )


def _add_data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", required=True, help="dataset name (see `gnnaas datasets`)")
    p.add_argument(
        "--data-root",
        default=None,
        help="folder holding <Class>/<Name>/raw/ of real datasets (default: $GNNAAS_DATA)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed for splits, sampling, init (default: 0)"
    )
    p.add_argument(
        "--device",
        default=None,
        help="auto (CUDA when present), cpu or cuda[:n] (default: $GNNAAS_DEVICE or auto)",
    )
    _add_quiet(p)


def _add_served_folders(p: argparse.ArgumentParser) -> None:
    """``--variants``, ``--profiles``, ``--data-root`` of what a server serves (serve,
    ray-config); left out, the GNNAAS_* variables decide."""
    p.add_argument("--variants", default=None, help=_VARIANTS_HELP)
    p.add_argument("--profiles", default=None, help=_PROFILES_HELP)
    p.add_argument(
        "--data-root",
        default=None,
        help="folder holding real datasets (default: $GNNAAS_DATA_ROOT or $GNNAAS_DATA)",
    )


def _add_epochs(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--epochs",
        type=_positive_int,
        default=200,
        help="most training epochs per model; early stopping usually ends sooner (default: 200)",
    )


_VARIANTS_HELP = "variant repository (default: $GNNAAS_VARIANTS_DIR or variants)"
_PROFILES_HELP = "profiles folder (default: $GNNAAS_PROFILES_DIR or profiles)"
