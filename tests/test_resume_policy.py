"""Dispatcher(resume_policy=...): "replay" (any version resumes a run) or "same_version"
(only a worker of the run's version resumes a run with recorded steps; fresh turns go to
any worker), and stranded runs (a version no live worker serves) are reported."""

from __future__ import annotations

import contextlib
import io
import logging
import uuid

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow
from runrow._workers import stranded_runs
from runrow.cli import main

from .helpers import is_terminal, rows, run_row, status_of, table, wait_for

pytestmark = pytest.mark.anyio

FAST = {"poll": 0.2, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.1}


async def agent(run: runrow.RunContext) -> None:
    await run.step("plan", lambda: "plan")
    if run.content == "wait":
        await run.wait_for_input("ok", "?")
    if run.content == "fail" and run.attempt == 1:
        raise RuntimeError("fails once, after its step")
    await run.write_message("done")


async def _is(conn: psycopg.AsyncConnection, schema: str, run_id: uuid.UUID, status: str) -> bool:
    return await status_of(conn, schema, run_id) == status


async def _parked_under_a(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> tuple[uuid.UUID, uuid.UUID]:
    """A run parked by a worker of version A, then answered (queued again); and the retry
    of a run that failed under A after recording a step (queued)."""
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="parked", user_id="u", content="wait")
    failed = await runrow.enqueue(dsn, schema=schema, conversation_id="failed", user_id="u", content="fail")
    async with runrow.Dispatcher(dsn, agent, schema=schema, version="A", **FAST):
        await wait_for(lambda: _is(conn, schema, run.id, "waiting"), what="the run to park")
        await wait_for(lambda: is_terminal(conn, schema, failed.id), what="the first attempt to fail")
    await runrow.provide_input(dsn, run.id, "ok", True, schema=schema)
    retry = await runrow.retry_run(dsn, failed.id, schema=schema)
    return run.id, retry.id


