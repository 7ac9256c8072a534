"""Durable steps: run.step() runs a call at most once per turn, and a retry replays it."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow

from .helpers import is_terminal, rows, run_row, table, wait_for

pytestmark = pytest.mark.anyio

FAST = {"poll": 0.5, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.2}

AgentFn = Callable[[runrow.RunContext], Awaitable[None]]


class Effects:
    """Side effects the test owns: one row per call that really ran (an in-memory list
    would do in one process; a table is what a real tool would write to)."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn, self.schema = dsn, schema

    async def create(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as c:
            await c.execute(
                sql.SQL("CREATE TABLE {} (id bigserial PRIMARY KEY, name text NOT NULL, run_id uuid)").format(
                    table(self.schema, "effect")
                )
            )

    async def do(self, name: str, run_id: uuid.UUID) -> dict[str, Any]:
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as c:
            cur = await c.execute(
                sql.SQL("INSERT INTO {} (name, run_id) VALUES (%s, %s) RETURNING id").format(
                    table(self.schema, "effect")
                ),
                (name, run_id),
            )
            row = await cur.fetchone()
            assert row is not None
            return {"effect": name, "id": row[0]}

    async def names(self, conn: psycopg.AsyncConnection) -> list[str]:
        got = await rows(
            conn, sql.SQL("SELECT name FROM {} ORDER BY id").format(table(self.schema, "effect"))
        )
        return [r[0] for r in got]


@pytest.fixture
async def effects(dsn: str, schema: str) -> Effects:
    e = Effects(dsn, schema)
    await e.create()
    return e


async def _turn(
    dsn: str, schema: str, agent: AgentFn, conn: psycopg.AsyncConnection, *, retries: int = 0
) -> list[Any]:
    """Runs one turn, then retries it by hand ``retries`` times; returns the runs' rows."""
    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="go")
        ids = [run.id]
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the first attempt")
        for _ in range(retries):
            again = await runrow.retry_run(dsn, ids[-1], schema=schema)
            ids.append(again.id)
            await wait_for(lambda a=again: is_terminal(conn, schema, a.id), what="the retry")
    return [await run_row(conn, schema, i) for i in ids]


async def _steps(conn: psycopg.AsyncConnection, schema: str) -> list[tuple[Any, ...]]:
    return await rows(
        conn,
        sql.SQL(
            "SELECT key, occurrence, position, status, result, error FROM {} ORDER BY lineage_id, position"
        ).format(table(schema, "run_step")),
    )


async def test_a_retry_replays_recorded_steps_without_running_them(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, effects: Effects
) -> None:
    seen: list[tuple[int, Any]] = []

    async def agent(run: runrow.RunContext) -> None:
        a = await run.step("charge", effects.do, "charge", run.run_id)
        b = await run.step("email", effects.do, "email", run.run_id)
        seen.append((run.attempt, (a, b)))
        if run.attempt == 1:
            raise RuntimeError("the model call after the tools failed")
        await run.write_message(f"charged {a['id']}, emailed {b['id']}")

    first, retry = await _turn(dsn, schema, agent, conn, retries=1)
    assert (first["status"], retry["status"]) == ("failed", "completed")
    assert (first["attempt"], retry["attempt"]) == (1, 2)
    assert (first["lineage_id"], retry["lineage_id"]) == (None, first["id"])
    assert await effects.names(conn) == ["charge", "email"]  # each ran once, in the first attempt
    assert seen[0][1] == seen[1][1]  # the retry got the very results the first attempt recorded
    steps = await _steps(conn, schema)
    assert [(s[0], s[1], s[2], s[3]) for s in steps] == [
        ("charge", 0, 0, "recorded"),
        ("email", 0, 1, "recorded"),
    ]
    info = await runrow.get_run(dsn, retry["id"], schema=schema)
    assert (info.attempt, info.lineage_id) == (2, first["id"])


async def test_steps_in_a_loop_share_a_key(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, effects: Effects
) -> None:
    results: list[list[int]] = []

    async def agent(run: runrow.RunContext) -> None:
        got = [(await run.step("tool", effects.do, f"tool-{i}", run.run_id))["id"] for i in range(5)]
        results.append(got)
        if run.attempt == 1:
            raise RuntimeError("fail after the loop")

    await _turn(dsn, schema, agent, conn, retries=1)
    assert await effects.names(conn) == [f"tool-{i}" for i in range(5)]
    assert results[0] == results[1]
    assert [(s[0], s[1], s[2]) for s in await _steps(conn, schema)] == [("tool", i, i) for i in range(5)]


