"""Deploys (#43): versions on runs and steps, the live worker registry, and draining a
version. On the session's server; the SIGKILLed worker is a real process (slow tier)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow
from runrow._engine.registry import agent_name
from runrow._engine.settings import _git_head, detect_version
from runrow._workers import list_workers, running_of_version, wait_version_drained
from runrow.cli import main

from . import manual
from .helpers import enqueue_turn, run_row, table, wait_for

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[1]


async def _noop(value: str) -> str:
    return value


async def approval(run: runrow.RunContext) -> None:
    """A step, a wait for a person, a step."""
    await run.step("before", _noop, "b")
    await run.wait_for_input("ok", {})
    await run.step("after", _noop, "a")
    await run.write_message("done")


async def steps_by_key(conn: psycopg.AsyncConnection, schema: str) -> dict[str, Any]:
    cur = await conn.execute(sql.SQL("SELECT key, version FROM {}").format(table(schema, "run_step")))
    return dict(await cur.fetchall())


def fast(**kw: Any) -> dict[str, Any]:
    return {"lease": 2.0, "heartbeat": 0.5, "grace": 1.0, "poll": 0.2, **kw}


# -- versions on runs ------------------------------------------------------------------


async def test_a_run_keeps_its_first_version_across_a_wait_and_its_steps_carry_their_workers(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    run = await enqueue_turn(dsn, schema, "c1")
    async with runrow.Dispatcher(dsn, approval, schema=schema, version="A", **fast()):
        await wait_for(lambda: _status(conn, schema, run.id, "waiting"), what="the run to park")
    assert (await run_row(conn, schema, run.id))["version"] == "A"
    await runrow.provide_input(dsn, run.id, "ok", True, schema=schema)
    async with runrow.Dispatcher(dsn, approval, schema=schema, version="B", **fast()):
        await wait_for(lambda: _status(conn, schema, run.id, "completed"), what="the resumed run to end")
    info = await runrow.get_run(dsn, run.id, schema=schema)
    assert (info.version, info.worker_version) == ("A", "B")  # started under A, finished by B
    assert await steps_by_key(conn, schema) == {"before": "A", "ok": None, "after": "B"}


async def _status(conn: psycopg.AsyncConnection, schema: str, run_id: Any, status: str) -> bool:
    return bool((await run_row(conn, schema, run_id))["status"] == status)


async def test_a_retry_keeps_the_version_its_turn_started_with(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    run = await enqueue_turn(dsn, schema, "c1")
    (row,) = await manual.claim(conn, schema, version="A")
    assert await manual.finalize(conn, schema, row["id"], row["claim_token"], "failed", row["last_seq"] + 1)
    retried = await runrow.retry_run(dsn, run.id, schema=schema)
    assert (await run_row(conn, schema, retried.id))["version"] == "A"  # before any claim
    (again,) = await manual.claim(conn, schema, version="B")
    assert again["id"] == retried.id
    after = await run_row(conn, schema, retried.id)
    assert (after["version"], after["worker_version"]) == ("A", "B")


async def test_the_default_version_is_the_environment_s_else_the_checkout_s(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RUNROW_VERSION", " 2026.1 ")
    assert detect_version() == "2026.1"
    monkeypatch.setenv("RUNROW_VERSION", "")
    assert detect_version() is None  # set but empty: unversioned on purpose
    monkeypatch.delenv("RUNROW_VERSION")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    monkeypatch.chdir(ROOT)
    assert detect_version() == (head.stdout.strip() or None)
    assert _git_head(str(tmp_path)) is None  # not a checkout: none, and no error
    with pytest.raises(runrow.ConfigurationError, match="version"):
        runrow.Dispatcher("postgresql://", approval, version="")


# -- the registry ----------------------------------------------------------------------


async def test_a_dispatcher_registers_beats_and_leaves_on_a_clean_stop(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    async with runrow.Dispatcher(dsn, approval, schema=schema, version="v7", concurrency=3, **fast()) as d:
        (w,) = await list_workers(dsn, schema=schema)
        assert (w.id, w.version, w.pid, w.concurrency, w.in_flight) == (d.worker_id, "v7", os.getpid(), 3, 0)
        assert w.agent == "tests.test_workers.approval" == agent_name(approval)
        first = w.heartbeat_at
        await enqueue_turn(dsn, schema, "c1")  # parks: in flight until then
        await wait_for(lambda: _beat_after(dsn, schema, first), what="a later heartbeat of the registry row")
        assert (await list_workers(dsn, schema=schema))[0].started_at == w.started_at
    assert await list_workers(dsn, schema=schema) == []


async def _beat_after(dsn: str, schema: str, first: Any) -> bool:
    (w,) = await list_workers(dsn, schema=schema)
    return bool(w.heartbeat_at > first)


async def test_the_reaper_removes_a_worker_past_its_lease_and_grace_and_no_sooner(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    async with runrow.Dispatcher(dsn, approval, schema=schema, version="new", **fast(poll=30.0)) as d:
        # A dead worker's row, as a SIGKILL leaves it: its lease lapsed 0.5 s ago.
        await conn.execute(
            sql.SQL(
                "INSERT INTO {} (id, host, pid, version, agent, concurrency, heartbeat_at, expires_at) "
                "VALUES ('dead', 'h', 1, 'old', 'a', 1, now() - interval '2.5 s', now() - interval '0.5 s')"
            ).format(table(schema, "worker"))
        )
        await d.reap()  # within grace (1 s): kept
        assert {w.id for w in await list_workers(dsn, schema=schema)} == {"dead", d.worker_id}
        await wait_for(lambda: _reaped(d, dsn, schema), timeout=5, what="the dead worker's removal")
        assert [w.id for w in await list_workers(dsn, schema=schema)] == [d.worker_id]


async def _reaped(d: runrow.Dispatcher, dsn: str, schema: str) -> bool:
    await d.reap()
    return "dead" not in {w.id for w in await list_workers(dsn, schema=schema)}


async def test_runrow_workers_lists_them(dsn: str, schema: str, capsys: pytest.CaptureFixture[str]) -> None:
    async with runrow.Dispatcher(dsn, approval, schema=schema, version="v9", **fast()) as d:
        assert (
            await anyio.to_thread.run_sync(main, ["workers", "--database-url", dsn, "--schema", schema]) == 0
        )
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["WORKER", "VERSION", "RUNS", "BEAT", "AGENT"]
    assert d.worker_id in out and " v9 " in out and "0/8" in out and "tests.test_workers.approval" in out


# -- draining a version ----------------------------------------------------------------


async def test_workers_wait_returns_once_no_run_of_the_version_is_running(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    await enqueue_turn(dsn, schema, "c1")
    await enqueue_turn(dsn, schema, "c2")
    (old,) = await manual.claim(conn, schema, version="old")
    await manual.claim(conn, schema, version="new")
    assert await running_of_version(dsn, "old", schema=schema) == 1
    args = ["workers", "wait", "--version", "old", "--database-url", dsn, "--schema", schema]
    # Bounded: the old run still runs, so it exits 7 once the timeout passes.
    assert await anyio.to_thread.run_sync(main, [*args, "--timeout", "0.3", "--interval", "0.05"]) == 7
    async with anyio.create_task_group() as tg:
        done: list[int] = []

        async def wait() -> None:
            done.append(
                await anyio.to_thread.run_sync(main, [*args, "--timeout", "20", "--interval", "0.05"])
            )

        tg.start_soon(wait)
        await anyio.sleep(0.3)
        assert done == []  # still waiting on the old run
        assert await manual.finalize(
            conn, schema, old["id"], old["claim_token"], "completed", old["last_seq"] + 1
        )
        await wait_for(lambda: done, what="workers wait to return")
    assert done == [0]
    assert await running_of_version(dsn, "new", schema=schema) == 1  # the new worker's run is not waited on
    assert await wait_version_drained(dsn, "never-deployed", timeout=1, schema=schema)


# -- a SIGKILLed worker process --------------------------------------------------------


@pytest.mark.slow
async def test_a_sigkilled_worker_leaves_the_registry_within_lease_and_grace(dsn: str, schema: str) -> None:
    lease, grace = 2.0, 1.0
    env = {**os.environ, "RUNROW_TEST_DSN": dsn, "RUNROW_TEST_SCHEMA": schema, "RUNROW_VERSION": "doomed"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.worker_proc",
            "hang_agent",
            "1",
            "2",
            str(lease),
            "0.5",
            str(grace),
            "0.5",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        (w,) = await list_workers(dsn, schema=schema)
        assert (w.version, w.pid) == ("doomed", proc.pid)
        # A live worker (and its reaper) beside it, with the same lease and grace.
        async with runrow.Dispatcher(
            dsn, approval, schema=schema, version="live", **fast(lease=lease, grace=grace, poll=0.25)
        ) as d:
            await wait_for(lambda: _ids(dsn, schema, {w.id, d.worker_id}), what="both registered")
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            killed_at = anyio.current_time()
            await wait_for(
                lambda: _ids(dsn, schema, {d.worker_id}), timeout=15, what="the dead worker's removal"
            )
            took = anyio.current_time() - killed_at
            # Not before its lease + grace could have lapsed (its last beat was at most
            # one heartbeat before the kill), and within them plus a reaper tick and slack.
            assert lease + grace - 0.5 - 0.3 <= took <= lease + grace + 0.25 + 5, took
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()  # (reaps it and closes its pipes)


async def _ids(dsn: str, schema: str, expected: set[str]) -> bool:
    return {w.id for w in await list_workers(dsn, schema=schema)} == expected
