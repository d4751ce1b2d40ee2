"""The package's functions stay short: under a line ceiling and within ruff's complexity limits.

The complexity thresholds are ruff's, set in ``pyproject.toml`` (``[tool.ruff.lint.mccabe]``,
``[tool.ruff.lint.pylint]``); this test runs the same rules, so a function past them fails the
test suite as well as ``make lint``, each offender named with its file and line.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "gnnaas"
MAX_FUNCTION_LINES = 120
"""A function's lines, from ``def`` (decorators excluded) to its last line, docstring included."""
SHAPE_RULES = "C901,PLR0912,PLR0915"


def _long_functions(root: Path, limit: int) -> list[str]:
    """``path:line name (N lines)`` of each function or method under ``root`` over ``limit``."""
    offenders = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    where = path.relative_to(root.parent)
                    offenders.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    return offenders


def _shape_findings(*paths: Path) -> list[str]:
    """Ruff's complexity findings on ``paths``, with the thresholds of the repository's
    ``pyproject.toml`` (skips the test when ruff is missing)."""
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed in this environment (`make install` installs it)")
    command = [sys.executable, "-m", "ruff", "check", "--select", SHAPE_RULES]
    command += ["--config", str(REPO / "pyproject.toml"), "--output-format", "concise"]
    # Neither a noqa comment nor a per-file ignore may hide an offender.
    command += ["--config", "lint.per-file-ignores = {}", "--ignore-noqa"]
    done = subprocess.run(
        [*command, "--no-cache", *map(str, paths)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode in (0, 1) and not done.stderr.strip(), done.stderr
    findings = [line for line in done.stdout.splitlines() if ": C901 " in line or ": PLR09" in line]
    assert (done.returncode == 1) == bool(findings), done.stdout
    return findings


def _function_of(name: str, num_ifs: int) -> str:
    """A function whose complexity is ``num_ifs + 1``, one ``if`` per line pair."""
    body = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(num_ifs))
    return f"def {name}(x):\n{body}    return -1\n"


def test_the_checks_find_a_long_and_a_tangled_function(tmp_path: Path) -> None:
    limit = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    complexity, branches = limit["mccabe"]["max-complexity"], limit["pylint"]["max-branches"]
    within = min(complexity - 1, branches)  # ifs: complexity and branches at their limits or under
    past = max(complexity, branches) + 1  # ifs: both past their limits
    fine = _function_of("fine", within)
    file = tmp_path / "m.py"
    file.write_text(fine + "\n\n" + _function_of("tangled", past))
    line = fine.count("\n") + 3  # tangled's def
    assert _long_functions(tmp_path, 2 * within + 2) == [
        f"{tmp_path.name}/m.py:{line} tangled ({2 * past + 2} lines)"
    ]
    findings = _shape_findings(file)
    assert len(findings) == 2, findings
    assert (
        f"m.py:{line}:5: C901 `tangled` is too complex ({past + 1} > {complexity})" in findings[0]
    )
    assert f"m.py:{line}:5: PLR0912 Too many branches ({past} > {branches})" in findings[1]


def test_no_function_is_longer_than_the_ceiling() -> None:
    offenders = _long_functions(PACKAGE, MAX_FUNCTION_LINES)
    assert not offenders, (
        f"functions over {MAX_FUNCTION_LINES} lines (split them along a seam):\n"
        + "\n".join(offenders)
    )


def test_no_function_is_past_the_complexity_limits() -> None:
    findings = _shape_findings(PACKAGE)
    assert not findings, (
        "functions past ruff's complexity limits (pyproject.toml; split them along a seam, no "
        "noqa):\n" + "\n".join(findings)
    )
