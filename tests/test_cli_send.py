"""`runrow send CONVERSATION TEXT`: a turn from the shell; with --wait, its answer and an
exit status for how it ended. The command runs in a subprocess; a real Dispatcher in the
test's process runs the agent."""

from __future__ import annotations

import json
import subprocess
import uuid
from typing import Any

import anyio
import psycopg
import pytest

import runrow

from .helpers import status_of, wait_for
from .test_cli import cli

# The slow tier: the CLI, in processes of its own.
pytestmark = [pytest.mark.anyio, pytest.mark.slow]
QUICK = {"poll": 0.2, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.1}


async def _send(dsn: str, schema: str, *args: str) -> subprocess.CompletedProcess[str]:
    return await anyio.to_thread.run_sync(
        lambda: cli("send", *args, "--database-url", dsn, "--schema", schema, timeout=120)
    )


async def test_send_queues_a_turn_for_the_user_and_tenant_and_names_its_run(dsn: str, schema: str) -> None:
    out = await _send(dsn, schema, "conv-1", "hello there", "--user", "ann", "--tenant", "acme")
    assert (out.returncode, out.stderr) == (0, ""), out
    run_id = out.stdout.split()[2]
    assert out.stdout == (
        f"queued run {run_id} in conversation conv-1; follow it with: runrow runs tail {run_id}\n"
    )
    run = await runrow.get_run(dsn, run_id, schema=schema)
    assert (run.status, run.conversation_id, run.user_id, run.tenant_id) == (
        "queued",
        "conv-1",
        "ann",
        "acme",
    )
    (message,) = await runrow.transcript(dsn, "conv-1", schema=schema)
    assert (message.role, message.content) == ("user", "hello there")
    as_json = await _send(dsn, schema, "conv-2", "hi", "--json")
    listed = json.loads(as_json.stdout)
    assert (
        listed["status"] == "queued"
        and (await runrow.get_run(dsn, listed["id"], schema=schema)).user_id == "cli"
    )


async def test_send_names_a_bad_conversation_in_one_line(dsn: str, schema: str) -> None:
    out = await _send(dsn, schema, "", "hi")
    assert (out.returncode, out.stderr) == (2, "runrow: conversation_id: must not be empty\n")


async def test_send_wait_prints_the_streamed_answer_and_exits_0(dsn: str, schema: str) -> None:
    async def agent(run: runrow.RunContext) -> None:
        for word in ("Hello", ", ", run.content, "!"):
            await run.text(word)
            await run.flush()

    async with runrow.Dispatcher(dsn, agent, schema=schema, **QUICK):
        out = await _send(dsn, schema, "c", "ann", "--wait")
    assert (out.returncode, out.stdout, out.stderr) == (0, "Hello, ann!\n", ""), out


async def test_send_wait_prints_a_written_answer_when_nothing_streamed(dsn: str, schema: str) -> None:
    async def agent(run: runrow.RunContext) -> None:
        await run.write_message("the answer")
        await run.write_message({"table": [1, 2]})

    async with runrow.Dispatcher(dsn, agent, schema=schema, **QUICK):
        out = await _send(dsn, schema, "c", "q", "--wait")
    assert (out.returncode, out.stderr) == (0, ""), out
    assert out.stdout == 'the answer\n{"table": [1, 2]}\n'


async def test_send_wait_json_prints_the_run_then_its_events(dsn: str, schema: str) -> None:
    async def agent(run: runrow.RunContext) -> None:
        await run.text("ok")

    async with runrow.Dispatcher(dsn, agent, schema=schema, **QUICK):
        out = await _send(dsn, schema, "c", "q", "--wait", "--json")
    assert out.returncode == 0, out
    first, *lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert first["status"] == "queued"
    assert [e["type"] for e in lines][:2] == ["user_message_created", "run_queued"]
    assert lines[-1]["type"] == "complete" and lines[-1]["status"] == "completed"  # as runs tail --json


async def test_send_wait_exits_4_when_the_run_fails(dsn: str, schema: str) -> None:
    async def agent(run: runrow.RunContext) -> None:
        await run.text("partial ")
        raise ValueError("model down")

    async with runrow.Dispatcher(dsn, agent, schema=schema, **QUICK):
        out = await _send(dsn, schema, "c", "q", "--wait")
    assert out.returncode == 4, out
    assert out.stdout == "partial \n"
    (line,) = out.stderr.splitlines()
    assert line.startswith("runrow: run ") and line.endswith(" failed: ValueError: model down"), line


async def test_send_wait_exits_5_when_the_run_is_cancelled(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    async def agent(run: runrow.RunContext) -> None:
        await run.text("thinking")
        await run.flush()
        await anyio.sleep_forever()

    async def cancel_when_running(conversation: str) -> None:
        async def running() -> Any:
            runs = await runrow.list_runs(dsn, conversation_id=conversation, schema=schema)
            return runs and runs[0].status == "running" and runs[0]

        run = await wait_for(running, timeout=60, what="the run to start")
        await runrow.cancel_run(dsn, run.id, schema=schema)

    conversation = f"c-{uuid.uuid4().hex[:6]}"
    result: list[subprocess.CompletedProcess[str]] = []

    async def send() -> None:
        result.append(await _send(dsn, schema, conversation, "q", "--wait"))

    async with runrow.Dispatcher(dsn, agent, schema=schema, **QUICK), anyio.create_task_group() as tg:
        tg.start_soon(send)
        await cancel_when_running(conversation)
    (out,) = result
    assert out.returncode == 5, out
    assert out.stdout == "thinking\n"
    assert out.stderr.splitlines()[-1].endswith(" was cancelled"), out.stderr


async def test_send_wait_says_what_a_run_waits_for_and_exits_6_when_it_expires(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    async def agent(run: runrow.RunContext) -> None:
        await run.wait_for_input("approve", {"question": "send it?"}, timeout=1.0)

    async with runrow.Dispatcher(dsn, agent, schema=schema, **QUICK):
        out = await _send(dsn, schema, "c", "q", "--wait")
    assert out.returncode == 6, out
    asked, ended = out.stderr.splitlines()
    run_id = ended.split()[2]
    assert asked == (
        f'runrow: run {run_id} waits for input approve ({{"question": "send it?"}}); '
        f"answer it with: runrow runs input {run_id} approve VALUE"
    )
    assert ended.startswith(f"runrow: run {run_id} expired: input_expired: "), ended
    assert await status_of(conn, schema, run_id) == "expired"
