"""Migrations: forward-only, concurrent-safe, and a clear error when the schema is behind."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

import runrow
from runrow._gateway import _exec
from runrow._gateway import schema as gateway_schema

from .helpers import table

pytestmark = pytest.mark.anyio


async def test_fresh_schema_reaches_latest_and_rerun_is_a_noop(
    dsn: str, schema_name: str, conn: psycopg.AsyncConnection
) -> None:
    try:
        assert await runrow.migrate(dsn, schema=schema_name) == [
            m.version for m in gateway_schema.migrations()
        ]
        assert await runrow.migrate(dsn, schema=schema_name) == []
        cur = await conn.execute(
            sql.SQL("SELECT version FROM {}").format(table(schema_name, "schema_version"))
        )
        assert [r[0] for r in await cur.fetchall()] == [m.version for m in gateway_schema.migrations()]
    finally:
        await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema_name)))


async def test_awkward_schema_names_are_quoted(dsn: str, conn: psycopg.AsyncConnection) -> None:
    name = f'Weird "Name"; DROP {uuid.uuid4().hex[:4]}'
    try:
        await runrow.migrate(dsn, schema=name)
        run = await runrow.enqueue(dsn, schema=name, conversation_id="c", user_id="u", content="x")
        assert run.status == "queued"
    finally:
        await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def test_concurrent_migrate_from_four_processes(dsn: str, schema_name: str) -> None:
    code = "import asyncio, sys, runrow;print(asyncio.run(runrow.migrate(sys.argv[1], schema=sys.argv[2])))"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, dsn, schema_name],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    try:
        assert [p.returncode for p in procs] == [0, 0, 0, 0], [e for _, e in outs]
        applied = [eval(o.strip()) for o, _ in outs]
        # Every version applied exactly once, by whichever process got there first.
        flat = sorted(v for lst in applied for v in lst)
        assert flat == [m.version for m in gateway_schema.migrations()]
    finally:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema_name)))


async def test_out_of_date_schema_is_reported_with_the_fix(
    dsn: str, schema_name: str, conn: psycopg.AsyncConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pretend this runrow knows one more migration than the database has.
    real = gateway_schema.migrations()
    extra = (*real, gateway_schema.Migration(real[-1].version + 1, "future", "SELECT 1"))
    try:
        await runrow.migrate(dsn, schema=schema_name)
        monkeypatch.setattr(gateway_schema, "migrations", lambda: extra)
        from runrow._gateway.schema import require as require_schema

        with pytest.raises(runrow.SchemaOutOfDate, match="runrow migrate") as info:
            await _exec.run(conn, require_schema(schema_name))
        assert (info.value.found, info.value.expected) == (real[-1].version, real[-1].version + 1)
        # And the other way round: a database newer than the code says to upgrade runrow.
        await runrow.migrate(dsn, schema=schema_name)
        monkeypatch.setattr(gateway_schema, "migrations", lambda: real)
        with pytest.raises(runrow.SchemaOutOfDate, match="upgrade the runrow package"):
            await _exec.run(conn, require_schema(schema_name))
        with pytest.raises(runrow.SchemaOutOfDate):
            await runrow.migrate(dsn, schema=schema_name)
    finally:
        await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema_name)))


async def test_migrate_to_a_target(dsn: str, schema_name: str, conn: psycopg.AsyncConnection) -> None:
    try:
        assert await runrow.migrate(dsn, schema=schema_name, target=0) == []
        with pytest.raises(runrow.InvalidInput):
            await runrow.migrate(dsn, schema=schema_name, target=runrow.latest_version() + 1)
    finally:
        await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema_name)))


# -- expand, then contract (docs/howto/upgrading.md) ------------------------------------

# The first migration held to the rule (1-7 predate it; 3 broke it, 8 expanded it again).
FIRST_EXPANDING = 8
# What a running previous release cannot survive. A migration that must do one of these
# is a contracting one and says so on a line of its own: "-- contract: <what and why>".
_CONTRACTING = {
    "SET NOT NULL": re.compile(r"\bSET\s+NOT\s+NULL\b", re.IGNORECASE),
    "a dropped column": re.compile(r"\bDROP\s+COLUMN\b", re.IGNORECASE),
    "a dropped table": re.compile(r"\bDROP\s+TABLE\b", re.IGNORECASE),
    "a rename": re.compile(r"\bRENAME\b", re.IGNORECASE),
    "a new constraint (old writers may break it)": re.compile(r"\bADD\s+CONSTRAINT\b", re.IGNORECASE),
    "a new unique index (old writers may break it)": re.compile(
        r"\bCREATE\s+UNIQUE\s+INDEX\b", re.IGNORECASE
    ),
    "a dropped function, trigger or type": re.compile(r"\bDROP\s+(?:FUNCTION|TRIGGER|TYPE)\b", re.IGNORECASE),
    "a column's type changed": re.compile(
        r"\bALTER\s+COLUMN\s+\S+\s+(?:SET\s+DATA\s+)?TYPE\b", re.IGNORECASE
    ),
}
# (COLUMN is optional after ADD; ADD CONSTRAINT is matched above.)
_ADD_COLUMN = re.compile(r"\bADD\s+(?:COLUMN\b|(?!CONSTRAINT\b)(?=\w))[^,;]*", re.IGNORECASE)
_FILLED = re.compile(r"\b(?:DEFAULT|GENERATED)\b", re.IGNORECASE)
_NOT_NULL = re.compile(r"\bNOT\s+NULL\b", re.IGNORECASE)


def _contracting(text: str) -> list[str]:
    code = "\n".join(line.split("--", 1)[0] for line in text.splitlines())
    found = [
        "a new NOT NULL column without a default"
        for clause in _ADD_COLUMN.findall(code)
        if _NOT_NULL.search(clause) and not _FILLED.search(clause)
    ][:1]
    return found + [what for what, pattern in _CONTRACTING.items() if pattern.search(code)]


def test_the_contraction_check_sees_what_breaks_a_previous_release() -> None:
    assert _contracting("ALTER TABLE {schema}.message ADD COLUMN turn bigint NOT NULL;") == [
        "a new NOT NULL column without a default"
    ]
    assert _contracting("ALTER TABLE {schema}.message ALTER COLUMN turn SET NOT NULL;") == ["SET NOT NULL"]
    assert _contracting("ALTER TABLE t ADD x int NOT NULL;") == ["a new NOT NULL column without a default"]
    assert _contracting("ALTER TABLE t DROP COLUMN x;") == ["a dropped column"]
    assert _contracting("ALTER TABLE t ADD CONSTRAINT c CHECK (x > 0);") == [
        "a new constraint (old writers may break it)"
    ]
    assert _contracting("CREATE UNIQUE INDEX i ON t (x);") == [
        "a new unique index (old writers may break it)"
    ]
    assert _contracting("DROP TRIGGER message_fill_turn ON t;") == ["a dropped function, trigger or type"]
    assert _contracting("ALTER TABLE t ALTER COLUMN x TYPE text;") == ["a column's type changed"]
    # Expanding is fine: defaults, nullable columns, new tables and indexes, comments.
    assert _contracting("ALTER TABLE t ADD COLUMN n integer NOT NULL DEFAULT 0;") == []
    assert _contracting("ALTER TABLE t ADD COLUMN k text GENERATED ALWAYS AS (x) STORED NOT NULL;") == []
    assert _contracting("ALTER TABLE t ADD COLUMN x uuid; -- never SET NOT NULL here") == []
    assert _contracting("ALTER TABLE t ALTER COLUMN turn DROP NOT NULL;") == []


def _widened(text: str) -> str:
    """``text`` without the CHECK constraints it replaces by wider ones: each declared on a
    line of its own, "-- widens: <name>", and dropped by name in the same migration (a
    previous release's writes pass a constraint that allows more; for the status check,
    tests/test_status_vocabulary.py holds the new one to the code's statuses)."""
    for name in re.findall(r"^--\s*widens:\s*(\w+)", text, re.MULTILINE):
        dropped = re.search(rf"\bDROP\s+CONSTRAINT\s+{name}\b", text, re.IGNORECASE)
        assert dropped, f"a widened constraint ({name}) replaces one of that name"
        text = re.sub(rf"\bADD\s+CONSTRAINT\s+{name}\b", "", text, flags=re.IGNORECASE)
    return text


def test_a_widened_constraint_must_replace_one() -> None:
    wider = "-- widens: c\nALTER TABLE t DROP CONSTRAINT c;\nALTER TABLE t ADD CONSTRAINT c CHECK (x > -1);"
    assert _contracting(_widened(wider)) == []
    with pytest.raises(AssertionError, match="replaces one of that name"):
        _widened("-- widens: c\nALTER TABLE t ADD CONSTRAINT c CHECK (x > 0);")
    assert _contracting(_widened(wider + "\nALTER TABLE t ADD CONSTRAINT d CHECK (y);")) == [
        "a new constraint (old writers may break it)"
    ]


def _kept(text: str) -> str:
    """``text`` without what a previous release cannot notice: a table renamed and made
    again under its old name in the same migration (the old release keeps using the name:
    migration 20 turns the journal into a partitioned table that way), and a constraint
    declared on a line of its own, "-- holds for old writers: <name>", right before it is
    added, for a check that what an old release writes always passes (the rolling-upgrade
    test runs that release on the migrated schema). A function's body ($$...$$) is not
    run by the migration: migration 18's makes each journal partition with the same keys
    the journal always had, which what an old release writes already satisfies."""
    text = re.sub(r"\$\$.*?\$\$", "$$ $$", text, flags=re.DOTALL)
    for renamed, _ in re.findall(r"ALTER\s+TABLE\s+\{schema\}\.(\w+)\s+RENAME\s+TO\s+(\w+)", text):
        if re.search(rf"CREATE\s+TABLE\s+\{{schema\}}\.{renamed}\b", text):
            text = re.sub(rf"ALTER\s+TABLE\s+\{{schema\}}\.{renamed}\s+RENAME\s+TO\s+\w+", "", text)
    for name in re.findall(r"^--\s*holds for old writers:\s*(\w+)", text, re.MULTILINE):
        declared = re.search(
            rf"^--\s*holds for old writers:\s*{name}\s*\n[^\n;]*\bADD\s+CONSTRAINT\s+{name}\b",
            text,
            re.MULTILINE,
        )
        assert declared, f"'holds for old writers: {name}' must stand right before ADD CONSTRAINT {name}"
        text = re.sub(rf"\bADD\s+CONSTRAINT\s+{name}\b", "", text, flags=re.IGNORECASE)
    return text


def test_a_kept_name_and_a_constraint_old_writers_pass_are_not_contractions() -> None:
    renamed = "ALTER TABLE {schema}.t RENAME TO t_old;\nCREATE TABLE {schema}.t (x int);"
    assert _contracting(_kept(renamed)) == []
    assert _contracting(_kept("ALTER TABLE {schema}.t RENAME TO t_old;")) == ["a rename"]
    held = "-- holds for old writers: c\nALTER TABLE t ADD CONSTRAINT c CHECK (x > 0) NOT VALID;"
    assert _contracting(_kept(held)) == []
    with pytest.raises(AssertionError, match="must stand right before"):
        _kept("-- holds for old writers: c\nSELECT 1;\nALTER TABLE t ADD CONSTRAINT c CHECK (x > 0);")
    assert _contracting(_kept(held + "\nALTER TABLE t ADD CONSTRAINT d CHECK (y);")) == [
        "a new constraint (old writers may break it)"
    ]


def test_migrations_expand_before_they_contract() -> None:
    """Every migration from 8 on leaves the schema usable by the release before it
    (tests/test_rolling_upgrade.py runs that release on it), or declares itself a
    contraction, which the upgrading guide then has to schedule."""
    steps = gateway_schema.migrations()
    assert len(steps) >= FIRST_EXPANDING
    # The check would have caught the migration that broke the previous release.
    assert _contracting(steps[2].text) == ["SET NOT NULL"]
    guide = (Path(__file__).resolve().parents[1] / "docs" / "howto" / "upgrading.md").read_text()
    for step in steps[FIRST_EXPANDING - 1 :]:
        declared = re.search(r"^--\s*contract:", step.text, re.MULTILINE)
        text = _kept(_widened(step.text))
        assert declared or not _contracting(text), (step.name, _contracting(text))
        # A contraction is scheduled in the guide before it ships.
        assert not declared or step.name in guide, f"{step.name} is not in docs/howto/upgrading.md"


async def test_a_message_inserted_without_its_turn_gets_the_one_this_release_would_write(
    schema: str, conn: psycopg.AsyncConnection
) -> None:
    """A release from before message.turn inserts messages without it (migration 8)."""
    first = await runrow.enqueue(conn, schema=schema, conversation_id="c", user_id="u", content="one")
    second = await runrow.enqueue(conn, schema=schema, conversation_id="c", user_id="u", content="two")
    message, run_table = table(schema, "message"), table(schema, "agent_run")
    cur = await conn.execute(
        sql.SQL("SELECT id, queue_order, user_message_id FROM {} ORDER BY queue_order").format(run_table)
    )
    (r1, order1, _), (r2, order2, m2) = await cur.fetchall()
    # As the old enqueue did: the message and its run in one statement, no turn.
    cur = await conn.execute(
        sql.SQL(
            "WITH run AS (INSERT INTO {r} (conversation_id, user_id, user_message_id)"
            " VALUES ('c', 'u', gen_random_uuid()) RETURNING id, user_message_id, queue_order)"
            " INSERT INTO {m} (id, conversation_id, run_id, role, content, status, user_id)"
            " SELECT user_message_id, 'c', id, 'user', '\"three\"', 'sent', 'u' FROM run"
            " RETURNING id, (SELECT queue_order FROM run)"
        ).format(r=run_table, m=message)
    )
    m3, order3 = await cur.fetchone()  # type: ignore[misc]
    # An answer to the first turn, written after the later turns were enqueued; and a
    # message of no run.
    await conn.execute(
        sql.SQL(
            "INSERT INTO {} (conversation_id, run_id, role, content, status)"
            " VALUES ('c', %s, 'assistant', '\"late answer\"', 'complete'),"
            " ('c', NULL, 'system', '\"note\"', 'complete')"
        ).format(message),
        (r1,),
    )
    cur = await conn.execute(sql.SQL("SELECT content, turn FROM {} ORDER BY position").format(message))
    turns = {content: turn for content, turn in await cur.fetchall()}
    assert turns == {"one": order1, "two": order2, "three": order3, "late answer": order1, "note": order3}
    # And the transcript reads in turn order: the late answer before the second question.
    listed = [m.content for m in await runrow.transcript(conn, "c", schema=schema)]
    assert listed == ["one", "late answer", "two", "three", "note"]
    assert (r2, m2, m3) and first.id == r1 and second.id == r2
