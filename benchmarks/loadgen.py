"""Open-loop Poisson load generator over aiohttp, and the server subprocess helper of the benches.

Open loop: arrival times are drawn up front (exponential gaps at the offered rate) and every
request is sent at its scheduled time whether or not earlier ones have answered, as independent
clients would. A request's latency is measured from its *scheduled* time, so a client that falls
behind shows up in the figures instead of hiding the server's queueing (no coordinated omission);
how far the client itself lagged is recorded too (``lag_p99_ms``) so a client-bound step can be
told apart.

Every step is bounded twice: at most ``max_requests`` arrivals and at most ``duration_s`` of
arrivals, then at most ``drain_s`` to collect the answers; whatever is still open is cancelled and
counted as a timeout. The targets are checked to be loopback addresses.

Example:
    >>> spec = StepSpec(rate_rps=100.0, duration_s=2.0, max_requests=200)
    >>> # result = asyncio.run(run_step("http://127.0.0.1:8000/ping", [b"{}"], {}, spec))
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import ipaddress
import json
import math
import multiprocessing
import os
import resource
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gnnaas import stats

__all__ = [
    "CLIENTS",
    "ServerProcess",
    "StepResult",
    "StepSpec",
    "Stream",
    "drive",
    "free_port",
    "parse_server_timing",
    "run_closed",
    "run_step",
]

_TIMEOUT = -1  # status recorded for a request that did not answer in time
_CLIENT_ERROR = -2  # connection refused/reset and similar


def _check_loopback(url: str) -> None:
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        ok = ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = host == "localhost"
    if not ok:
        raise ValueError(f"loadgen only targets the loopback address (got host {host!r} in {url})")


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse_server_timing(value: str | None) -> dict[str, float]:
    """``'queue;dur=0.1, sample;dur=0.52'`` -> ``{'queue': 0.1, 'sample': 0.52}`` (ms)."""
    out: dict[str, float] = {}
    if not value:
        return out
    for metric in value.split(","):
        parts = [p.strip() for p in metric.split(";")]
        if not parts[0]:
            continue
        for p in parts[1:]:
            if p.startswith("dur="):
                with contextlib.suppress(ValueError):
                    out[parts[0]] = float(p[4:].strip('"'))
    return out


@dataclass(frozen=True)
class StepSpec:
    """One load step.

    Args:
        rate_rps (float): offered rate (mean of the Poisson process), requests/s; ``0`` for a
            closed-loop step (see ``concurrency``).
        duration_s (float): arrivals stop after this long.
        max_requests (int): and after this many.
        drain_s (float, optional): how long to wait for answers after the last arrival.
            (default: ``10.0``)
        timeout_s (float, optional): per-request limit. (default: ``10.0``)
        seed (int, optional): seed of the arrival process and body choice. (default: ``0``)
        keep_bodies (bool, optional): keep the response bodies (parsed as JSON) of successful
            requests. (default: ``False``)
        concurrency (int, optional): closed loop only: requests kept in flight. (default: ``0``)
    """

    rate_rps: float
    duration_s: float
    max_requests: int
    drain_s: float = 10.0
    timeout_s: float = 10.0
    seed: int = 0
    keep_bodies: bool = False
    concurrency: int = 0


@dataclass
class StepResult:
    """What one step measured; per-request arrays are aligned."""

    spec: StepSpec
    sent: int
    wall_s: float  # first scheduled arrival -> last answer
    latency_ms: np.ndarray  # from scheduled time; inf for timeouts
    lag_ms: np.ndarray  # how late the client sent each request
    status: np.ndarray  # HTTP status, -1 timeout, -2 client error
    variant: list[str | None]
    server_timing: list[str | None]
    bodies: list[Any] = field(default_factory=list)
    client_cpu_s: float = math.nan  # CPU this (client) process used during the step
    served: Counter[str] | None = None  # answers per variant, when not read from each answer

    @property
    def ok(self) -> np.ndarray:
        """Mask of requests answered with 200."""
        return self.status == 200

    @property
    def throughput_rps(self) -> float:
        """Successful answers per second of the step's wall time."""
        return float(self.ok.sum()) / self.wall_s if self.wall_s > 0 else 0.0

    def share(self, status: int) -> float:
        """Share of the sent requests that ended with ``status``."""
        return float((self.status == status).sum()) / max(self.sent, 1)

    @property
    def rejected_share(self) -> float:
        """Share answered 503 (queue full)."""
        return self.share(503)

    @property
    def error_share(self) -> float:
        """Share neither 200 nor 503 (timeouts, 4xx/5xx, connection errors)."""
        return 1.0 - self.share(200) - self.share(503)

    def percentile(self, q: float) -> float:
        """Latency percentile (ms, :func:`gnnaas.stats.percentile`) over the requests not
        rejected; a timeout counts as infinite (a percentile that reaches one is infinite)."""
        lat = self.latency_ms[self.status != 503]
        if lat.size == 0:
            return math.nan
        return stats.percentile(lat, q)

    def slo_attainment(self, slo_ms: float) -> float:
        """Share of the sent requests answered 200 within ``slo_ms``."""
        return float((self.ok & (self.latency_ms <= slo_ms)).sum()) / max(self.sent, 1)

    def variants_served(self) -> Counter[str]:
        """How many successful answers each variant gave."""
        if self.served is not None:
            return Counter(self.served)
        ok = self.ok
        return Counter(v for v, good in zip(self.variant, ok, strict=True) if good and v)

    def timings(self) -> list[dict[str, float]]:
        """Parsed ``Server-Timing`` of the successful answers."""
        ok = self.ok
        return [
            parse_server_timing(t) for t, good in zip(self.server_timing, ok, strict=True) if good
        ]

    @classmethod
    def merged(cls, parts: Sequence[StepResult]) -> StepResult:
        """One result of several steps of the same kind (slices of one step run apart): their
        requests together over their summed wall time."""
        if not parts:
            raise ValueError("StepResult.merged needs at least one part")
        return cls(
            parts[0].spec,
            sum(r.sent for r in parts),
            sum(r.wall_s for r in parts),
            np.concatenate([r.latency_ms for r in parts]),
            np.concatenate([r.lag_ms for r in parts]),
            np.concatenate([r.status for r in parts]),
            [v for r in parts for v in r.variant],
            [t for r in parts for t in r.server_timing],
            [b for r in parts for b in r.bodies],
            sum(r.client_cpu_s for r in parts),
            sum((r.variants_served() for r in parts), Counter())
            if any(r.served is not None for r in parts)
            else None,
        )

    @classmethod
    def together(cls, parts: Sequence[StepResult], spec: StepSpec) -> StepResult:
        """One result of shares of one step run at the same time (:func:`drive` in several
        client processes): their requests together over the longest share's wall time, under
        the whole step's ``spec``."""
        if not parts:
            raise ValueError("StepResult.together needs at least one part")
        one = cls.merged(parts)
        one.spec = spec
        one.wall_s = max(r.wall_s for r in parts)
        return one

    def summary(self) -> dict[str, float]:
        """The headline figures of the step."""
        return {
            "offered_rps": self.spec.rate_rps,
            "sent": float(self.sent),
            "throughput_rps": self.throughput_rps,
            "p50_ms": self.percentile(50),
            "p95_ms": self.percentile(95),
            "p99_ms": self.percentile(99),
            "rejected": self.rejected_share,
            "errors": self.error_share,
            "lag_p99_ms": stats.percentile(self.lag_ms, 99) if self.sent else math.nan,
            "client_cpu_ms_per_request": 1e3 * self.client_cpu_s / max(self.sent, 1),
        }


