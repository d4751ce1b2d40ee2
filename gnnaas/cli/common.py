"""What the command modules share: settings, progress lines, tables, option helpers.

Package-internal: the command modules (:mod:`gnnaas.cli.data`, ...) import these names; nothing
here imports torch at module level, so ``gnnaas --help`` stays fast.

Configuration: an offline command builds one :class:`~gnnaas.config.CommandSettings` when it
starts (:func:`_start`), from the options given on its command line (``--data-root``,
``--variants``, ``--profiles``, ``--device``, ``--state-dir``, ``--threads``, ``--tie-margin``,
or the command's own spelling of one, e.g. ``generate --out``), then the ``GNNAAS_*`` variables,
then the defaults; every later read of a setting in the command uses that object.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gnnaas.config import CommandSettings

__all__ = [
    "_PROFILES_HELP",
    "_VARIANTS_HELP",
    "_add_data_args",
    "_add_epochs",
    "_add_quiet",
    "_add_served_folders",
    "_load",
    "_pipeline",
    "_positive_float",
    "_positive_int",
    "_print_table",
    "_progress",
    "_quiet",
    "_say",
    "_settings",
    "_start",
]

# The settings an option sets when a command has it (field -> option); a command may spell one
# differently (``generate --out`` is its variants folder).
_OPTIONS = {
    "data_root": "--data-root",
    "variants_dir": "--variants",
    "profiles_dir": "--profiles",
    "device": "--device",
    "state_dir": "--state-dir",
    "threads": "--threads",
    "tie_margin": "--tie-margin",
}


def _quiet(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "quiet", False))


def _progress(args: argparse.Namespace) -> bool:
    """Whether library functions draw progress bars."""
    return not _quiet(args)


def _say(args: argparse.Namespace, message: str) -> None:
    """One progress line on stderr (a phase starts), unless ``--quiet``."""
    if not _quiet(args):
        print(f"{args.command}: {message}", file=sys.stderr, flush=True)


def _settings(
    args: argparse.Namespace, options: Mapping[str, str] | None = None
) -> CommandSettings:
    """The command's settings, built on the first call and kept on ``args``: the options given
    (flag), then the ``GNNAAS_*`` variables (environment), then the defaults.

    Args:
        args (argparse.Namespace): the parsed command line.
        options (Mapping[str, str], optional): settings this command sets with another option
            than the usual one (field -> option, e.g. ``{"variants_dir": "--out"}``).

    Raises:
        ConfigError: a bad value, naming the option or the variable it came from.
    """
    built: CommandSettings | None = getattr(args, "_settings", None)
    if built is not None:
        return built
    from pydantic import ValidationError

    from gnnaas.config import CommandSettings, settings_error

    flags = {**_OPTIONS, **(options or {})}
    given = {}
    for field, option in flags.items():
        value = getattr(args, option.lstrip("-").replace("-", "_"), None)
        if value is not None:
            given[field] = value
    try:
        built = CommandSettings(**given)
    except ValidationError as exc:
        raise settings_error(
            exc, CommandSettings, given, flags=flags, where=f"{args.command}: "
        ) from None
    args._settings = built
    return built


def _start(
    args: argparse.Namespace,
    message: str | None = None,
    *,
    options: Mapping[str, str] | None = None,
) -> CommandSettings:
    """Builds the command's settings (:func:`_settings`), says ``message``, then applies its
    ``threads`` to this process (importing torch takes seconds).

    Returns:
        CommandSettings: the command's settings.
    """
    settings = _settings(args, options)
    if message is not None:
        _say(args, message)
    if settings.threads is not None:
        import torch

        torch.set_num_threads(settings.threads)
    return settings


def _pipeline(settings: CommandSettings, device: Any = None) -> dict[str, Any]:
    """The serving pipeline profiles must be measured with, as ``profile_dataset`` takes it: the
    server's sampler seed, batch cap and inline threshold (``GNNAAS_SEED``,
    ``GNNAAS_MAX_BATCH_NODES``, ``GNNAAS_INLINE_MAX_NODES``), the threads (``--threads`` when
    given, else the server's ``GNNAAS_TORCH_THREADS``: profiles are timed with the threads they
    will be served with) and, on a CUDA ``device``, the feature cache the server builds there
    (``GNNAAS_FEATURE_CACHE_MB``)."""
    on_cuda = device is not None and device.type == "cuda"
    return {
        "sampler_seed": settings.seed,
        "max_batch_nodes": settings.max_batch_nodes,
        "inline_max_nodes": settings.inline_max_nodes,
        "threads": settings.threads if settings.threads is not None else settings.torch_threads,
        "feature_cache_mb": settings.feature_cache_mb if on_cuda else 0.0,
    }


def _print_table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> None:
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for i, row in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))


def _load(args: argparse.Namespace) -> Any:
    """The dataset's graph store, from the command's data root and cache (:func:`_settings`)."""
    from gnnaas.data import load_dataset

    settings = _settings(args)
    return load_dataset(
        args.dataset, settings.data_root, seed=args.seed, cache_dir=settings.cache_dir
    )


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


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0 (got {text!r})") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0 (got {text!r})")
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
        help="folder holding real datasets (default: $GNNAAS_DATA)",
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
