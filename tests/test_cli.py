"""The ``gnnaas`` command: help everywhere, one clear line and exit 1 on bad input."""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gnnaas.cli import _build_parser, main

COMMANDS = [
    "datasets",
    "import",
    "train",
    "generate",
    "variants",
    "profile",
    "report",
    "cache-plan",
    "prepare",
    "infer",
    "precompute",
    "serve",
    "stop",
    "ray-config",
    "compact",
]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    assert "usage: gnnaas" in capsys.readouterr().out


@pytest.mark.parametrize("command", [*COMMANDS, "variants add"])
def test_an_unknown_option_is_the_commands_error(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Also when a required option is missing: the unknown one is what the user mistyped.
    with pytest.raises(SystemExit) as exc:
        main([*command.split(), "--nope"])
    assert exc.value.code == 2  # argparse's convention
    err = capsys.readouterr().err
    assert err.startswith(f"usage: gnnaas {command} ")
    assert err.strip().splitlines()[-1] == (
        f"gnnaas {command}: error: unrecognized arguments: --nope"
    )


def test_an_unknown_top_level_option_is_the_top_levels_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--nope", "datasets"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: gnnaas [-h]")
    assert err.strip().splitlines()[-1] == "gnnaas: error: unrecognized arguments: --nope"


def test_datasets_lists_real_and_synthetic(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["datasets"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0].split()
    assert header == ["name", "nodes", "edges", "features", "classes", "multi-label", "source"]
    for name in ("Cora", "PubMed", "synth-flickr", "synth-products", "synth-small"):
        assert name in out
    assert "2708" in out  # Cora's nodes


@pytest.mark.parametrize("cached", [False, True])
def test_datasets_counts_the_stored_edges_of_a_built_synthetic_graph(
    cached: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import gnnaas.data.synthetic
    from gnnaas.data import load_dataset

    def row() -> list[str]:
        assert main(["datasets"]) == 0
        lines = capsys.readouterr().out.splitlines()
        return next(line.split() for line in lines if line.startswith("synth-small "))

    monkeypatch.setenv("GNNAAS_CACHE", str(tmp_path))
    if cached:  # as for the large presets: the graph itself is cached, its header is read
        monkeypatch.setattr(gnnaas.data.synthetic, "_CACHE_MIN_SIZE", 0)
    assert row()[2] == "~30000"  # never built here: the preset's target
    store = load_dataset("synth-small", seed=0)
    assert store.num_edges == 29956  # duplicate pairs and self loops dropped
    assert row()[2] == "29956"  # as infer and compact count them
    assert any(p.suffix == (".safetensors" if cached else ".json") for p in tmp_path.rglob("*"))


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line; progress lines (``COMMAND: ...``) may precede it."""
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.split(":")[0] not in COMMANDS]
    assert len(errors) == 1, err
    assert err[-1] == errors[0] and "Traceback" not in errors[0]
    return errors[0]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_option_has_help() -> None:
    parser = _build_parser()
    commands = _subcommands(parser)
    assert sorted(commands) == sorted(COMMANDS)
    for name, command in [("gnnaas", parser), *commands.items()]:
        assert command.description, f"{name} has no description"
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            words = (action.help or "").split()
            # "(default: x)" alone does not say what the option is
            assert len(words) >= 2 and not words[0].startswith("("), (name, action.dest)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_on_a_busy_port_fails_before_loading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # The variants folder does not exist either: the port is checked first.
        args = ["serve", "--port", str(port), "--variants", str(tmp_path / "none")]
        assert main(args) == 1
        line = _one_error_line(capsys)
        assert main(["serve", "--check-port", "--port", str(port)]) == 1
        assert _one_error_line(capsys) == line
    assert line == (
        f"ConfigError: serve: port {port} is in use on 127.0.0.1; "
        "pick another with --port (or PORT=... with make serve)"
    )
    assert main(["serve", "--check-port", "--port", str(port)]) == 0  # free again


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"GNNAAS_VARIANTS_DIR": "{tmp}/from-env"}, "variants folder '{tmp}/from-env' ("),
        ({"GNNAAS_DEVICE": "nonsense"}, "nonsense"),
    ],
)
def test_serve_reads_settings_from_the_environment(
    env: dict[str, str],
    expected: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value.format(tmp=tmp_path))
    monkeypatch.chdir(tmp_path)  # no ./variants either
    assert main(["serve", "--port", str(_free_port())]) == 1
    assert expected.format(tmp=tmp_path) in _one_error_line(capsys)


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """``prepare`` with the data, training and profiling replaced by recorders."""
    import gnnaas.data
    import gnnaas.profiling.profiler
    import gnnaas.profiling.table
    import gnnaas.variants.pipeline

    calls: dict[str, Any] = {}
    store = SimpleNamespace(name="fake")

    def generate(store: Any, repo: Any, **kwargs: Any) -> list[Any]:
        calls["variants"], calls["device"] = repo.root, kwargs["device"]
        calls["progress"] = kwargs["progress"]
        return []

    def profile(store: Any, repo: Any, out: Path, **kwargs: Any) -> None:
        calls["profiles"] = out

    monkeypatch.setattr(gnnaas.data, "load_dataset", lambda *a, **k: store, raising=False)
    monkeypatch.setattr(gnnaas.variants.pipeline, "generate_variants", generate)
    monkeypatch.setattr(gnnaas.profiling.profiler, "profile_dataset", profile)
    monkeypatch.setattr(gnnaas.profiling.table, "has_profiles", lambda *a, **k: False)
    return calls


def test_prepare_defaults_come_from_the_environment(
    recorded: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("GNNAAS_VARIANTS_DIR", str(tmp_path / "v"))
    monkeypatch.setenv("GNNAAS_PROFILES_DIR", str(tmp_path / "p"))
    monkeypatch.setenv("GNNAAS_DEVICE", "cpu")
    assert main(["prepare", "--dataset", "fake"]) == 0
    assert recorded["variants"] == tmp_path / "v" and recorded["profiles"] == tmp_path / "p"
    assert str(recorded["device"]) == "cpu" and recorded["progress"] is True
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "prepare: loading dataset fake"
    assert [line.split(" ")[1] for line in err] == ["loading", "generating", "profiling"]

    # An option given on the command line wins over the environment.
    assert main(["prepare", "--dataset", "fake", "--variants", str(tmp_path / "cli")]) == 0
    assert recorded["variants"] == tmp_path / "cli"


@pytest.mark.parametrize("argv", [["-q", "prepare"], ["prepare", "-q"]])
def test_quiet_prints_no_progress(
    argv: list[str], recorded: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--dataset", "fake", "--device", "cpu"]) == 0
    out = capsys.readouterr()
    assert out.err == "" and recorded["progress"] is False
    assert out.out.startswith("ready:")


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


@pytest.mark.parametrize(
    ("argv", "word"),
    [
        (["generate", "--arch", "gat"], "gat"),
        (["generate", "--ranking", "magic"], "magic"),
        (["generate", "--axes", "features", "colour"], "colour"),
        (["generate", "--fanouts", "10.x"], "10.x"),
        (["prepare", "--ranking", "magic"], "magic"),
        (["train", "--arch", "gat"], "gat"),
    ],
)
def test_a_bad_plan_fails_before_the_dataset_loads(
    argv: list[str],
    word: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import gnnaas.data

    def load_dataset(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the dataset was loaded")

    monkeypatch.setattr(gnnaas.data, "load_dataset", load_dataset)
    monkeypatch.setenv("GNNAAS_VARIANTS_DIR", str(tmp_path / "v"))
    assert main([*argv, "--dataset", "synth-small", "--device", "cpu"]) == 1
    line = _one_error_line(capsys)
    assert line.startswith("ConfigError:") and word in line
    assert not (tmp_path / "v").exists()


def test_cuda_on_cpu_machine_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["train", "--dataset", "synth-small", "--device", "cuda"]) == 1
    assert _one_error_line(capsys).startswith("ConfigError:")


def _tiny_graph(folder: Path) -> list[str]:
    """``--edges --features --labels`` of a 10-node graph whose node 9 has no edge."""
    import numpy as np

    folder.mkdir()
    edges = "".join(f"{i},{i + 1}\n" for i in range(8))
    (folder / "edges.csv").write_text("src,dst\n" + edges)
    np.save(folder / "x.npy", np.arange(30, dtype=np.float32).reshape(10, 3))
    np.save(folder / "y.npy", np.array([0, 1] * 5))
    return [
        *("--edges", str(folder / "edges.csv")),
        *("--features", str(folder / "x.npy")),
        *("--labels", str(folder / "y.npy")),
    ]


def test_import_prints_the_graph_and_the_name_works_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GNNAAS_HOME", str(tmp_path / "home"))
    files = _tiny_graph(tmp_path / "in")
    assert main(["import", "MyGraph", *files, "--undirected"]) == 0
    out = capsys.readouterr()
    lines = dict(line.split(": ", 1) for line in out.out.splitlines())
    assert list(lines) == [
        "dataset", "nodes", "edges", "features", "classes", "isolated_nodes", "split", "store",
        "import_time_s",
    ]  # fmt: skip
    assert (lines["dataset"], lines["nodes"], lines["edges"]) == ("MyGraph", "10", "16")
    assert (lines["features"], lines["classes"], lines["isolated_nodes"]) == ("3", "2", "1")
    assert lines["split"] == "default (train 6, val 2, test 2)"
    assert lines["store"] == str(tmp_path / "home" / "datasets" / "mygraph")
    assert float(lines["import_time_s"]) >= 0
    err = out.err.splitlines()
    assert err[0] == "import: importing MyGraph" and all(e.startswith("import: ") for e in err)

    assert main(["datasets"]) == 0
    row = capsys.readouterr().out.splitlines()[-1].split()
    assert row == ["MyGraph", "10", "16", "3", "2", "False", "imported"]
    assert main(["-q", "train", "--dataset", "mygraph", "--epochs", "2", "--device", "cpu"]) == 0
    assert "dataset: MyGraph" in capsys.readouterr().out


def test_import_failure_is_one_line_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("GNNAAS_HOME", str(home))
    files = _tiny_graph(tmp_path / "in")
    (tmp_path / "in" / "edges.csv").write_text("src,dst\n0,1\n1,10\n")
    assert main(["import", "g", *files]) == 1
    line = _one_error_line(capsys)
    assert line == (
        f"ConfigError: edges file {tmp_path / 'in' / 'edges.csv'}, row 1 (line 3): dst 10 is "
        "outside [0, 10); the features have 10 rows, one per node"
    )
    assert not home.exists()


def test_import_again_needs_force(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GNNAAS_HOME", str(tmp_path / "home"))
    files = _tiny_graph(tmp_path / "in")
    assert main(["-q", "import", "g", *files]) == 0
    assert main(["-q", "import", "G", *files]) == 1
    assert _one_error_line(capsys).startswith(
        "ConfigError: import: dataset 'G' is already imported"
    )
    assert main(["-q", "import", "G", *files, "--force"]) == 0
    assert "dataset: G" in capsys.readouterr().out


def test_console_script_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gnnaas.cli", "--help"], capture_output=True, text=True, check=True
    )
    assert "generate" in out.stdout and "serve" in out.stdout


def _pyg_master(tmp_path: Path, store: Any, hidden: int = 8) -> list[str]:

    from safetensors.torch import save_file
    from torch_geometric.nn.models import GraphSAGE

    model = GraphSAGE(store.num_features, hidden, num_layers=2, out_channels=store.num_classes)
    save_file(model.state_dict(), str(tmp_path / "m.safetensors"))
    (tmp_path / "m.json").write_text(
        json.dumps(
            {
                "class": "GraphSAGE",
                "in_channels": store.num_features,
                "hidden_channels": hidden,
                "num_layers": 2,
                "out_channels": store.num_classes,
            }
        )
    )
    return [
        "--from-model",
        str(tmp_path / "m.safetensors"),
        "--model-config",
        str(tmp_path / "m.json"),
    ]


def test_generate_from_a_pyg_model_then_add_and_profile_one_variant(
    tmp_path: Path, small_store: Any, capsys: pytest.CaptureFixture[str]
) -> None:

    from safetensors.torch import save_file
    from torch_geometric.nn.models import GraphSAGE

    out = ["--dataset", "synth-small", "--device", "cpu"]
    variants = str(tmp_path / "variants")
    argv = ["-q", "generate", *out, "--out", variants, "--ranking", "greedy", "--prune", "1", "2"]
    argv += ["--axes", "features"]
    assert main([*argv, "--epochs", "2", *_pyg_master(tmp_path, small_store)]) == 0
    table = capsys.readouterr().out
    assert "sage-full-1x" in table and "user" in table and "sage-greedy-2x" in table
    assert "gin-" not in table  # only the master's arch
    # A variant the user trained on 3 columns of their choice, then profiled alone.
    f, c = small_store.num_features, small_store.num_classes
    save_file(GraphSAGE(3, 8, num_layers=2, out_channels=c).state_dict(), str(tmp_path / "v.st"))
    (tmp_path / "kept.json").write_text(json.dumps([2, 0, 1]))
    cfg = {"class": "GraphSAGE", "in_channels": 3, "hidden_channels": 8, "num_layers": 2}
    (tmp_path / "v.json").write_text(json.dumps({**cfg, "out_channels": c}))
    add = ["variants", "add", *out, "--variants", variants, "--weights", str(tmp_path / "v.st")]
    add += ["--model-config", str(tmp_path / "v.json"), "--kept-features"]
    assert main(["-q", *add, str(tmp_path / "kept.json")]) == 0
    vid = f"sage-user-{round(f / 3)}x"
    assert f"variant: {vid}" in capsys.readouterr().out
    profiles = str(tmp_path / "profiles")
    prof = ["-q", "profile", *out, "--variants", variants, "--out", profiles, "--runs", "1"]
    assert main(prof) == 0
    assert main([*prof, "--only", vid]) == 0
    assert "profiled 3 variants" in capsys.readouterr().out
    # Mistakes are one line each.
    (tmp_path / "kept.json").write_text(json.dumps([0, f]))
    assert main(["-q", *add, str(tmp_path / "kept.json"), "--force"]) == 1
    assert f"is outside [0, {f})" in _one_error_line(capsys)
    assert main(["-q", "generate", *out, "--out", variants, "--from-model", "x.safetensors"]) == 1
    assert "--from-model and --model-config go together" in _one_error_line(capsys)


def test_cache_plan_on_cora_holds_the_issues_figure(
    data_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A budget holding 10% of Cora's 1x features; no variants: the default prune factors.
    budget_mb = 0.1 * 2708 * 1433 * 4 / 2**20
    args = ["cache-plan", "--dataset", "Cora", "--data-root", str(data_root), "--budget-mb"]
    folders = ["--variants", str(tmp_path / "none"), "--profiles", str(tmp_path / "p")]
    assert main([*args, f"{budget_mb:.6f}", *folders, "-q"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("variants: none of Cora in ") and "factors 1 2 4 8" in out[0]
    start = out.index("variant  features_kept  cached_nodes  hit_ratio")
    rows = [line.split() for line in out[start + 2 : start + 6]]
    assert [r[:3] for r in rows] == [
        ["1x", "1433", "270"],
        ["2x", "716", "541"],
        ["4x", "358", "1083"],
        ["8x", "179", "2167"],
    ]
    ratios = [float(r[3]) for r in rows]
    assert all(0 < a < b <= 1 for a, b in zip(ratios, ratios[1:], strict=False))
    assert ratios[3] >= 2 * ratios[0]  # the issue's check: 8x at least twice 1x
    table = (tmp_path / "p" / "Cora" / "cache_plan.csv").read_text().splitlines()
    assert table[0].startswith("dataset,variant,fanouts,features_kept,") and len(table) == 5
    assert (tmp_path / "p" / "Cora" / "cache_ranking.safetensors").is_file()


def test_cache_plan_reads_variants_and_recorded_seeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import numpy as np

    import gnnaas.data

    sys.path.insert(0, str(Path(__file__).parent / "serving"))
    try:
        from serving_fakes import tiny_store, write_tiny_repository
    finally:
        sys.path.pop(0)
    store = tiny_store()
    variants_dir, _ = write_tiny_repository(tmp_path, store)
    monkeypatch.setattr(gnnaas.data, "load_dataset", lambda *a, **k: store, raising=False)
    monkeypatch.setenv("GNNAAS_PROFILES_DIR", str(tmp_path / "env-profiles"))
    np.save(tmp_path / "traffic.npy", np.array([3, 9, 3, 250]))
    args = ["cache-plan", "--dataset", "tiny", "--variants", str(variants_dir)]
    assert main([*args, "--budget-mb", "0.005", "--seeds", str(tmp_path / "traffic.npy")]) == 0
    out = capsys.readouterr().out
    assert "seeds: traffic.npy (4 nodes, batches of 1024), ranked by access" in out
    assert (
        "sage-full-1x    16             81" in out and "sage-random-4x  4              300" in out
    )
    table = (tmp_path / "env-profiles" / "tiny" / "cache_plan.csv").read_text()
    assert ",traffic.npy,4,1024,depth,0," in table
    (tmp_path / "seeds.txt").write_text("# recorded\n1, 2\n3 4\n")
    seeds = ["--seeds", str(tmp_path / "seeds.txt"), "--by", "degree"]
    assert main([*args, "--budget-mb", "1", *seeds]) == 0
    assert "seeds: seeds.txt (4 nodes" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--budget-mb", "0"], "cache-plan: --budget-mb must be a number of MB > 0 (got '0')"),
        (["--budget-mb", "nan"], "--budget-mb must be a number of MB > 0 (got 'nan')"),
        (["--budget-mb", "lots"], "--budget-mb must be a number of MB > 0 (got 'lots')"),
        (["--budget-mb", "1", "--seeds", "{tmp}/none.npy"], "is not a file"),
        (["--budget-mb", "1", "--seeds", "{tmp}/far.txt"], "has ids outside [0, 3000), e.g. 5000"),
        (["--budget-mb", "1", "--seeds", "{tmp}/empty.txt"], "non-empty 1-D list of integer"),
        (["--budget-mb", "1", "--seeds", "{tmp}/words.txt"], "is not a .npy array or a text file"),
    ],
)
def test_cache_plan_bad_input_is_one_line(
    extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "far.txt").write_text("1 5000\n")
    (tmp_path / "empty.txt").write_text("# nothing\n")
    (tmp_path / "words.txt").write_text("one two\n")
    args = ["cache-plan", "--dataset", "synth-small", "--profiles", str(tmp_path / "p")]
    assert main([*args, *[e.format(tmp=tmp_path) for e in extra]]) == 1
    line = _one_error_line(capsys)
    assert line.startswith("ConfigError: cache-plan: ") and message in line
    assert not (tmp_path / "p").exists()  # nothing written


def test_cache_plan_unknown_dataset_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache-plan", "--dataset", "Coraa", "--budget-mb", "1"]) == 1
    line = _one_error_line(capsys)
    assert line.startswith("ConfigError:") and "Coraa" in line


def test_report_checks_its_tie_margin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["report", "--dataset", "Cora", "--profiles", str(tmp_path), "--tie-margin", "-1"]
    assert main(args) == 1
    line = _one_error_line(capsys)
    assert line == (
        "ConfigError: report: --tie-margin must be a number in [0, 10], as the server's (got '-1')"
    )
    # The data root of the other dataset commands is taken (and unused), not refused.
    assert main([*args, "--data-root", str(tmp_path)]) == 1
    assert _one_error_line(capsys) == line


def test_the_exact_pass_bar_counts_the_graphs_nodes_per_layer(
    small_store: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sys.path.insert(0, str(Path(__file__).parent / "serving"))
    try:
        from serving_fakes import write_tiny_repository
    finally:
        sys.path.pop(0)
    variants, _ = write_tiny_repository(tmp_path, small_store)
    argv = ["infer", "--dataset", small_store.name, "--variants", str(variants)]
    argv += ["--variant", "sage-full-1x", "--out", str(tmp_path / "all.parquet")]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert small_store.num_nodes == 3000 and "6.00k" not in err  # not nodes x layers
    assert "infer sage-full-1x layer 1/2" in err and "infer sage-full-1x layer 2/2" in err
    last = err.rstrip().splitlines()[-1].split("\r")[-1]
    assert last.startswith("infer sage-full-1x layer 2/2: 100%")
    assert "3.00k/3.00k" in err


def test_ray_config_warns_when_a_real_dataset_has_no_data_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("ray.serve")
    sys.path.insert(0, str(Path(__file__).parent / "serving"))
    try:
        from serving_fakes import tiny_store, write_tiny_repository
    finally:
        sys.path.pop(0)
    variants, profiles = write_tiny_repository(tmp_path, tiny_store("Cora"))
    for name in ("GNNAAS_DATA", "GNNAAS_DATA_ROOT"):
        monkeypatch.delenv(name, raising=False)
    out = tmp_path / "serve.yaml"
    argv = ["-q", "ray-config", "--variants", str(variants), "--profiles", str(profiles)]
    assert main([*argv, "-o", str(out)]) == 0
    assert _config_data_roots(out) == {None}  # still written
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "ray-config: warning: Cora is a real dataset read from a data root, and none is set"
    )
    assert "--data-root DIR" in err[0]
    assert main([*argv, "-o", str(out), "--data-root", str(tmp_path)]) == 0
    assert capsys.readouterr().err == ""
    assert _config_data_roots(out) == {str(tmp_path.resolve())}


def _config_data_roots(path: Path) -> set[str | None]:
    """The ``data_root`` of every application's settings in a ``ray-config`` file."""
    import yaml

    config = yaml.safe_load(path.read_text())
    return {app["args"]["settings"]["data_root"] for app in config["applications"]}


def test_profile_says_what_it_does_after_its_bar(
    small_store: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sys.path.insert(0, str(Path(__file__).parent / "serving"))
    try:
        from serving_fakes import write_tiny_repository
    finally:
        sys.path.pop(0)
    variants, profiles = write_tiny_repository(tmp_path, small_store)
    argv = ["--threads", "1", "profile", "--dataset", small_store.name, "--variants", str(variants)]
    assert main([*argv, "--out", str(profiles), "--runs", "2", "--only", "sage-full-1x"]) == 0
    lines = [line.split("\r")[-1] for line in capsys.readouterr().err.splitlines()]
    said = [line for line in lines if line.startswith("profile: ")]
    assert said[-3:] == [
        "profile: timing the service curves of 1 variant(s) in interleaved rounds",
        "profile: bootstrapping the paired accuracy intervals of 2 variant(s)",
        f"profile: writing profiles.csv and service_times.csv to {profiles / small_store.name}",
    ]
    bar = [i for i, line in enumerate(lines) if line.startswith(f"profile {small_store.name}:")]
    assert bar and lines.index(said[-3]) > max(bar)  # after the bar's last line


def test_generate_reports_epochs_as_they_finish(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every trained model says its epochs while it trains (``key: value`` lines: stderr is not a
    terminal here): its first and its last, before the next model starts."""
    argv = ["--threads", "1", "generate", "--dataset", "synth-small", "--device", "cpu"]
    argv += ["--out", str(tmp_path), "--arch", "sage", "--ranking", "greedy", "--prune", "1", "2"]
    assert main([*argv, "--axes", "features", "--epochs", "2"]) == 0
    out, err = capsys.readouterr()
    lines = [part for line in err.splitlines() for part in line.split("\r")]
    epochs = [line.split()[1:4:2] for line in lines if line.startswith("variant: ")]
    assert epochs == [
        ["sage-full-1x", "001/002"],
        ["sage-full-1x", "002/002"],
        ["sage-greedy-2x", "001/002"],
        ["sage-greedy-2x", "002/002"],
    ]
    last = next(line for line in lines if line.startswith("variant: sage-greedy-2x  epoch: 002"))
    assert re.fullmatch(
        r"variant: sage-greedy-2x  epoch: 002/002  loss: \d\.\d{4}  val_acc: 0\.\d{4}  "
        r"epoch_s: \d+\.\d{3}  best_epoch: 00[12]  best_val_acc: 0\.\d{4}",
        last,
    )
    assert [row.split()[0] for row in out.splitlines()[2:]] == ["sage-full-1x", "sage-greedy-2x"]
