"""The benchmark scripts' results pages are what the scripts render from the JSON beside them, and
no benchmark imports another (they share ``benchmarks/common.py``, ``loadgen.py``, ``measure.py``
and ``trivial_app.py``). Nothing here runs a benchmark."""

from __future__ import annotations

import ast
import importlib
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
RESULTS = BENCH / "results"
HELPERS = {"common", "h2load", "loadgen", "measure", "trivial_app"}
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py") if p.stem not in HELPERS)

# Pages a benchmark wrote whose run kept no JSON, and whose figures cannot be read back from the
# page exactly: each stays until its script is run again (the command is in the page), which
# writes the JSON beside it; this list then loses the page, or the test fails.
NO_JSON = {
    "router.md": "bench_router.py kept its JSON in a workdir; the page shortens its tables",
    "router-layers.md": "written by bench_router.py --layers (now bench_layers.py), no JSON kept",
    "side-by-side-Cora.md": "no JSON kept; the summary is not derivable from the rounded cells",
    "side-by-side-synth-flickr.md": "as side-by-side-Cora.md",
    "policy-precomputed.md": "bench_policy.py with --out elsewhere, its JSON not kept",
}
# Pages under benchmarks/results that no benchmark writes.
NOT_BENCHMARKS = {
    "report-Cora/report.md": "`gnnaas report` of the profiles.csv beside it",
    "report-synth-flickr@0.2-h200/report.md": "`gnnaas report` of the CUDA profiles beside it",
}


@pytest.fixture(scope="module", autouse=True)
def _benchmarks_on_path() -> Any:
    """Imports the scripts the way ``python benchmarks/<script>.py`` finds its helpers."""
    sys.path.insert(0, str(BENCH))
    yield
    sys.path.remove(str(BENCH))