async def test_a_step_that_raised_raises_the_same_error_on_replay(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, effects: Effects
) -> None:
    caught: list[tuple[type[BaseException], str]] = []

    async def refused(run_id: uuid.UUID) -> None:
        await effects.do("refused", run_id)
        raise PermissionError("card declined: insufficient funds")

    async def agent(run: runrow.RunContext) -> None:
        try:
            await run.step("charge", refused, run.run_id)
        except PermissionError as exc:
            caught.append((type(exc), str(exc)))
        if run.attempt == 1:
            raise RuntimeError("fail after the step")

    _, retry = await _turn(dsn, schema, agent, conn, retries=1)
    assert retry["status"] == "completed"
    assert caught == [(PermissionError, "card declined: insufficient funds")] * 2
    assert await effects.names(conn) == ["refused"]  # the replay raised without calling it
    (step,) = await _steps(conn, schema)
    assert step[3] == "failed" and step[5]["type"] == "PermissionError" and step[5]["module"] == "builtins"


class _Picky(Exception):
    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code}: {text}")


async def test_an_error_that_cannot_be_rebuilt_replays_as_step_failed(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    caught: list[BaseException] = []

    def picky() -> None:
        raise _Picky(418, "teapot")

    async def agent(run: runrow.RunContext) -> None:
        try:
            await run.step("brew", picky)
        except Exception as exc:
            caught.append(exc)
        if run.attempt == 1:
            raise RuntimeError("again")

    await _turn(dsn, schema, agent, conn, retries=1)
    first, replayed = caught
    assert isinstance(first, _Picky)
    assert isinstance(replayed, runrow.StepFailed)
    assert (replayed.type, str(replayed), replayed.key) == ("_Picky", "418: teapot", "brew")


async def test_a_retry_that_calls_steps_in_another_order_fails_with_step_mismatch(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, effects: Effects
) -> None:
    async def agent(run: runrow.RunContext) -> None:
        order = ["a", "b"] if run.attempt == 1 else ["b", "a"]  # not deterministic
        for name in order:
            await run.step(name, effects.do, name, run.run_id)
        if run.attempt == 1:
            raise RuntimeError("fail")

    _, retry = await _turn(dsn, schema, agent, conn, retries=1)
    assert retry["status"] == "failed" and retry["error"]["type"] == "StepMismatch"
    assert "step call 0 is 'b'" in retry["error"]["message"] and "'a'" in retry["error"]["message"]
    assert await effects.names(conn) == ["a", "b"]


async def test_an_uncertain_step_fails_the_retry_naming_it_and_an_idempotent_one_runs_again(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, effects: Effects
) -> None:
    """A step cut while it ran (a stop cancels it here; in production its worker dies) is
    begun and never recorded: a retry must not run it again unless it is idempotent."""
    hang: set[str] = {"lookup"}
    entered = [anyio.Event()]

    async def tool(name: str, run_id: uuid.UUID) -> dict[str, Any]:
        got = await effects.do(name, run_id)
        if name in hang:
            entered[0].set()
            await anyio.sleep_forever()
        return got

    async def agent(run: runrow.RunContext) -> None:
        await run.idempotent_step("lookup", tool, "lookup", run.run_id)
        await run.step("charge", tool, "charge", run.run_id)

    async def attempt(run_id: uuid.UUID | None) -> dict[str, Any]:
        entered[0] = anyio.Event()
        if run_id is None:
            run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="go")
        else:
            run = await runrow.retry_run(dsn, run_id, schema=schema)
        if hang:
            await entered[0].wait()
            await runrow.cancel_run(dsn, run.id, schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the attempt to end")
        return await run_row(conn, schema, run.id)

    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        first = await attempt(None)  # cut inside the idempotent lookup
        assert first["status"] == "cancelled"
        assert await _steps(conn, schema) == []  # an idempotent step is never marked begun
        hang.clear()
        hang.add("charge")
        second = await attempt(first["id"])  # lookup runs again; cut inside charge
        assert second["status"] == "cancelled"
        assert [(st[0], st[3]) for st in await _steps(conn, schema)] == [
            ("lookup", "recorded"),
            ("charge", "started"),
        ]
        hang.clear()
        third = await attempt(second["id"])
    assert third["status"] == "failed" and third["error"]["type"] == "StepUncertain"
    assert "'charge'" in third["error"]["message"], third["error"]
    # lookup ran twice (idempotent, cut before it was recorded); charge once, never again.
    assert await effects.names(conn) == ["lookup", "lookup", "charge"]


@pytest.mark.parametrize("idempotent", [False, True], ids=["step", "idempotent_step"])
async def test_step_writes_are_fenced_by_the_claim(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, effects: Effects, idempotent: bool
) -> None:
    """Once the claim is no longer this worker's, a step does not record, raises
    LeaseLost, and the agent is stopped."""
    outcome: list[BaseException] = []

    async def agent(run: runrow.RunContext) -> None:
        await conn.execute(
            sql.SQL("UPDATE {} SET claim_token = gen_random_uuid() WHERE id = %s").format(
                table(schema, "agent_run")
            ),
            (run.run_id,),
        )
        step = run.idempotent_step if idempotent else run.step
        try:
            await step("charge", effects.do, "charge", run.run_id)
        except runrow.LeaseLost as exc:
            outcome.append(exc)
            raise

    # A short lease and grace: the test waits for the reap, not for its timing.
    async with runrow.Dispatcher(dsn, agent, schema=schema, **{**FAST, "lease": 1.0, "grace": 0.5}):
        run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="go")
        await wait_for(lambda: outcome, what="the step to be refused")
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the reaper to end the run")
    # A step's begun-mark is refused before the call: it never runs. An idempotent step
    # is not marked begun, so it runs, but its record is refused all the same.
    assert await effects.names(conn) == (["charge"] if idempotent else [])
    assert await _steps(conn, schema) == []


