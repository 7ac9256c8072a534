"""Each table's rules in one function-checked constraint (migrations 21-24): agent_run's
function refuses exactly the rows its seventeen CHECK constraints refused, run_step's its
five's and message's its three's, and each names one of the rules a row breaks, as those
constraints did. The old constraints are read from a schema migrated to version 20, as
the server stored them, not copied here."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.types.json import Jsonb

import runrow

pytestmark = pytest.mark.anyio

BEFORE = 20  # the last version with the old constraints
TABLES = {"agent_run": 17, "run_step": 5, "message": 3}
Reference = tuple[str, dict[str, dict[str, str]]]


@pytest.fixture(scope="module")
async def reference(dsn: str) -> AsyncIterator[Reference]:
    """A schema migrated to version 20 (its tables' constraints read), then to the
    latest, with runs written before the steps so that validation reads real rows."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    await runrow.migrate(dsn, schema=name, target=BEFORE)
    try:
        rules: dict[str, dict[str, str]] = {}
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            for table in TABLES:
                cur = await conn.execute(
                    "SELECT conname, pg_get_expr(conbin, conrelid) FROM pg_constraint"
                    " WHERE conrelid = (quote_ident(%s) || '.' || %s)::regclass AND contype = 'c'",
                    (name, table),
                )
                rules[table] = {n: e for n, e in await cur.fetchall()}
                assert len(rules[table]) == TABLES[table], sorted(rules[table])
            for i in range(3):
                await runrow.enqueue(conn, schema=name, conversation_id=f"c{i}", user_id="u", content="x")
        assert await runrow.migrate(dsn, schema=name) == list(range(BEFORE + 1, runrow.latest_version() + 1))
        yield name, rules
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.mark.parametrize("table", list(TABLES))
async def test_the_old_constraints_are_gone_and_one_holds_them(
    reference: Reference, conn: psycopg.AsyncConnection, table: str
) -> None:
    schema, rules = reference
    cur = await conn.execute(
        "SELECT conname, convalidated FROM pg_constraint"
        " WHERE conrelid = (quote_ident(%s) || '.' || %s)::regclass AND contype = 'c'",
        (schema, table),
    )
    assert await cur.fetchall() == [(f"{table}_rules", True)]
    # Every rule the old constraints named is named by the function, in its refusing branch.
    cur = await conn.execute(
        "SELECT prosrc FROM pg_proc WHERE proname = %s AND pronamespace = quote_ident(%s)::regnamespace",
        (f"{table}_rules", schema),
    )
    (source,) = await cur.fetchone()  # type: ignore[misc]
    for name in rules[table]:
        assert f"THEN '{name}'" in source, name


def _json(row: dict[str, Any]) -> Jsonb:
    return Jsonb(row, dumps=lambda value: json.dumps(value, default=str))


_T = datetime(2026, 1, 1, tzinfo=UTC)
_ID = uuid.UUID(int=1)
_TIMES = st.sampled_from([None, _T])
_IDS = st.sampled_from([None, _ID])
_TEXTS = st.sampled_from([None, "", "k", "x" * 200, "x" * 201])
_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "status": st.sampled_from(
        ["queued", "running", "waiting", "completed", "failed", "cancelled", "expired", "absorbed", "odd"]
    ),
    "conversation_id": _TEXTS,
    "user_id": _TEXTS,
    "tenant_id": _TEXTS,
    "idempotency_key": _TEXTS,
    "agent_key": _TEXTS,
    "limit_key": _TEXTS,
    "attempt": st.sampled_from([None, 0, 1, 2]),
    "resumes": st.sampled_from([None, -1, 0, 1]),
    **{f: _IDS for f in ("lineage_id", "parent_run_id", "root_run_id", "absorbed_into", "claim_token")},
    **{f: _TIMES for f in ("claim_expires_at", "started_at", "finished_at", "input_deadline_at")},
}
_VALID: dict[str, dict[str, Any]] = {  # a row each status allows, to break one rule or two of
    "queued": {},
    "running": {"claim_token": _ID, "claim_expires_at": _T, "started_at": _T},
    "waiting": {"started_at": _T, "input_deadline_at": _T},
    **{s: {"started_at": _T, "finished_at": _T} for s in ("completed", "failed", "cancelled", "expired")},
    "absorbed": {"finished_at": _T, "absorbed_into": _ID},
}


@st.composite
def _bent(
    draw: st.DrawFn,
    valid: dict[str, dict[str, Any]],
    common: dict[str, Any],
    fields: dict[str, st.SearchStrategy[Any]],
) -> dict[str, Any]:
    """A row some status allows, with up to three of its fields drawn anew: most rows
    then break one rule or two, or none."""
    status = draw(st.sampled_from(sorted(valid)))
    row: dict[str, Any] = {f: None for f in fields} | common | {"status": status} | valid[status]
    for field in draw(st.lists(st.sampled_from(sorted(fields)), max_size=3, unique=True)):
        row[field] = draw(fields[field])
    return row