def _imports(path: Path) -> set[str]:
    """Top-level names of every module ``path`` imports, at any depth of its code."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("name", SCRIPTS + sorted(HELPERS))
def test_no_benchmark_imports_another(name: str) -> None:
    imported = _imports(BENCH / f"{name}.py")
    assert not imported & set(SCRIPTS), f"{name}.py imports {sorted(imported & set(SCRIPTS))}"


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_renders_its_page_from_json(name: str) -> None:
    tree = ast.parse((BENCH / f"{name}.py").read_text())
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    options = {
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value == "--render"
    }
    assert "render" in functions, f"{name}.py has no render(results)"
    assert options == {"--render"}, f"{name}.py has no --render option"
    assert "save_results" in _imports_from_common(tree), f"{name}.py does not use save_results"


def _imports_from_common(tree: ast.Module) -> set[str]:
    return {
        alias.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module == "common"
        for alias in n.names
    }


def _saved() -> list[Path]:
    """Every results JSON written by a benchmark (it names its script)."""
    out = []
    for path in sorted(RESULTS.rglob("*.json")):
        if "script" in json.loads(path.read_text()):
            out.append(path)
    return out


def _pages(path: Path) -> dict[Path, str]:
    """The pages the script named in ``path`` renders from it."""
    results = json.loads(path.read_text())
    module = importlib.import_module(results["script"])
    from common import pages_of

    return {
        path.parent / f: text for f, text in pages_of(path.stem, results, module.render).items()
    }


@pytest.mark.parametrize("path", _saved(), ids=lambda p: str(p.relative_to(RESULTS)))
def test_pages_are_rendered_from_their_json(path: Path) -> None:
    for page, text in _pages(path).items():
        assert page.exists(), f"{page.name} is missing: run the script's --render {path.name}"
        assert page.read_text() == text, (
            f"{page.relative_to(RESULTS)} is not what {json.loads(path.read_text())['script']}.py "
            f"renders from {path.name}: rewrite it with --render, never by hand"
        )


def test_every_page_has_its_json() -> None:
    pages = {str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*.md")}
    rendered = {str(page.relative_to(RESULTS)) for path in _saved() for page in _pages(path)}
    unbacked = pages - rendered - set(NOT_BENCHMARKS)
    assert unbacked == set(NO_JSON), (
        f"pages without a JSON: {sorted(unbacked - set(NO_JSON))}; rerun their script. "
        f"Listed in NO_JSON but backed or gone now: {sorted(set(NO_JSON) - unbacked)}"
    )


def test_no_machine_path_in_results() -> None:
    # A results file says which setting named a folder, never where it was on the machine.
    absolute = re.compile(r"(?<![\w.~])/(?:tmp|home|root|work|Users|var|mnt|opt|srv)/")
    found = [
        str(p.relative_to(RESULTS))
        for p in sorted(RESULTS.rglob("*"))
        if p.suffix in {".json", ".md"} and absolute.search(p.read_text())
    ]
    assert found == [], f"machine paths in {found}"


def test_a_cuda_run_names_its_card_and_a_cpu_run_names_none() -> None:
    from common import gpu_words

    machine = {"gpu": "NVIDIA H200", "gpu_mem_gb": 139.8}
    assert gpu_words(machine, "cuda") == ", served on NVIDIA H200 (139.8 GB)"
    assert gpu_words(machine, "cuda:1") == ", served on NVIDIA H200 (139.8 GB)"
    assert gpu_words(machine, "cpu") == ""
    assert gpu_words({"gpu": None}, "cuda") == ""


@pytest.mark.parametrize("level", [0.9, 0.95, 0.99])
def test_bench_scale_median_interval_is_the_order_statistic_rule(level: float) -> None:
    """``x(k)``, ``x(n+1-k)`` for the largest ``k`` with ``P(Binomial(n, 1/2) < k) <= (1-level)/2``,
    at least 1, on shuffled samples with ties."""
    from bench_scale import median_interval
    from scipy.stats import binom

    rng = np.random.default_rng(0)
    for n in range(1, 60):
        values = sorted(rng.integers(0, 3 * n, size=n).astype(float))
        k = max(1, sum(binom.cdf(j - 1, n, 0.5) <= (1 - level) / 2 for j in range(1, n // 2 + 1)))
        shuffled = list(rng.permutation(values))
        assert median_interval(shuffled, level) == (values[k - 1], values[n - k]), n


def test_bench_scale_judges_the_ray_cpu_goal_per_round() -> None:
    """The median of a sample has a distribution-free interval of order statistics, and the
    CPU goal is the median of each round's excess over its bound (trivial + 1.2 × alone)."""
    from bench_scale import _paired_excess, median_interval

    assert median_interval(list(range(1, 13))) == (3, 10)  # P(Bin(12, 1/2) <= 2) = 0.019
    assert median_interval([5.0, 1.0, 3.0]) == (1.0, 5.0)  # too few for 95%: the whole range
    assert median_interval([2.0, 1.0], level=0.5) == (1.0, 2.0)  # scipy: (nan, 2)
    mine = {"slices_ms": [9.0, 9.5, 8.0]}
    floor = {"slices_ms": [8.0, 8.0, 8.0]}
    alone = {"slices_ms": [0.5, 0.5, 1.0]}
    assert _paired_excess(mine, floor, alone) == pytest.approx([0.4, 0.9, -1.2])
    assert _paired_excess({"server_ms": {}}, floor, alone) is None  # a run saved before rounds


class _Lines:
    """A source of handmade lines for ``bench_layers.classify``: ``{(path, line): text}``."""

    def __init__(self, lines: dict[tuple[str, int], str]) -> None:
        self._lines = lines

    def line(self, path: str, lineno: int) -> str:
        return self._lines.get((path, lineno), "")


ROUTER = "/repo/gnnaas/serving/core/router.py"
EXECUTOR = "/repo/gnnaas/inference/executor.py"
PREDICT = "/repo/gnnaas/serving/http/routes/predict.py"
LINES = {
    (ROUTER, 5): "variant = self.select(request)",
    (ROUTER, 6): "await batcher.submit(nodes)",
    (EXECUTOR, 1): "n_id = torch.unique(n_id)",
    (EXECUTOR, 2): "x = self.x.index_select(0, n_id)",
    (EXECUTOR, 3): "out = logits.tolist()",
    (EXECUTOR, 4): "logits = self.model(x, blocks)",
    (PREDICT, 1): "return Response(json.dumps(payload))",
    (PREDICT, 2): "metrics.observe(latency)",
    (PREDICT, 3): "nodes = body.nodes",
}


