"""Writes the docs' generated blocks: figures from the results JSON, rules from the constants.

Neither a measured figure nor a number of a rule is typed by hand in README.md or
docs/architecture.md: each such block sits between two markers,

    <!-- table: NAME -->
    ...
    <!-- end table: NAME -->

and this script rewrites what is between them, from ``benchmarks/results/*.json`` (the JSON the
benchmark scripts write; their pages are rendered from the same files) or from the code whose
constants apply the rule. ``--check`` only says which blocks differ and exits 1 if any does;
``tests/test_docs.py`` runs that check, so a rerun benchmark, or a changed constant, whose block
was not refreshed fails the suite.

Blocks:

- ``speedups`` (README): the speed a tolerance buys, the router's sustained rate over the full
  model's (``bench_policy.py``'s ``policy.json`` for synth-flickr@0.2, ``policy-Cora.json`` for
  Cora), and the share of the router's answers the precomputed variant gave;
- ``headers`` (README): the predict request headers, from
  :data:`gnnaas.serving.http.requests.HEADER_DOCS` (what OpenAPI shows);
- ``rule`` (README, docs/architecture.md): the tolerance rule and the choice among admissible
  variants, from :func:`gnnaas.policy.describe_rule` and :func:`gnnaas.policy.describe_selection`;
- ``knobs`` (README): every setting a server reads, with its variable, the ``gnnaas serve``
  option that sets it if any, its default and its meaning, from the settings classes
  (:func:`gnnaas.config.describe_settings`) and :data:`gnnaas.cli.serve.SERVE_OPTIONS`;
- ``metrics`` (README): every Prometheus metric of ``/metrics`` with its type, labels and
  meaning, from :data:`gnnaas.serving.core.metrics.METRICS`.

Example:
    python scripts/readme_tables.py            # rewrite the tables in README.md
    python scripts/readme_tables.py --check    # exit 1 when one is out of date
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gnnaas.stats import median

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
README = REPO / "README.md"
DOCS = (README, REPO / "docs" / "architecture.md")  # the files whose blocks are rewritten

# The policy runs the speed-up table reads, in the order of its rows: (graph, results file).
POLICY_RUNS = (("synth-flickr@0.2", "policy.json"), ("Cora", "policy-Cora.json"))


def _ratios(block: dict[str, Any], key: str, base: str) -> list[float]:
    """``key``'s sustained rate over ``base``'s, repeat by repeat."""
    return [
        rep[key]["rate_rps"] / rep[base]["rate_rps"]
        for rep in block["repeats"]
        if rep.get(base, {}).get("rate_rps", 0) > 0 and key in rep
    ]


def _share(block: dict[str, Any], key: str, variant: str | None) -> float | None:
    """The share of ``key``'s answers (all steps, all repeats) that ``variant`` gave."""
    if variant is None:
        return None
    served: dict[str, int] = {}
    for rep in block["repeats"]:
        for step in rep.get(key, {}).get("steps", []):
            for k, v in step["variants"].items():
                served[k] = served.get(k, 0) + v
    total = sum(served.values())
    return served.get(variant, 0) / total if total else None


def speedups() -> str:
    """Router / full model per graph, request size and tolerance, from the policy runs."""
    tolerances: list[float] = []
    rows = []
    for graph, file in POLICY_RUNS:
        path = RESULTS / file
        if not path.exists():
            continue
        results = json.loads(path.read_text())
        full, exact = results.get("full_model"), results.get("precomputed")
        if full is None:  # a run before the full model was pinned: nothing to compare with
            continue
        for size, block in results["sizes"].items():
            cells: dict[float, str] = {}
            shares: dict[float, float | None] = {}
            for pol in block["policies"]:
                tol = pol["tolerance"]
                if tol is None:
                    continue
                ratios = _ratios(block, pol["key"], f"pin:{full}")
                if not ratios:
                    continue
                if tol not in tolerances:
                    tolerances.append(tol)
                spread = f" ({min(ratios):.2f}–{max(ratios):.2f})" if len(ratios) > 1 else ""
                cells[tol] = f"**{median(ratios):.2f}×**{spread}"
                shares[tol] = _share(block, pol["key"], exact)
            bound = block.get("bound_ms")
            exact_cell = ", ".join(
                f"{t:g}: {100 * s:.0f}%" for t, s in shares.items() if s is not None and t in (1, 2)
            )
            rows.append((graph, int(size), bound, full, cells, exact, exact_cell))
    if not rows:
        return "_No policy run with a pinned full model yet: run `benchmarks/bench_policy.py`._"
    tolerances.sort()
    head = " | ".join(f"tolerance {t:g}" for t in tolerances)
    lines = [
        f"| graph | nodes per request (p99 bound) | full model | {head} | answered by the "
        "precomputed variant at tolerance 1, 2 |",
        "|---|---:|---|" + "---:|" * len(tolerances) + "---|",
    ]
    for graph, size, bound, full, cells, exact, exact_cell in rows:
        bound_text = f" (≤ {bound:g} ms)" if bound else ""
        values = " | ".join(cells.get(t, "–") for t in tolerances)
        share = f"`{exact}` {exact_cell}" if exact and exact_cell else "–"
        lines.append(f"| {graph} | {size}{bound_text} | `{full}` | {values} | {share} |")
    return "\n".join(lines)


