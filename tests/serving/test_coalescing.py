"""The ingress's CoalescingCaller: one call per request at low load, one call per group under
load, every request its own answer or its call's error."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from gnnaas.serving.remote import Call, CoalescingCaller


class _Lost(Exception):
    pass


class _Gate:
    """A caller whose calls finish when the test says so; answers echo the request."""

    def __init__(self) -> None:
        self.calls: list[list[Call]] = []
        self.release: list[asyncio.Future[None]] = []
        self.fail: set[int] = set()  # indexes of calls that raise

    async def describe(self) -> str:
        return "dataset"

    async def _serve(self, calls: list[Call]) -> list[tuple[str, list[int], str]]:
        index = len(self.calls)
        self.calls.append(calls)
        gate = asyncio.get_running_loop().create_future()
        self.release.append(gate)
        await gate
        if index in self.fail:
            raise _Lost(f"call {index} lost")
        return [(variant, [n * 10 for n in nodes], output) for variant, nodes, output in calls]

    async def predict(self, variant_id: str, nodes: list[int], output: str):  # type: ignore[no-untyped-def]
        (answer,) = await self._serve([(variant_id, nodes, output)])
        return answer

    async def predict_many(self, calls: Sequence[Call]):  # type: ignore[no-untyped-def]
        return await self._serve(list(calls))


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_alone_at_low_load_grouped_under_load_each_its_own_answer() -> None:
    async def scenario() -> None:
        gate = _Gate()
        caller = CoalescingCaller(gate, max_in_flight=1)  # type: ignore[arg-type]
        first = asyncio.create_task(caller.predict("a", [1], "class"))
        await _settle()
        assert gate.calls == [[("a", [1], "class")]]  # went at once, alone
        rest = [
            asyncio.create_task(caller.predict(v, [n], "proba"))
            for v, n in (("b", 2), ("a", 3), ("b", 4))
        ]
        await _settle()
        assert len(gate.calls) == 1  # queued behind the call out
        gate.release[0].set_result(None)
        assert await first == ("a", [10], "class")
        await _settle()
        assert gate.calls[1] == [("b", [2], "proba"), ("a", [3], "proba"), ("b", [4], "proba")]
        gate.release[1].set_result(None)
        assert await asyncio.gather(*rest) == [
            ("b", [20], "proba"),
            ("a", [30], "proba"),
            ("b", [40], "proba"),
        ]
        assert (caller.calls_sent, caller.requests_sent) == (2, 4)

    asyncio.run(scenario())


def test_a_lost_call_fails_each_request_it_carried_and_no_other() -> None:
    async def scenario() -> None:
        gate = _Gate()
        caller = CoalescingCaller(gate, max_in_flight=1)  # type: ignore[arg-type]
        first = asyncio.create_task(caller.predict("a", [1], "class"))
        await _settle()
        grouped = [asyncio.create_task(caller.predict("a", [n], "class")) for n in (2, 3)]
        await _settle()
        gate.fail.add(1)
        gate.release[0].set_result(None)
        await first
        await _settle()
        later = asyncio.create_task(caller.predict("a", [4], "class"))
        await _settle()
        gate.release[1].set_result(None)
        for task in grouped:
            with pytest.raises(_Lost):
                await task
        await _settle()
        gate.release[2].set_result(None)
        assert await later == ("a", [40], "class")

    asyncio.run(scenario())


def test_a_request_given_up_while_queued_is_not_sent() -> None:
    async def scenario() -> None:
        gate = _Gate()
        caller = CoalescingCaller(gate, max_in_flight=1, max_calls=2)  # type: ignore[arg-type]
        first = asyncio.create_task(caller.predict("a", [1], "class"))
        await _settle()
        gone = asyncio.create_task(caller.predict("a", [2], "class"))
        kept = [asyncio.create_task(caller.predict("a", [n], "class")) for n in (3, 4, 5)]
        await _settle()
        gone.cancel()
        await _settle()
        gate.release[0].set_result(None)
        await first
        await _settle()
        # the cancelled request's slot is dropped; at most max_calls per call
        assert gate.calls[1] == [("a", [3], "class")]
        gate.release[1].set_result(None)
        await _settle()
        assert gate.calls[2] == [("a", [4], "class"), ("a", [5], "class")]
        gate.release[2].set_result(None)
        assert [a[1] for a in await asyncio.gather(*kept)] == [[30], [40], [50]]

    asyncio.run(scenario())


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="max_in_flight"):
        CoalescingCaller(_Gate(), max_in_flight=0)  # type: ignore[arg-type]
