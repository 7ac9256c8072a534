"""run.changed(name): old runs keep the old path on replay, new runs take the new one."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

import runrow

from .helpers import is_terminal, rows, run_row, status_of, table, wait_for

pytestmark = pytest.mark.anyio

FAST = {"poll": 0.2, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.1}


async def _waiting(conn: psycopg.AsyncConnection, schema: str, run_id: uuid.UUID) -> bool:
    return await status_of(conn, schema, run_id) == "waiting"


async def _keys(conn: psycopg.AsyncConnection, schema: str, run_id: uuid.UUID) -> list[tuple[str, int]]:
    got = await rows(
        conn,
        sql.SQL("SELECT key, position FROM {} WHERE lineage_id = %s ORDER BY position").format(
            table(schema, "run_step")
        ),
        (run_id,),
    )
    return [(r[0], r[1]) for r in got]


async def test_an_old_run_replayed_by_new_code_keeps_the_old_path_and_a_new_run_the_new_one(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    calls: list[str] = []
    paths: list[tuple[uuid.UUID, int, str]] = []

    async def old(run: runrow.RunContext) -> None:
        await run.step("plan", calls.append, "plan")
        await run.wait_for_input("ok", "?")
        await run.step("old", calls.append, "old")

    async def new(run: runrow.RunContext) -> None:
        await run.step("plan", calls.append, "plan")
        path = "new" if await run.changed("send-v2") else "old"
        assert await run.changed("send-v2") == (path == "new")  # asked again: the same answer
        paths.append((run.run_id, run.resumes, path))
        await run.wait_for_input("ok", "?")
        await run.step(path, calls.append, path)

    before = await runrow.enqueue(dsn, schema=schema, conversation_id="c1", user_id="u", content="x")
    async with runrow.Dispatcher(dsn, old, schema=schema, **FAST):
        await wait_for(lambda: _waiting(conn, schema, before.id), what="the old run to park")
    # The deploy: new code resumes the run the old code parked, and takes a new one.
    after = await runrow.enqueue(dsn, schema=schema, conversation_id="c2", user_id="u", content="x")
    async with runrow.Dispatcher(dsn, new, schema=schema, **FAST):
        await wait_for(lambda: _waiting(conn, schema, after.id), what="the new run to park")
        await runrow.provide_input(dsn, before.id, "ok", True, schema=schema)
        await runrow.provide_input(dsn, after.id, "ok", True, schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, before.id), what="the old run to end")
        await wait_for(lambda: is_terminal(conn, schema, after.id), what="the new run to end")
    for run_id in (before.id, after.id):
        row = await run_row(conn, schema, run_id)
        assert row["status"] == "completed", row["error"]
    assert sorted(p for p in paths if p[0] == before.id) == [(before.id, 1, "old")]
    # The new run took the new path, and its replay after the wait took it again.
    assert sorted(p for p in paths if p[0] == after.id) == [(after.id, 0, "new"), (after.id, 1, "new")]
    assert sorted(calls) == ["new", "old", "plan", "plan"]  # every step ran once
    # The old run never recorded the marker (its steps keep their positions); the new one did.
    assert await _keys(conn, schema, before.id) == [("plan", 0), ("ok", 1), ("old", 2)]
    assert await _keys(conn, schema, after.id) == [("plan", 0), ("changed:send-v2", 1), ("ok", 2), ("new", 3)]


async def test_a_retry_past_the_marker_with_nothing_recorded_after_it_takes_the_new_path(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    seen: list[tuple[int, bool]] = []

    async def agent(run: runrow.RunContext) -> None:
        await run.step("plan", lambda: "plan")
        seen.append((run.attempt, await run.changed("x")))
        if run.attempt == 2:
            raise RuntimeError("fail after the marker")

    async def old(run: runrow.RunContext) -> None:
        await run.step("plan", lambda: "plan")
        raise RuntimeError("old code fails after its step")

    async with runrow.Dispatcher(dsn, old, schema=schema, **FAST):
        first = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
        await wait_for(lambda: is_terminal(conn, schema, first.id), what="the old attempt")
    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        # Nothing was recorded past the marker's place: the new path is safe to take.
        retry = await runrow.retry_run(dsn, first.id, schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, retry.id), what="the retry")
        again = await runrow.retry_run(dsn, retry.id, schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, again.id), what="the second retry")
    assert seen == [(2, True), (3, True)]
    assert (await run_row(conn, schema, again.id))["status"] == "completed"


async def test_changed_refuses_a_bad_name(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> None:
    errors: list[Any] = []

    async def agent(run: runrow.RunContext) -> None:
        for name in ("", 5, "x" * 200):
            try:
                await run.changed(name)  # type: ignore[arg-type]
            except runrow.InvalidInput as exc:
                errors.append(exc.field)

    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the run")
    assert errors == ["name", "name", "name"]
