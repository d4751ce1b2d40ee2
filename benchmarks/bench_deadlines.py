"""Under overload, do deadlines and priorities keep the important traffic fast?

One ``gnnaas serve`` on a free 127.0.0.1 port. First its *sustained rate* for single-node requests
at the benchmark's tolerance: the closed-loop throughput at which p99 reaches the deadline (20 ms),
without deadline or priority headers. Then open-loop Poisson traffic at ``--load`` (2×) that rate,
in three independent streams: 20 % ``high``, 40 % ``normal``, 40 % ``low`` priority. Two runs are
alternated ``--repeats`` times:

- **with headers**: every request carries ``X-Deadline-Ms: 20`` and its ``X-Priority``;
- **without**: the same streams with neither header (what a client without them gets).

Per stream the tables count answers 200 within the deadline (client clock: from the request's
scheduled send time to its answer), 200 late (more than the deadline plus 5 ms after it was
scheduled), 503 (refused at admission: no variant predicted in time, queue full or shed for a
higher priority), 504 (expired in the queue) and other outcomes; the client's own lag (how late it
sent) and CPU say whether the client kept up with the offered rate. *Goodput* is the answers 200
within their deadline per second, over the run.

The open-loop streams come from ``h2load`` (nghttp2's C load generator, :mod:`h2load`) when it
is installed (``--client h2load``, the default then): each stream at a constant rate per
connection from several processes with distinct bodies, a client that keeps up with single-node
requests at 2× on one core. Without it (or ``--client raw``/``aiohttp``) one Python client sends
a few thousand requests per second; ``--client-processes N`` spreads every stream over ``N``
client processes (each an independent share of each Poisson stream, started together), for a
machine with cores to spare beside the server. ``--server-cpus 0 --client-cpus 1`` keeps the
load generator off the server's core on a 2-core machine.

Writes ``deadlines.json`` and ``deadlines.md`` (``--render JSON`` rewrites the page from the JSON).

Example:
    python benchmarks/bench_deadlines.py --dataset synth-flickr@0.2
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from common import (
    RESULTS,
    Plan,
    busy_note,
    check_cores,
    command_line,
    computed_only,
    load_snapshot,
    machine_info,
    make_bodies,
    prepare,
    render_saved,
    save_results,
    say,
    serve_cmd,
    test_nodes,
    utc_now,
    wait_idle,
)
from h2load import INSTALL as H2LOAD_INSTALL
from h2load import available as h2load_available
from h2load import drive_h2load
from loadgen import ServerProcess, StepResult, StepSpec, drive, free_port
from measure import percentile, rate_at_bound

__all__ = ["main", "render"]

STREAMS = (("high", 0.2), ("normal", 0.4), ("low", 0.4))
_LATE_SLACK_MS = 5.0


def sustained_rate(
    url: str, bodies: list[bytes], headers: dict[str, str], args: argparse.Namespace
) -> dict[str, Any]:
    """Closed-loop steps at rising concurrency; the rate at which p99 reaches the deadline."""
    steps = []
    over = 0
    for concurrency in args.concurrency:
        spec = StepSpec(
            rate_rps=0.0,
            duration_s=args.step_s,
            max_requests=args.step_max_requests,
            concurrency=concurrency,
        )
        (result,) = drive(
            url,
            bodies,
            [(headers, spec)],
            processes=min(args.client_processes, concurrency),
            client=closed_loop_client(args.client),
        )
        step = {
            "concurrency": concurrency,
            "throughput_rps": result.throughput_rps,
            "p99_ms": result.percentile(99),
            "errors": result.error_share + result.rejected_share,
        }
        steps.append(step)
        say(
            f"sustained: c={concurrency} {step['throughput_rps']:.0f} req/s p99 "
            f"{step['p99_ms']:.1f} ms"
        )
        over = over + 1 if step["p99_ms"] > args.deadline_ms else 0
        if over >= 2:
            break
    return {"rate_rps": rate_at_bound(steps, args.deadline_ms), "steps": steps}


def closed_loop_client(client: str) -> str:
    """The client of the closed-loop steps: h2load sends open-loop load at a fixed rate, so the
    sustained rate is searched with the Python client ``raw`` then."""
    return "raw" if client == "h2load" else client


def _streams(
    url: str, bodies: list[bytes], base: dict[str, str], rate: float, args: argparse.Namespace,
    with_headers: bool, seed: int,
) -> dict[str, StepResult]:  # fmt: skip
    """The three priority streams at once, each its own Poisson process and connections (from
    ``--client-processes`` client processes, each a share of every stream)."""
    streams = []
    for i, (priority, share) in enumerate(args.streams):
        headers = dict(base)
        if with_headers:
            headers |= {"X-Deadline-Ms": f"{args.deadline_ms:g}", "X-Priority": priority}
        spec = StepSpec(
            rate_rps=rate * share,
            duration_s=args.duration_s,
            max_requests=int(rate * share * args.duration_s * 1.5) + 10,
            timeout_s=5.0,
            drain_s=5.0,
            seed=seed * 10 + i,
        )
        streams.append((headers, spec))
    if args.client == "h2load":
        done = drive_h2load(url, bodies, streams, bodies_per_stream=args.bodies_per_stream)
        return dict(zip((p for p, _ in args.streams), done, strict=True))
    done = drive(
        url,
        bodies,
        streams,
        processes=args.client_processes,
        client=args.client,
        connections=args.connections * args.client_processes,
    )
    return dict(zip((p for p, _ in args.streams), done, strict=True))


def outcome(result: StepResult, deadline_ms: float) -> dict[str, Any]:
    """What one stream got: shares of every outcome and its latencies (ms, client clock)."""
    sent = max(result.sent, 1)
    ok = result.status == 200
    lat = result.latency_ms
    within = ok & (lat <= deadline_ms)
    late = ok & (lat > deadline_ms + _LATE_SLACK_MS)
    ok_lat = lat[ok]
    # The server's own time of each 200 (Server-Timing total, from its arrival at the app) and
    # the rest of the client's latency: the sockets, the event loop before the app, the client.
    server = np.array([t.get("total", math.nan) for t in result.timings()])
    outside = ok_lat - server if server.size == ok_lat.size else np.array([])
    return {
        "sent": int(result.sent),
        "offered_rps": result.spec.rate_rps,
        "goodput_rps": float(within.sum()) / result.wall_s if result.wall_s > 0 else 0.0,
        "ok_within": float(within.sum()) / sent,
        "ok_late": float(late.sum()) / sent,
        "ok_late_count": int(late.sum()),
        "ok": float(ok.sum()) / sent,
        "shed_503": result.share(503),
        "expired_504": result.share(504),
        "other": 1.0 - float(ok.sum()) / sent - result.share(503) - result.share(504),
        "ok_p50_ms": percentile(ok_lat, 50),
        "ok_p99_ms": percentile(ok_lat, 99),
        "ok_max_ms": float(ok_lat.max()) if ok_lat.size else math.nan,
        "lag_p99_ms": percentile(result.lag_ms, 99),
        "server_p50_ms": percentile(server, 50),
        "server_p99_ms": percentile(server, 99),
        "outside_p50_ms": percentile(outside, 50),
        "outside_p99_ms": percentile(outside, 99),
        "client_cpu_s": result.client_cpu_s,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(args.workdir)
    before = load_snapshot()
    variants, profiles = prepare(Plan(dataset=args.dataset, threads=1), workdir, "cpu")
    if args.no_precomputed:
        variants = computed_only(variants, args.dataset, workdir)
    nodes = test_nodes(args.dataset, workdir)
    bodies = make_bodies(nodes, args.size, 2048, seed=3)
    port = free_port()
    results: dict[str, Any] = {
        "dataset": args.dataset,
        "date": utc_now(),
        "machine": machine_info(),
        "command": command_line("bench_deadlines.py", args.argv),
        "deadline_ms": args.deadline_ms,
        "tolerance": args.tolerance,
        "size": args.size,
        "precomputed": not args.no_precomputed,
        "load": args.load,
        "streams": [list(s) for s in args.streams],
        "client": args.client,
        "bodies_per_stream": args.bodies_per_stream,
        "client_processes": args.client_processes,
        "server_cpus": args.server_cpus,
        "client_cpus": args.client_cpus,
        "runs": [],
    }
    cmd = serve_cmd(args.dataset, variants, profiles, port, "cpu")
    env = {"GNNAAS_TORCH_THREADS": "1"}
    base = {"X-Accuracy-Tolerance": f"{args.tolerance:g}"}
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(
            ServerProcess(
                cmd, port, workdir / "deadlines-server.log", env=env, cpus=args.server_cpus
            )
        )
        if args.client_cpus is not None:  # this process and the client processes it spawns
            os.sched_setaffinity(0, args.client_cpus)
        url = f"{server.base_url}/v1/datasets/{args.dataset}/predict"
        wait_idle(server, args.dataset)
        if args.sustained_rps is None:
            sustained = sustained_rate(url, bodies, base, args)
        else:  # another run's, so that runs offer the same rates
            sustained = {"rate_rps": args.sustained_rps, "steps": [], "given": True}
        results["sustained"] = sustained
        rate = args.load * sustained["rate_rps"]
        results["offered_rps"] = rate
        say(f"sustained {sustained['rate_rps']:.0f} req/s; offering {rate:.0f} req/s")
        for r in range(args.repeats):
            order = (True, False) if r % 2 == 0 else (False, True)
            for with_headers in order:
                wait_idle(server, args.dataset)
                lag_before = loop_lag_buckets(server.base_url)
                streams = _streams(url, bodies, base, rate, args, with_headers, seed=r)
                row = {
                    "repeat": r + 1,
                    "headers": with_headers,
                    "streams": {p: outcome(s, args.deadline_ms) for p, s in streams.items()},
                    "loop_lag": lag_quantiles(lag_before, loop_lag_buckets(server.base_url)),
                }
                results["runs"].append(row)
                high = row["streams"]["high"]
                say(
                    f"repeat {r + 1} {'with' if with_headers else 'without'} headers: high "
                    f"{100 * high['ok_within']:.1f}% within {args.deadline_ms:g} ms, late 200s "
                    + str(sum(s["ok_late_count"] for s in row["streams"].values()))
                )
        with urllib.request.urlopen(f"{server.base_url}/metrics", timeout=10) as resp:
            metrics = resp.read().decode()
        results["admission_metrics"] = [
            line for line in metrics.splitlines() if line.startswith("gnnaas_admission_total")
        ]
    results["busy_note"] = busy_note(before)
    return results


_LAG_BUCKET = "gnnaas_event_loop_lag_seconds_bucket{le="


def loop_lag_buckets(base_url: str) -> dict[float, float]:
    """The server's event-loop lag histogram now: cumulative tick counts by upper bound (s)."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    buckets = {}
    for line in text.splitlines():
        if line.startswith(_LAG_BUCKET):
            bound, count = line[len(_LAG_BUCKET) :].split("}")
            buckets[float(bound.strip('"'))] = float(count)
    return buckets


