"""Configuration: one pydantic-settings path for every gnnaas process, flag > environment > default.

Every setting is a field of one class tree, read from arguments and ``GNNAAS_*`` variables::

    SharedSettings              what every process reads (below)
    ├── CommandSettings         + what only an offline command reads (``--threads``)
    └── gnnaas.serving.core.settings.Settings
                                + what only a server reads (limits, tokens, live writes, workers)

:class:`SharedSettings` holds the folders (variants, profiles, data root, cache, data home, live
state), the device, and the serving pipeline a profile must be measured with (the sampler's
seed, batch cap, inline threshold, torch threads, feature cache, the router's tie margin). The
server's :class:`~gnnaas.serving.core.settings.Settings` *extends* it rather than the offline
commands using the server's class: an offline command then neither validates nor imports what
only a server reads (tokens, queue limits), and every field the profiler and the server share is
defined once (name, variable, default, bounds), so a profile is measured with exactly the
pipeline a server started in the same environment serves.

How a process reads it:

- an offline command (``gnnaas generate``, ``profile``, ...) builds one :class:`CommandSettings`
  when it starts, from the options given on its command line (flag), the ``GNNAAS_*`` variables
  (environment), then the defaults below; a bad value is one :class:`~gnnaas.errors.ConfigError`
  line (:func:`settings_error`) naming the option or the variable;
- a server builds one ``Settings`` the same way (``gnnaas serve`` passes the options given;
  ``--workers`` and Ray pass the values on to their processes);
- a library function called without a folder it needs (``load_dataset(name)`` without a data
  root, ``resolve_cache_dir()``) takes it from :func:`from_environment`: the same fields, read when
  it is called.

Nothing is read at import time, and no setting switches between two implementations of one job:
the sampler, the model and the HTTP edge choose their faster path themselves. The variables of the
switches that did (``GNNAAS_FAST_LANE``, ``GNNAAS_FAST_SAMPLER``, ``GNNAAS_FUSED_FORWARD``) are
no longer read; pydantic-settings ignores unknown ``GNNAAS_*`` variables (``extra="forbid"``
covers arguments only), so a process that finds one set logs one warning saying so.

Process plumbing that is not configuration is left to the environment: ``PROMETHEUS_MULTIPROC_DIR``
(prometheus-client's multiprocess mode), the worker supervisor's ``GNNAAS_SUPERVISOR_PID`` and
``GNNAAS_SHARED_STORE_DIR`` (set by the supervisor for its workers, read back as ``Settings``
fields) and ``TQDM_MININTERVAL``.

Example:
    >>> CommandSettings(variants_dir="v", threads=2).threads
    2
"""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from pydantic import AliasChoices, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gnnaas.errors import ConfigError
from gnnaas.policy import TIE_MARGIN

__all__ = [
    "CommandSettings",
    "SettingDoc",
    "SharedSettings",
    "describe_settings",
    "from_environment",
    "settings_error",
]

_ENV_PREFIX = "GNNAAS_"

_log = logging.getLogger(__name__)

# Variables of switches gnnaas no longer has, and what happens instead: each chose between two
# implementations of one job, and one of them (the faster, or for sampling the one that keeps a
# node's answer independent of its batch-mates) now always serves what it can.
_REMOVED_VARIABLES = {
    "GNNAAS_FAST_LANE": "the predict fast lane answers every request it can",
    "GNNAAS_FAST_SAMPLER": "the compiled sampler samples every CPU batch it can",
    "GNNAAS_FUSED_FORWARD": "eval-mode forwards on sampled blocks run the fused layers",
    "GNNAAS_SAMPLING": "the depth sampler samples every batch: a node's answer never depends on "
    "its batch-mates",
}


@functools.cache  # once per process and set of variables, however often settings are built
def _warn_removed(names: tuple[str, ...]) -> None:
    said = ", ".join(f"{name} ({_REMOVED_VARIABLES[name]})" for name in names)
    _log.warning("environment variables no longer read, unset them: %s", said)