async def test_a_run_parked_under_a_resumes_under_b_with_replay(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    parked, retry = await _parked_under_a(dsn, schema, conn)
    async with runrow.Dispatcher(dsn, agent, schema=schema, version="B", **FAST):  # (replay: the default)
        await wait_for(lambda: is_terminal(conn, schema, parked), what="the run to resume under B")
        await wait_for(lambda: is_terminal(conn, schema, retry), what="the retry to run under B")
    for run_id in (parked, retry):
        row = await run_row(conn, schema, run_id)
        assert (row["status"], row["version"], row["worker_version"]) == ("completed", "A", "B")


async def test_same_version_leaves_a_resumed_run_to_its_version_reports_it_and_takes_fresh_turns(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, caplog: pytest.LogCaptureFixture
) -> None:
    # (A retry whose lineage recorded steps under A is A's too; a fresh turn is anyone's.)
    parked, retry_id = await _parked_under_a(dsn, schema, conn)
    caplog.set_level(logging.WARNING, logger="runrow.dispatcher")
    b = runrow.Dispatcher(dsn, agent, schema=schema, version="B", resume_policy="same_version", **FAST)
    async with b:
        fresh = await runrow.enqueue(dsn, schema=schema, conversation_id="fresh", user_id="u", content="go")
        await wait_for(lambda: is_terminal(conn, schema, fresh.id), what="B to take the fresh turn")
        # Past the bound (lease + grace) with no live worker of A: reported, in the log and by the call.
        found = await wait_for(
            lambda: _stranded(dsn, schema, {parked, retry_id}), timeout=15, what="the stranded report"
        )
        assert {(r.version, r.status) for r in found} == {("A", "queued")}
        code, text = await _cli(
            "workers", "stranded", "--older-than", "3", "--database-url", dsn, "--schema", schema
        )
        assert code == 0 and str(parked) in text and str(retry_id) in text and "version A" in text, text
        await wait_for(lambda: "stranded" in caplog.text, what="the dispatcher's warning")
        assert await status_of(conn, schema, parked) == "queued"  # B never resumed it
        assert await status_of(conn, schema, retry_id) == "queued"
        async with runrow.Dispatcher(
            dsn, agent, schema=schema, version="A", resume_policy="same_version", **FAST
        ):
            await wait_for(lambda: is_terminal(conn, schema, parked), what="an A worker to resume it")
            await wait_for(lambda: is_terminal(conn, schema, retry_id), what="an A worker to retry it")
    assert "version A" in caplog.text
    for run_id, worker in ((fresh.id, "B"), (parked, "A"), (retry_id, "A")):
        row = await run_row(conn, schema, run_id)
        assert (row["status"], row["worker_version"]) == ("completed", worker)
    assert await stranded_runs(dsn, older_than=0, schema=schema) == []


async def _cli(*argv: str) -> tuple[int, str]:
    """The ``runrow`` command in process (its own event loop, on a thread), and its output."""
    buf = io.StringIO()

    def call() -> int:
        with contextlib.redirect_stdout(buf):
            return main(list(argv))

    return await anyio.to_thread.run_sync(call), buf.getvalue()


async def _stranded(dsn: str, schema: str, ids: set[uuid.UUID]) -> list[object] | None:
    found = await stranded_runs(dsn, older_than=3.0, schema=schema)
    return found if {r.id for r in found} == ids else None


async def test_resume_policy_is_checked() -> None:
    with pytest.raises(runrow.ConfigurationError, match="resume_policy"):
        runrow.Dispatcher("postgresql://", agent, resume_policy="newest")  # type: ignore[arg-type]


async def test_a_rolling_deploy_under_same_version_loses_and_doubles_nothing(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    ran: list[tuple[uuid.UUID, str, str]] = []  # (run, step, version that ran it): every real call

    def deployed(version: str) -> runrow.Agent:
        async def agent(run: runrow.RunContext) -> None:
            await run.step("a", lambda: ran.append((run.run_id, "a", version)))
            if str(run.content).startswith("wait"):
                await run.wait_for_input("ok", "?")
            await run.step("b", lambda: ran.append((run.run_id, "b", version)))
            await run.write_message(f"done by {version}")

        return agent

    opts = {**FAST, "concurrency": 4, "resume_policy": "same_version"}

    async def burst(tag: str, n: int) -> list[uuid.UUID]:
        ids = []
        for i in range(n):
            content = f"wait-{tag}" if i % 3 == 0 else tag
            run = await runrow.enqueue(
                dsn, schema=schema, conversation_id=f"{tag}-{i}", user_id="u", content=content
            )
            ids.append(run.id)
        return ids

    async def answer_all() -> None:
        for w in await runrow.waiting_inputs(dsn, schema=schema, limit=1000):
            await runrow.provide_input(dsn, w.run_id, w.key, True, schema=schema)

    async def all_done(ids: list[uuid.UUID]) -> bool:
        if not all([await is_terminal(conn, schema, i) for i in ids]):
            await answer_all()
            return False
        return True

    async def a_drained(ids: list[uuid.UUID]) -> bool:
        rows_ = [await run_row(conn, schema, i) for i in ids]
        if any(r["version"] is None or (r["version"] == "A" and r["finished_at"] is None) for r in rows_):
            await answer_all()
            return False
        return True

    async with runrow.Dispatcher(dsn, deployed("A"), schema=schema, version="A", **opts):
        old = await burst("old", 24)
        await wait_for(lambda: _count_waiting(conn, schema, 8), what="the old waits to park")
        async with runrow.Dispatcher(dsn, deployed("B"), schema=schema, version="B", **opts):
            new = await burst("new", 24)  # both versions claim fresh turns now
            # Drain A once every run has started and none of version A is left (a waiting
            # run of A's would be stranded: only an A worker may resume it).
            await wait_for(lambda: a_drained(old + new), timeout=60, what="the runs of A (resumed by A only)")
        # (A drains here; B goes on alone.)
        async with runrow.Dispatcher(dsn, deployed("B"), schema=schema, version="B", **opts):
            await wait_for(lambda: all_done(new), timeout=60, what="the new runs")
    for run_id in old + new:
        row = await run_row(conn, schema, run_id)
        assert row["status"] == "completed", (row["status"], row["error"])
        calls = [(step, v) for r, step, v in ran if r == run_id]
        assert sorted(s for s, _ in calls) == ["a", "b"], calls  # each step once: none lost, none doubled
        if row["resumes"]:
            # Resumed only by its own version: its steps ran under the version it started with.
            assert {v for _, v in calls} == {row["version"]}, (calls, row["version"])
    assert {r["version"] for r in [await run_row(conn, schema, i) for i in old]} == {"A"}


async def _count_waiting(conn: psycopg.AsyncConnection, schema: str, n: int) -> bool:
    got = await rows(
        conn, sql.SQL("SELECT count(*) FROM {} WHERE status = 'waiting'").format(table(schema, "agent_run"))
    )
    return bool(got[0][0] >= n)
