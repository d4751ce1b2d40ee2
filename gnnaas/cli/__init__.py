"""The ``gnnaas`` command: datasets, import, train, generate, profile, report, cache-plan, prepare,
infer, precompute, compact, serve, stop.

Every command prints one line ``ErrorName: message`` and exits 1 on a user error; ``--debug``
shows the traceback instead. Heavy modules are imported inside the commands so ``gnnaas --help``
stays fast and a command's first progress line appears before torch is loaded.

Configuration is one path (:mod:`gnnaas.config`), flag > environment > default: options that
have an environment fallback default to ``None`` here, and each command builds one settings object
when it starts from the options given, then the ``GNNAAS_*`` variables, then the defaults
(``--data-root`` ← ``GNNAAS_DATA``, ``--variants`` and ``generate --out`` ←
``GNNAAS_VARIANTS_DIR``, ``--profiles`` and ``profile --out`` ← ``GNNAAS_PROFILES_DIR``,
``--device`` ← ``GNNAAS_DEVICE``, ``--state-dir`` ← ``GNNAAS_STATE_DIR``, ``--threads`` ←
``GNNAAS_THREADS``, ``report --tie-margin`` ← ``GNNAAS_TIE_MARGIN``; the profiled pipeline from
the server's ``GNNAAS_SEED``, ``GNNAAS_MAX_BATCH_NODES``, ...). ``serve`` passes only the options
given to the server's settings, so every other ``GNNAAS_*`` server setting applies.

Long commands (train, generate, profile, prepare) print one line per phase on stderr and show a
progress bar per phase, also when stderr is not a terminal (then refreshed every few seconds, so
logs stay short); ``-q``/``--quiet`` silences both. ``generate`` and ``prepare`` also show each
model's epochs as they finish (the bar's postfix on a terminal, ``key: value`` lines otherwise)
and, after a plan's first epoch, an estimate when it may take long
(:mod:`gnnaas.variants.progress`).

The commands live in one module per group: :mod:`gnnaas.cli.data` (datasets, import),
:mod:`gnnaas.cli.variants` (train, generate, variants add), :mod:`gnnaas.cli.profiling` (profile,
report, cache-plan, prepare), :mod:`gnnaas.cli.exact` (compact, infer, precompute) and
:mod:`gnnaas.cli.serve` (serve, stop, ray-config); :mod:`gnnaas.cli.common` holds what they share.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from gnnaas.cli import data, exact, profiling, serve, variants
from gnnaas.cli.common import _positive_int
from gnnaas.errors import GnnaasError

__all__ = ["main"]

_log = logging.getLogger("gnnaas")

# When stderr is a file or a pipe, tqdm redraws at most this often (seconds; tqdm reads
# TQDM_MININTERVAL when it is first imported).
_LOG_REFRESH_S = "5"


class _CommandParser(argparse.ArgumentParser):
    """A command's parser: its own usage line with every error, an unknown option included.

    An option the command does not know would otherwise reach the top-level parser (its usage,
    not the command's), or be hidden behind "the following arguments are required" when a
    required option is missing too; :func:`main` and :meth:`error` report it here instead.
    """

    _given: Sequence[str] = ()

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._given = list(args) if args is not None else sys.argv[1:]
        return super().parse_known_args(args, namespace)

    def unknown_options(self, given: Sequence[str]) -> list[str]:
        """The words of ``given`` that look like options this parser does not know (nor any
        abbreviation of one), up to a ``--``."""
        unknown = []
        for word in given:
            if word == "--":
                break
            name = word.split("=", 1)[0]
            if (
                name.startswith("-")
                and len(name) > 1
                and not self._negative_number_matcher.match(name)
                and not any(option.startswith(name) for option in self._option_string_actions)
            ):
                unknown.append(word)
        return unknown

    def error(self, message: str) -> NoReturn:
        if message.startswith("the following arguments are required"):
            unknown = self.unknown_options(self._given)
            if unknown:
                message = f"unrecognized arguments: {' '.join(unknown)}"
        super().error(message)


def _command_parser(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> argparse.ArgumentParser:
    """The parser of the (sub)command ``args`` ran: ``gnnaas variants add``'s for that one."""
    current = parser
    while True:
        subs = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, subs[0].dest, None) if subs else None
        if name is None:
            return current
        current = subs[0].choices[name]


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parser.parse_args(argv)``, except that words nobody knew are reported by the command's
    parser (its usage line, exit 2), not the top-level one."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        words = list(argv) if argv is not None else sys.argv[1:]
        before = words[: words.index(args.command)] if args.command in words else []
        owner = parser if any(e in before for e in extras) else _command_parser(parser, args)
        owner.error(f"unrecognized arguments: {' '.join(extras)}")
    return args


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gnnaas",
        description="Model-less GNN inference: generate, profile, serve feature-pruned variants.",
        epilog="Run `gnnaas COMMAND --help` for a command's options. A first run: "
        "`gnnaas prepare --dataset synth-small` then `gnnaas serve`.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress at INFO level")
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress lines or bars on stderr (results and errors are still printed)",
    )
    parser.add_argument(
        "--threads",
        type=_positive_int,
        default=None,
        help="torch intra-op threads of the command; profile and prepare time with them "
        "(default: $GNNAAS_THREADS, else torch's choice, and for profiling the server's "
        "$GNNAAS_TORCH_THREADS or 1; 1 is faster on a busy machine)",
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_CommandParser
    )
    for group in (data, variants, profiling, exact, serve):
        group.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gnnaas`` console script."""
    parser = _build_parser()
    args = _parse(parser, argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    func: Callable[[argparse.Namespace], int] = args.func
    # Bars stay on when stderr is a file or pipe, redrawn every few seconds instead of 10x/s.
    refresh = not sys.stderr.isatty() and "TQDM_MININTERVAL" not in os.environ
    if refresh:
        os.environ["TQDM_MININTERVAL"] = _LOG_REFRESH_S
    try:
        return func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (GnnaasError, FileNotFoundError, PermissionError) as exc:
        if args.debug:
            raise
        red, reset = ("\033[31m", "\033[0m") if sys.stderr.isatty() else ("", "")
        print(f"{red}{type(exc).__name__}: {exc}{reset}", file=sys.stderr)
        return 1
    finally:
        if refresh:
            os.environ.pop("TQDM_MININTERVAL", None)