_RUN = {"conversation_id": "c", "user_id": "u", "agent_key": "a", "attempt": 1, "resumes": 0}


async def _same_verdict(
    conn: psycopg.AsyncConnection, schema: str, table: str, rules: dict[str, str], row: dict[str, Any]
) -> None:
    """The function's verdict on ``row`` against the old constraints' (each as the server
    stored it, over the same row): it passes a row none refuses, and refuses any other
    naming one that refuses it."""
    names = sorted(rules)
    verdicts = sql.SQL(", ").join(sql.SQL(rules[n]) for n in names)  # (the server's own text)
    query = sql.SQL("SELECT {verdicts} FROM jsonb_populate_record(NULL::{t}, %s) AS {a}").format(
        verdicts=verdicts, t=sql.Identifier(schema, table), a=sql.Identifier(table)
    )
    cur = await conn.execute(query, (_json(row),))
    got = await cur.fetchone()
    assert got is not None
    broken = {n for n, ok in zip(names, got, strict=True) if ok is False}
    check = sql.SQL("SELECT {f}(r) FROM jsonb_populate_record(NULL::{t}, %s) AS r").format(
        f=sql.Identifier(schema, f"{table}_rules"), t=sql.Identifier(schema, table)
    )
    if not broken:
        cur = await conn.execute(check, (_json(row),))
        assert await cur.fetchone() == (True,)
        return
    with pytest.raises(psycopg.errors.CheckViolation) as refused:
        await conn.execute(check, (_json(row),))
    assert refused.value.diag.constraint_name in broken
    assert refused.value.diag.table_name == table
    assert f'violates check constraint "{refused.value.diag.constraint_name}"' in str(refused.value)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(row=_bent(_VALID, _RUN, _FIELDS))
async def test_agent_runs_function_refuses_exactly_what_the_seventeen_refused(
    reference: Reference, conn: psycopg.AsyncConnection, row: dict[str, Any]
) -> None:
    schema, rules = reference
    await _same_verdict(conn, schema, "agent_run", rules["agent_run"], row)


_STEP_VALID: dict[str, dict[str, Any]] = {
    "started": {},
    "waiting": {"request": {"q": 1}},
    "recorded": {"result": 1, "recorded_at": _T},
    "failed": {"error": {"type": "E"}, "recorded_at": _T},
}
_STEP_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "status": st.sampled_from([*_STEP_VALID, "odd"]),
    "key": _TEXTS,
    "occurrence": st.sampled_from([None, -1, 0, 3]),
    "position": st.sampled_from([None, -1, 0, 3]),
    **{f: st.sampled_from([None, 0, "x", {"a": 1}]) for f in ("result", "error", "request")},
    "recorded_at": _TIMES,
}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(row=_bent(_STEP_VALID, {"key": "k", "occurrence": 0, "position": 0}, _STEP_FIELDS))
async def test_run_steps_function_refuses_exactly_what_the_five_refused(
    reference: Reference, conn: psycopg.AsyncConnection, row: dict[str, Any]
) -> None:
    schema, rules = reference
    await _same_verdict(conn, schema, "run_step", rules["run_step"], row)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    row=st.fixed_dictionaries(
        {
            "conversation_id": _TEXTS,
            "role": st.sampled_from(["user", "assistant", "tool", "system", "odd", None]),
            "status": st.sampled_from(["sent", "draft", "complete", "partial", "odd", None]),
        }
    )
)
async def test_messages_function_refuses_exactly_what_the_three_refused(
    reference: Reference, conn: psycopg.AsyncConnection, row: dict[str, Any]
) -> None:
    schema, rules = reference
    await _same_verdict(conn, schema, "message", rules["message"], row)


async def test_a_write_that_breaks_a_rule_is_refused_by_name(
    reference: Reference, conn: psycopg.AsyncConnection
) -> None:
    schema, _ = reference
    run = await runrow.enqueue(conn, schema=schema, conversation_id="w", user_id="u", content="x")
    runs = sql.Identifier(schema, "agent_run")
    with pytest.raises(psycopg.errors.CheckViolation, match="agent_run_running_claimed") as refused:
        # Running without a claim.
        await conn.execute(
            sql.SQL("UPDATE {} SET status = 'running', started_at = now() WHERE id = %s").format(runs),
            (run.id,),
        )
    assert refused.value.diag.table_name == "agent_run"
    with pytest.raises(psycopg.errors.CheckViolation, match="agent_run_status_check"):
        await conn.execute(sql.SQL("UPDATE {} SET status = 'odd' WHERE id = %s").format(runs), (run.id,))
    cur = await conn.execute(sql.SQL("SELECT status FROM {} WHERE id = %s").format(runs), (run.id,))
    assert await cur.fetchone() == ("queued",)