class SharedSettings(BaseSettings):
    """What every gnnaas process reads: folders, device and the served pipeline.

    Every field is also read from ``GNNAAS_<FIELD>`` (e.g. ``GNNAAS_VARIANTS_DIR``), except where
    a variable is named below.

    Args:
        variants_dir (Path): the variant repository. (default: ``variants``)
        profiles_dir (Path): the profiles folder. (default: ``profiles``)
        data_root (Path, optional): where real datasets' raw files live (``GNNAAS_DATA``, the one
            the docs name; ``GNNAAS_DATA_ROOT``, its older name, is still read when it is unset);
            synthetic and imported datasets need none. (default: ``None``)
        cache_dir (Path, optional): the writable cache of processed datasets
            (``GNNAAS_CACHE``). (default: ``None``: ``~/.cache/gnnaas``)
        home_dir (Path, optional): gnnaas's data home, where ``gnnaas import`` keeps datasets
            (``GNNAAS_HOME``). (default: ``None``: ``~/.local/share/gnnaas``)
        device (str): ``auto``, ``cpu`` or ``cuda[:n]``. (default: ``auto``)
        state_dir (Path, optional): the live graphs' state folder (``serve --state-dir``); the
            offline commands that take ``--state-dir`` read the graphs as it holds them.
            (default: ``None``: frozen graphs)
        seed (int): seed of the serving-time consistent sampler. (default: ``0``)
        max_batch_nodes (int): most target nodes merged into one forward pass. (default: ``1024``)
        inline_max_nodes (int): batches of at most this many nodes run on the event loop's thread
            instead of the variant's worker thread (no thread hand-off); the profiler times them
            the same way (profile with the value you serve with). ``0`` runs every batch in the
            worker thread. (default: ``16``)
        torch_threads (int): intra-op threads of torch for the server process, and the default
            of ``gnnaas profile`` too, so that profiles are measured as they are served (a
            server under other threads re-times the curves). One thread leaves the other cores
            to the event loop, the client and other workers; batches of a few nodes gain
            nothing from more. (default: ``1``)
        feature_cache_mb (float): device memory (MiB) for feature caches on CUDA: the pruned
            rows of each served variant's most read nodes stay on the GPU and a batch copies only
            the others (:mod:`gnnaas.inference.cache`). One budget for every served variant, split
            by traffic share (equal at start-up) and marginal hit gain
            (:func:`gnnaas.runtime.caches.split_budget`); nodes in the order ``gnnaas
            cache-plan`` wrote beside the profiles, else by neighbor count. Ignored on the CPU
            (the features are already local) and for live graphs. ``0`` turns caching off.
            (default: ``0``)
        tie_margin (float): predicted completion times within this fraction of the fastest
            candidate's count as ties, won by the most accurate; keeps profiling noise between
            variants of nearly equal speed from scattering requests (``gnnaas report`` makes its
            picks with it too). (default: ``0.1``)
    """

    # A variable set to nothing (GNNAAS_CACHE=) is unset: the default applies.
    model_config = SettingsConfigDict(
        env_prefix=_ENV_PREFIX,
        env_ignore_empty=True,
        extra="forbid",
        frozen=True,
        populate_by_name=True,
    )

    variants_dir: Path = Path("variants")
    profiles_dir: Path = Path("profiles")
    data_root: Path | None = Field(
        default=None, validation_alias=AliasChoices("GNNAAS_DATA", "GNNAAS_DATA_ROOT")
    )
    cache_dir: Path | None = Field(default=None, validation_alias=AliasChoices("GNNAAS_CACHE"))
    home_dir: Path | None = Field(default=None, validation_alias=AliasChoices("GNNAAS_HOME"))
    device: str = "auto"
    state_dir: Path | None = None
    seed: int = 0
    max_batch_nodes: int = Field(default=1024, ge=1)
    # gnnaas.inference.INLINE_MAX_NODES, spelled out so that reading settings loads no torch (the
    # supervisor of --workers stays small); a test keeps the two equal.
    inline_max_nodes: int = Field(default=16, ge=0, le=1024)
    torch_threads: int = Field(default=1, ge=1)
    feature_cache_mb: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    tie_margin: float = Field(default=TIE_MARGIN, ge=0.0, le=10.0)

    @field_validator("data_root", "cache_dir", "home_dir", "state_dir", mode="before")
    @classmethod
    def _blank_folder_is_none(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @model_validator(mode="after")
    def _removed_variables(self) -> Self:
        # pydantic-settings skips unknown GNNAAS_* variables: say so rather than ignore them.
        names = tuple(name for name in _REMOVED_VARIABLES if name in os.environ)
        if names:
            _warn_removed(names)
        return self


class CommandSettings(SharedSettings):
    """The settings of one offline command (``gnnaas generate``, ``profile``, ...).

    Args:
        threads (int, optional): torch intra-op threads of the command (``--threads``,
            ``GNNAAS_THREADS``); ``gnnaas profile`` and ``prepare`` time with them instead of
            ``torch_threads``. (default: ``None``: torch's choice for training, ``torch_threads``
            for profiling)
    """

    threads: int | None = Field(default=None, ge=1)


def _variables(cls: type[BaseSettings], field: str) -> list[str]:
    """The environment variables a field is read from, first match first."""
    info = cls.model_fields[field]
    alias = info.validation_alias
    if isinstance(alias, AliasChoices):
        return [str(c) for c in alias.choices if str(c).startswith(_ENV_PREFIX)]
    if isinstance(alias, str):
        return [alias]
    return [_ENV_PREFIX + field.upper()]


@dataclass(frozen=True)
class SettingDoc:
    """One setting as the docs list it (:func:`describe_settings`).

    Args:
        name (str): the field.
        variables (tuple[str, ...]): the environment variables it is read from, first match first.
        default (str): its default, in words.
        meaning (str): what it does, from the class docstring (Markdown, its default left out).
    """

    name: str
    variables: tuple[str, ...]
    default: str
    meaning: str


# Sphinx roles and literals of the docstrings, as Markdown: ``x`` and :mod:`a.b` -> `x`, `a.b`;
# a role's leading ~ shows the last part only.
_ROLE = re.compile(r":(?:mod|func|class|meth|data|attr):`(~?)([^`]+)`")
_ENTRY = re.compile(r"^ {8}(\w+) \(([^)]*)\): (.*)$")
_DEFAULT = re.compile(r"\s*\(default: (.*)\)\s*$", re.DOTALL)


def _markdown(text: str) -> str:
    text = _ROLE.sub(
        lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`", text
    )
    return " ".join(text.replace("``", "`").split())


def _docstring_args(cls: type) -> dict[str, str]:
    """``{field: its text}`` from the ``Args:`` section of ``cls``'s docstring (and its bases')."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        current = None
        for line in (klass.__doc__ or "").splitlines():
            entry = _ENTRY.match(line)
            if entry:
                current = entry.group(1)
                found[current] = entry.group(3)
            elif current is not None and line.startswith(" " * 12) and line.strip():
                found[current] += " " + line.strip()
            else:
                current = None
    return found


def describe_settings(cls: type[BaseSettings], skip: tuple[str, ...] = ()) -> list[SettingDoc]:
    """Every field of ``cls`` (but ``skip``) with its variables, default and meaning, in
    definition order: what ``scripts/readme_tables.py`` writes into the README's table of knobs.

    Raises:
        ValueError: a field has no entry in the docstrings (the docs would miss it).

    Example:
        >>> [d.variables for d in describe_settings(CommandSettings) if d.name == "threads"]
        [('GNNAAS_THREADS',)]
    """
    texts = _docstring_args(cls)
    out = []
    for name, info in cls.model_fields.items():
        if name in skip:
            continue
        if name not in texts:
            raise ValueError(f"describe_settings: {cls.__name__}.{name} has no docstring entry")
        text = texts[name]
        match = _DEFAULT.search(text)
        stated = _markdown(match.group(1)) if match else ""
        meaning = _markdown(text[: match.start()] if match else text)
        default = info.default
        if default is None or stated.startswith("`None`:"):
            shown = stated.removeprefix("`None`:").strip() if stated != "`None`" else "unset"
        elif isinstance(default, bool):
            shown = f"`{str(default).lower()}`"
        else:
            shown = f"`{default}`"
        out.append(SettingDoc(name, tuple(_variables(cls, name)), shown or "unset", meaning))
    return out


def settings_error(
    exc: ValidationError,
    cls: type[BaseSettings],
    given: Mapping[str, Any],
    *,
    flags: Mapping[str, str] | None = None,
    where: str = "",
) -> ConfigError:
    """One line naming what was wrong and where it came from: the option when it was given on
    the command line, else the ``GNNAAS_*`` variable that set it.

    Args:
        exc (ValidationError): what building the settings raised.
        cls (type): the settings class that was built.
        given (Mapping[str, Any]): the values passed as arguments (the options given).
        flags (Mapping[str, str], optional): field -> its option (``--variants``); by default
            ``--<field with dashes>``. (default: ``None``)
        where (str, optional): a prefix, e.g. ``"profile: "``. (default: ``""``)

    Example:
        >>> try:
        ...     CommandSettings(threads=0)
        ... except ValidationError as exc:
        ...     print(settings_error(exc, CommandSettings, {"threads": 0}))
        --threads=0: Input should be greater than or equal to 1
    """
    first = exc.errors()[0]
    loc = [str(part) for part in first["loc"]]
    field = next((name for name in cls.model_fields if loc and loc[0] == name), None)
    if field is None and loc:  # reported under the variable's name (an alias)
        field = next((f for f in cls.model_fields if loc[0].upper() in _variables(cls, f)), None)
    message = str(first["msg"])
    if field is None:
        return ConfigError(f"{where}{'.'.join(loc) or 'settings'}: {message}")
    if field in given:
        option = (flags or {}).get(field, "--" + field.replace("_", "-"))
        return ConfigError(f"{where}{option}={given[field]!r}: {message}")
    names = _variables(cls, field)
    name = next((n for n in names if n in os.environ), names[0])
    value = os.environ.get(name)
    shown = f"{name}={value!r}" if value is not None else name
    return ConfigError(f"{where}{shown}: {message}")


def from_environment() -> SharedSettings:
    """The shared settings as the ``GNNAAS_*`` variables set them now (a library function's
    fallback for a folder it was not given).

    Raises:
        ConfigError: a variable holds a bad value (one line naming it).
    """
    try:
        return SharedSettings()
    except ValidationError as exc:
        raise settings_error(exc, SharedSettings, {}) from None
