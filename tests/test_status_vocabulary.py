"""One run-status vocabulary: the Python literal (runrow/_status.py), the schema's status
rule as a migrated database holds it, the OpenAPI document of runrow.http, and the
live set SQL writes once (the ``live_status`` fragment) with the partial indexes and the
checks built on it all agree. A status added on one side only fails here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args

import httpx
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool
from starlette.requests import Request

from runrow import RunStatus, _status
from runrow._gateway import statement_text
from runrow.http import create_api

pytestmark = pytest.mark.anyio

SQL = Path(__file__).resolve().parents[1] / "sql"


def _literals(text: str) -> set[str]:
    """The quoted words of a constraint's or a predicate's text, as the server prints it."""
    return set(re.findall(r"'([a-z_]+)'", text))


async def _constraint(conn: psycopg.AsyncConnection, schema: str, name: str) -> set[str]:
    """The literals of agent_run's rule ``name``: since migration 22 a branch of the
    function its one CHECK constraint calls (``agent_run_rules``), whose fast path must
    hold the same rule word for word."""
    cur = await conn.execute(
        "SELECT prosrc FROM pg_proc WHERE proname = 'agent_run_rules'"
        " AND pronamespace = quote_ident(%s)::regnamespace",
        (schema,),
    )
    row = await cur.fetchone()
    assert row is not None, "no function agent_run_rules"
    fast, naming = row[0].split("broken :=", 1)
    found = re.search(rf"WHEN NOT ((?:(?!WHEN NOT).)*?)\s+THEN '{name}'", naming, re.DOTALL)
    assert found is not None, f"no rule {name} in agent_run_rules"
    rule = found.group(1)
    assert re.sub(r"\s+", "", rule) in re.sub(r"\s+", "", fast), f"the fast path lacks {name}"
    return _literals(rule)


async def _index_predicates(conn: psycopg.AsyncConnection, schema: str) -> dict[str, str]:
    cur = await conn.execute(
        "SELECT c.relname, pg_get_expr(i.indpred, i.indrelid) FROM pg_index i"
        " JOIN pg_class c ON c.oid = i.indexrelid"
        " WHERE i.indrelid = (quote_ident(%s) || '.agent_run')::regclass AND i.indpred IS NOT NULL",
        (schema,),
    )
    return {name: pred for name, pred in await cur.fetchall()}


def _status_enums(node: Any) -> list[list[str]]:
    """Every ``enum`` the document gives a property named ``status``."""
    found: list[list[str]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "status" and isinstance(value, dict) and "enum" in value:
                found.append(value["enum"])
            found += _status_enums(value)
    elif isinstance(node, list):
        for item in node:
            found += _status_enums(item)
    return found


def _fragment(name: str) -> str:
    text = (SQL / "fragments.sql").read_text(encoding="utf-8")
    block = text.split(f"-- fragment: {name}\n", 1)[1].split("-- fragment:", 1)[0]
    return "\n".join(line for line in block.splitlines() if not line.lstrip().startswith("--")).strip()


def _anonymous(request: Request) -> str | None:
    return None


async def test_the_literal_the_check_constraint_and_the_openapi_enum_agree(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    python = get_args(RunStatus)
    assert len(set(python)) == len(python) and python == _status.STATUSES
    assert await _constraint(conn, schema, "agent_run_status_check") == set(python)

    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, open=False)
    api = create_api(pool, authenticate=_anonymous, schema=schema)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://api") as client:
        document = (await client.get("/openapi.json")).json()
    enums = _status_enums(document)
    assert enums, "the OpenAPI document gives no status an enum"
    for enum in enums:
        assert enum == list(python)


async def test_the_live_set_is_written_once_and_the_schema_agrees(
    schema: str, conn: psycopg.AsyncConnection
) -> None:
    """The live set: the Python one, the SQL fragment every statement takes, the partial
    index on a conversation's active turns (a query can use it only if it spells the
    same set), and the check that only live runs may be unfinished."""
    live = set(_status.LIVE)
    assert _literals(_fragment("live_status")) == live
    predicates = await _index_predicates(conn, schema)
    assert _literals(predicates["agent_run_active_conversation_idx"]) == live
    assert await _constraint(conn, schema, "agent_run_terminal_finished") == live
    # Every status a partial index or the statements' live set names is a status.
    for name, predicate in predicates.items():
        assert _literals(predicate) <= set(_status.STATUSES), name
    assert set(_status.STATUSES) - live == _status.TERMINAL
    # The statuses retry accepts: the statement's own filter.
    retry = statement_text("retry", "s").decode()
    found = re.search(r"status IN \(([^)]*)\)", retry)
    assert found is not None and _literals(found.group(1)) == set(_status.RETRYABLE)