def _self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _arrivals(spec: StepSpec) -> np.ndarray:
    rng = np.random.default_rng(spec.seed)
    expected = int(spec.rate_rps * spec.duration_s * 1.5) + 16
    gaps = rng.exponential(1.0 / spec.rate_rps, size=min(expected, spec.max_requests))
    times = np.cumsum(gaps)
    return times[times <= spec.duration_s][: spec.max_requests]


class _Reply:
    __slots__ = ("payload", "status", "timing", "variant")

    def __init__(self, status: int, variant: str | None, timing: str | None, payload: bytes):
        self.status, self.variant, self.timing, self.payload = status, variant, timing, payload


class _AiohttpSender:
    """POSTs through one ``aiohttp.ClientSession`` (keep-alive pool)."""

    def __init__(self, url: str, headers: Mapping[str, str], timeout_s: float, connections: int):
        import aiohttp

        self._aiohttp = aiohttp
        self.url = url
        self.headers = {"Content-Type": "application/json", **headers}
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections),
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            auto_decompress=False,
        )
        self.errors: tuple[type[BaseException], ...] = (aiohttp.ClientError, OSError)

    async def post(self, body: bytes) -> _Reply:
        async with self.session.post(self.url, data=body, headers=self.headers) as resp:
            payload = await resp.read()
            return _Reply(
                resp.status,
                resp.headers.get("X-Variant"),
                resp.headers.get("Server-Timing"),
                payload,
            )

    async def close(self) -> None:
        await self.session.close()


