"""The ending writer's budget clock: one loop timer answers every ending whose budget ran
out (``_engine/ending_answer.py``). Pure loop logic: no server needed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from runrow._engine.ending_answer import Answer, BudgetClock

pytestmark = pytest.mark.anyio


def _answer(loop: asyncio.AbstractEventLoop, budget: float, told: dict[str, Any], name: str) -> Answer:
    return Answer(
        lambda recorded: told.__setitem__(name, recorded), loop.time() + budget, "completed", object()
    )  # type: ignore[arg-type]


async def test_the_clock_answers_each_ending_past_its_budget_and_no_other() -> None:
    loop = asyncio.get_running_loop()
    told: dict[str, Any] = {}
    expired: list[str] = []
    names: dict[int, str] = {}

    def expire(answer: Answer) -> None:
        expired.append(names[id(answer)])
        answer(False)

    clock = BudgetClock(expire)
    a = _answer(loop, 0.05, told, "a")
    b = _answer(loop, 0.06, told, "b")
    names.update({id(a): "a", id(b): "b"})
    clock.add(loop, a)
    clock.add(loop, b)
    a(True)  # landed in time: the head is answered, the one behind it is not
    await asyncio.sleep(0.15)
    assert expired == ["b"] and told == {"a": "completed", "b": None}

    # Added after the timer went idle: the clock arms again.
    c = _answer(loop, 0.03, told, "c")
    d = _answer(loop, 30.0, told, "d")
    names.update({id(c): "c", id(d): "d"})
    clock.add(loop, c)
    clock.add(loop, d)
    await asyncio.sleep(0.1)
    assert expired == ["b", "c"], "c's budget ran out; d's has not"
    d(True)
    assert expired == ["b", "c"] and told["d"] == "completed"


async def test_an_answered_ending_lets_go_of_its_run_and_callback() -> None:
    """The clock may hold an answered ending until it reaches the head: by then it must no
    longer keep the run (and its journal, its context) alive."""
    loop = asyncio.get_running_loop()
    answer = Answer(lambda recorded: None, loop.time() + 10, "completed", object())  # type: ignore[arg-type]
    BudgetClock(lambda a: None).add(loop, answer)
    answer(True)
    assert answer.run is None and answer.done is None