def lag_quantiles(before: dict[float, float], after: dict[float, float]) -> dict[str, Any]:
    """The ticks between two readings of :func:`loop_lag_buckets`: how many, and the bucket
    bounds (ms) their median and 99th percentile fall under (``None`` without ticks)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    out: dict[str, Any] = {"ticks": int(total), "p50_ms": None, "p99_ms": None}
    if total:
        for name, q in (("p50_ms", 0.5), ("p99_ms", 0.99)):
            out[name] = next(b * 1e3 for b, c in zip(bounds, counts, strict=True) if c >= q * total)
    return out


def _pct(x: float) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f} %"


def _ms(x: float) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1f}"


def _clients(results: dict[str, Any]) -> str:
    n = results.get("client_processes", 1)
    if results.get("client") == "h2load":
        text = f"h2load, {results.get('bodies_per_stream', '?')} processes per stream"
    else:
        text = "one Python process" if n == 1 else f"{n} Python processes"
    server, client = results.get("server_cpus"), results.get("client_cpus")
    if client is not None:
        text += f" on core(s) {', '.join(map(str, client))}"
    if server is not None:
        text += f", the server on core(s) {', '.join(map(str, server))}"
    return text


def _size_text(results: dict[str, Any]) -> str:
    size = results.get("size", 1)
    text = "Single-node requests" if size == 1 else f"{size}-node requests"
    if results.get("precomputed", True) is False:
        text += " to a server without the precomputed variants (every answer computed)"
    return text


def render(results: dict[str, Any]) -> str:
    """The page of a run: the sustained rate, then per run and stream what each got."""
    lines = _intro(results)
    if results.get("busy_note"):
        lines += [results["busy_note"], ""]
    lines += _client_note(results)
    lines += _table(results)
    lines += _goals(results)
    if results.get("admission_metrics"):
        lines += ["", "Server counters at the end (`gnnaas_admission_total`):", "", "```"]
        lines += results["admission_metrics"]
        lines += ["```"]
    return "\n".join(lines) + "\n"


def _intro(results: dict[str, Any]) -> list[str]:
    """The page's title and what was run: machine, command, sustained and offered rates."""
    m = results["machine"]
    d = results["deadline_ms"]
    lines = [
        f"# Deadlines and priorities under overload ({results['dataset']})",
        "",
        f"Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, torch {m.get('torch', '?')}; "
        f"client ({_clients(results)}) and server on the same machine; server on one torch "
        "thread. Run "
        f"{results['date']}. Command: `{results['command']}`.",
        "",
        f"{_size_text(results)} at `X-Accuracy-Tolerance: {results['tolerance']:g}`. Sustained "
        + (
            "rate (given, measured by another run): "
            if results["sustained"].get("given")
            else "rate (closed loop"
            + (", the Python client" if results.get("client") == "h2load" else "")
            + f", p99 ≤ {d:g} ms, no deadline or priority headers): "
        )
        + f"**{results['sustained']['rate_rps']:,.0f} req/s**. Offered: {results['load']:g}× that, "
        + f"**{results['offered_rps']:,.0f} req/s** open loop in "
        + ("", "one ", "two ", "three ")[len(results["streams"])]
        + ("constant-rate" if results.get("client") == "h2load" else "Poisson")
        + (" streams " if len(results["streams"]) > 1 else " stream ")
        + ", ".join(f"{p} {100 * s:.0f} %" for p, s in results["streams"])
        + f". With headers every request carries `X-Deadline-Ms: {d:g}` and its `X-Priority`; "
        "without, neither. Latency on the client's clock, from each request's "
        + (
            "send (h2load logs no schedule)"
            if results.get("client") == "h2load"
            else "scheduled send time"
        )
        + f"; *late* = a 200 more than {d:g} + 5 ms after it was "
        + ("sent" if results.get("client") == "h2load" else "scheduled")
        + ". Of a 200's "
        "latency, *in the server* is its `Server-Timing` total (from its arrival at the app, "
        "where the deadline starts, to its answer) and *outside it* the rest (the client, the "
        "sockets and the event loop before the app).",
        "",
    ]
    return lines


