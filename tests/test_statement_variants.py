"""The hot statements' variants (fragments switched off, see ``runrow._sql``): each one
the claimer or the ending writer may send is valid on a real server, switches off only
what it names, and is chosen only when the steps it drops would read nothing."""

from __future__ import annotations

import itertools
import uuid
from datetime import timedelta

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

import runrow
from runrow._gateway import claims, endings, statement_positional

from .helpers import empty, table

pytestmark = pytest.mark.anyio

_CLAIM_OFF = ("tree_open", "tree_capped", "version_open", "limits_open", "limits_grant", "stamp_many")


def _claim_variants() -> list[frozenset[str]]:
    return [
        claims._off(tree, version, limits, one)
        for tree, version, limits, one in itertools.product((False, True), repeat=4)
    ]


def _finalize_variants() -> list[frozenset[str]]:
    return sorted(set(endings._OFF.values()), key=sorted)


def test_a_variant_writes_the_off_form_in_place_of_each_fragment_it_names() -> None:
    full = statement_positional("claim", "s").query.decode()
    for off in _claim_variants():
        text = statement_positional("claim", "s", off).query.decode()
        assert set(off) <= set(_CLAIM_OFF)
        assert (text == full) == (not off)
        assert ("limit_granted" in text) == ("limits_grant" not in off)
        assert ("PARTITION BY c.root_run_id" in text) == ("tree_capped" not in off)
        assert ("run_step" in text) == ("version_open" not in off)
        assert ("a.id = (SELECT id FROM allowed)" in text) == ("stamp_many" in off)
    assert "same_version" not in statement_positional("claim", "s", frozenset({"version_open"})).names


def test_the_finalize_variant_keeps_each_step_a_batch_needs() -> None:
    def ending(**kw: object) -> endings.Ending:
        base: dict[str, object] = {
            "run_id": uuid.uuid4(),
            "claim_token": uuid.uuid4(),
            "status": "completed",
            "error": None,
            "partial": None,
            "events": [(3, "complete", "{}")],
        }
        return endings.Ending(**{**base, **kw})  # type: ignore[arg-type]

    steps = {"retried", "gate_shut", "usage_rolled", "answer_saved"}
    assert endings._off([ending()]) == steps
    assert endings._off([ending(), ending(retry=True, status="failed")]) == steps - {"retried"}
    assert endings._off([ending(status="queued", retry_after=1.0, gate_key="k")]) == steps - {"gate_shut"}
    usage = [(3, "usage", "{}"), (4, "complete", "{}")]
    assert endings._off([ending(events=usage)]) == steps - {"usage_rolled"}
    assert endings._off([ending(), ending(partial="")]) == steps - {"answer_saved"}
    assert len(_finalize_variants()) == 16


async def test_every_variant_is_valid_on_the_server(schema: str, conn: psycopg.AsyncConnection) -> None:
    """Each variant parses and plans against the migrated schema (prepared, not run)."""
    texts = [
        statement_positional(name, schema, off).query
        for name in ("claim", "claim_fifo")
        for off in _claim_variants()
    ] + [statement_positional("finalize", schema, off).query for off in _finalize_variants()]
    texts.append(statement_positional("append_events", schema, frozenset({"usage_rolled"})).query)
    assert len(set(texts)) == len(texts) == 2 * 16 + 16 + 1
    for i, text in enumerate(texts):
        result = conn.pgconn.prepare(f"variant_{i}".encode(), text)
        assert result.status == psycopg.pq.ExecStatus.COMMAND_OK, (
            i,
            (result.error_message or b"").decode(),
        )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    # (tenant, conversation, priority, delayed an hour, spawned in a tree)
    turns=st.lists(
        st.tuples(
            st.sampled_from(["A", "B", None]),
            st.sampled_from("xyz"),
            st.sampled_from([0, 1]),
            st.booleans(),
            st.booleans(),
        ),
        min_size=1,
        max_size=12,
    ),
    started=st.integers(min_value=0, max_value=2),
    limit=st.integers(min_value=1, max_value=4),
)
async def test_a_variant_claims_exactly_what_the_whole_claim_claims(
    dsn: str,
    schema: str,
    conn: psycopg.AsyncConnection,
    turns: list[tuple[str | None, str, int, bool, bool]],
    started: int,
    limit: int,
) -> None:
    """With no rate limit defined, no cap per tree and the replay policy, the claim with
    every step switched off picks the same runs, in the same order, as the claim with
    every step on (each in a transaction rolled back)."""
    await empty(conn, schema)
    root = None
    for tenant, conversation, priority, delayed, spawned in turns:
        run = await runrow.enqueue(
            dsn,
            schema=schema,
            conversation_id=f"{tenant}-{conversation}",
            user_id="u",
            content=conversation,
            tenant_id=tenant,
            priority=priority,
            not_before=timedelta(hours=1) if delayed else None,
        )
        root = root or run.id
        if spawned and root != run.id:  # (a made-up tree, passed as the whole claim does)
            await conn.execute(
                sql.SQL("UPDATE {} SET parent_run_id = %s, root_run_id = %s WHERE id = %s").format(
                    table(schema, "agent_run")
                ),
                (root, root, run.id),
            )
    for _ in range(started):
        await claims.claim(conn, schema, order="fair", limit=1, lease_seconds=30, worker_id="w")
    for order in ("fair", "fifo"):
        req = claims.ClaimRequest(order, limit, 30.0, "w", limits=False)  # type: ignore[arg-type]
        whole = statement_positional("claim" if order == "fair" else "claim_fifo", schema)
        picks = []
        for query, params in (
            claims.statement(schema, req),
            (whole.query, whole.bind(claims._params(req))),
        ):
            async with conn.transaction(force_rollback=True):
                cur = claims.rows_cursor(conn)
                await cur.execute(query, params)
                picks.append([(r.id, r.limited) for r in await claims.fetch(cur)])
        assert picks[0] == picks[1], order
