"""Every reference to the project's architecture document resolves inside a clone."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
_SKIP = {".venv", ".cache", ".git", "variants", "profiles"}


def _texts() -> list[Path]:
    return [
        p
        for p in REPO.rglob("*")
        if p.is_file()
        and p.suffix in (".py", ".md", ".toml")
        and not _SKIP.intersection(p.relative_to(REPO).parts)
    ]


def test_architecture_references_name_sections_that_exist() -> None:
    doc = (REPO / "docs" / "architecture.md").read_text()
    sections = {int(n) for n in re.findall(r"^## (\d+)\. ", doc, flags=re.M)}
    assert sections == set(range(1, max(sections) + 1))  # numbered 1..n without a gap
    cited: dict[int, list[str]] = {}
    for path in _texts():
        for first, last in re.findall(r"docs/architecture\.md §(\d+)(?:-(\d+))?", path.read_text()):
            for n in range(int(first), int(last or first) + 1):
                cited.setdefault(n, []).append(str(path.relative_to(REPO)))
    assert cited, "no reference found: the pattern is stale"
    missing = {n: paths for n, paths in cited.items() if n not in sections}
    assert not missing, f"references to sections that do not exist: {missing}"


def test_no_reference_points_outside_the_clone() -> None:
    offenders = []
    for path in _texts():
        if path.name == "test_docs.py":
            continue
        text = path.read_text()
        if re.search(r"ARCHITECTURE\.md|shared/(?:STYLE|REFERENCE)\.md", text):
            offenders.append(str(path.relative_to(REPO)))
    assert not offenders, f"references to files outside the repository: {offenders}"


def test_generated_blocks_are_written_from_the_results_and_the_code() -> None:
    """The docs' generated blocks (README tables of figures, the header table, the rule's prose)
    are what scripts/readme_tables.py makes of the results JSON and of the constants: a
    benchmark rerun or a changed constant without refreshing them, or a figure edited by hand,
    fails here."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "readme_tables", REPO / "scripts" / "readme_tables.py"
    )
    assert spec is not None and spec.loader is not None
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    text = (REPO / "README.md").read_text()
    for name in tables.TABLES:
        assert f"<!-- table: {name} -->" in text, f"README has no table {name!r}"
    for path in tables.DOCS:
        assert tables.refreshed(path.read_text())[1] == [], "run python scripts/readme_tables.py"
    assert "<!-- table: rule -->" in (REPO / "docs" / "architecture.md").read_text()
    # A figure changed by hand is noticed, and so is a rule's number.
    tampered = re.sub(r"\*\*\d+\.\d+×\*\*", "**9.99×**", text, count=1)
    assert tampered == text or tables.refreshed(tampered)[1] == ["speedups"]
    assert tables.refreshed(text.replace("N + 1 points", "N + 2 points", 1))[1] == ["rule"]
    # A setting's default or a metric's labels typed by hand are noticed too.
    assert tables.refreshed(text.replace("| `16384` |", "| `9999` |", 1))[1] == ["knobs"]
    tampered = text.replace("| `gnnaas_nodes_total` | counter | `dataset`, `variant` |",
                            "| `gnnaas_nodes_total` | counter | `dataset` |", 1)  # fmt: skip
    assert tampered != text and tables.refreshed(tampered)[1] == ["metrics"]
    from gnnaas.serving.http.requests import HEADER_DOCS

    assert HEADER_DOCS["X-Priority"] in text  # the header table is OpenAPI's own text


def _script(name: str) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve the module's annotations through it
    spec.loader.exec_module(module)
    return module


def test_readme_check_ends_a_block_whose_background_server_outlives_it(tmp_path: Path) -> None:
    """A block that leaves a background process holding its output (as `make serve &` then
    `kill %1` does without job control) is done when its shell exits; the process is stopped."""
    check = _script("readme_check")
    pid_file = tmp_path / "pid"
    text = f"sleep 300 &\necho $! > {pid_file}\necho started\n# expect: started\n"
    ok, output, _ = check.run_block(check.Block(1, text, timeout_s=60.0), dict(os.environ))
    assert ok and "started" in output  # done when its shell exits, not at the timeout
    stat = Path(f"/proc/{int(pid_file.read_text())}/stat")
    assert not stat.exists() or stat.read_text().split(")")[-1].split()[0] == "Z"  # gone or dead