def _client_note(results: dict[str, Any]) -> list[str]:
    """A warning when the load generator did not send on time, else nothing."""
    d = results["deadline_ms"]
    lines: list[str] = []
    lagging = [
        (row, max(s["lag_p99_ms"] for s in row["streams"].values()))
        for row in results["runs"]
        if max(s["lag_p99_ms"] for s in row["streams"].values()) > d
    ]
    if lagging:
        which = "; ".join(
            f"repeat {row['repeat']} {'with' if row['headers'] else 'without'} headers: "
            f"{lag:,.0f} ms"
            for row, lag in lagging
        )
        every = len(lagging) == len(results["runs"])
        cores = results["machine"].get("cores", "?")
        lines += [
            f"**The client did not keep up** in {'every run' if every else 'some runs'}: its "
            f"lag (how late it sent a request after the time scheduled) passed the deadline at "
            f"p99 ({which}). Latency is counted from the scheduled time and the server counts a "
            "deadline from a request's arrival, so in such a run the lateness is the load "
            "generator's as much as the server's and the goals are not measured: the offered "
            f"rate is beyond what the load generator ({_clients(results)}, {cores} cores on "
            "the machine) sends on time (a slower server, larger requests, or a client of more "
            "processes, `--client-processes`, on spare cores can).",
            "",
        ]
    return lines


