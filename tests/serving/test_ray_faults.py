"""A Ray replica killed under load: its in-flight requests get 503 with ``Retry-After`` (from
gnnaas's middleware in Serve's proxy), the rest keep answering 200, nothing hangs, and Ray brings
the replica back."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from serving_fakes import hanging_toy_registry_factory, toy_registry_factory
from test_app import PIN_FULL, SETTINGS, URL

from gnnaas.serving import Settings
from gnnaas.serving.deploy.proxy import LOST_DETAIL

REQUEST_TIMEOUT_S = 20.0  # the bound no request may wait past
THREADS = 3


@dataclass(frozen=True)
class _Answer:
    status: int
    retry_after: str | None
    body: str
    sent: float
    took_s: float


@pytest.fixture(scope="module")
def two_replicas(ray_serve: int) -> Iterator[str]:
    from gnnaas.serving.deploy import ray as ray_backend

    url = ray_backend.run_ray(
        Settings(**SETTINGS),
        replicas=2,
        port=ray_serve,
        datasets=["toy"],
        registry_factory=toy_registry_factory,
        replica_cpus=0.5,
    )
    try:
        yield url
    finally:
        ray_backend.delete_apps()


def _poll(cond: object, timeout_s: float, what: str) -> None:
    """Polls ``cond()`` until it holds, at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        pause.wait(0.05)


def test_killed_replica_is_restarted_and_only_its_requests_fail(two_replicas: str) -> None:
    from gnnaas.serving.deploy.ray import replica_pids

    before: dict[str, int] = {}

    def both_known() -> bool:
        before.update(replica_pids("toy"))
        return len(before) >= 2

    _poll(both_known, 30, "both replicas answering")
    answers: list[_Answer] = []
    lock = threading.Lock()
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(base_url=two_replicas, timeout=REQUEST_TIMEOUT_S) as client:
            for i in range(5000):  # bounded, whatever happens
                if stop.is_set():
                    return
                sent = time.monotonic()
                try:
                    r = client.post(URL, json={"nodes": [i % 100]})
                    answer = _Answer(
                        r.status_code,
                        r.headers.get("Retry-After"),
                        r.text,
                        sent,
                        r.elapsed.total_seconds(),
                    )
                except httpx.TimeoutException:
                    answer = _Answer(-1, None, "timeout", sent, time.monotonic() - sent)
                with lock:
                    answers.append(answer)

    threads = [threading.Thread(target=load) for _ in range(THREADS)]
    for t in threads:
        t.start()
    try:
        _poll(lambda: len(answers) >= 30, 60, "load started")
        victim_replica, victim = sorted(before.items())[0]
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        after: dict[str, int] = {}

        def back() -> bool:
            after.clear()
            after.update(replica_pids("toy", calls=8))
            return len(after) >= 2 and victim_replica not in after

        _poll(back, 90, "the killed replica replaced")
        back_at = time.monotonic()
        _poll(lambda: sum(a.sent > back_at for a in answers) >= 30, 60, "load after recovery")
    finally:
        stop.set()
        for t in threads:
            t.join(REQUEST_TIMEOUT_S + 5)
    assert not any(t.is_alive() for t in threads)
    assert victim not in after.values()
    codes = {a.status for a in answers}
    assert codes <= {200, 503}, codes  # no 500, no timeout (-1)
    for a in answers:
        if a.status == 503:
            assert a.retry_after is not None and int(a.retry_after) >= 1
            assert a.body.startswith('{"detail":') and "Traceback" not in a.body
        assert a.took_s < REQUEST_TIMEOUT_S
    assert any(a.status == 200 and a.sent > killed_at for a in answers)
    assert all(a.status == 200 for a in answers if a.sent > back_at + 5)


def test_request_in_flight_on_a_killed_replica_gets_503(ray_serve: int, tmp_path: Path) -> None:
    """Deterministic: the request is inside the model (its marker written) when its only replica
    is killed; Serve's proxy loses the call and gnnaas's middleware there answers 503 with
    ``Retry-After`` and a detail as soon as Ray reports the death; Ray brings a new replica up."""
    from gnnaas.serving.deploy import ray as ray_backend

    armed, marker = tmp_path / "armed", tmp_path / "in-flight"
    factory = functools.partial(hanging_toy_registry_factory, str(armed), str(marker), 60.0)
    url = ray_backend.run_ray(
        Settings(**SETTINGS),
        replicas=1,
        port=ray_serve,
        datasets=["toy"],
        registry_factory=factory,
        replica_cpus=0.5,
        name="hanging",
        route_prefix="/hanging",
    )
    try:
        pids = ray_backend.replica_pids("toy", "hanging", calls=2)
        armed.touch()  # after the replica's warm-up
        answers: list[httpx.Response | Exception] = []

        def send() -> None:
            with httpx.Client(base_url=url, timeout=REQUEST_TIMEOUT_S) as client:
                try:
                    answers.append(client.post(URL, json={"nodes": [3]}, headers=PIN_FULL))
                except httpx.HTTPError as exc:  # a timeout shows in the assertion below
                    answers.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        _poll(marker.exists, 30, "the request inside the model")
        killed = next(iter(pids.values()))
        os.kill(killed, signal.SIGKILL)
        killed_at = time.monotonic()
        sender.join(REQUEST_TIMEOUT_S + 5)
        took = time.monotonic() - killed_at
        after = ray_backend.replica_pids("toy", "hanging", calls=2)
    finally:
        ray_backend.delete_apps("hanging")
    assert not sender.is_alive() and len(answers) == 1
    answer = answers[0]
    assert isinstance(answer, httpx.Response), repr(answer)
    assert answer.status_code == 503, answer.text
    assert int(answer.headers["Retry-After"]) >= 1
    assert answer.json() == {"detail": LOST_DETAIL}
    assert took < REQUEST_TIMEOUT_S / 2  # on Ray's death notice, not a timeout
    assert after and killed not in after.values()
