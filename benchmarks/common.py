"""What the benchmark scripts share: the machine, results files, variants to serve, servers.

Every ``bench_*.py`` script answers one question and imports its helpers from here (and from
:mod:`loadgen` for load generation, :mod:`measure` for the measurements several scripts share,
``trivial_app.py`` for the FastAPI ceiling); no script imports another.

- **Machine**: :func:`machine_info` (CPU, memory, versions, GPU), :func:`load_snapshot`,
  :func:`busy_note`.
- **Results**: a script keeps every figure of a run in one JSON-able dict and renders its pages
  from that dict alone with its ``render(results)`` function (a Markdown text, or
  ``{file name: text}`` for several pages). :func:`save_results` writes ``<name>.json`` and the
  pages; :func:`render_saved` (the scripts' ``--render JSON``) rewrites the pages from a saved
  JSON without running anything. The JSON records the script that wrote it (``script``), so
  ``tests/test_benchmarks.py`` checks that every page is what its script renders.
- **Variants to serve**: :class:`Plan`, :data:`FULL` and :data:`QUICK` (the default plan of
  ``gnnaas generate``, and the small one), :func:`prepare` and :func:`add_precomputed`.
- **Requests and servers**: :func:`test_nodes`, :func:`make_bodies`, :func:`serve_cmd`,
  :func:`trivial_cmd`, :func:`wait_idle`, :func:`variant_table` and :func:`predict_ms` (a
  server's variants and their profiled service curves), and per-process CPU and memory:
  :func:`proc_cpu_s`, :func:`tree_pids`, :func:`tree_pss_mb`.

Scripts run as ``python benchmarks/<script>.py``: Python puts ``benchmarks/`` first on
``sys.path``, so ``import common`` needs no path edit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as _dt
import importlib.util
import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from loadgen import ServerProcess

__all__ = [
    "FULL",
    "QUICK",
    "REPO",
    "RESULTS",
    "Plan",
    "Renderer",
    "add_precomputed",
    "busy_note",
    "command_line",
    "computed_only",
    "exit_status",
    "load_snapshot",
    "machine_info",
    "make_bodies",
    "pages_of",
    "predict_ms",
    "prepare",
    "proc_cpu_s",
    "render_saved",
    "save_results",
    "say",
    "serve_cmd",
    "shown",
    "test_nodes",
    "tree_pids",
    "tree_pss_mb",
    "trivial_cmd",
    "utc_now",
    "variant_table",
    "wait_idle",
    "write_text",
]

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"

Renderer = Callable[[dict[str, Any]], "str | Mapping[str, str]"]
"""``render(results)``: the Markdown page of a run, or ``{file name: text}`` for several."""


def exit_status(main: Callable[[], int | None]) -> int:
    """A benchmark script's exit status: ``main()``'s, or 1 with one line on stderr when gnnaas
    refuses an input (a :class:`~gnnaas.errors.GnnaasError`: a dataset without its data root, an
    unknown one), as the CLI reports it, so a wrong flag reads as a message and not as a
    traceback; 130 on Ctrl-C. Any other exception is a bug and keeps its traceback."""
    from gnnaas.errors import GnnaasError  # here: gpu_check puts this checkout on the path first

    try:
        return main() or 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except GnnaasError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def say(*parts: object) -> None:
    """Progress on stdout (a benchmark's only output besides its files)."""
    print(*parts, flush=True)


def check_cores(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exits with ``parser``'s one-line error when ``--server-cpus`` or ``--client-cpus`` name
    cores this process may not use."""
    usable = os.sched_getaffinity(0)
    for flag, cores in (("--server-cpus", args.server_cpus), ("--client-cpus", args.client_cpus)):
        if cores is not None and not set(cores) <= usable:
            parser.error(f"{flag}: cores {sorted(set(cores) - usable)} are not among this "
                         f"machine's usable cores {sorted(usable)}")  # fmt: skip


def shown(path: Path | str) -> str:
    """``path`` relative to the repository when inside it (results never name a machine's paths)."""
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return Path(path).name


def utc_now() -> str:
    """The time now, UTC, to the second (``2026-11-25T18:48:33Z``)."""
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def command_line(script: str, argv: Sequence[str] | None = None) -> str:
    """``python benchmarks/<script> <args>``: how to reproduce a run (``argv``: the script's
    arguments; default: this process's). An ``--out`` to an absolute folder is left out: it names
    a machine's path, and the page is reproduced where it is committed (the default folder)."""
    args = list(sys.argv[1:] if argv is None else argv)
    kept: list[str] = []
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
        elif arg == "--out" and i + 1 < len(args) and Path(args[i + 1]).is_absolute():
            skip = True
        elif not (arg.startswith("--out=") and Path(arg[len("--out=") :]).is_absolute()):
            kept.append(arg)
    return " ".join(["python", f"benchmarks/{script}", *map(shlex.quote, kept)])


# ----------------------------------------------------------------------------------------------
# machine


def gpu_words(machine: dict[str, Any], device: str) -> str:
    """``", served on NVIDIA H200 (139.8 GB)"`` for a run on a CUDA ``device``, else ``""``: the
    card a results page names next to the host."""
    if not device.startswith("cuda") or not machine.get("gpu"):
        return ""
    return f", served on {machine['gpu']} ({machine.get('gpu_mem_gb', '?')} GB)"


def _sh(cmd: Sequence[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _version(module: str) -> str | None:
    """``module.__version__`` when the module is installed (without importing it otherwise)."""
    if importlib.util.find_spec(module) is None:
        return None
    mod = __import__(module)
    return str(getattr(mod, "__version__", "?"))


def machine_info() -> dict[str, Any]:
    """CPU, cores, memory, Python and library versions, torch threads, CUDA and the GPU.

    Optional serving libraries (uvicorn, aiohttp) are reported when installed and ``None``
    otherwise, so a CUDA environment without them can describe itself too.
    """
    import torch

    cpu = platform.processor() or platform.machine() or "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_gb = math.nan
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gb = int(line.split()[1]) / 2**20
    info: dict[str, Any] = {
        "host": platform.node(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "mem_gb": round(mem_gb, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda,
        "gpu": None,
        "uvicorn": _version("uvicorn"),
        "uvicorn_loop": _uvicorn_impls(),
        "aiohttp": _version("aiohttp"),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_mem_gb"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    return info


def _uvicorn_impls() -> str:
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return f"{loop} + {http}"


def load_snapshot() -> dict[str, Any]:
    """Load average and the busiest processes right now."""
    top = _sh(["top", "-bn1", "-o", "%CPU"]).splitlines()
    procs = [line for line in top[7:12] if line.strip()]
    return {"uptime": _sh(["uptime"]), "load": os.getloadavg(), "top": procs}


def busy_note(before: Mapping[str, Any]) -> str:
    """Whether the machine was otherwise idle when a run started, from its
    :func:`load_snapshot`."""
    b = before["load"][0]
    cpu = []
    for line in before.get("top", [])[:3]:
        fields = line.split(None, 11)
        try:
            cpu.append((float(fields[8]), fields[-1]))
        except (IndexError, ValueError):
            continue
    busiest = max(cpu, default=(0.0, ""))
    if b < 1.0 and busiest[0] < 25.0:
        return (
            f"The machine was otherwise idle when the run started (1-min load {b:.2f}, "
            f"no process above {busiest[0]:.0f}% CPU)."
        )
    top = "; ".join(f"{name} {pct:.0f}%" for pct, name in cpu)
    return (
        f"**The machine was otherwise busy when the run started** (1-min load {b:.2f}; top: "
        f"{top}); figures are lower than on an idle machine."
    )


# ----------------------------------------------------------------------------------------------
# results


def write_text(path: Path, text: str) -> None:
    """Writes ``text`` to ``path`` through a temporary file and a rename (readers never see half
    a file; a failed write leaves the old one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o644)
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _script_of(render: Renderer) -> str:
    """The stem of the file that defines ``render`` (``bench_drift``), also when it runs as
    ``__main__``."""
    module = sys.modules.get(render.__module__)
    file = getattr(module, "__file__", None)
    return Path(file).stem if file else render.__module__


def pages_of(name: str, results: dict[str, Any], render: Renderer) -> dict[str, str]:
    """``{file name: text}`` of the pages ``render`` makes of ``results`` (a single page is
    ``<name>.md``)."""
    out = render(results)
    return {f"{name}.md": out} if isinstance(out, str) else dict(out)


def save_results(
    name: str, results: dict[str, Any], render: Renderer, out: Path = RESULTS
) -> list[Path]:
    """Writes ``<out>/<name>.json`` (every figure of the run) and the pages ``render`` makes of it.

    The pages are rendered before anything is written, so a renderer error leaves the previous
    files as they were; each file is replaced atomically. ``results`` gets ``script`` (the stem
    of the script whose ``render`` this is) unless it names one already.

    Returns:
        list[Path]: the JSON and the pages written.
    """
    results.setdefault("script", _script_of(render))
    text = json.dumps(results, indent=1, default=str) + "\n"
    pages = pages_of(name, json.loads(text), render)  # what --render will make of the JSON
    write_text(out / f"{name}.json", text)
    paths = [out / f"{name}.json"]
    for file, page in pages.items():
        write_text(out / file, page)
        paths.append(out / file)
    say("wrote " + ", ".join(shown(p) for p in paths))
    return paths


def render_saved(path: Path | str, render: Renderer) -> list[Path]:
    """Rewrites the pages of a saved ``<name>.json`` beside it, running nothing (``--render``)."""
    path = Path(path)
    pages = pages_of(path.stem, json.loads(path.read_text()), render)
    out = []
    for file, page in pages.items():
        write_text(path.parent / file, page)
        out.append(path.parent / file)
    say("wrote " + ", ".join(shown(p) for p in out))
    return out


# ----------------------------------------------------------------------------------------------
# variants to serve


@dataclass(frozen=True)
class Plan:
    """Which variants and profiles :func:`prepare` makes for a dataset.

    Args:
        dataset (str): the dataset (a preset name, ``@`` scale allowed).
        rankings (tuple[str, ...], optional): feature rankings. (default: the default plan's)
        epochs (int, optional): most training epochs of each variant. (default: ``200``)
        axes (tuple[str, ...], optional): variant axes. (default: all four)
        profile_runs (int, optional): timed profile runs per batch size. (default: ``30``)
        threads (int | None, optional): torch threads while profiling; the servers' own thread
            count, so curves are those of the served pipeline. (default: torch's)
    """

    dataset: str
    # The default plan of `gnnaas generate` (rankings, axes, epochs) unless a script says less.
    rankings: tuple[str, ...] = ("greedy", "lasso")
    epochs: int = 200
    axes: tuple[str, ...] = ("features", "width", "fanouts", "precision")
    profile_runs: int = 30
    threads: int | None = None


FULL = Plan(dataset="synth-flickr")
QUICK = Plan(
    dataset="synth-flickr@0.2", rankings=("greedy",), epochs=2, axes=("features",), profile_runs=5
)


def _profiles_for_threads(folder: Path, dataset: str, threads: int) -> Path:
    """``folder``, or ``<folder>-<threads>t`` when ``folder``'s curves of ``dataset`` were taken
    on another thread count (the one most of its rows name: a lookup's curve names its own)."""
    from gnnaas.errors import ArtifactError
    from gnnaas.profiling.table import read_service_times

    try:
        taken = read_service_times(folder / dataset)["threads"].mode()
    except (ArtifactError, KeyError):
        return folder  # nothing (readable) there yet: the plan's profiles go here
    if taken.empty or int(taken.iloc[0]) == threads:
        return folder
    other = folder.with_name(f"{folder.name}-{threads}t")
    say(
        f"prepare: the curves in {shown(folder / dataset)} were taken on {int(taken.iloc[0])} "
        f"torch threads, this plan profiles on {threads}: its profiles are in {shown(other)}"
    )
    return other


def prepare(
    plan: Plan, workdir: Path, device: str, profiles_name: str = "profiles"
) -> tuple[Path, Path]:
    """Variants and profiles of ``plan`` under ``workdir`` (reused when present).

    The library calls of ``gnnaas prepare`` with the plan's rankings and epochs (training every
    ranking of the full preset takes hours on 2 cores). ``profiles_name`` names the profiles'
    folder (another one keeps profiles taken under other settings, e.g. threads, beside); when
    its curves of the dataset were taken on another torch thread count than the plan profiles
    on, they are left as they are and the plan's go to ``<profiles_name>-<n>t`` (a server on
    ``n`` threads would otherwise re-time every curve at start-up, in a few runs each).

    Returns:
        tuple[Path, Path]: ``workdir/variants`` and the profiles' folder.
    """
    import torch

    from gnnaas.data import load_dataset
    from gnnaas.profiling.profiler import profile_dataset
    from gnnaas.profiling.table import has_profiles
    from gnnaas.variants.pipeline import generate_variants
    from gnnaas.variants.repository import VariantRepository
    from gnnaas.variants.training import TrainConfig

    if plan.threads:  # profile as the server will run
        torch.set_num_threads(plan.threads)
    variants = workdir / "variants"
    profiles = _profiles_for_threads(workdir / profiles_name, plan.dataset, torch.get_num_threads())
    say(
        f"prepare: {plan.dataset}, archs sage gin, rankings {' '.join(plan.rankings)}, "
        f"prune 1 2 4 8, axes {' '.join(plan.axes)}, max {plan.epochs} epochs, profile runs "
        f"{plan.profile_runs} -> {workdir}"
    )
    t0 = time.monotonic()
    tty = sys.stderr.isatty()
    store = load_dataset(plan.dataset)
    repo = VariantRepository(variants)
    generate_variants(
        store,
        repo,
        archs=("sage", "gin"),
        rankings=plan.rankings,
        prunes=(1, 2, 4, 8),
        config=TrainConfig(seed=0, max_epochs=plan.epochs),
        device=device,
        force=False,
        progress=tty,
        axes=plan.axes,
    )
    say(f"prepare: variants ready after {time.monotonic() - t0:.0f} s")
    # int8 variants run on the CPU only: a CUDA profile skips them, so they are not waited for
    servable = [m for m in repo.list(store.name) if device == "cpu" or m.precision != "int8"]
    if not has_profiles(profiles / store.name, servable):
        profile_dataset(
            store,
            repo,
            profiles,
            batch_size=1024,
            runs=plan.profile_runs,
            device=device,
            progress=tty,
        )
    say(f"prepare: done in {time.monotonic() - t0:.0f} s")
    return variants, profiles


DECISION_TOLERANCES = (0.0, 1.0, 2.0, 5.0)
"""The tolerances the decision benchmarks time (``bench_decision``, ``bench_decision_ab``)."""
DECISION_SIZES = (1, 64)
"""Their request sizes (nodes)."""


async def decision_router(variants: Path, profiles: Path, dataset: str, device: str) -> Any:
    """A started router on ``dataset``'s variants and profiles, in-process, as ``gnnaas serve``
    builds it (``VariantRegistry.load``, ``Router``; no warm-up), with the server's default
    settings (one torch thread, the inline threshold)."""
    from gnnaas.serving import Router, Settings, VariantRegistry

    settings = Settings(
        variants_dir=variants,
        profiles_dir=profiles,
        datasets=[dataset],
        warmup=False,
        device=device,
    )
    router = Router(VariantRegistry.load(settings), settings)
    await router.start()
    return router


async def decision_backlog(router: Any, ds: Any) -> tuple[list[Any], Any]:
    """A backlog of real requests on ``ds``'s slowest routed variant, one batch of it running
    once this returns (the event loop does not run while a timing loop does, so every decision
    timed then sees the same backlog): the requests' futures and the variant's lane. Only the
    router's public calls and a lane's batcher are read: it runs on older checkouts too."""
    import torch

    slowest = max(ds.candidates, key=lambda c: c.service.predict(64)).variant_id
    ids = torch.arange(min(ds.num_nodes, 64))
    backlog = [asyncio.ensure_future(router.predict(ds, ids, pinned=slowest)) for _ in range(40)]
    lane = router.lane(ds.name, slowest)
    for _ in range(1000):
        await asyncio.sleep(0)
        if lane.batcher.in_flight_since is not None and lane.batcher.queued_requests:
            break
    return backlog, lane


def time_decisions(
    router: Any, ds: Any, nodes: int, tol: float, n: int, rounds: int, *, path: bool = False
) -> tuple[list[float], int, str]:
    """One cell of the decision benchmarks: ``rounds`` timings (mean CPU µs of the deciding
    thread over ``n`` decisions, ``time.thread_time``), the function calls of one
    ``Router.select`` (``cProfile``'s count over ``n // 20``) and the variant it chose. Each
    decision gets the request's node ids as the predict route gives them (a precomputed
    variant's pick checks them); the stream's variant is put back after each round, so every
    round decides from the same state. ``path``: time ``Router._decide``, what
    ``Router.predict`` runs (``select`` wraps it), instead of ``Router.select``. Reads ``_last``
    on a checkout from before the router's generation (``bench_decision_ab`` times older
    ones)."""
    import cProfile
    import pstats

    import torch

    ids = torch.arange(min(nodes, ds.num_nodes))
    stream = router._last if hasattr(router, "_last") else router._gen.current
    kept = stream.get(ds.name)

    def put_back() -> None:
        if kept is None:
            stream.pop(ds.name, None)
        else:
            stream[ds.name] = kept

    select, decide = router.select, getattr(router, "_decide", None)
    timings = []
    for _ in range(rounds):
        start = time.thread_time()
        if path:
            for _ in range(n):
                decide(ds, nodes, tol, None, ids, None, "normal", None)
        else:
            for _ in range(n):
                select(ds, nodes, tolerance=tol, nodes=ids)
        timings.append((time.thread_time() - start) / n * 1e6)
        put_back()
    profiled = max(n // 20, 1)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(profiled):
        select(ds, nodes, tolerance=tol, nodes=ids)
    profile.disable()
    choice = select(ds, nodes, tolerance=tol, nodes=ids)[0].variant_id
    put_back()
    return timings, round(pstats.Stats(profile).total_calls / profiled), choice


def computed_only(variants: Path, dataset: str, workdir: Path) -> Path:
    """A variants folder of ``dataset``'s variants without the precomputed ones (links)."""
    from gnnaas.variants.manifest import EXACT_SUFFIX

    out = workdir / "deadlines-variants"
    shutil.rmtree(out, ignore_errors=True)
    (out / dataset).mkdir(parents=True)
    for entry in sorted((variants / dataset).iterdir()):
        if entry.is_dir() and not entry.name.endswith(EXACT_SUFFIX):
            (out / dataset / entry.name).symlink_to(entry.resolve(), target_is_directory=True)
    return out


def add_precomputed(
    dataset: str, variants_dir: Path, profiles_dir: Path, choice: str
) -> str | None:
    """Stores and profiles the precomputed variant of ``choice`` unless it is there; returns its
    id. ``best``: the 1× model (trained or distilled, fp32) whose *exact* pass is the most
    accurate on the validation nodes."""
    if choice == "none":
        return None
    folder = variants_dir / dataset
    if choice == "best":
        from gnnaas.data import load_dataset
        from gnnaas.variants.exact import exact_pass
        from gnnaas.variants.repository import VariantRepository

        repo = VariantRepository(variants_dir)
        # every 1× model whose exact pass differs: trained or distilled, fp32 (other fanouts
        # share their base's exact answers; int8 is a CPU serving form, not a model to tabulate)
        full = [
            m
            for m in repo.list(dataset)
            if m.prune == 1
            and m.precomputed is None
            and m.precision == "fp32"
            and m.axes["fanouts"] is None
        ]
        store = load_dataset(dataset, os.environ.get("GNNAAS_DATA"), seed=full[0].seed)
        scores = {
            m.variant_id: exact_pass(store, repo, m.variant_id).accuracy["val"]["exact"]
            for m in full
        }
        choice = max(scores, key=lambda v: scores[v])
        say(f"precompute: exact validation accuracy of the 1x models {scores}: {choice}")
    exact = f"{choice}@exact"
    base = [sys.executable, "-m", "gnnaas.cli", "-q"]
    where = ["--dataset", dataset, "--variants", str(variants_dir)]
    if not (folder / exact / "manifest.json").exists():
        say(f"precomputing {exact}")
        subprocess.run([*base, "precompute", *where, "--variant", choice], check=True)
    profiled = (profiles_dir / dataset / "profiles.csv").read_text()
    if f",{exact}," not in profiled:
        say(f"profiling {exact}")
        subprocess.run(
            [*base, "profile", *where, "--out", str(profiles_dir), "--only", exact],
            check=True,
            env={**os.environ, "GNNAAS_TORCH_THREADS": "1"},
        )
    return exact


# ----------------------------------------------------------------------------------------------
# requests and servers


def test_nodes(dataset: str, workdir: Path) -> np.ndarray:
    """The dataset's test node ids (cached in the workdir)."""
    import numpy as np

    path = workdir / f"{dataset.replace('@', '_at_')}.test_idx.npy"
    if path.exists():
        return np.load(path)
    from gnnaas.data import load_dataset

    store = load_dataset(dataset)
    idx = store.test_idx.numpy().astype(np.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, idx)
    return idx


def make_bodies(nodes: np.ndarray, size: int, count: int, seed: int) -> list[bytes]:
    """``count`` request bodies of ``size`` random nodes of ``nodes``: distinct while there
    are enough of them (the API allows duplicates, which a larger body then repeats)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        pick = rng.choice(nodes, size=size, replace=size > len(nodes))
        out.append(json.dumps({"nodes": [int(v) for v in pick]}).encode())
    return out


def serve_cmd(dataset: str, variants: Path, profiles: Path, port: int, device: str) -> list[str]:
    """``gnnaas serve`` of ``dataset`` on 127.0.0.1:``port``."""
    return [
        sys.executable,
        "-m",
        "gnnaas.cli",
        "serve",
        "--variants",
        str(variants),
        "--profiles",
        str(profiles),
        "--dataset",
        dataset,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        device,
    ]


def trivial_cmd(port: int) -> list[str]:
    """``benchmarks/trivial_app.py`` (the FastAPI + uvicorn ceiling) on 127.0.0.1:``port``."""
    return [sys.executable, str(REPO / "benchmarks" / "trivial_app.py"), "--port", str(port)]


def wait_idle(server: ServerProcess, dataset: str, timeout_s: float = 30.0) -> None:
    """Waits (bounded) until no variant has queued nodes, so steps do not overlap."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            listing = server.get_json(f"/v1/datasets/{dataset}/variants")
            if sum(v.get("queued_nodes", 0) for v in listing["variants"]) == 0:
                time.sleep(0.3)
                return
        except OSError:
            pass
        time.sleep(0.5)


def variant_table(server: ServerProcess, dataset: str) -> list[dict[str, Any]]:
    """Variants with profiled accuracy and service curve, from the server's own listing."""
    listing = server.get_json(f"/v1/datasets/{dataset}/variants")["variants"]
    out = []
    for v in listing:
        profile = v.get("profile") or {}
        curve = {int(p["batch_size"]): float(p["e2e_ms"]) for p in profile.get("service_times", [])}
        out.append(
            {
                "id": v["id"],
                "prune": v["prune"],
                "arch": v["arch"],
                "ranking": v["ranking"],
                "features_kept": v["features_kept"],
                "accuracy": v["accuracy"],
                "test_accuracy": v.get("test_accuracy"),
                "routable": v["routable"],
                "service_ms": curve,
            }
        )
    return out


def predict_ms(curve: Mapping[int, float], size: int) -> float:
    """Profiled service time at ``size`` nodes (linear interpolation, as the policy does)."""
    if not curve:
        return math.nan
    bs = sorted(curve)
    if size <= bs[0]:
        return curve[bs[0]]
    for b0, b1 in zip(bs, bs[1:], strict=False):
        if size <= b1:
            return curve[b0] + (curve[b1] - curve[b0]) * (size - b0) / (b1 - b0)
    if len(bs) == 1:
        return curve[bs[0]] * size / bs[0]
    b0, b1 = bs[-2], bs[-1]
    return curve[b1] + (curve[b1] - curve[b0]) * (size - b1) / (b1 - b0)


def proc_cpu_s(pid: int, task: int | None = None) -> float:
    """User + system CPU seconds of a process (all threads), or of its thread ``task``; NaN
    once it is gone."""
    path = f"/proc/{pid}/stat" if task is None else f"/proc/{pid}/task/{task}/stat"
    try:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return math.nan


def tree_pids(pid: int) -> list[int]:
    """A process and all its descendants (those alive now)."""
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
        pids.append(p)
    return pids


def tree_pss_mb(pid: int) -> float:
    """PSS (MB) of a process and all its descendants; shared pages counted once over them."""
    total_kb = 0
    for p in tree_pids(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total_kb += int(line.split()[1])
    return total_kb / 1024
