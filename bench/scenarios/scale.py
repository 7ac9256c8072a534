"""scale: claim and tail-read latency with few vs many finished runs and journal rows.

The finished history is seeded with one bulk SQL statement per table (rows a finished
run would leave: its user message, the run, its journal), then VACUUM ANALYZE, as
autovacuum would do in time. The live runs are enqueued through runrow. The claim and
the tail read are runrow's own statements (sql/claims.sql claim, sql/journal.sql
read_events) timed on a plain psycopg connection; each claimed run is then finalised
(untimed) so the next claim meets the same queue.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from lib import Bench, Row, channels, finalize_params, latency_rows, statement
from psycopg import sql

from runrow._gateway.claims import ClaimedRun

LAST_SEQ = ClaimedRun._fields.index("last_seq")  # the claim's RETURNING column (it grew past it)

# (Run ids: md5s with the version nibble set to 4, as ids made before schema 20 were: an
# md5 that happened to read as a time-ordered id would route to a journal partition for a
# made-up time that nobody makes.)
SEED = """
INSERT INTO {s}.message (id, conversation_id, role, content, status, user_id, created_at, turn)
SELECT md5('m' || g)::uuid, 'hist' || (g %% 5000), 'user', '"hello"', 'sent', 'u',
       now() - interval '30 days' + g * interval '1 ms', g
FROM generate_series(1, %(runs)s) g;
INSERT INTO {s}.agent_run (id, conversation_id, user_id, user_message_id, status, claim_token,
                           claim_expires_at, worker_id, created_at, started_at, last_heartbeat_at, finished_at)
SELECT overlay(md5('r' || g) PLACING '4' FROM 13 FOR 1)::uuid, 'hist' || (g %% 5000), 'u', md5('m' || g)::uuid, 'completed', gen_random_uuid(),
       now() - interval '29 days', 'seed', now() - interval '30 days' + g * interval '1 ms',
       now() - interval '30 days', now() - interval '30 days', now() - interval '29 days'
FROM generate_series(1, %(runs)s) g;
INSERT INTO {s}.run_event (run_id, seq, type, payload)
SELECT overlay(md5('r' || (1 + (g - 1) %% %(runs)s)) PLACING '4' FROM 13 FOR 1)::uuid, 1 + (g - 1) / %(runs)s,
       CASE WHEN g > %(events)s - %(runs)s THEN 'complete' ELSE 'content_delta' END,
       CASE WHEN g > %(events)s - %(runs)s THEN '{{"status": "completed"}}'::jsonb
            ELSE '{{"delta": "some streamed text of a plausible length"}}'::jsonb END