def _table(results: dict[str, Any]) -> list[str]:
    """Per run and stream: what the requests got."""
    d = results["deadline_ms"]
    lines: list[str] = []
    lines += [
        "| repeat | headers | priority | sent | 200 within "
        f"{d:g} ms | 200 late | 503 shed | 504 expired | other | 200 p50 / p99 / max ms "
        "| in the server p50 / p99 ms | outside it p50 / p99 ms | client lag p99 ms |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---|---|---|---:|",
    ]
    for row in results["runs"]:
        for priority, s in row["streams"].items():
            lines.append(
                f"| {row['repeat']} | {'yes' if row['headers'] else 'no'} | {priority} | "
                f"{s['sent']:,} | {_pct(s['ok_within'])} | {s['ok_late_count']} | "
                f"{_pct(s['shed_503'])} | {_pct(s['expired_504'])} | {_pct(s['other'])} | "
                f"{_ms(s['ok_p50_ms'])} / {_ms(s['ok_p99_ms'])} / {_ms(s['ok_max_ms'])} | "
                f"{_ms(s.get('server_p50_ms'))} / {_ms(s.get('server_p99_ms'))} | "
                f"{_ms(s.get('outside_p50_ms'))} / {_ms(s.get('outside_p99_ms'))} | "
                f"{_ms(s['lag_p99_ms'])} |"
            )
    return lines


