"""Tests never sleep and never read the real clock, except those that run real processes.

The serving core takes its time from an injected clock (:mod:`gnnaas.serving.core.clock`), so a
test of its logic drives a :class:`~gnnaas.serving.core.clock.FakeClock` and waits on events, never
on time: a sleep used to let something happen races the machine's speed, and an assertion on a
real duration fails on a slower machine. Only the modules in :data:`REAL_TIME` may sleep or read
the real clock: each starts real processes or servers (uvicorn, ``--workers``, Ray) and polls
them, with nothing but time to wait on. Test code that needs a real process goes into one of them
rather than exempting lines elsewhere.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent

REAL_TIME = frozenset(
    {
        "serving/test_contract.py",  # the contract on the `--workers` and Ray backends
        "serving/test_live_crash.py",  # kills a live-graph server mid-stream, restarts it
        "serving/test_ray_faults.py",  # kills Ray Serve replicas under load
        "serving/test_ray_start.py",  # `gnnaas serve --backend ray` and its clean-up
        "serving/test_server.py",  # `gnnaas serve` under uvicorn, SIGHUP, SIGINT
        "serving/test_workers.py",  # `gnnaas serve --workers`, SIGHUP replacing workers
    }
)
"""The test modules that may sleep and read the real clock (paths under ``tests/``)."""

# Sleeping and reading the real clock: these names of the modules that provide them.
_CLOCK_NAMES = frozenset(
    {
        "sleep",
        "monotonic",
        "monotonic_ns",
        "perf_counter",
        "perf_counter_ns",
        "process_time",
        "time",
        "time_ns",
    }
)
_CLOCK_MODULES = frozenset({"time", "asyncio", "anyio", "trio"})


class _Finder(ast.NodeVisitor):
    """Collects ``(line, what)`` for every sleep or real clock read in a module."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str]] = []
        self.modules = set(_CLOCK_MODULES)  # and their aliases in this module

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name in _CLOCK_MODULES and alias.asname:
                self.modules.add(alias.asname)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module in _CLOCK_MODULES:
            for alias in node.names:
                if alias.name in _CLOCK_NAMES:
                    self.found.append((node.lineno, f"from {node.module} import {alias.name}"))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        value = node.value
        if isinstance(value, ast.Name) and value.id in self.modules and node.attr in _CLOCK_NAMES:
            self.found.append((node.lineno, f"{value.id}.{node.attr}"))
        elif node.attr == "sleep":  # whatever provides it
            self.found.append((node.lineno, f"{ast.unparse(node)}"))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "time"
            and not node.args
            and not (isinstance(func.value, ast.Name) and func.value.id in self.modules)
        ):  # an event loop's clock, `loop.time()`
            self.found.append((node.lineno, f"{ast.unparse(func)}()"))
        self.generic_visit(node)


def _offences(path: Path) -> list[tuple[int, str]]:
    finder = _Finder()
    finder.visit(ast.parse(path.read_text(), filename=str(path)))
    return sorted(finder.found)


def _modules() -> dict[str, Path]:
    return {
        p.relative_to(TESTS).as_posix(): p
        for p in sorted(TESTS.rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def test_no_test_sleeps_or_reads_the_real_clock_outside_the_real_process_modules() -> None:
    offenders = [
        f"tests/{name}:{line}: {what}"
        for name, path in _modules().items()
        if name not in REAL_TIME
        for line, what in _offences(path)
    ]
    assert not offenders, (
        "tests that sleep or read the real clock (drive a FakeClock and wait on events instead; "
        "code that runs real processes goes into a module of REAL_TIME):\n" + "\n".join(offenders)
    )


def test_the_real_time_modules_exist_and_need_it() -> None:
    modules = _modules()
    assert REAL_TIME <= modules.keys(), f"not found: {sorted(REAL_TIME - modules.keys())}"
    idle = sorted(name for name in REAL_TIME if not _offences(modules[name]))
    assert not idle, f"on the list but never sleep nor read the clock: {idle}"


def test_the_scan_finds_each_way_of_sleeping_and_reading_the_clock(tmp_path: Path) -> None:
    source = tmp_path / "test_example.py"
    source.write_text(
        "import asyncio\n"
        "import time as t\n"
        "from time import perf_counter\n"
        "async def f(loop, pause):\n"
        "    await asyncio.sleep(0)\n"
        "    t.sleep(0.1)\n"
        "    started = t.monotonic()\n"
        "    assert loop.time() - started < 1\n"
        "    await asyncio.to_thread(t.sleep, 1)\n"
        "    pause.sleep(1)\n"
        "    clock.now(); loop.run_until_complete(f); timeout_s = 1.0\n"
    )
    assert _offences(source) == [
        (3, "from time import perf_counter"),
        (5, "asyncio.sleep"),
        (6, "t.sleep"),
        (7, "t.monotonic"),
        (8, "loop.time()"),
        (9, "t.sleep"),
        (10, "pause.sleep"),
    ]