@pytest.mark.parametrize(
    ("frame", "layer"),
    [
        ("sample (/repo/gnnaas/sampling/khop.py:10)", "sampling"),
        ("forward (/venv/torch/nn/modules/linear.py:12)", "forward"),
        ("propagate (/venv/torch_geometric/nn/conv/sage_conv.py:3)", "forward"),
        (f"run ({EXECUTOR}:1)", "sampling"),
        (f"run ({EXECUTOR}:2)", "gather"),
        (f"run ({EXECUTOR}:3)", "serialization"),
        (f"run ({EXECUTOR}:4)", "forward"),
        ("decide (/repo/gnnaas/policy/decision.py:7)", "policy"),
        (f"Router.decision_load ({ROUTER}:9)", "policy"),
        (f"Router._measure ({ROUTER}:9)", "policy"),  # a decision's snapshot
        (f"Router._decide ({ROUTER}:9)", "policy"),
        (f"_stream_of ({ROUTER}:9)", "policy"),
        (f"Router._on_batch ({ROUTER}:9)", "metrics"),
        (f"Router.predict ({ROUTER}:5)", "policy"),  # predict goes by its line
        (f"Router.predict ({ROUTER}:6)", "queue (batcher)"),
        ("submit (/repo/gnnaas/serving/core/batcher.py:3)", "queue (batcher)"),
        ("inc (/venv/prometheus_client/metrics.py:3)", "metrics"),
        ("observe (/repo/gnnaas/serving/core/metrics.py:3)", "metrics"),
        (f"predict ({PREDICT}:1)", "serialization"),
        (f"predict ({PREDICT}:2)", "metrics"),
        (f"predict ({PREDICT}:3)", "HTTP + parsing"),
        ("app (/repo/gnnaas/serving/http/app.py:3)", "HTTP + parsing"),
        ("app (gnnaas/serving/http/app.py:3)", "HTTP + parsing"),  # a path from the repo root
        ("validate (/venv/pydantic/main.py:3)", "HTTP + parsing"),
        ("handle (/venv/uvicorn/protocols/http.py:3)", "HTTP + parsing"),
        ("_worker (/usr/lib/python3.11/concurrent/futures/thread.py:3)", "thread hand-off"),
        ("wait (/usr/lib/python3.11/threading.py:3)", "thread hand-off"),
    ],
)
def test_bench_layers_classifies_a_frame_by_its_rule(frame: str, layer: str) -> None:
    from bench_layers import classify

    # Below the frame: an event loop frame and one of no known layer, which it decides over.
    stack = ["run (/usr/lib/python3.11/asyncio/base_events.py:1)", "f (/venv/numpy/x.py:1)", frame]
    assert classify(stack, _Lines(LINES)) == layer


def test_bench_layers_classifies_by_the_innermost_known_frame() -> None:
    from bench_layers import classify

    lines = _Lines(LINES)
    sampled = ["handle (/venv/uvicorn/http.py:1)", "sample (/repo/gnnaas/sampling/khop.py:1)"]
    assert classify(sampled, lines) == "sampling"
    assert classify(sampled[::-1], lines) == "HTTP + parsing"
    # The router's file is the router's, not generic serving code.
    assert classify([f"Router._on_batch ({ROUTER}:9)"], lines) == "metrics"
    asyncio_only = ["run (/usr/lib/python3.11/asyncio/events.py:1)", "f (/venv/numpy/x.py:1)"]
    assert classify(asyncio_only, lines) == "event loop"
    assert classify(["f (/venv/numpy/x.py:1)", "<module>"], lines) == "other"
    assert classify([], lines) == "other"


