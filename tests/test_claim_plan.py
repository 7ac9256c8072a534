"""The claim's work stays proportional to what it claims, even when the planner's
statistics say the queue is empty.

A common production shape: ANALYZE ran while nothing was queued (statistics say no row
is 'queued'), then a burst arrives. Planned on those statistics, the fair claim once
turned its "no older turn of this conversation" check into an anti-join that scanned the
whole queue for every queued run: 150,000 buffer reads and 50 ms per claim for 400
queued runs, quadratic in the queue. Buffer reads are counted by the server and do not
depend on the machine's speed, so they make a deterministic bound (not a timing).
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg import sql

from runrow._gateway import claims, statement_positional, statement_text

from .bulk import SEED, seed
from .helpers import table

pytestmark = pytest.mark.anyio

BURST = 400


async def _history(conn: psycopg.AsyncConnection, schema: str, n: int) -> None:
    """``n`` runs that ended (their entries still in the live-turn index until a vacuum),
    then ANALYZE: statistics that say nothing is live."""
    await seed(conn, schema, tenant=None, n=n, conversations=n, prefix="old")
    await conn.execute(
        sql.SQL(
            "UPDATE {} SET status = 'completed', claim_token = gen_random_uuid(),"
            " claim_expires_at = now(), started_at = now(), finished_at = now()"
        ).format(table(schema, "agent_run"))
    )
    await conn.execute(sql.SQL("ANALYZE {}").format(table(schema, "agent_run")))


async def _history_then_burst(conn: psycopg.AsyncConnection, schema: str, tenants: int = 0) -> None:
    """2,000 finished runs, ANALYZE with nothing queued, then a burst of queued runs
    (of the default tenant, or spread over ``tenants`` tenants: the fair path)."""
    await _history(conn, schema, 2_000)
    # The burst: inserted after the ANALYZE, so the statistics still say none is queued
    # (seed()'s own statement, without the ANALYZE seed() runs after it).
    query = sql.SQL(SEED).format(
        run=table(schema, "agent_run"), message=table(schema, "message"), event=table(schema, "run_event")
    )
    if not tenants:
        await conn.execute(
            query, {"prefix": "burst", "conversations": BURST // 2, "tenant": None, "n": BURST}
        )
    for k in range(tenants):
        await conn.execute(
            query,
            {
                "prefix": f"burst{k}",
                "conversations": BURST // tenants // 2,
                "tenant": f"t{k}",
                "n": BURST // tenants,
            },
        )


async def _explained(
    conn: psycopg.AsyncConnection, query: bytes, bound: tuple[Any, ...], *, generic: bool
) -> tuple[Any, dict[str, Any]]:
    """EXPLAIN ANALYZE of the positional ``query`` (in a transaction rolled back): the
    whole document and its top plan. ``generic``: prepared first, under a generic plan,
    as the dispatcher's warm connection runs it (each of those two runs claims too)."""
    cur = psycopg.AsyncRawCursor(conn)
    async with conn.transaction(force_rollback=True):
        if generic:
            await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            for _ in range(2):
                await cur.execute(query, bound, prepare=True)
        await cur.execute(b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, bound)
        row = await cur.fetchone()
    assert row is not None
    doc = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    return doc, doc[0]["Plan"]


def _buffers(plan: dict[str, Any]) -> int:
    return int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))


