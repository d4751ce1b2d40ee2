"""One configuration path: flag > environment > default, one-line errors, nothing read at import."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gnnaas.cli import _build_parser, main
from gnnaas.cli.common import _settings
from gnnaas.config import CommandSettings, SharedSettings, from_environment, settings_error
from gnnaas.errors import ConfigError

_VARIABLES = ("GNNAAS_VARIANTS_DIR", "GNNAAS_THREADS", "GNNAAS_DEVICE", "GNNAAS_TIE_MARGIN")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in _VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_flag_beats_environment_beats_default(clean_env: pytest.MonkeyPatch) -> None:
    args = _build_parser().parse_args(["generate", "--dataset", "x"])
    default = _settings(args, {"variants_dir": "--out"})
    assert (default.variants_dir, default.threads, default.device) == (
        Path("variants"),
        None,
        "auto",
    )
    assert _settings(args) is default  # built once per command

    clean_env.setenv("GNNAAS_VARIANTS_DIR", "from-env")
    clean_env.setenv("GNNAAS_THREADS", "3")
    clean_env.setenv("GNNAAS_DEVICE", "cpu")
    env = _settings(_build_parser().parse_args(["generate", "--dataset", "x"]), {})
    assert (env.variants_dir, env.threads, env.device) == (Path("from-env"), 3, "cpu")

    argv = [
        "--threads",
        "2",
        "generate",
        "--dataset",
        "x",
        "--out",
        "from-flag",
        "--device",
        "meta",
    ]
    flag = _settings(_build_parser().parse_args(argv), {"variants_dir": "--out"})
    assert (flag.variants_dir, flag.threads, flag.device) == (Path("from-flag"), 2, "meta")


def test_the_profiled_pipeline_is_the_servers(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from gnnaas.cli.common import _pipeline
    from gnnaas.serving.core.settings import Settings

    clean_env.setenv("GNNAAS_SEED", "7")
    clean_env.setenv("GNNAAS_MAX_BATCH_NODES", "64")
    clean_env.setenv("GNNAAS_TORCH_THREADS", "2")
    args = _build_parser().parse_args(["profile", "--dataset", "x"])
    pipeline = _pipeline(_settings(args, {"profiles_dir": "--out"}))
    served = Settings(variants_dir=tmp_path)  # what a server in this environment serves
    assert (served.seed, served.max_batch_nodes, served.torch_threads) == (7, 64, 2)
    assert pipeline == {
        "sampler_seed": 7,
        "max_batch_nodes": 64,
        "inline_max_nodes": served.inline_max_nodes,
        "threads": 2,
        "feature_cache_mb": 0.0,
    }
    threads = _build_parser().parse_args(["--threads", "1", "profile", "--dataset", "x"])
    assert _pipeline(_settings(threads))["threads"] == 1  # --threads wins over the server's


@pytest.mark.parametrize(
    ("variable", "value", "line"),
    [
        (
            "GNNAAS_MAX_BATCH_NODES",
            "zero",
            "ConfigError: profile: GNNAAS_MAX_BATCH_NODES='zero': Input should be a valid "
            "integer, unable to parse string as an integer",
        ),
        (
            "GNNAAS_FEATURE_CACHE_MB",
            "lots",
            "ConfigError: profile: GNNAAS_FEATURE_CACHE_MB='lots': Input should be a valid "
            "number, unable to parse string as a number",
        ),
    ],
)
def test_a_bad_variable_is_one_line(
    variable: str,
    value: str,
    line: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import gnnaas.data

    monkeypatch.setenv(variable, value)
    monkeypatch.setattr(gnnaas.data, "load_dataset", _never_called)
    assert main(["profile", "--dataset", "synth-small"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [line]


def _never_called(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the dataset was loaded")


def test_a_bad_option_names_the_option() -> None:
    with pytest.raises(ValidationError) as exc:
        CommandSettings(tie_margin="11")
    error = settings_error(exc.value, CommandSettings, {"tie_margin": "11"}, where="report: ")
    assert str(error) == "report: --tie-margin='11': Input should be less than or equal to 10"


def test_library_fallbacks_read_the_same_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    from gnnaas.data import resolve_cache_dir, resolve_home_dir

    monkeypatch.setenv("GNNAAS_CACHE", "/tmp/c")
    monkeypatch.setenv("GNNAAS_HOME", "  ")  # blank: unset
    monkeypatch.delenv("GNNAAS_DATA_ROOT", raising=False)
    monkeypatch.setenv("GNNAAS_DATA", "/tmp/d")
    assert resolve_cache_dir() == Path("/tmp/c") and resolve_cache_dir("/x") == Path("/x")
    assert resolve_home_dir() == Path.home() / ".local" / "share" / "gnnaas"
    assert from_environment().data_root == Path("/tmp/d")
    monkeypatch.setenv("GNNAAS_SEED", "x")
    with pytest.raises(ConfigError, match="^GNNAAS_SEED='x': Input should be a valid integer"):
        resolve_cache_dir()


def test_only_the_documented_fields_are_shared() -> None:
    from gnnaas.serving.core.settings import Settings

    shared = set(SharedSettings.model_fields)
    assert shared <= set(Settings.model_fields) and shared <= set(CommandSettings.model_fields)
    assert set(CommandSettings.model_fields) - shared == {"threads"}
    for name in shared:  # every field is in the class docstring
        assert f"{name} (" in (SharedSettings.__doc__ or ""), name


_IMPORT = """
import gnnaas.cli, gnnaas.config, gnnaas.inference.settings, gnnaas.models, gnnaas.sampling.fastpath
import gnnaas.serving.http.app
print("imported")
"""


def test_nothing_is_read_at_import() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GNNAAS_")}
    bad = {"GNNAAS_SEED": "x", "GNNAAS_FAST_LANE": "0", "GNNAAS_DATA": "/nowhere"}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_IMPORT)],
        capture_output=True,
        text=True,
        env={**env, **bad},
        check=True,
    )
    # No bad value raised and no warning was logged: settings are read when a command starts.
    assert (out.stdout.strip(), out.stderr) == ("imported", "")


def test_a_removed_switch_is_ignored_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import gnnaas.config as config
    from gnnaas.serving.core.settings import Settings

    # The three switches of two implementations of one job are gone: their variables are not
    # read (even a value they would have refused), and a process that finds one says so once.
    monkeypatch.setenv("GNNAAS_FAST_LANE", "0")
    monkeypatch.setenv("GNNAAS_FUSED_FORWARD", "maybe")
    monkeypatch.delenv("GNNAAS_FAST_SAMPLER", raising=False)
    config._warn_removed.cache_clear()
    with caplog.at_level("WARNING", logger="gnnaas.config"):
        for _ in range(2):
            assert CommandSettings().threads is None and Settings().warmup
    assert [r.getMessage() for r in caplog.records] == [
        "environment variables no longer read, unset them: GNNAAS_FAST_LANE (the predict fast "
        "lane answers every request it can), GNNAAS_FUSED_FORWARD (eval-mode forwards on sampled "
        "blocks run the fused layers)"
    ]
    for name in ("fast_lane", "fast_sampler", "fused_forward", "sampling"):
        assert name not in Settings.model_fields
        with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
            Settings(**{name: True})  # an argument is still refused
    config._warn_removed.cache_clear()


def test_the_data_root_is_gnnaas_data_and_its_older_name_still_works(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The docs name one variable, GNNAAS_DATA; GNNAAS_DATA_ROOT (its older name) is still read
    when GNNAAS_DATA is unset, and loses to it when both are set."""
    monkeypatch.delenv("GNNAAS_DATA", raising=False)
    monkeypatch.setenv("GNNAAS_DATA_ROOT", "/tmp/older")
    assert from_environment().data_root == Path("/tmp/older")
    monkeypatch.setenv("GNNAAS_DATA", "/tmp/named")
    assert from_environment().data_root == Path("/tmp/named")
    assert CommandSettings(data_root="/tmp/flag").data_root == Path("/tmp/flag")