class _RawConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection that parses exactly what the bench needs."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[_Reply] | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("connection closed by the server"))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        fields: dict[str, str] = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        length = int(fields.get("content-length", "0"))
        if len(self.buf) < end + 4 + length:
            return
        payload = bytes(self.buf[end + 4 : end + 4 + length])
        del self.buf[: end + 4 + length]
        if fields.get("connection", "").lower() == "close":
            self.closed = True
        status = int(head[0].split(" ", 2)[1])
        waiter.set_result(
            _Reply(status, fields.get("x-variant"), fields.get("server-timing"), payload)
        )

    def send(self, data: bytes, loop: asyncio.AbstractEventLoop) -> asyncio.Future[_Reply]:
        assert self.transport is not None
        self.waiter = loop.create_future()
        self.transport.write(data)
        return self.waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class _RawSender:
    """POSTs over a pool of raw keep-alive connections: a fraction of aiohttp's CPU per request."""

    def __init__(self, url: str, headers: Mapping[str, str], timeout_s: float, connections: int):
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        lines = [
            f"POST {parts.path or '/'} HTTP/1.1",
            f"Host: {self.host}:{self.port}",
            "Content-Type: application/json",
            *(f"{k}: {v}" for k, v in headers.items()),
        ]
        self.prefix = ("\r\n".join(lines) + "\r\nContent-Length: ").encode("latin-1")
        self.timeout_s = timeout_s
        self.limit = connections
        self.idle: list[_RawConnection] = []
        self.open = 0
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.errors: tuple[type[BaseException], ...] = (OSError, ValueError, IndexError)
        self.all: list[_RawConnection] = []

    async def _acquire(self) -> _RawConnection:
        loop = asyncio.get_running_loop()
        while True:
            while self.idle:
                conn = self.idle.pop()
                if not conn.closed:
                    return conn
                self.open -= 1
            if self.open < self.limit:
                self.open += 1
                try:
                    _, conn = await loop.create_connection(_RawConnection, self.host, self.port)
                except BaseException:
                    self.open -= 1
                    raise
                self.all.append(conn)
                return conn
            wake: asyncio.Future[None] = loop.create_future()
            self.waiters.append(wake)
            await wake

    def _release(self, conn: _RawConnection, reusable: bool) -> None:
        if reusable and not conn.closed:
            self.idle.append(conn)
        else:
            conn.close()
            self.open -= 1
        while self.waiters:
            wake = self.waiters.popleft()
            if not wake.done():
                wake.set_result(None)
                break

    async def post(self, body: bytes) -> _Reply:
        conn = await self._acquire()
        ok = False
        try:
            data = self.prefix + str(len(body)).encode() + b"\r\n\r\n" + body
            fut = conn.send(data, asyncio.get_running_loop())
            async with asyncio.timeout(self.timeout_s):
                reply = await fut
            ok = True
            return reply
        finally:
            self._release(conn, ok)

    async def close(self) -> None:
        for conn in self.all:
            conn.close()
        for wake in self.waiters:
            if not wake.done():
                wake.cancel()


