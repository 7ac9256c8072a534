"""run_agent with scripted answers (``inputs=``) for an agent that waits for a person:
one input, two in turn, two at once, and a wait nobody scripted (ended at once, named)."""

from __future__ import annotations

import asyncio

import anyio
import pytest

import runrow
from runrow.testing import InputNotScripted, run_agent

pytestmark = pytest.mark.anyio


async def approving_agent(run: runrow.RunContext) -> None:
    answer = await run.wait_for_input("approve", {"question": f"send {run.content}?"})
    await run.write_message("sent" if answer else "not sent")


async def test_one_scripted_input_is_given_and_the_run_resumes_to_its_end(dsn: str, schema: str) -> None:
    for value, said in ((True, "sent"), (False, "not sent")):
        result = await run_agent(dsn, approving_agent, "mail", schema=schema, inputs={"approve": value})
        assert result.status == "completed", result.error
        assert result.transcript[-1].content == said
        assert result.payloads("input_requested")[0]["request"] == {"question": "send mail?"}
        assert [p["key"] for p in result.payloads("input_provided")] == ["approve"]
        assert result.event_types[-1] == "complete"


async def test_two_inputs_in_turn_are_each_given(dsn: str, schema: str) -> None:
    async def agent(run: runrow.RunContext) -> None:
        name = await run.wait_for_input("name", "who?")
        sure = await run.wait_for_input("confirm", f"send to {name}?")
        await run.write_message(f"{name}: {sure}")

    result = await run_agent(dsn, agent, "x", schema=schema, inputs={"confirm": "yes", "name": "bob"})
    assert result.status == "completed", result.error
    assert result.transcript[-1].content == "bob: yes"
    assert [p["key"] for p in result.payloads("input_requested")] == ["name", "confirm"]
    assert [p["key"] for p in result.payloads("input_provided")] == ["name", "confirm"]


async def test_two_inputs_waited_for_at_once_are_both_given(dsn: str, schema: str) -> None:
    async def agent(run: runrow.RunContext) -> None:
        got = await asyncio.gather(
            run.wait_for_input("approve:t1", {"tool": "t1"}),
            run.wait_for_input("approve:t2", {"tool": "t2"}),
        )
        await run.write_message(got)

    result = await run_agent(dsn, agent, "x", schema=schema, inputs={"approve:t1": True, "approve:t2": False})
    assert result.status == "completed", result.error
    assert result.transcript[-1].content == [True, False]
    assert sorted(p["key"] for p in result.payloads("input_provided")) == ["approve:t1", "approve:t2"]


async def test_a_wait_for_an_input_not_scripted_ends_run_agent_naming_it(dsn: str, schema: str) -> None:
    for inputs in (None, {"something_else": 1}):
        with anyio.fail_after(20), pytest.raises(InputNotScripted) as caught:  # not its 60 s timeout
            await run_agent(dsn, approving_agent, "mail", schema=schema, inputs=inputs, timeout=60)
        err = caught.value
        assert (err.key, err.request) == ("approve", {"question": "send mail?"})
        assert "waits for input 'approve'" in str(err) and "inputs={'approve': ...}" in str(err)
        assert err.result.status == "waiting" and err.result.event_types[-1] == "input_requested"


async def test_a_second_wait_not_scripted_is_named_after_the_first_is_given(dsn: str, schema: str) -> None:
    async def agent(run: runrow.RunContext) -> None:
        await run.wait_for_input("first", None)
        await run.wait_for_input("second", {"n": 2})

    with pytest.raises(InputNotScripted, match="waits for input 'second'") as caught:
        await run_agent(dsn, agent, "x", schema=schema, inputs={"first": 1})
    assert [p["key"] for p in caught.value.result.payloads("input_provided")] == ["first"]
