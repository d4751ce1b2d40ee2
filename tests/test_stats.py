"""The one percentile definition (``gnnaas/stats.py``), and that nothing computes another one."""

from __future__ import annotations

import ast
import math
import statistics
import warnings
from pathlib import Path

import numpy as np
import pytest

from gnnaas import stats
from gnnaas.stats import median, percentile

REPO = Path(__file__).resolve().parents[1]
INF = math.inf


def _linear(values: list[float], q: float) -> float:
    """The definition of gnnaas/stats.py written out: the line between the order statistics
    around position ``h = (n - 1) q / 100``."""
    xs = sorted(values)
    h = (len(xs) - 1) * q / 100
    lo = math.floor(h)
    return xs[lo] if lo == h else xs[lo] + (h - lo) * (xs[lo + 1] - xs[lo])


@pytest.mark.parametrize(
    ("q", "expected"), [(0, 10.0), (25, 17.5), (50, 25.0), (75, 32.5), (90, 37.0), (100, 40.0)]
)
def test_percentile_interpolates_between_order_statistics(q: float, expected: float) -> None:
    assert percentile([40.0, 10.0, 30.0, 20.0], q) == pytest.approx(expected, abs=1e-12)


def test_percentile_is_the_definition_on_random_samples() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 10, 101, 1000):
        sample = list(rng.lognormal(size=n))
        for q in (0, 1, 50, 95, 99, 99.9, 100):
            assert percentile(sample, q) == pytest.approx(_linear(sample, q), rel=1e-12)
    assert percentile([7.0], 99) == 7.0


def test_percentile_takes_any_iterable() -> None:
    values = [3.0, 1.0, 2.0, 5.0]
    expected = percentile(values, 95)
    assert percentile(iter(values), 95) == expected
    assert percentile((v for v in values), 95) == expected
    assert percentile(np.array(values), 95) == expected
    assert percentile(range(1, 6), 50) == 3.0


def test_median_agrees_with_the_50th_percentile() -> None:
    assert median([5.0, 1.0, 3.0]) == 3.0  # odd: the middle value
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5  # even: the mean of the two middle ones
    rng = np.random.default_rng(1)
    for n in (1, 2, 5, 6, 99, 100):
        sample = list(rng.normal(size=n))
        assert median(sample) == pytest.approx(percentile(sample, 50), abs=1e-12)
        assert median(sample) == statistics.median(sample)  # the textbook median, to the bit
    assert median(v for v in [2.0, 1.0]) == 1.5


