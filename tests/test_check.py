"""``runrow check module:agent``: replays waiting (and recently failed) runs against new
code without side effects, and reports which would hit a step mismatch, before a deploy."""

from __future__ import annotations

import contextlib
import io
import json
import uuid
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow
from runrow.cli import main

from .helpers import is_terminal, rows, status_of, table, wait_for

pytestmark = pytest.mark.anyio

FAST = {"poll": 0.2, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.1}
CALLS: list[str] = []  # every step fn that really ran (the check must run none)


def _do(name: str) -> str:
    CALLS.append(name)
    return name


async def deployed(run: runrow.RunContext) -> None:
    """The code that parked the runs: two steps, then a wait."""
    await run.text("checking. ")
    await run.step("lookup", _do, "lookup")
    await run.step("quote", _do, "quote")
    if run.content == "fail":
        raise RuntimeError("the model call failed")
    await run.wait_for_input("approve", {"kind": "approval"})
    await run.step("send", _do, "send")
    await run.write_message("sent")


async def unchanged(run: runrow.RunContext) -> None:
    """The same steps; only code after the wait changed (and a marker guards a new step)."""
    await run.text("checking. ")
    await run.step("lookup", _do, "lookup")
    if await run.changed("audit"):
        await run.step("audit", _do, "audit")
    await run.step("quote", _do, "quote")
    if run.content == "fail":
        raise RuntimeError("the model call failed")
    await run.wait_for_input("approve", {"kind": "approval"})
    await run.step("send-v2", _do, "send")
    await run.write_message("sent, v2")


async def reordered(run: runrow.RunContext) -> None:
    """Two steps swapped: a replay of a parked run would fail with StepMismatch."""
    await run.step("quote", _do, "quote")
    await run.step("lookup", _do, "lookup")
    await run.wait_for_input("approve", {"kind": "approval"})


async def _check(*argv: str) -> tuple[int, str]:
    """``runrow check`` in process (its own event loop, on a thread), and its output."""
    buf = io.StringIO()

    def call() -> int:
        with contextlib.redirect_stdout(buf):
            return main(["check", *argv])

    code = await anyio.to_thread.run_sync(call)
    return code, buf.getvalue()


async def _snapshot(conn: psycopg.AsyncConnection, schema: str) -> list[Any]:
    """Every row of the run, step, event and message tables, as text: what must not change."""
    out = []
    for name in ("agent_run", "run_step", "run_event", "message", "worker"):
        got = await rows(
            conn,
            sql.SQL(
                "SELECT count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM {} t"
            ).format(table(schema, name)),
        )
        out.append((name, *got[0]))
    return out


async def _park(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> tuple[uuid.UUID, uuid.UUID]:
    waiting = await runrow.enqueue(dsn, schema=schema, conversation_id="c1", user_id="u", content="go")
    failed = await runrow.enqueue(dsn, schema=schema, conversation_id="c2", user_id="u", content="fail")
    async with runrow.Dispatcher(dsn, deployed, schema=schema, **FAST):
        await wait_for(lambda: _is(conn, schema, waiting.id, "waiting"), what="the run to park")
        await wait_for(lambda: is_terminal(conn, schema, failed.id), what="the run to fail")
    return waiting.id, failed.id


async def _is(conn: psycopg.AsyncConnection, schema: str, run_id: uuid.UUID, status: str) -> bool:
    return await status_of(conn, schema, run_id) == status


async def test_check_finds_two_reordered_steps_and_passes_unchanged_code_changing_nothing(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    waiting, failed = await _park(dsn, schema, conn)
    CALLS.clear()
    before = await _snapshot(conn, schema)
    common = ["--database-url", dsn, "--schema", schema]

    code, text = await _check(f"{__name__}:unchanged", *common)
    assert code == 0, text
    assert str(waiting) in text and "ok" in text and str(failed) not in text

    code, text = await _check(f"{__name__}:reordered", *common, "--json")
    assert code == 8, text
    (report,) = [json.loads(line) for line in text.splitlines()]
    assert report["mismatches"] == 1
    (one,) = report["runs"]
    assert one["run_id"] == str(waiting) and one["status"] == "waiting" and not one["ok"]
    assert one["position"] == 0 and "'quote'" in one["problem"] and "'lookup'" in one["problem"]

    # --failed-since takes the recently failed runs too (a retry would replay them).
    code, text = await _check(f"{__name__}:reordered", *common, "--json", "--failed-since", "1h")
    assert code == 8
    report = json.loads(text)
    assert {r["run_id"] for r in report["runs"] if not r["ok"]} == {str(waiting), str(failed)}
    code, text = await _check(f"{__name__}:unchanged", *common, "--failed-since", "1h")
    assert code == 0 and str(failed) in text, text

    assert CALLS == []  # no step ran: each recorded step returned its record
    assert await _snapshot(conn, schema) == before  # the check changed nothing in the database


async def test_check_with_nothing_to_check_passes(dsn: str, schema: str) -> None:
    code, text = await _check(f"{__name__}:reordered", "--database-url", dsn, "--schema", schema)
    assert code == 0 and "no run" in text, text


async def reads_a_new_shape(run: runrow.RunContext) -> None:
    """Same steps, but the code after one expects another result shape: a resume raises."""
    looked = await run.step("lookup", _do, "lookup")
    looked["items"]  # (the recorded result is a string: TypeError)
    await run.step("quote", _do, "quote")
    await run.wait_for_input("approve", {"kind": "approval"})


async def test_check_reports_a_waiting_run_whose_replay_raises(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    waiting, _ = await _park(dsn, schema, conn)
    code, text = await _check(f"{__name__}:reads_a_new_shape", "--database-url", dsn, "--schema", schema)
    assert code == 8, text
    line = next(x for x in text.splitlines() if x.startswith(str(waiting)))
    assert "FAILS" in line and "TypeError" in line, line
