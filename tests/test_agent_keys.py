"""Agent keys (#41 point 3): a run names the agent that runs it (``enqueue(agent_key=)``),
a Dispatcher serves agents by key (``Dispatcher(agents={...})`` beside its default
``agent``) and claims only the runs it serves; a queued run no live worker serves is
reported, never silently stuck."""

from __future__ import annotations

import contextlib
import io
import json

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import runrow
import runrow.sync
from runrow._gateway.claims import _text_array
from runrow._workers import unserved_runs
from runrow.cli import main

from .helpers import is_terminal, run_row, wait_for

pytestmark = pytest.mark.anyio

FAST = {"poll": 0.2, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.1}


def _answering(name: str):  # type: ignore[no-untyped-def]
    async def agent(run: runrow.RunContext) -> None:
        await run.write_message(name)

    return agent


async def _answer(conn: psycopg.AsyncConnection, schema: str, run_id: object) -> object:
    cur = await conn.execute(
        f'SELECT content FROM "{schema}".message WHERE run_id = %s AND role = %s', (run_id, "assistant")
    )
    (row,) = await cur.fetchall()
    return row[0]


async def test_each_run_goes_to_the_agent_its_key_names(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    plain = await runrow.enqueue(dsn, schema=schema, conversation_id="c1", user_id="u", content="x")
    keyed = await runrow.enqueue(
        dsn, schema=schema, conversation_id="c2", user_id="u", content="x", agent_key="researcher"
    )
    assert (await runrow.get_run(dsn, keyed.id, schema=schema)).agent_key == "researcher"
    agents = {"researcher": _answering("researcher"), "critic": _answering("critic")}
    async with runrow.Dispatcher(dsn, _answering("default"), agents=agents, schema=schema, **FAST):
        for run in (plain, keyed):
            await wait_for(lambda run=run: is_terminal(conn, schema, run.id), what="the runs to end")
    assert (await run_row(conn, schema, plain.id))["status"] == "completed"
    assert await _answer(conn, schema, plain.id) == "default"
    assert await _answer(conn, schema, keyed.id) == "researcher"


async def test_a_worker_claims_only_the_keys_it_serves_and_the_rest_are_reported(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    plain = await runrow.enqueue(dsn, schema=schema, conversation_id="c1", user_id="u", content="x")
    keyed = await runrow.enqueue(
        dsn, schema=schema, conversation_id="c2", user_id="u", content="x", agent_key="critic"
    )
    # A worker of "critic" only: the default agent's run is not its to claim.
    async with runrow.Dispatcher(dsn, agents={"critic": _answering("critic")}, schema=schema, **FAST) as d:
        await wait_for(lambda: is_terminal(conn, schema, keyed.id), what="the critic's run to end")
        assert d.get_stats()["claimed"] == 1
        assert (await run_row(conn, schema, plain.id))["status"] == "queued"
        unserved = await unserved_runs(dsn, schema=schema)
        assert [(u.agent_key, u.runs) for u in unserved] == [("", 1)]
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            code = await _cli(["workers", "--database-url", dsn, "--schema", schema])
        assert code == 0
        assert "1 queued run(s) of agent (default) that no live worker serves" in stdout.getvalue()
        assert "[critic]" in stdout.getvalue()  # the worker's keys, after its agent's name
    # A default-only worker: a run of a key it does not serve waits for one that does.
    late = await runrow.enqueue(
        dsn, schema=schema, conversation_id="c3", user_id="u", content="x", agent_key="nobody"
    )
    async with runrow.Dispatcher(dsn, _answering("default"), schema=schema, **FAST) as d:
        await wait_for(lambda: is_terminal(conn, schema, plain.id), what="the default run to end")
        assert (await run_row(conn, schema, late.id))["status"] == "queued"
        assert [(u.agent_key, u.runs) for u in await unserved_runs(dsn, schema=schema)] == [("nobody", 1)]


async def _cli(argv: list[str]) -> int:
    import anyio

    return await anyio.to_thread.run_sync(lambda: main(argv))


async def test_a_retry_keeps_its_agent_key(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> None:
    async def fails(run: runrow.RunContext) -> None:
        if run.attempt == 1:
            raise RuntimeError("once")
        await run.write_message("second")

    run = await runrow.enqueue(
        dsn, schema=schema, conversation_id="c", user_id="u", content="x", agent_key="flaky"
    )
    retry = runrow.RetryPolicy(max_attempts=2, backoff=0.01)
    async with runrow.Dispatcher(dsn, agents={"flaky": fails}, schema=schema, retry=retry, **FAST):
        await wait_for(lambda: _retried_and_done(conn, schema, run.id), what="the retry to complete")


async def _retried_and_done(conn: psycopg.AsyncConnection, schema: str, run_id: object) -> bool:
    cur = await conn.execute(
        f'SELECT status, agent_key FROM "{schema}".agent_run WHERE retry_of = %s', (run_id,)
    )
    got = await cur.fetchall()
    return bool(got) and got[0] == ("completed", "flaky")


def test_a_dispatcher_needs_an_agent_and_checks_its_keys() -> None:
    with pytest.raises(runrow.InvalidInput, match="give an agent"):
        runrow.Dispatcher("postgresql://x")
    with pytest.raises(runrow.InvalidInput, match="agents"):
        runrow.Dispatcher("postgresql://x", agents={"": _answering("x")})
    with pytest.raises(runrow.InvalidInput, match="not async"):
        runrow.Dispatcher("postgresql://x", agents={"k": lambda run: None})
    with pytest.raises(runrow.InvalidInput, match="agent_key"):
        runrow.sync.enqueue("postgresql://x", conversation_id="c", user_id="u", content="x", agent_key="")
    assert json.dumps(runrow.Dispatcher("postgresql://x", agents={"b": _answering("b")}).settings.agent_keys)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    keys=st.lists(
        st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=12), max_size=4
    )
)
async def test_the_claims_agent_keys_literal_reads_back_as_the_keys(
    conn: psycopg.AsyncConnection, keys: list[str]
) -> None:
    # The claim sends a worker's keys as one cached text[] literal: quotes, backslashes,
    # commas, braces, spaces and NULL-looking words must come back as they went.
    cur = await conn.execute("SELECT %s::text[]", (_text_array(tuple(keys)),))
    assert await cur.fetchone() == (keys,)
