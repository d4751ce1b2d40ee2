"""Runs the README's command blocks top to bottom and checks what they print.

Every fenced ```bash block of README.md runs, in order, in one bash process per block started in the
repository root (``.venv/bin`` first on ``PATH``, as after ``source .venv/bin/activate``), with the
same environment for all blocks (``GNNAAS_DATA`` the data root; scratch folders under a fresh
temporary directory: ``GNNAAS_HOME``, where imported graphs go, is one there, so a run leaves the
user's data home alone; the README's own commands write ``variants/`` and ``profiles/`` in the
clone, as they say). A block fails when it exits non-zero or when a text it quotes does not appear
in its output: a line ``# expect: TEXT`` inside a block names TEXT the block's output (stdout and
stderr) must contain, case-insensitively. A block preceded by ``<!-- readme-check: skip (why) -->``
is shown but not run (the test suite itself, say), and one preceded by ``<!-- readme-check: timeout
N -->`` may run N seconds (default 600).

Background servers a block starts (``... &``) are stopped when it ends: each block runs in its own
process group, killed with its children.

Usage:
    make readme-check                     # from a clone, after make install
    python scripts/readme_check.py --list # the blocks, without running them
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_FENCE = re.compile(r"^```(\w*)\s*$")
_MARK = re.compile(r"<!--\s*readme-check:\s*(skip|timeout)\s*(.*?)\s*-->")
_EXPECT = re.compile(r"^\s*#\s*expect:\s*(.+?)\s*$")


@dataclass
class Block:
    """One ```bash block of the README."""

    line: int
    text: str
    skip: str | None = None
    timeout_s: float = 600.0

    @property
    def expects(self) -> list[str]:
        return [m.group(1) for m in map(_EXPECT.match, self.text.splitlines()) if m]


def blocks(readme: Path) -> list[Block]:
    """The README's bash blocks with their markers."""
    out: list[Block] = []
    lines = readme.read_text(encoding="utf-8").splitlines()
    pending_skip: str | None = None
    pending_timeout: float | None = None
    i = 0
    while i < len(lines):
        mark = _MARK.search(lines[i])
        if mark:
            if mark.group(1) == "skip":
                pending_skip = mark.group(2) or "marked skip"
            else:
                pending_timeout = float(mark.group(2))
        fence = _FENCE.match(lines[i])
        if fence:
            start = i
            body = []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            if fence.group(1) == "bash":
                block = Block(start + 1, "\n".join(body), pending_skip)
                if pending_timeout is not None:
                    block.timeout_s = pending_timeout
                out.append(block)
            pending_skip, pending_timeout = None, None
        i += 1
    return out


def _stop_group(pgid: int, grace_s: float = 20.0) -> None:
    """Stops what a block left running (servers it started in the background): SIGTERM to its
    process group, then SIGKILL after ``grace_s``; returns once the group is gone, so the next
    block finds its port free."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def run_block(block: Block, env: dict[str, str]) -> tuple[bool, str, float]:
    """Runs one block; ``(ok, output, seconds)``.

    The output goes to a file, not a pipe: a server the block started in the background and did
    not stop (``kill %1`` signals only the job's first process without job control) would hold a
    pipe open, and the block would seem to run until its timeout. The block is done when its shell
    exits; what it left running is then stopped with its process group."""
    script = "set -e\n" + block.text + "\n"
    start = time.monotonic()
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(
            ["bash", "-c", script],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: background servers die with it
        )
        timed_out = False
        try:
            code = proc.wait(timeout=block.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code, timed_out = -1, True
        finally:
            _stop_group(proc.pid)
        log.seek(0)
        output = log.read()
    if timed_out:
        output += f"\n[readme-check: timed out after {block.timeout_s:.0f} s]"
    seconds = time.monotonic() - start
    missing = [e for e in block.expects if e.lower() not in output.lower()]
    if missing:
        output += "\n[readme-check: missing from the output: " + "; ".join(missing) + "]"
    return code == 0 and not missing, output, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--readme", default=str(REPO / "README.md"))
    parser.add_argument("--list", action="store_true", help="list the blocks, run nothing")
    parser.add_argument("--from-line", type=int, default=0, help="start at this README line")
    args = parser.parse_args(argv)
    found = blocks(Path(args.readme))
    if args.list:
        for b in found:
            state = f"skip ({b.skip})" if b.skip else f"run, {len(b.expects)} expectations"
            print(f"line {b.line}: {state}: {b.text.splitlines()[0] if b.text else ''}")
        return 0
    scratch = Path(tempfile.mkdtemp(prefix="gnnaas-readme-"))
    env = {
        **os.environ,
        "PATH": f"{REPO / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "GNNAAS_DATA": os.environ.get("GNNAAS_DATA", str(REPO.parent / "shared" / "data")),
        "GNNAAS_HOME": str(scratch / "home"),  # imported datasets: not the user's own home
    }
    failed = 0
    total = time.monotonic()
    for b in found:
        if b.line < args.from_line:
            continue
        if b.skip:
            print(f"- line {b.line}: skipped ({b.skip})", flush=True)
            continue
        ok, output, seconds = run_block(b, env)
        print(f"- line {b.line}: {'ok' if ok else 'FAILED'} in {seconds:.0f} s", flush=True)
        if not ok:
            failed += 1
            print("  " + "\n  ".join(output.splitlines()[-40:]), flush=True)
    print(
        f"readme-check: {len(found) - failed} of {len(found)} blocks ok "
        f"in {time.monotonic() - total:.0f} s (scratch {scratch})",
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
