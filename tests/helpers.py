"""Small helpers shared by the tests: counting rows and reading a schema's tables."""

from __future__ import annotations

import re
from typing import Any

import psycopg
from psycopg import sql

import runrow


def table(schema: str, name: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(name))


async def count(conn: psycopg.AsyncConnection, schema: str, name: str) -> int:
    cur = await conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table(schema, name)))
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def empty(conn: psycopg.AsyncConnection, schema: str) -> None:
    """Deletes every run, step, message, event and tenant policy (one hypothesis example's start)."""
    names = ("run_step", "run_event", "agent_run", "message", "tenant_policy")
    await conn.execute(sql.SQL("TRUNCATE {}").format(sql.SQL(", ").join(table(schema, n) for n in names)))


async def counts(conn: psycopg.AsyncConnection, schema: str) -> dict[str, int]:
    return {t: await count(conn, schema, t) for t in ("message", "agent_run", "run_event")}


async def rows(
    conn: psycopg.AsyncConnection, query: sql.Composable, params: Any = None
) -> list[tuple[Any, ...]]:
    cur = await conn.execute(query, params)
    return await cur.fetchall()


async def events(conn: psycopg.AsyncConnection, schema: str, run_id: Any) -> list[tuple[int, str, Any]]:
    q = sql.SQL("SELECT seq, type, payload FROM {} WHERE run_id = %s ORDER BY seq").format(
        table(schema, "run_event")
    )
    return [(r[0], r[1], r[2]) for r in await rows(conn, q, (run_id,))]


async def run_row(conn: psycopg.AsyncConnection, schema: str, run_id: Any) -> dict[str, Any]:
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    await cur.execute(sql.SQL("SELECT * FROM {} WHERE id = %s").format(table(schema, "agent_run")), (run_id,))
    row = await cur.fetchone()
    assert row is not None
    return row


async def wait_for(
    predicate: Any, *, timeout: float = 10.0, interval: float = 0.02, what: str = "condition"
) -> Any:
    """Polls an (async or sync) predicate until it returns something truthy, or fails the test."""
    import inspect

    import anyio

    deadline = anyio.current_time() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if anyio.current_time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await anyio.sleep(interval)


async def blocked_by(conn: psycopg.AsyncConnection, pid: int) -> bool:
    """Whether some backend is waiting for a lock that backend ``pid`` holds (e.g. a stop
    queued behind an uncommitted ending): the wait itself, instead of a sleep."""
    cur = await conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid)))", (pid,)
    )
    row = await cur.fetchone()
    return bool(row and row[0])


async def status_of(conn: psycopg.AsyncConnection, schema: str, run_id: Any) -> str:
    cur = await conn.execute(
        sql.SQL("SELECT status FROM {} WHERE id = %s").format(table(schema, "agent_run")), (run_id,)
    )
    row = await cur.fetchone()
    assert row is not None
    return str(row[0])


async def assert_journal_sound(
    conn: psycopg.AsyncConnection, schema: str, run_id: Any
) -> list[tuple[int, str, Any]]:
    """Seq gap-free from 1, exactly one terminal event, and it is the last."""
    evs = await events(conn, schema, run_id)
    assert [s for s, _, _ in evs] == list(range(1, len(evs) + 1)), evs
    terminals = [e for e in evs if e[1] == "complete"]
    assert len(terminals) == 1, evs
    assert evs[-1][1] == "complete", evs
    return evs


async def is_terminal(conn: psycopg.AsyncConnection, schema: str, run_id: Any) -> bool:
    from runrow._status import TERMINAL

    return await status_of(conn, schema, run_id) in TERMINAL


async def enqueue_turn(dsn: str, schema: str, conversation: str, **kw: Any) -> Any:
    """A turn of user "u" whose content is its conversation id (the shape many tests need)."""
    import runrow

    return await runrow.enqueue(
        dsn, schema=schema, conversation_id=conversation, user_id="u", content=conversation, **kw
    )


async def drop_time_partitions(conn: psycopg.AsyncConnection, schema: str) -> None:
    """Detaches and drops every time partition of a schema's journal (not the legacy one)."""
    for row in await runrow.journal_partitions(conn, schema=schema):
        if row.starts is not None:
            await conn.execute(
                sql.SQL("ALTER TABLE {} DETACH PARTITION {}").format(
                    table(schema, "run_event"), table(schema, row.name)
                )
            )
            await conn.execute(sql.SQL("DROP TABLE {}").format(table(schema, row.name)))


async def hourly_partitions(conn: psycopg.AsyncConnection, schema: str, *, premake: int = 2) -> None:
    """Cuts a fresh schema's journal by the hour instead of the day, before any run is
    made: drops its (empty) time partitions and makes hourly ones from the current hour,
    so that a test travelling a day or two ahead knows which partitions expire."""
    await drop_time_partitions(conn, schema)
    await conn.execute(
        sql.SQL("UPDATE {} SET partition_seconds = 3600, premake = %s").format(
            table(schema, "journal_settings")
        ),
        (premake,),
    )
    assert await runrow.ensure_journal_partitions(conn, schema=schema) == premake + 1


async def indexes_naming(
    conn: psycopg.AsyncConnection, schema: str, name: str, columns: tuple[str, ...]
) -> tuple[int, list[str]]:
    """How many indexes table ``name`` has, and those that name any of ``columns`` in
    their columns, expressions or predicate (an update changing such a column cannot be
    heap-only), with what they name and their definition."""
    defs = await rows(
        conn,
        "SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index"
        " WHERE indrelid = %s::regclass",
        (f'"{schema}".{name}',),
    )
    found = []
    for index, definition in defs:
        after = definition.split(" USING ", 1)[1]  # (the table's name may hold a column's)
        named = [c for c in columns if re.search(rf"\b{c}\b", after)]
        if named:
            found.append(f"{index} names {named}: {definition}")
    return len(defs), found


def plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan, the root first."""
    return [plan, *(n for child in plan.get("Plans", []) for n in plan_nodes(child))]


async def updates_counted(
    conn: psycopg.AsyncConnection, schema: str, name: str, at_least: int
) -> tuple[int, int] | None:
    """(updates, heap-only updates) of table ``name`` in pg_stat_user_tables, once it
    counts ``at_least`` updates (a backend's counters reach the view when it exits or
    goes idle): None before, for :func:`wait_for`."""
    (row,) = await rows(
        conn,
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = %s::regclass",
        (f'"{schema}".{name}',),
    )
    return (int(row[0]), int(row[1])) if row[0] >= at_least else None