def test_infinities_are_the_largest_values() -> None:
    """A timed-out request counts as infinitely slow: a percentile that reaches it is infinite
    (numpy alone gives NaN and a RuntimeWarning there)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert percentile([1.0, 2.0, INF], 50) == 2.0  # h falls on the finite 2
        assert percentile([1.0, 2.0, INF], 75) == INF
        assert percentile([1.0, INF, INF], 75) == INF
        assert percentile([1.0, 2.0, 3.0, INF], 50) == 2.5  # the neighbours are finite
        assert percentile([-INF, 1.0, 2.0], 25) == -INF
        assert math.isnan(percentile([-INF, INF], 50))
        assert median([1.0, 2.0, INF]) == 2.0
        assert median([1.0, INF]) == INF
        assert math.isnan(median([-INF, INF]))


def test_nan_propagates() -> None:
    assert math.isnan(percentile([1.0, math.nan, 3.0], 50))
    assert math.isnan(median([1.0, math.nan, 3.0]))


def test_errors_name_the_function_and_the_value() -> None:
    with pytest.raises(ValueError, match=r"stats.percentile: values must hold .* \(got none\)"):
        percentile([], 50)
    with pytest.raises(ValueError, match=r"stats.median: values must hold .* \(got none\)"):
        median(iter([]))
    with pytest.raises(ValueError, match=r"stats.percentile: q must be in \[0, 100\] \(got 101\)"):
        percentile([1.0], 101)
    with pytest.raises(ValueError, match=r"q must be in \[0, 100\] \(got -1\)"):
        percentile([1.0], -1)
    with pytest.raises(ValueError, match=r"q must be in \[0, 100\] \(got nan\)"):
        percentile([1.0], math.nan)
    with pytest.raises(ValueError, match=r"one-dimensional \(got shape \(2, 2\)\)"):
        median([[1.0, 2.0], [3.0, 4.0]])


def test_module_exports_and_imports_nothing_from_gnnaas() -> None:
    assert stats.__all__ == sorted(stats.__all__) == ["median", "percentile"]
    tree = ast.parse((REPO / "gnnaas" / "stats.py").read_text())
    imported = {
        name
        for node in ast.walk(tree)
        for name in (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
    }
    assert not {m for m in imported if m.split(".")[0] == "gnnaas"}


# -- nothing else computes a percentile or a median --------------------------------------------

# Functions that compute a percentile, quantile or median in the libraries gnnaas uses.
_STAT_FUNCTIONS = {
    "median",
    "median_grouped",
    "median_high",
    "median_low",
    "mquantiles",
    "nanmedian",
    "nanpercentile",
    "nanquantile",
    "percentile",
    "quantile",
    "quantiles",
    "scoreatpercentile",
}
_LIBRARIES = {"numpy", "pandas", "scipy", "statistics", "torch"}
# Methods of pandas and torch objects that compute one (``series.median()``, ``t.quantile(q)``);
# ``percentile`` is left out: ``StepResult.percentile`` of benchmarks/loadgen.py calls this module.
_STAT_METHODS = {"median", "nanmedian", "nanquantile", "quantile"}
# The one exception, with its reason.
_ALLOWED = {
    ("gnnaas/profiling/uncertainty.py", "numpy.nanquantile"): (
        "the percentile bootstrap's interval ends: quantiles of a [resamples, variants] matrix "
        "along an axis, skipping the resamples whose denominator was 0 (NaN); a statistical "
        "method of its own, not a latency figure"
    ),
}


def _stat_calls(source: str) -> list[tuple[int, str]]:
    """``(line, name)`` of every call in ``source`` that computes a percentile, quantile or median
    with numpy, pandas, scipy, statistics or torch (or imports such a function by name)."""
    tree = ast.parse(source)
    modules: dict[str, str] = {}  # local name -> what it is bound to
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:  # `import a.b` binds `a`; `import a.b as c` binds `c` to a.b
                bound = a.name if a.asname else a.name.split(".")[0]
                modules[a.asname or bound] = bound
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                modules[a.asname or a.name] = full
                if node.module.split(".")[0] in _LIBRARIES and a.name in _STAT_FUNCTIONS:
                    found.append((node.lineno, full))
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        receiver = ast.unparse(node.func.value)
        root, _, rest = receiver.partition(".")
        if root in modules and isinstance(node.func.value, ast.Name | ast.Attribute):
            full = ".".join(p for p in (modules[root], rest, node.func.attr) if p)
            if full.split(".")[0] in _LIBRARIES and node.func.attr in _STAT_FUNCTIONS:
                found.append((node.lineno, full))
        elif node.func.attr in _STAT_METHODS:
            found.append((node.lineno, f"{receiver}.{node.func.attr}"))
    return sorted(found)


def test_the_scan_finds_other_definitions() -> None:
    source = """
import numpy as np
import statistics
import torch
from statistics import quantiles
from gnnaas import stats
from gnnaas.stats import median

np.percentile(a, 99)
np.quantile(a, 0.5)
statistics.median(a)
torch.median(t)
series.median()
step.percentile(99)
stats.percentile(a, 99)
median(a)
"""
    assert _stat_calls(source) == [
        (5, "statistics.quantiles"),
        (9, "numpy.percentile"),
        (10, "numpy.quantile"),
        (11, "statistics.median"),
        (12, "torch.median"),
        (13, "series.median"),
    ]


def test_nothing_but_gnnaas_stats_computes_a_percentile() -> None:
    """Every percentile and median of gnnaas, its benchmarks and scripts is gnnaas/stats.py's:
    no call of numpy's, statistics', pandas' or torch's own, whose definitions differ (numpy's
    ``method``, torch's lower median of an even count) or break on infinite latencies."""
    paths = [
        *sorted((REPO / "gnnaas").rglob("*.py")),
        *sorted((REPO / "benchmarks").glob("*.py")),
        *sorted((REPO / "scripts").glob("*.py")),
    ]
    assert len(paths) > 100  # the walk saw the package and the benchmarks
    offending, used = [], set()
    for path in paths:
        rel = path.relative_to(REPO).as_posix()
        if rel == "gnnaas/stats.py":
            continue
        for line, name in _stat_calls(path.read_text()):
            if (rel, name) in _ALLOWED:
                used.add((rel, name))
            else:
                offending.append(f"{rel}:{line}: {name}")
    assert offending == [], "use gnnaas.stats.percentile / median instead: " + ", ".join(offending)
    assert used == set(_ALLOWED), f"exceptions no longer needed: {set(_ALLOWED) - used}"
