"""The partitioned journal's invariants (#44): whatever the times runs are made at (in
any partition, or before partitioning: legacy), a run's events all live in one
partition, (run_id, seq) stays unique and one ending per run, across the table."""

from __future__ import annotations

import itertools
import uuid
from datetime import timedelta

import anyio
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

import runrow
from runrow._gateway import claims, statement_positional

from .helpers import assert_journal_sound, drop_time_partitions, table

pytestmark = pytest.mark.anyio

DAY_MS = 86_400_000


def _id_at(ms: int | None) -> uuid.UUID:
    """A run id made at ``ms`` (time-ordered, version 7), or a random version-4 one."""
    if ms is None:
        return uuid.uuid4()
    raw = bytearray(ms.to_bytes(6, "big") + uuid.uuid4().bytes[6:])
    raw[6] = (raw[6] & 0x0F) | 0x70
    return uuid.UUID(bytes=bytes(raw))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    runs=st.lists(
        st.tuples(
            st.one_of(st.none(), st.integers(min_value=0, max_value=3 * DAY_MS - 1)),  # None: legacy id
            st.integers(min_value=1, max_value=5),  # events
        ),
        min_size=1,
        max_size=8,
    )
)
async def test_a_runs_events_live_in_one_partition_and_stay_unique_across_the_table(
    dsn: str, schema: str, runs: list[tuple[int | None, int]]
) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        now = await (await conn.execute("SELECT (extract(epoch FROM now()) * 1000)::bigint")).fetchone()
        assert now is not None
        day_start = now[0] // DAY_MS * DAY_MS  # the first partition (daily) starts here
        event, run_table, message = (table(schema, n) for n in ("run_event", "agent_run", "message"))
        made = []
        for offset, count in runs:
            run_id = _id_at(None if offset is None else day_start + offset)
            cur = await conn.execute(
                sql.SQL(
                    "INSERT INTO {m} (conversation_id, role, content, status, user_id)"
                    " VALUES (%s, 'user', '\"q\"', 'sent', 'u') RETURNING id"
                ).format(m=message),
                (f"c-{run_id.hex[:8]}",),
            )
            (message_id,) = await cur.fetchone()  # type: ignore[misc]
            await conn.execute(
                sql.SQL(
                    "INSERT INTO {} (id, conversation_id, user_id, user_message_id) VALUES (%s, %s, 'u', %s)"
                ).format(run_table),
                (run_id, f"c-{run_id.hex[:8]}", message_id),
            )
            await conn.execute(
                sql.SQL(
                    "INSERT INTO {} (run_id, seq, type) SELECT %s, s, CASE WHEN s = %s THEN 'complete' ELSE 'x' END"
                    " FROM generate_series(1, %s) s"
                ).format(event),
                (run_id, count, count),
            )
            made.append((run_id, count, offset))
        for run_id, count, offset in made:
            cur = await conn.execute(
                sql.SQL(
                    "SELECT tableoid::regclass::text, count(*) FROM {} WHERE run_id = %s GROUP BY 1"
                ).format(event),
                (run_id,),
            )
            where = await cur.fetchall()
            assert len(where) == 1 and where[0][1] == count, where  # one partition, every event
            assert (where[0][0].endswith("run_event_legacy")) == (offset is None)
            # The reads runrow sends (pruned to the run's partition) see the same rows.
            pruned = await conn.execute(
                sql.SQL(
                    "SELECT count(*) FROM {} WHERE run_id = %s AND {}.run_ms(run_id) = {}.run_ms(%s)"
                ).format(event, sql.Identifier(schema), sql.Identifier(schema)),
                (run_id, run_id),
            )
            assert await pruned.fetchone() == (count,)
            with pytest.raises(psycopg.errors.UniqueViolation):  # the key holds across the table
                await conn.execute(
                    sql.SQL("INSERT INTO {} (run_id, seq, type) VALUES (%s, 1, 'x')").format(event), (run_id,)
                )
            with pytest.raises(psycopg.errors.UniqueViolation):  # one ending per run
                await conn.execute(
                    sql.SQL("INSERT INTO {} (run_id, seq, type) VALUES (%s, %s, 'complete')").format(event),
                    (run_id, count + 1),
                )