@pytest.mark.parametrize(
    ("statement", "tenants"),
    [("claim", 0), ("claim", 20), ("claim_fifo", 0)],
    ids=["claim", "claim-20-tenants", "claim_fifo"],
)
@pytest.mark.parametrize("generic", [False, True], ids=["custom-plan", "generic-plan"])
# (same_version: Dispatcher(resume_policy="same_version"), whose version test each
# candidate also passes: these fresh runs are any worker's.)
@pytest.mark.parametrize("same_version", [False, True], ids=["replay", "same-version"])
# (lean: the variant a worker sends while no rate limit is defined, its steps switched off.)
@pytest.mark.parametrize("lean", [False, True], ids=["whole", "lean"])
async def test_a_claim_after_a_burst_on_stale_statistics_is_not_quadratic(
    conn: psycopg.AsyncConnection,
    schema: str,
    statement: str,
    tenants: int,
    generic: bool,
    same_version: bool,
    lean: bool,
) -> None:
    await _history_then_burst(conn, schema, tenants)
    params = {
        "limit": 4,
        "lease_seconds": 30.0,
        "worker_id": "plan-test",
        "now": None,
        "retry_policy": None,
        "version": None,
        "same_version": same_version,
        "agent_keys": [],
        "serves_default": True,
        "tree_cap": None,
    }
    off = claims._off(False, same_version, False, False) if lean else frozenset()
    positional = statement_positional(statement, schema, off)
    query, bound = positional.query, positional.bind(params)
    doc, plan = await _explained(conn, query, bound, generic=generic)
    # The claim took what it asked for ...
    assert plan["Actual Rows"] == 4
    # ... reading a bounded number of buffers per queued run (the quadratic plan read
    # about 400 per queued run; an ordered walk or a linear scan reads a handful).
    assert _buffers(plan) < 15 * BURST, json.dumps(doc, indent=1)[:4000]


async def test_a_stop_after_many_ended_runs_probes_the_tree_indexes(
    conn: psycopg.AsyncConnection, schema: str
) -> None:
    """Stop's sweep of a run's tree (lock_descendants, twice per stop) reads a handful of
    buffers for a run with no tree, however many runs ended since the last vacuum (their
    entries linger in the live-turn index: a walk of it read them all)."""
    await _history(conn, schema, 20_000)
    await seed(conn, schema, tenant=None, n=1, conversations=1, prefix="new")
    cur = await conn.execute(
        sql.SQL("SELECT id FROM {} WHERE status = 'queued'").format(table(schema, "agent_run"))
    )
    (run_id,) = await cur.fetchone() or (None,)
    async with conn.transaction(force_rollback=True):
        cur = await conn.execute(
            b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement_text("lock_descendants", schema),
            {"conversation_id": None, "run_id": run_id},
        )
        row = await cur.fetchone()
    assert row is not None
    doc = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    assert _buffers(doc[0]["Plan"]) < 100, json.dumps(doc, indent=1)[:4000]


def _scans_of(plan: dict[str, Any], relation: str) -> list[str]:
    """The executed scans of ``relation`` in ``plan``, by node type."""
    found = []
    if plan.get("Relation Name") == relation and plan.get("Actual Loops", 0) > 0:
        found.append(str(plan["Node Type"]))
    for child in plan.get("Plans", []):
        found += _scans_of(child, relation)
    return found


@pytest.mark.parametrize("statement", ["claim", "claim_fifo"])
@pytest.mark.parametrize("lean", [False, True], ids=["whole", "lean"])
async def test_a_claim_of_one_run_probes_it_by_key_on_a_small_table(
    conn: psycopg.AsyncConnection, schema: str, statement: str, lean: bool
) -> None:
    """A claim of one run (the usual claim: a slot came free) stamps the run it locked by
    its primary key. With the ids as an array of unknown length the generic plan counted
    ten of them, and on a young table of a few hundred runs it read the whole table for
    the stamp on every claim (a fresh installation's size: this is what a newcomer's
    first worker did)."""
    query = sql.SQL(SEED).format(
        run=table(schema, "agent_run"), message=table(schema, "message"), event=table(schema, "run_event")
    )
    await conn.execute(query, {"prefix": "old", "conversations": 600, "tenant": None, "n": 600})
    await conn.execute(
        sql.SQL(
            "UPDATE {} SET status = 'completed', claim_token = gen_random_uuid(),"
            " claim_expires_at = now(), started_at = now(), finished_at = now()"
        ).format(table(schema, "agent_run"))
    )
    # (Three queued: the two executions that prepare the statement take one each. No
    # ANALYZE: a young table's planner works from its size on disk.)
    await conn.execute(query, {"prefix": "new", "conversations": 3, "tenant": None, "n": 3})
    order: claims.ClaimOrder = "fair" if statement == "claim" else "fifo"
    req = claims.ClaimRequest(order, 1, 30.0, "w", limits=not lean)
    claim, bound = claims.statement(schema, req)
    doc, plan = await _explained(conn, claim, bound, generic=True)
    assert plan["Actual Rows"] == 1
    assert "Seq Scan" not in _scans_of(plan, "agent_run"), json.dumps(doc, indent=1)[:4000]