def headers() -> str:
    """The predict request headers and what each means, as OpenAPI documents them."""
    from gnnaas.serving.http.requests import HEADER_DOCS

    rows = [f"| `{name}` | {text} |" for name, text in HEADER_DOCS.items()]
    return "\n".join(["| request header | meaning |", "| --- | --- |", *rows])


def rule() -> str:
    """The tolerance rule and the choice among admissible variants, with their constants."""
    from gnnaas.policy import describe_rule, describe_selection

    return f"{describe_rule()} {describe_selection()}"


# Settings the `gnnaas serve --workers` supervisor sets for its workers: plumbing, not knobs.
_PLUMBING = ("shared_store_dir", "supervisor_pid", "generation")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def knobs() -> str:
    """Every server setting: variable, ``gnnaas serve`` option, default, meaning; then the
    offline commands' own (``--threads``)."""
    from gnnaas.cli.serve import SERVE_OPTIONS
    from gnnaas.config import CommandSettings, SharedSettings, describe_settings
    from gnnaas.serving.core.settings import Settings

    lines = [
        "| setting | variable | `gnnaas serve` option | default | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    rows = [(d, SERVE_OPTIONS.get(d.name)) for d in describe_settings(Settings, _PLUMBING)]
    own = set(CommandSettings.model_fields) - set(SharedSettings.model_fields)
    rows += [(d, "`gnnaas --threads`") for d in describe_settings(CommandSettings) if d.name in own]
    for doc, option in rows:
        names = f"`{doc.variables[0]}`"  # the one the docs name (an older alias stays read)
        shown = option if option is None or option.startswith("`") else f"`{option}`"
        lines.append(
            f"| `{doc.name}` | {names} | {shown or '–'} | {_cell(doc.default)} | "
            f"{_cell(doc.meaning)} |"
        )
    return "\n".join(lines)


def metrics() -> str:
    """Every metric of ``/metrics``: name, type, labels, meaning."""
    from gnnaas.serving.core.metrics import METRICS

    lines = ["| metric | type | labels | meaning |", "| --- | --- | --- | --- |"]
    for doc in METRICS.values():
        labels = ", ".join(f"`{label}`" for label in doc.labels) or "–"
        lines.append(f"| `{doc.name}` | {doc.kind} | {labels} | {_cell(doc.meaning)} |")
    return "\n".join(lines)


TABLES: dict[str, Callable[[], str]] = {
    "speedups": speedups,
    "headers": headers,
    "rule": rule,
    "knobs": knobs,
    "metrics": metrics,
}


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- table: {re.escape(name)} -->\n)(.*?)(<!-- end table: {re.escape(name)} -->)",
        re.DOTALL,
    )


def refreshed(text: str) -> tuple[str, list[str]]:
    """``text`` with every table rewritten, and the names of those that changed."""
    changed = []
    for name, make in TABLES.items():
        pattern = _pattern(name)
        match = pattern.search(text)
        if match is None:
            continue
        table = make() + "\n"
        if match.group(2) != table:
            changed.append(name)
            text = text[: match.start(2)] + table + text[match.end(2) :]
    return text, changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a block is stale")
    args = parser.parse_args(argv)
    stale = []
    for path in DOCS:
        new, changed = refreshed(path.read_text())
        name = path.relative_to(REPO)
        stale += [f"{name}: {block}" for block in changed]
        if changed and not args.check:
            path.write_text(new)
            print(f"{name}: rewritten {', '.join(changed)}")
    if args.check and stale:
        print(
            f"out of date: {'; '.join(stale)}; run python scripts/readme_tables.py", file=sys.stderr
        )
        return 1
    if not stale:
        print("every block is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