CLIENTS = ("aiohttp", "raw")


def _sender(
    client: str, url: str, headers: Mapping[str, str], timeout_s: float, connections: int
) -> _AiohttpSender | _RawSender:
    _check_loopback(url)
    if client == "aiohttp":
        return _AiohttpSender(url, headers, timeout_s, connections)
    if client == "raw":
        return _RawSender(url, headers, timeout_s, connections)
    raise ValueError(f"loadgen client must be one of {CLIENTS} (got {client!r})")


async def run_step(
    url: str,
    bodies: Sequence[bytes],
    headers: Mapping[str, str],
    spec: StepSpec,
    *,
    client: str = "aiohttp",
    connections: int = 256,
) -> StepResult:
    """Drives one open-loop step against ``url`` (POST each body in turn) and returns what it saw.

    Args:
        url (str): loopback URL to POST to.
        bodies (Sequence[bytes]): request bodies, chosen at random per request.
        headers (Mapping[str, str]): sent with every request.
        spec (StepSpec): rate and bounds.
        client (str, optional): ``aiohttp`` or ``raw`` (a minimal keep-alive HTTP/1.1 client).
            (default: ``"aiohttp"``)
        connections (int, optional): most connections open at once. (default: ``256``)
    """
    if not bodies:
        raise ValueError("run_step needs at least one request body")
    if spec.rate_rps <= 0 or spec.duration_s <= 0 or spec.max_requests < 1:
        raise ValueError(f"run_step needs a positive rate, duration and request count (got {spec})")
    arrivals = _arrivals(spec)
    n = int(arrivals.size)
    rng = np.random.default_rng(spec.seed + 1)
    choice = rng.integers(0, len(bodies), size=n)
    latency = np.full(n, math.inf)
    lag = np.zeros(n)
    status = np.full(n, _TIMEOUT, dtype=np.int64)
    variant: list[str | None] = [None] * n
    timing: list[str | None] = [None] * n
    kept: list[Any] = []
    last_done = [0.0]
    sender = _sender(client, url, headers, spec.timeout_s, connections)
    errors = sender.errors
    loop = asyncio.get_running_loop()
    clock = loop.time

    async def one(i: int, scheduled: float) -> None:
        lag[i] = (clock() - scheduled) * 1e3
        try:
            reply = await sender.post(bodies[choice[i]])
        except TimeoutError:
            status[i] = _TIMEOUT
            return
        except errors:
            status[i] = _CLIENT_ERROR
            return
        done = clock()
        status[i], variant[i], timing[i] = reply.status, reply.variant, reply.timing
        latency[i] = (done - scheduled) * 1e3
        last_done[0] = max(last_done[0], done)
        if spec.keep_bodies and reply.status == 200:
            kept.append(json.loads(reply.payload))

    tasks: list[asyncio.Task[None]] = []
    cpu0 = _self_cpu_s()
    start = clock() + 0.01
    try:
        for i in range(n):
            scheduled = start + float(arrivals[i])
            # Always yield: a client that falls behind must still read the answers it gets.
            await asyncio.sleep(max(scheduled - clock(), 0.0))
            tasks.append(asyncio.create_task(one(i, scheduled)))
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=spec.drain_s)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
    finally:
        for t in tasks:
            t.cancel()
        await sender.close()
    wall = (last_done[0] - start) if last_done[0] > 0 else spec.duration_s
    return StepResult(
        spec,
        n,
        max(wall, 1e-9),
        latency,
        lag,
        status,
        variant,
        timing,
        kept,
        client_cpu_s=_self_cpu_s() - cpu0,
    )