def test_bench_faults_counts_the_answers_around_the_kill() -> None:
    from bench_faults import _Answer, _answer_counts

    ok = _Answer(200, None, '{"predictions": [1]}', sent=1.0, took_s=0.5)
    died = _Answer(503, "1", '{"detail": "replica died"}', sent=9.5, took_s=1.0)  # spans 10.0
    late = _Answer(503, "1", '{"detail": "queue full"}', sent=11.0, took_s=0.1)
    bare = _Answer(503, None, '{"detail": "queue full"}', sent=12.0, took_s=0.1)
    text = _Answer(503, "1", "Service Unavailable", sent=12.5, took_s=0.1)
    lost = _Answer(-1, None, "client timeout", sent=9.0, took_s=20.0)  # spans 10.0
    counts = _answer_counts([ok, died, late, bare, text, lost, ok], killed_at=10.0)
    assert counts == {
        "requests": 7,
        "status_counts": {"-1": 1, "200": 2, "503": 4},
        "in_flight_at_kill": 2,
        "non_200": 5,
        "non_200_not_in_flight": 3,
        "503_without_retry_after_or_detail": 2,
        "non_200_bodies": [
            "Service Unavailable",
            "client timeout",
            '{"detail": "queue full"}',
            '{"detail": "replica died"}',
        ],
    }


def test_h2load_logs_become_step_results(tmp_path: Path) -> None:
    h2load = importlib.import_module("h2load")
    loadgen = importlib.import_module("loadgen")
    log = tmp_path / "log.tsv"
    # start (µs since epoch), status, duration (µs); -1: a failed stream
    log.write_text("1000000\t200\t1500\n1000500\t503\t300\n1001000\t-1\t0\n")
    start, status, duration = h2load.read_log(log)
    assert start.tolist() == [1e6, 1000500.0, 1001000.0]
    assert status.tolist() == [200, 503, -1] and duration.tolist() == [1500.0, 300.0, 0.0]
    cmd = h2load._command(
        "http://127.0.0.1:1/p", tmp_path / "b", {"X-Priority": "low"}, 12.5, 40, log
    )
    assert cmd[:2] == ["h2load", "--h1"] and cmd[-1] == "http://127.0.0.1:1/p"
    assert "--rps=12.5" in cmd and ["-n", "40"] == cmd[cmd.index("-n") : cmd.index("-n") + 2]
    assert "X-Priority: low" in cmd and "Content-Type: application/json" in cmd

    class Done:  # a finished process
        returncode = 0

        def communicate(self, timeout: float) -> tuple[bytes, bytes]:
            return b"", b""

    spec = loadgen.StepSpec(rate_rps=3.0, duration_s=1.0, max_requests=10)
    result = h2load._result(spec, [(Done(), log)])
    assert result.sent == 3 and result.status.tolist() == [200, 503, -1]
    assert result.latency_ms[:2].tolist() == [1.5, 0.3] and result.latency_ms[2] == np.inf
    assert result.wall_s == pytest.approx(0.0015)  # first start to the last end
    assert result.share(503) == pytest.approx(1 / 3)