FROM generate_series(1, %(events)s) g;
"""


async def _seed(b: Bench, schema: str, runs: int, events: int) -> float:
    t0 = time.monotonic()
    async with await psycopg.AsyncConnection.connect(b.conninfo, autocommit=True) as conn:
        async with conn.transaction():
            for part in filter(str.strip, SEED.split(";")):
                q = sql.SQL(part).format(s=sql.Identifier(schema))  # type: ignore[arg-type]
                await conn.execute(q, {"runs": runs, "events": max(events, runs)})
        await conn.execute(sql.SQL("VACUUM ANALYZE {}.agent_run").format(sql.Identifier(schema)))
        await conn.execute(sql.SQL("VACUUM ANALYZE {}.run_event").format(sql.Identifier(schema)))
        await conn.execute(sql.SQL("VACUUM ANALYZE {}.message").format(sql.Identifier(schema)))
    return time.monotonic() - t0


class _Probe:
    def __init__(self, b: Bench, schema: str, conn: psycopg.AsyncConnection, runs: int) -> None:
        self.b, self.schema, self.conn, self.runs = b, schema, conn, runs
        self.claim = statement("claim", schema)
        self.finalize = statement("finalize", schema)
        self.read = statement("read_events", schema)
        self.ch = channels(schema)
        self.done: list[Any] = []  # live runs claimed and finalised here (3 journal rows each)

    async def claim_ms(self) -> float:
        t0 = time.perf_counter()
        cur = await self.conn.execute(
            self.claim,
            {
                "limit": 1,
                "lease_seconds": 30.0,
                "worker_id": "probe",
                "now": None,
                "retry_policy": None,
                "version": None,
                "same_version": False,
                "agent_keys": [],
                "serves_default": True,
                "tree_cap": None,
            },
        )
        rows = await cur.fetchall()
        ms = (time.perf_counter() - t0) * 1000
        assert rows, "the scale probe ran out of queued runs"
        r = rows[0]
        await self.conn.execute(self.finalize, finalize_params(self.ch, [(r[0], r[1], int(r[LAST_SEQ]) + 1)]))
        self.done.append(r[0])
        return ms

    async def tail_ms(self) -> float:
        """A tail's read of a live run's journal (the run just finalised: 3 rows)."""
        run_id = self.done[-1]
        t0 = time.perf_counter()
        cur = await self.conn.execute(self.read, {"run_id": run_id, "after": 0, "limit": 500})
        rows = await cur.fetchall()
        ms = (time.perf_counter() - t0) * 1000
        assert rows
        return ms

    async def explain(self) -> dict[str, str]:
        out = {}
        async with self.conn.transaction(force_rollback=True):
            cur = await self.conn.execute(
                b"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + self.claim,
                {
                    "limit": 1,
                    "lease_seconds": 30.0,
                    "worker_id": "probe",
                    "now": None,
                    "retry_policy": None,
                    "version": None,
                    "same_version": False,
                    "agent_keys": [],
                    "serves_default": True,
                    "tree_cap": None,
                },
            )
            out["claim"] = "\n".join(r[0] for r in await cur.fetchall())
        cur = await self.conn.execute(
            b"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + self.read,
            {"run_id": self.done[-1], "after": 0, "limit": 500},
        )
        out["tail read (read_events)"] = "\n".join(r[0] for r in await cur.fetchall())
        return out


async def scale(b: Bench) -> tuple[list[Row], dict[str, str]]:
    p = b.profile
    n = p.scale_samples
    small_runs, big_runs = p.scale_small, p.scale_big
    async with b.schema("scale_s") as s_small, b.schema("scale_b") as s_big:
        seed_small = await _seed(b, s_small, small_runs, p.scale_events_small)
        seed_big = await _seed(b, s_big, big_runs, p.scale_events_big)
        for s in (s_small, s_big):
            await b.enqueue_many(s, n + 5, prefix="live")
        async with (
            await psycopg.AsyncConnection.connect(b.conninfo, autocommit=True) as c1,
            await psycopg.AsyncConnection.connect(b.conninfo, autocommit=True) as c2,
        ):
            small, big = _Probe(b, s_small, c1, small_runs), _Probe(b, s_big, c2, big_runs)
            claim: dict[str, list[float]] = {"small": [], "big": []}
            read: dict[str, list[float]] = {"small": [], "big": []}
            for _ in range(3):  # warm-up
                await small.claim_ms(), await big.claim_ms(), await small.tail_ms(), await big.tail_ms()
            for i in range(n):
                pair = ((small, "small"), (big, "big")) if i % 2 == 0 else ((big, "big"), (small, "small"))
                for probe, key in pair:
                    claim[key].append(await probe.claim_ms())
                    read[key].append(await probe.tail_ms())
            explains = {
                f"{k} ({big_runs:,} finished runs, {p.scale_events_big:,} journal rows)": v
                for k, v in (await big.explain()).items()
            }
    blocks = p.reps + 1
    note = f"seeded in {seed_small:.0f}s / {seed_big:.0f}s"
    rows = []
    for what, data, ev_small, ev_big in (
        ("claim", claim, small_runs, big_runs),
        ("tail read", read, p.scale_events_small, p.scale_events_big),
    ):
        unit_small = f"{ev_small:,} {'finished runs' if what == 'claim' else 'journal rows'}"
        unit_big = f"{ev_big:,}"
        got = latency_rows(
            "scale",
            f"{what}, {unit_big} vs {unit_small}",
            data["big"],
            blocks,
            baseline=data["small"],
            baseline_label=unit_small,
            goals=(("ratio <= 1.2", lambda v: True), None),
            note=note,
        )
        for r in got:
            if r.goal:
                r.met = r.ratio is not None and r.ratio <= 1.2
        rows += got
    return rows, explains