async def test_every_time_partition_carries_the_journals_keys(dsn: str, schema: str) -> None:
    """Made by the function, each partition has the primary key and the one-ending index
    (the partitioned table cannot declare them itself: its key is an expression)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            sql.SQL("UPDATE {} SET partition_seconds = 3600").format(table(schema, "journal_settings"))
        )
        assert await runrow.ensure_journal_partitions(conn, schema=schema, at=None) >= 0
        parts = await runrow.journal_partitions(conn, schema=schema)
        assert len(parts) >= 5  # the legacy one, today's and premake (4) ahead at least
        for part in parts:
            cur = await conn.execute(
                "SELECT indexdef FROM pg_indexes WHERE schemaname = %s AND tablename = %s",
                (schema, part.name),
            )
            defs = [row[0] for row in await cur.fetchall()]
            assert any("UNIQUE" in d and "(run_id, seq)" in d for d in defs), (part.name, defs)
            assert any("UNIQUE" in d and "(run_id)" in d and "'complete'" in d for d in defs), (
                part.name,
                defs,
            )
        spans = [(p.starts, p.ends) for p in parts if p.starts is not None]
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans)), "partitions are contiguous"


async def test_run_ids_carry_the_time_they_were_made_in_the_uuidv7_layout(dsn: str, schema: str) -> None:
    s = sql.Identifier(schema)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            sql.SQL(
                "SELECT {s}.new_run_id(), (extract(epoch FROM clock_timestamp()) * 1000)::bigint,"
                " {s}.run_id_at('2026-12-05 10:00:00.123+00'), {s}.run_ms(gen_random_uuid())"
            ).format(s=s)
        )
        made, clock, at, legacy = await cur.fetchone()  # type: ignore[misc]
    assert made.version == 7 and at.version == 7  # the layout any UUIDv7 reader expects
    assert abs(int.from_bytes(made.bytes[:6], "big") - clock) < 5_000
    assert int.from_bytes(at.bytes[:6], "big") == 1_796_464_800_123
    assert legacy == 0
    assert _id_at(1_796_464_800_123).bytes[:6] == at.bytes[:6]


async def test_trim_finishes_a_detach_that_was_interrupted(dsn: str, schema: str) -> None:
    """DETACH ... CONCURRENTLY runs in two transactions; cancelled between them, it leaves
    the partition half detached. The next trim finishes the detach and drops it."""
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as holder,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as detacher,
    ):
        parts = await runrow.journal_partitions(conn, schema=schema)
        victim = parts[-1].name  # the newest, empty one made ahead
        # An open snapshot that reads the journal makes the detach's second phase wait.
        await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await holder.execute(sql.SQL("SELECT count(*) FROM {}").format(table(schema, "run_event")))
        pid = (await (await detacher.execute("SELECT pg_backend_pid()")).fetchone())[0]  # type: ignore[index]

        async def detach() -> None:
            with pytest.raises(psycopg.errors.QueryCanceled):
                await detacher.execute(
                    sql.SQL("ALTER TABLE {} DETACH PARTITION {} CONCURRENTLY").format(
                        table(schema, "run_event"), table(schema, victim)
                    )
                )

        async with anyio.create_task_group() as tg:
            tg.start_soon(detach)
            for _ in range(200):  # until it waits for the old snapshot
                cur = await conn.execute(
                    "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
                )
                if (await cur.fetchone()) == ("Lock",):
                    break
                await anyio.sleep(0.02)
            await conn.execute("SELECT pg_cancel_backend(%s)", (pid,))
        await holder.execute("ROLLBACK")
        cur = await conn.execute(
            "SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = %s::regclass",
            (f'"{schema}"."{victim}"',),
        )
        assert await cur.fetchone() == (True,)  # half detached
        result = await runrow.trim(conn, schema=schema)
        assert result.partitions == 1
        assert victim not in {p.name for p in await runrow.journal_partitions(conn, schema=schema)}
        cur = await conn.execute("SELECT to_regclass(%s)", (f'"{schema}"."{victim}"',))
        assert await cur.fetchone() == (None,)


FAST = {"poll": 0.2, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.1}


async def test_dropping_old_partitions_leaves_live_runs_and_their_tails_whole(dsn: str, schema: str) -> None:
    """Yesterday's finished runs sit in their own partitions; while workers stream today's
    turns and tails follow them, trim passes drop yesterday's partitions (detached
    concurrently). Every live tail gets its whole journal, gap-free, ending once."""
    s = sql.Identifier(schema)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        # Hourly partitions from 30 hours ago (made before any run, as a backfill would).
        await drop_time_partitions(conn, schema)
        await conn.execute(
            sql.SQL("UPDATE {}.journal_settings SET partition_seconds = 3600, premake = 2").format(s)
        )
        await conn.execute(
            sql.SQL("SELECT {}.journal_ensure_partitions(now() - interval '30 hours')").format(s)
        )
        assert await runrow.ensure_journal_partitions(conn, schema=schema) > 20  # contiguous to now
        # 300 finished runs made 29 hours ago, 20 events each.
        await conn.execute(
            sql.SQL(
                "WITH m AS (INSERT INTO {s}.message (conversation_id, role, content, status, user_id)"
                " SELECT 'old' || g, 'user', '\"q\"', 'sent', 'u' FROM generate_series(1, 300) g"
                " RETURNING id, conversation_id),"
                " r AS (INSERT INTO {s}.agent_run (id, conversation_id, user_id, user_message_id, status,"
                "       created_at, started_at, finished_at)"
                " SELECT {s}.run_id_at(now() - interval '29 hours' + (substr(conversation_id, 4)::int * interval '10 s')),"
                "        conversation_id, 'u', id, 'completed', now() - interval '29 hours',"
                "        now() - interval '29 hours', now() - interval '28 hours' FROM m RETURNING id)"
                " INSERT INTO {s}.run_event (run_id, seq, type)"
                " SELECT r.id, q, CASE WHEN q = 20 THEN 'complete' ELSE 'x' END FROM r, generate_series(1, 20) q"
            ).format(s=s)
        )
        before = await runrow.journal_partitions(conn, schema=schema)

        async def agent(run: runrow.RunContext) -> None:
            for i in range(30):
                await run.text(f"{i} ")
                await anyio.sleep(0.005)

        got: dict[uuid.UUID, list[int]] = {}

        async def follow(run_id: uuid.UUID) -> None:
            got[run_id] = [e.seq async for e in runrow.tail(dsn, run_id, schema=schema)]

        dropped = 0
        async with (
            runrow.Dispatcher(dsn, agent, schema=schema, concurrency=8, **FAST),
            anyio.create_task_group() as tg,
        ):
            runs = []
            for i in range(24):
                run = await runrow.enqueue(
                    dsn, schema=schema, conversation_id=f"live{i}", user_id="u", content="q"
                )
                runs.append(run.id)
                tg.start_soon(follow, run.id)
                if i % 6 == 5:
                    dropped += (
                        await runrow.trim(dsn, schema=schema, retention=timedelta(hours=24))
                    ).partitions
        dropped += (await runrow.trim(dsn, schema=schema, retention=timedelta(hours=24))).partitions
        after = await runrow.journal_partitions(conn, schema=schema)
        assert dropped >= 2, (before, after)  # the old runs' hours went, whole
        cur = await conn.execute(
            sql.SQL(
                "SELECT count(*) FROM {}.run_event e JOIN {}.agent_run r ON r.id = e.run_id"
                " WHERE r.conversation_id LIKE 'old%%'"
            ).format(s, s)
        )
        assert await cur.fetchone() == (0,)
        for run_id in runs:
            evs = await assert_journal_sound(conn, schema, run_id)
            assert got[run_id] == [seq for seq, _, _ in evs]


def _appends_on_the_journal(plan: dict[str, object]) -> list[dict[str, object]]:
    found = []
    if plan.get("Node Type") == "Append" and any(
        str(p.get("Relation Name", "")).startswith("run_event")
        for p in plan.get("Plans", [])  # type: ignore[attr-defined]
    ):
        found.append(plan)
    for child in plan.get("Plans", []):  # type: ignore[attr-defined]
        found += _appends_on_the_journal(child)
    return found


async def test_the_claim_reads_each_runs_last_seq_from_its_partition_alone(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """The claim reads each claimed run's last seq through journal_last_seq (migration
    0025): the claim's own plan scans no partition of the journal (a recheck of a row
    updated concurrently initialises every subplan of a statement again, and a second
    initialisation of a scan pruned as it runs crashed PostgreSQL 18), and the function
    looks up one partition, chosen as its lookup starts (the run id is its parameter),
    never building those made ahead. The run still gets its own last seq."""
    run = await runrow.enqueue(dsn, conversation_id="c", user_id="u", content="x", schema=schema)
    ahead = [p for p in await runrow.journal_partitions(dsn, schema=schema) if p.name != "run_event_legacy"]
    assert len(ahead) >= 4  # (today's and those made ahead)
    q = statement_positional("claim", schema, claims._off(False, False, False, False))
    req = claims.ClaimRequest("fair", 1, 30.0, "w")
    cur = psycopg.AsyncRawCursor(conn)
    async with conn.transaction(force_rollback=True):
        await cur.execute(b"EXPLAIN (ANALYZE, FORMAT JSON) " + q.query, q.bind(claims._params(req)))
        row = await cur.fetchone()
    assert row is not None
    assert _appends_on_the_journal(row[0][0]["Plan"]) == []
    assert "journal_last_seq" in q.query.decode()
    # The function's lookup, as it plans it (generic: the run id a parameter).
    async with conn.transaction(force_rollback=True):
        await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        await conn.execute(
            sql.SQL(
                "PREPARE last_seq (uuid) AS SELECT max(e.seq) FROM {}.run_event e"
                " WHERE e.run_id = $1 AND {}.run_ms(e.run_id) = {}.run_ms($1)"
            ).format(sql.Identifier(schema), sql.Identifier(schema), sql.Identifier(schema))
        )
        cur2 = await conn.execute(
            sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE last_seq ({})").format(sql.Literal(str(run.id)))
        )
        plan = (await cur2.fetchone())[0][0]["Plan"]  # type: ignore[index]
        await conn.execute("DEALLOCATE last_seq")
    scanned = _relations(plan)
    assert scanned and all(r.startswith("run_event") for r in scanned), scanned
    assert len(scanned) == 1, scanned  # (one partition: the others pruned as it starts)
    rows = await claims.run(conn, schema, req)
    assert [(r.id, r.last_seq) for r in rows] == [(run.id, 2)]


def _relations(plan: dict[str, object]) -> set[str]:
    found = {str(plan["Relation Name"])} if "Relation Name" in plan else set()
    for child in plan.get("Plans", []):  # type: ignore[attr-defined]
        found |= _relations(child)
    return found