async def run_closed(
    url: str,
    bodies: Sequence[bytes],
    headers: Mapping[str, str],
    spec: StepSpec,
    *,
    client: str = "aiohttp",
) -> StepResult:
    """Closed loop: ``spec.concurrency`` clients each send their next request when the last one
    answers, until ``spec.duration_s`` or ``spec.max_requests``; measures saturation throughput.
    """
    if spec.concurrency < 1 or spec.duration_s <= 0 or spec.max_requests < 1:
        raise ValueError(f"run_closed needs concurrency, duration and max_requests > 0 ({spec})")
    n_max = spec.max_requests
    latency = np.full(n_max, math.inf)
    status = np.full(n_max, _TIMEOUT, dtype=np.int64)
    variant: list[str | None] = [None] * n_max
    timing: list[str | None] = [None] * n_max
    rng = np.random.default_rng(spec.seed)
    choice = rng.integers(0, len(bodies), size=n_max)
    counter = [0]
    sender = _sender(client, url, headers, spec.timeout_s, spec.concurrency)
    errors = sender.errors
    loop = asyncio.get_running_loop()
    clock = loop.time
    cpu0 = _self_cpu_s()
    start = clock()
    deadline = start + spec.duration_s
    last_done = [start]

    async def worker() -> None:
        while clock() < deadline and counter[0] < n_max:
            i = counter[0]
            counter[0] += 1
            sent = clock()
            try:
                reply = await sender.post(bodies[choice[i]])
            except TimeoutError:
                continue
            except errors:
                status[i] = _CLIENT_ERROR
                continue
            done = clock()
            status[i], variant[i], timing[i] = reply.status, reply.variant, reply.timing
            latency[i] = (done - sent) * 1e3
            last_done[0] = max(last_done[0], done)

    workers = [asyncio.create_task(worker()) for _ in range(spec.concurrency)]
    try:
        _, pending = await asyncio.wait(workers, timeout=spec.duration_s + spec.drain_s)
        for t in pending:
            t.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    finally:
        for t in workers:
            t.cancel()
        await sender.close()
    n = counter[0]
    return StepResult(
        spec,
        n,
        max(last_done[0] - start, 1e-9),
        latency[:n],
        np.zeros(n),
        status[:n],
        variant[:n],
        timing[:n],
        client_cpu_s=_self_cpu_s() - cpu0,
    )


Stream = tuple[Mapping[str, str], StepSpec]
"""One stream of a :func:`drive` call: its headers and its step (open loop when ``rate_rps`` is
positive, else closed loop at ``concurrency``)."""


def _share(spec: StepSpec, processes: int, k: int) -> StepSpec | None:
    """Process ``k``'s share of ``spec`` among ``processes``: an open-loop step at
    ``1/processes`` of the rate with its own seed (independent Poisson processes add up to the
    whole), a closed-loop step with its part of the clients (``None``: no client left for it)."""
    if spec.rate_rps > 0:
        return dataclasses.replace(
            spec,
            rate_rps=spec.rate_rps / processes,
            max_requests=max(1, math.ceil(spec.max_requests / processes)),
            seed=spec.seed * 1_000 + k,
        )
    clients = spec.concurrency // processes + (k < spec.concurrency % processes)
    if clients == 0:
        return None
    return dataclasses.replace(
        spec,
        concurrency=clients,
        max_requests=max(1, math.ceil(spec.max_requests * clients / spec.concurrency)),
        seed=spec.seed * 1_000 + k,
    )


async def _drive_here(
    url: str,
    bodies: Sequence[bytes],
    streams: Sequence[tuple[Mapping[str, str], StepSpec | None]],
    client: str,
    connections: int,
    start_at: float | None = None,
) -> list[StepResult | None]:
    if start_at is not None:  # shares in other processes start at the same moment
        await asyncio.sleep(max(start_at - time.time(), 0.0))

    async def one(headers: Mapping[str, str], spec: StepSpec | None) -> StepResult | None:
        if spec is None:
            return None
        if spec.rate_rps > 0:
            return await run_step(
                url, bodies, headers, spec, client=client, connections=connections
            )
        return await run_closed(url, bodies, headers, spec, client=client)

    return list(await asyncio.gather(*(one(h, s) for h, s in streams)))


def _drive_process(payload: tuple[Any, ...]) -> list[StepResult | None]:
    """A client process of :func:`drive` (spawned: imports nothing of its parent's state)."""
    return asyncio.run(_drive_here(*payload))


