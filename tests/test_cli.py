"""The ``gnnaas`` command: help everywhere, one clear line and exit 1 on bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gnnaas.cli import main

COMMANDS = ["datasets", "train", "generate", "profile", "report", "prepare", "serve"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    assert "usage: gnnaas" in capsys.readouterr().out


def test_datasets_lists_real_and_synthetic(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["datasets"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0].split()
    assert header == ["name", "nodes", "edges", "features", "classes", "multi-label", "source"]
    for name in ("Cora", "PubMed", "synth-flickr", "synth-products", "synth-small"):
        assert name in out
    assert "2708" in out  # Cora's nodes


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "Traceback" not in err[0]
    return err[0]


def test_unknown_dataset_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--dataset", "Coraa", "--device", "cpu"]) == 1
    line = _one_error_line(capsys)
    assert line.startswith("ConfigError:") and "Coraa" in line


def test_missing_data_root_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("GNNAAS_DATA", raising=False)
    missing = tmp_path / "nowhere"
    assert main(["train", "--dataset", "Cora", "--data-root", str(missing), "--device", "cpu"]) == 1
    line = _one_error_line(capsys)
    assert line.startswith("ConfigError:") and "nowhere" in line


def test_unknown_arch_is_one_line(data_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["train", "--dataset", "Cora", "--data-root", str(data_root), "--arch", "gat"]
    assert main([*args, "--device", "cpu"]) == 1
    line = _one_error_line(capsys)
    assert line.startswith("ConfigError:") and "gat" in line


def test_unknown_ranking_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["generate", "--dataset", "synth-small", "--ranking", "magic", "--out", str(tmp_path)]
    assert main([*args, "--device", "cpu"]) == 1
    line = _one_error_line(capsys)
    assert line.startswith("ConfigError:") and "magic" in line
    assert not any(tmp_path.iterdir())  # nothing was trained or written


def test_cuda_on_cpu_machine_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["train", "--dataset", "synth-small", "--device", "cuda"]) == 1
    assert _one_error_line(capsys).startswith("ConfigError:")


def test_console_script_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gnnaas.cli", "--help"], capture_output=True, text=True, check=True
    )
    assert "generate" in out.stdout and "serve" in out.stdout