@pytest.mark.parametrize(
    ("key", "fn", "problem"),
    [
        ("", len, "key: must not be empty"),
        ("k" * 201, len, "key: must be at most 200 characters"),
        ("k\x00", len, "key: must not contain NUL"),
        (7, len, "key: must be"),
        ("k", "not callable", "fn: must be callable"),
    ],
)
async def test_bad_step_arguments_are_refused_before_anything_runs(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, key: Any, fn: Any, problem: str
) -> None:
    errors: list[BaseException] = []

    async def agent(run: runrow.RunContext) -> None:
        try:
            await run.step(key, fn, "x")
        except runrow.InvalidInput as exc:
            errors.append(exc)

    (row,) = await _turn(dsn, schema, agent, conn)
    assert row["status"] == "completed"
    assert problem in str(errors[0])
    assert await _steps(conn, schema) == []


async def test_a_result_that_is_not_json_fails_the_step_and_replays_so(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    caught: list[BaseException] = []

    async def agent(run: runrow.RunContext) -> None:
        try:
            await run.step("odd", lambda: {1, 2})
        except runrow.RunrowError as exc:
            caught.append(exc)
        if run.attempt == 1:
            raise RuntimeError("again")

    await _turn(dsn, schema, agent, conn, retries=1)
    assert isinstance(caught[0], runrow.InvalidInput) and "JSON-serialisable" in str(caught[0])
    assert isinstance(caught[1], runrow.StepFailed) and str(caught[1]) == str(caught[0])


async def test_results_come_back_through_json_on_every_attempt(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    got: list[Any] = []

    async def agent(run: runrow.RunContext) -> None:
        got.append(await run.step("shape", lambda: {"pair": (1, 2), "none": None}))
        got.append(await run.step("null", lambda: None))
        # jsonb orders an object's keys and may change a number's type: the first
        # attempt must see what a replay will, not what the function returned.
        got.append(await run.step("order", lambda: {"zeta": 1, "a": 2, "bb": 3, "n": 1e16}))
        if run.attempt == 1:
            raise RuntimeError("again")

    await _turn(dsn, schema, agent, conn, retries=1)
    first, replayed = got[:3], got[3:]
    assert first[:2] == [{"pair": [1, 2], "none": None}, None]
    assert first == replayed
    assert list(first[2]) == list(replayed[2]) and type(first[2]["n"]) is type(replayed[2]["n"])


async def test_trim_removes_step_records_once_the_lineage_is_finished(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, effects: Effects
) -> None:
    async def agent(run: runrow.RunContext) -> None:
        await run.step("s", effects.do, "s", run.run_id)
        raise RuntimeError("always fails")

    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="go")
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="the run to fail")
    retry = await runrow.retry_run(dsn, run.id, schema=schema)  # queued: no worker now
    trimmed = await runrow.trim(dsn, schema=schema, retention=timedelta(0), erase_requests=True)
    assert trimmed.runs == 1
    assert len(await _steps(conn, schema)) == 1  # the queued retry still replays it
    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        await wait_for(lambda: is_terminal(conn, schema, retry.id), what="the retry to fail")
    assert await effects.names(conn) == ["s"]  # replayed, not run again
    await runrow.trim(dsn, schema=schema, retention=timedelta(0), erase_requests=True)
    assert await _steps(conn, schema) == []


