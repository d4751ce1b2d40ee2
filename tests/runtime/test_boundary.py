"""The runtime is the one place that builds what runs a variant.

What is profiled is what is served by construction only if nothing else builds an executor, a
sampler, an inference path or a device feature cache: a second builder would be a second copy of
the pipeline to keep in step. This scans the source of the package and the benchmarks for calls
that construct them; the modules that define the classes (a sampler's hops, an executor's path)
and the benchmark that compares sampler implementations are the exceptions, each with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

BUILT_BY_THE_RUNTIME = frozenset(
    {
        "Executor",
        "InferencePath",
        "LookupPath",
        "FeatureCache",
        "DepthSampler",
        "NeighborSampler",
    }
)

# module -> why it may construct them
EXCEPTIONS = {
    "gnnaas/runtime/": "the runtime itself",
    "gnnaas/sampling/": "a DepthSampler is built of one NeighborSampler per hop",
    "gnnaas/inference/executor.py": "an executor holds the path of its variant",
    "benchmarks/bench_sampler.py": "it measures the sampler implementations against each other",
    "benchmarks/bench_latency.py": "its micro-benchmark times the compiled and the torch path",
}


def _constructions(path: Path) -> list[tuple[int, str]]:
    """``(line, class)`` of every call of a class the runtime builds in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name in BUILT_BY_THE_RUNTIME:
                out.append((node.lineno, name))
    return out


def _sources() -> list[Path]:
    files = [*(REPO / "gnnaas").rglob("*.py"), *(REPO / "benchmarks").glob("*.py")]
    return sorted(files)


def test_nothing_outside_the_runtime_builds_an_executor_or_a_sampler() -> None:
    offenders = []
    for path in _sources():
        rel = path.relative_to(REPO).as_posix()
        if any(rel.startswith(prefix) for prefix in EXCEPTIONS):
            continue
        offenders += [f"{rel}:{line}: {name}(...)" for line, name in _constructions(path)]
    assert not offenders, (
        "build these through gnnaas.runtime (RuntimeGraph.sampler, RuntimeVariant.executor, "
        "sampled_path, training_sampler):\n" + "\n".join(offenders)
    )


def test_the_scan_sees_constructions_and_its_exceptions_exist(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text(
        "from gnnaas.sampling import DepthSampler\n"
        "import gnnaas.inference as inf\n"
        "s = DepthSampler(r, c, (2,))\n"
        "e = inf.Executor(m, x, s)\n"
        "f = sampler_factory(s)\n"
    )
    assert _constructions(sample) == [(3, "DepthSampler"), (4, "Executor")]
    for prefix in EXCEPTIONS:
        assert (REPO / prefix).exists(), prefix
    built = {name for path in _sources() for _, name in _constructions(path)}
    assert built == BUILT_BY_THE_RUNTIME  # every class is still constructed somewhere