def _goals(results: dict[str, Any]) -> list[str]:
    """Per run with headers: each goal of the issue, measured."""
    d = results["deadline_ms"]
    lines: list[str] = []
    lines += ["", "## The goals, per run with headers", ""]
    for row in results["runs"]:
        if not row["headers"]:
            continue
        streams = row["streams"]
        high = streams["high"]
        late = sum(s["ok_late_count"] for s in streams.values())
        shed = {p: s["shed_503"] + s["expired_504"] for p, s in streams.items()}
        line = (
            f"- repeat {row['repeat']}: high answered 200 within {d:g} ms "
            f"**{_pct(high['ok_within'])}** (goal ≥ 99 %); 200 answers later than {d:g} + 5 ms: "
            f"**{late}** (goal 0); refused or expired: high {_pct(shed['high'])}, normal "
            f"{_pct(shed.get('normal'))}, low {_pct(shed.get('low'))} (goal: on low and normal)"
        )
        if all("goodput_rps" in s for s in streams.values()):  # runs before it: not measured
            goodput = sum(s["goodput_rps"] for s in streams.values())
            ratio = goodput / results["sustained"]["rate_rps"]
            line += f"; goodput **{goodput:,.0f} req/s** = {ratio:.2f} × the sustained rate "
            line += "(goal ≥ 0.5)"
        lag = row.get("loop_lag") or {}
        if lag.get("ticks"):
            line += (
                f"; the server's event loop ran {lag['ticks']:,} ticks, its lag p50 ≤ "
                f"{lag['p50_ms']:g} ms and p99 ≤ {lag['p99_ms']:g} ms (histogram bounds)"
            )
        lines.append(line + ".")
    return lines


def _parser() -> argparse.ArgumentParser:
    """The command line of this benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="synth-flickr@0.2")
    parser.add_argument("--workdir", default=".cache/bench", help="(default: .cache/bench)")
    parser.add_argument("--out", default=str(RESULTS), help="results folder")
    parser.add_argument("--deadline-ms", type=float, default=20.0)
    parser.add_argument("--tolerance", type=float, default=2.0)
    parser.add_argument("--size", type=int, default=1, help="nodes per request (default: 1)")
    parser.add_argument(
        "--no-precomputed",
        action="store_true",
        help="serve without the precomputed (@exact) variants: every answer computed",
    )
    parser.add_argument("--load", type=float, default=2.0, help="offered / sustained rate")
    parser.add_argument("--duration-s", type=float, default=8.0, help="seconds per run")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--step-s", type=float, default=3.0, help="closed-loop step seconds")
    parser.add_argument("--step-max-requests", type=int, default=30_000)
    parser.add_argument(
        "--client",
        choices=("h2load", "raw", "aiohttp"),
        default="h2load" if h2load_available() else "raw",
        help="the open-loop streams' load generator (default: h2load when installed, else raw; "
        f"to install it: {H2LOAD_INSTALL})",
    )
    parser.add_argument(
        "--bodies-per-stream",
        type=int,
        default=16,
        help="h2load: processes (each one distinct body) per stream (default: 16)",
    )
    parser.add_argument(
        "--connections", type=int, default=128, help="per stream and client process"
    )
    parser.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="client processes sharing the load (default: 1); one Python client sends a few "
        "thousand requests per second: a machine with spare cores needs several",
    )
    parser.add_argument(
        "--server-cpus",
        type=int,
        nargs="+",
        help="cores the server may use (default: all); with --client-cpus, a load generator "
        "that does not take the server's cores on a machine without a second one",
    )
    parser.add_argument(
        "--client-cpus", type=int, nargs="+", help="cores the load generator may use (default: all)"
    )
    parser.add_argument(
        "--name", default="deadlines", help="results file stem: <name>.md and <name>.json"
    )
    parser.add_argument(
        "--sustained-rps",
        type=float,
        help="the sustained rate to offer a multiple of, instead of measuring it (another run's)",
    )
    parser.add_argument(
        "--priorities",
        nargs="+",
        choices=[p for p, _ in STREAMS],
        default=[p for p, _ in STREAMS],
        help="the streams to send, each at its share of the offered rate (default: all; "
        "`--priorities high` offers the high stream alone: what no shedding can improve on)",
    )
    parser.add_argument("--render", metavar="JSON", help="only rewrite the page from a JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else None
    args.streams = [s for s in STREAMS if s[0] in args.priorities]
    check_cores(parser, args)
    if args.render:
        render_saved(args.render, render)
        return 0
    results = run(args)
    save_results(args.name, results, render, Path(args.out))
    return 0


if __name__ == "__main__":
    from common import exit_status

    raise SystemExit(exit_status(main))