async def test_the_schema_holds_the_step_invariants(schema: str, conn: psycopg.AsyncConnection) -> None:
    run = await runrow.enqueue(conn, schema=schema, conversation_id="c", user_id="u", content="x")
    insert = sql.SQL(
        "INSERT INTO {} (lineage_id, key, occurrence, position, run_id, status, idempotent, result, error, recorded_at)"
        " VALUES (%s, 'k', 0, 0, %s, %s, false, %s, %s, %s)"
    ).format(table(schema, "run_step"))
    bad = [
        ("recorded", None, None, "now"),  # recorded without a result
        ("started", psycopg.types.json.Jsonb(1), None, None),  # begun with a result
        ("failed", None, None, "now"),  # failed without an error
        ("done", None, None, None),  # no such status
    ]
    for status, result, error, at in bad:
        with pytest.raises(psycopg.errors.CheckViolation):
            async with conn.transaction():
                await conn.execute(insert, (run.id, run.id, status, result, error, at))
    with pytest.raises(psycopg.errors.CheckViolation):  # a first attempt has no lineage
        async with conn.transaction():
            await conn.execute(
                sql.SQL("UPDATE {} SET attempt = 2 WHERE id = %s").format(table(schema, "agent_run")),
                (run.id,),
            )


async def test_an_idempotent_step_that_raised_is_called_again_on_retry(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, effects: Effects
) -> None:
    """A failure of a call that is safe to repeat is not recorded: a retry may succeed."""

    async def flaky(run_id: uuid.UUID, attempt: int) -> dict[str, Any]:
        got = await effects.do("model", run_id)
        if attempt == 1:
            raise TimeoutError("the model timed out")
        return got

    async def agent(run: runrow.RunContext) -> None:
        await run.idempotent_step("model", flaky, run.run_id, run.attempt)

    first, retry = await _turn(dsn, schema, agent, conn, retries=1)
    assert (first["status"], first["error"]["type"], retry["status"]) == (
        "failed",
        "TimeoutError",
        "completed",
    )
    assert await effects.names(conn) == ["model", "model"]
    assert [(st[0], st[3]) for st in await _steps(conn, schema)] == [("model", "recorded")]


async def test_concurrent_steps_of_one_key_are_refused(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Two calls of one key at once would be numbered in arrival order, which a replay
    may not repeat: the second is refused; distinct keys run side by side."""
    outcome: list[Any] = []

    async def slow(name: str) -> str:
        await anyio.sleep(0.2)
        return name

    async def agent(run: runrow.RunContext) -> None:
        async with anyio.create_task_group() as tg:
            for key, name in (("tool", "a"), ("tool", "b"), ("other", "c")):

                async def call(key: str = key, name: str = name) -> None:
                    try:
                        outcome.append(await run.step(key, slow, name))
                    except runrow.InvalidInput as exc:
                        outcome.append(str(exc))

                tg.start_soon(call)

    (row,) = await _turn(dsn, schema, agent, conn)
    assert row["status"] == "completed"
    assert sorted(map(str, outcome)) == [
        "a",
        "c",
        "key: step 'tool' is already running in this turn; concurrent steps need keys of their own",
    ]


async def test_trim_keeps_the_steps_while_a_run_of_the_lineage_can_still_be_retried(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, effects: Effects
) -> None:
    """Attempt 1 is past retention, attempt 2 is not (it failed later): a retry of
    attempt 2 is still allowed, so the recorded steps must stay for it to replay."""

    async def agent(run: runrow.RunContext) -> None:
        await run.step("charge", effects.do, "charge", run.run_id)
        if run.attempt < 3:
            raise RuntimeError("fail")

    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        first = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="go")
        await wait_for(lambda: is_terminal(conn, schema, first.id), what="attempt 1")
        second = await runrow.retry_run(dsn, first.id, schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, second.id), what="attempt 2")
        # Attempt 1 finished long ago, attempt 2 just now: trim takes only attempt 1.
        await conn.execute(
            sql.SQL("UPDATE {} SET finished_at = finished_at - interval '2 days' WHERE id = %s").format(
                table(schema, "agent_run")
            ),
            (first.id,),
        )
        assert (
            await runrow.trim(dsn, schema=schema, retention=timedelta(days=1), erase_requests=True)
        ).runs == 1
        assert len(await _steps(conn, schema)) == 1
        third = await runrow.retry_run(dsn, second.id, schema=schema)
        await wait_for(lambda: is_terminal(conn, schema, third.id), what="attempt 3")
    assert (await run_row(conn, schema, third.id))["status"] == "completed"
    assert await effects.names(conn) == ["charge"]  # never charged again