def drive(
    url: str,
    bodies: Sequence[bytes],
    streams: Sequence[Stream],
    *,
    processes: int = 1,
    client: str = "aiohttp",
    connections: int = 256,
    start_delay_s: float = 3.0,
) -> list[StepResult]:
    """Runs ``streams`` at the same time and returns one result per stream.

    With ``processes`` > 1 the load comes from that many client processes, each driving a share
    of every stream (:func:`_share`) from its own event loop, all starting at one moment
    ``start_delay_s`` from now (time to spawn): a Python client sends a few thousand requests
    per second per core, so a load above that needs several (a client that falls behind shows in
    ``lag_ms``). Each share opens ``connections / processes`` connections.

    Raises:
        ValueError: on ``processes`` < 1 or no stream.
    """
    if processes < 1 or not streams:
        raise ValueError(f"drive needs processes >= 1 and a stream (got {processes}, {streams})")
    if processes == 1:
        here = asyncio.run(_drive_here(url, bodies, streams, client, connections))
        return [r for r in here if r is not None]
    start_at = time.time() + start_delay_s
    payloads = [
        (
            url,
            list(bodies),
            [(dict(h), _share(spec, processes, k)) for h, spec in streams],
            client,
            max(1, connections // processes),
            start_at,
        )
        for k in range(processes)
    ]
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(processes, mp_context=context) as pool:
        parts = list(pool.map(_drive_process, payloads))
    out = []
    for j, (_, spec) in enumerate(streams):
        shares = [p[j] for p in parts if p[j] is not None]
        out.append(StepResult.together(shares, spec))
    return out


# ----------------------------------------------------------------------------------------------
# server subprocesses


class ServerProcess:
    """A server in a subprocess on 127.0.0.1, stopped with SIGINT (then SIGTERM, SIGKILL).

    Use as a context manager; the process is stopped in ``__exit__`` whatever happened.

    Args:
        argv (Sequence[str]): the command; must bind ``127.0.0.1:port``.
        port (int): its port.
        log_path (Path): stdout and stderr go here.
        env (Mapping[str, str], optional): extra environment variables. (default: ``None``)
        ready_path (str, optional): polled until it answers 200. (default: ``"/readyz"``)
        ready_timeout_s (float, optional): how long to wait for it. (default: ``600``)
        cpus (Collection[int], optional): the cores it may run on (its threads and children
            inherit them). (default: ``None``: the machine's)
    """

    def __init__(
        self,
        argv: Sequence[str],
        port: int,
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        ready_path: str = "/readyz",
        ready_timeout_s: float = 600.0,
        cpus: Collection[int] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.env = {**os.environ, **(env or {})}
        self.ready_path = ready_path
        self.ready_timeout_s = ready_timeout_s
        self.cpus = None if cpus is None else set(cpus)
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        finally:
            log.close()
        try:
            if self.cpus is not None:  # before the interpreter starts any thread
                os.sched_setaffinity(self.proc.pid, self.cpus)
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        """The server's process id."""
        if self.proc is None:
            raise RuntimeError("server not started")
        return self.proc.pid

    def get_json(self, path: str, timeout_s: float = 10.0) -> Any:
        """GET ``path`` and parse the JSON answer."""
        with urllib.request.urlopen(self.base_url + path, timeout=timeout_s) as resp:
            return json.loads(resp.read())

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(
                    f"server exited with code {self.proc.returncode} before it was ready; "
                    f"log {self.log_path}:\n{tail}"
                )
            try:
                with urllib.request.urlopen(self.base_url + self.ready_path, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.25)
        raise TimeoutError(
            f"server not ready after {self.ready_timeout_s:.0f} s; see {self.log_path}"
        )

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """Stops the server (SIGINT, then SIGTERM, then SIGKILL) and returns its exit code."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return None if proc is None else proc.returncode
        for sig, wait_s in ((signal.SIGINT, timeout_s), (signal.SIGTERM, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            try:
                return proc.wait(wait_s)
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        return proc.wait(5.0)