def test_h2load_closed_steps_count_answers_per_variant_from_the_metrics(tmp_path: Path) -> None:
    h2load = importlib.import_module("h2load")
    loadgen = importlib.import_module("loadgen")
    cmd = h2load._closed_command(
        "http://127.0.0.1:1/p", tmp_path / "b", {"X-Variant": "v"}, 3, 0.75, tmp_path / "l"
    )
    assert cmd[cmd.index("-c") + 1] == "3" and cmd[cmd.index("-m") + 1] == "1"
    assert cmd[cmd.index("-D") + 1] == "750ms" and "X-Variant: v" in cmd
    text = (
        "# TYPE gnnaas_requests_total counter\n"
        'gnnaas_requests_total{dataset="Cora",variant="a"} 5.0\n'
        'gnnaas_requests_total{dataset="Cora",variant="b@exact"} 2.0\n'
        'gnnaas_nodes_total{dataset="Cora",variant="a"} 99.0\n'
    )
    assert h2load._served_in(text) == {"a": 5, "b@exact": 2}
    spec = loadgen.StepSpec(rate_rps=0.0, duration_s=1.0, max_requests=10, concurrency=2)

    def step(served: dict[str, int] | None) -> Any:
        n = 2
        return loadgen.StepResult(
            spec, n, 1.0, np.ones(n), np.zeros(n), np.full(n, 200), ["x"] * n, [None] * n,
            served=None if served is None else loadgen.Counter(served),
        )  # fmt: skip

    assert step(None).variants_served() == {"x": 2}  # read from each answer
    merged = loadgen.StepResult.merged([step({"a": 2}), step({"a": 1, "b": 1})])
    assert merged.variants_served() == {"a": 3, "b": 1}


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_gpu_check_without_cuda_changes_no_results(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``make gpu-check`` on a machine without CUDA leaves the committed GPU page (and every
    other result) as it was; ``--out`` still records the attempt where it is asked to."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    gpu_check = importlib.import_module("gpu_check")
    before = _snapshot(RESULTS)
    assert gpu_check.main([]) == 0
    assert _snapshot(RESULTS) == before
    said = capsys.readouterr().out
    assert "no CUDA device: nothing to check" in said
    assert "nothing written: benchmarks/results/gpu.md keeps the last run on a GPU" in said
    assert gpu_check.main(["--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu.json", "gpu.md"]
    assert json.loads((tmp_path / "gpu.json").read_text())["cuda"] is False
    assert "No CUDA device was available" in (tmp_path / "gpu.md").read_text()
    assert _snapshot(RESULTS) == before


def test_a_command_line_leaves_out_an_absolute_results_folder() -> None:
    # A page says how to reproduce it where it is committed, never where a run wrote it.
    common = importlib.import_module("common")
    line = common.command_line
    assert line("bench_x.py", ["--size", "64", "--out", "/scratch/run1", "--name", "d"]) == (
        "python benchmarks/bench_x.py --size 64 --name d"
    )
    assert line("bench_x.py", ["--out=/scratch/run1", "--repeats", "2"]) == (
        "python benchmarks/bench_x.py --repeats 2"
    )
    kept = ["--out", "benchmarks/results", "--workdir", ".cache/bench-drift"]
    assert line("bench_x.py", kept) == "python benchmarks/bench_x.py " + " ".join(kept)


def test_the_loop_lag_of_a_run_is_read_off_the_histograms_buckets() -> None:
    from bench_deadlines import lag_quantiles

    # Cumulative counts by upper bound (s) before and after a run: 99 ticks in it, 48 under
    # 1 ms, 95 under 10 ms, the rest above.
    before = {0.001: 2.0, 0.01: 5.0, math.inf: 5.0}
    after = {0.001: 50.0, 0.01: 100.0, math.inf: 104.0}
    assert lag_quantiles(before, after) == {"ticks": 99, "p50_ms": 10.0, "p99_ms": math.inf}
    assert lag_quantiles({}, {}) == {"ticks": 0, "p50_ms": None, "p99_ms": None}


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_exits_through_exit_status(name: str) -> None:
    """A refused input reads as one line, not a traceback, in every script (common.exit_status)."""
    assert "raise SystemExit(exit_status(main))" in (BENCH / f"{name}.py").read_text()


def test_exit_status_turns_a_refused_input_into_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    common = importlib.import_module("common")
    from gnnaas.data.registry import load_dataset

    def unknown_graph() -> int:
        load_dataset("no-such-graph")
        return 0

    assert common.exit_status(lambda: 3) == 3
    assert common.exit_status(lambda: None) == 0
    assert common.exit_status(unknown_graph) == 1
    err = capsys.readouterr().err
    assert err.startswith("ConfigError: unknown dataset 'no-such-graph'") and err.count("\n") == 1

    def broken() -> int:
        raise RuntimeError("a bug, shown in full")

    with pytest.raises(RuntimeError):
        common.exit_status(broken)


def _variant(vid: str, accuracy: float, admissible_at: float) -> dict[str, Any]:
    return {"id": vid, "prune": 1, "accuracy": accuracy, "admissible_at": admissible_at}


def test_bench_policy_pins_its_control_twice_and_reads_the_rule_against_its_noise() -> None:
    bench_policy = importlib.import_module("bench_policy")
    variants = [
        {**_variant("full", 0.80, 0.0), "routable": True},
        {**_variant("half", 0.79, 1.0), "routable": True},
        {**_variant("quarter", 0.77, 5.0), "routable": True},
    ]
    prerun = {"full": 100.0, "half": 300.0, "quarter": 900.0}
    policies = bench_policy.make_policies(variants, 1, [5.0, 0.0], prerun, top=1)
    keys = [p.key for p in policies]
    # the control is the fastest variant admissible at the *smallest* tolerance, pinned twice
    assert keys.count("pin:full") == 1 and keys.count("twin:full") == 1
    assert {p.headers["X-Variant"] for p in policies if p.key.endswith(":full")} == {"full"}
    assert "twin:quarter" not in keys
    assert "twin:full" not in [
        p.key for p in bench_policy.make_policies(variants, 1, [0.0], prerun, 1, twin=False)
    ]

    def rates(**by_key: float) -> dict[str, Any]:
        return {k.replace("_", ":"): {"rate_rps": v, "steps": []} for k, v in by_key.items()}

    results = {
        "variants": variants,
        "sizes": {
            "1": {
                "bound_ms": 20.0,
                "policies": [
                    {"key": "router-tol0", "tolerance": 0.0},
                    {"key": "pin:full", "tolerance": None},
                    {"key": "twin:full", "tolerance": None},
                ],
                "repeats": [
                    rates(**{"router-tol0": 80.0, "pin_full": 100.0, "twin_full": 125.0}),
                    rates(**{"router-tol0": 70.0, "pin_full": 100.0, "twin_full": 95.0}),
                ],
            }
        },
    }
    controls = bench_policy.twins(results)
    assert [r["ratio"] for r in controls] == pytest.approx([1.25, 0.95])
    assert bench_policy.twin_floor(controls) == pytest.approx(0.8)  # 100 / 125, either way
    rows = bench_policy.check(results, 0.9)
    # the twin is not a candidate for the best fixed variant, only the control
    assert {r["best_fixed"] for r in rows} == {"pin:full"}
    assert [(r["ok"], r["within_noise"]) for r in rows] == [(False, True), (False, False)]
    page = bench_policy.render(
        {**results, "check": rows, "machine": {}, "args": {"concurrency": [], "repeats": 2}}
        | {"overhead": _OVERHEAD, "args_line": "", "dataset": "toy", "picks": []}
    )
    assert "Lowest over the run, either way: **0.80**" in page
    # 2 control ratios, 2 rule cells: below the floor by noise alone with probability 1/6 each
    assert "probability about 1/(2(2+1)) = 0.17" in page and "about 0.3 of the 2 cells" in page
    assert "| 1 | 0 | 1 | 80 | pin:full | 100 | 0.80 | **no** | yes |" in page
    assert "| 1 | 0 | 2 | 70 | pin:full | 100 | 0.70 | **no** | **no** |" in page


_OVERHEAD = {
    "requests": 1,
    "server_total_p50_ms": 1.0,
    "executor_p50_ms": 0.5,
    "queue_p50_ms": 0.1,
    "overhead_p50_ms": 0.5,
    "client_p50_ms": 2.0,
}


def test_prepare_keeps_profiles_taken_on_another_thread_count_apart(tmp_path: Path) -> None:
    """A plan profiling on 1 thread does not reuse curves taken on 2 (its server would re-time
    them in a few runs each): it gets ``<folder>-1t``; a plan on 2 threads keeps the folder."""
    common = importlib.import_module("common")
    header = (
        "variant,batch_size,sample_ms,gather_ms,compute_ms,e2e_ms,hit_ratio,copied_kb,sampling,"
        "sampler_seed,threads,inline_max_nodes,device,torch_version,gnnaas_version"
    )
    rows = [
        f"toy-full-1x,{b},0.5,0.1,1.0,2.0,0,10,depth,0,2,16,cpu,2.13.0+cpu,0.1.0" for b in (1, 4)
    ]
    rows.append("toy-full-1x@exact,1,0.03,0.03,0,0.15,0,0,depth,0,1,16,cpu,2.13.0+cpu,0.1.0")
    folder = tmp_path / "profiles"
    (folder / "toy").mkdir(parents=True)
    (folder / "toy" / "service_times.csv").write_text("\n".join([header, *rows]) + "\n")
    assert common._profiles_for_threads(folder, "toy", 2) == folder  # the lookup's row is not it
    assert common._profiles_for_threads(folder, "toy", 1) == tmp_path / "profiles-1t"
    assert common._profiles_for_threads(folder, "other", 1) == folder  # nothing there yet
