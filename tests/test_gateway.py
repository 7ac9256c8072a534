"""The gateway's records match the columns their statements return."""

from __future__ import annotations

import psycopg
import pytest

import runrow
from runrow._gateway import claims

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("order", ["fair", "fifo"])
async def test_a_claimed_row_is_read_by_column_name(
    dsn: str,
    schema: str,
    conn: psycopg.AsyncConnection,
    order: claims.ClaimOrder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ClaimedRun is built from the row by position; the claim checks the names once per
    process. Here each statement is checked afresh, and the record carries the run."""
    monkeypatch.setattr(claims, "_checked", False)
    run = await runrow.enqueue(
        dsn, schema=schema, conversation_id="c", user_id="u", content={"x": 1}, tenant_id="t"
    )
    (row,) = await claims.claim(conn, schema, order=order, limit=1, lease_seconds=30, worker_id="w")
    assert claims._checked
    assert (row.id, row.conversation_id, row.user_id, row.tenant_id, row.content, row.last_seq) == (
        run.id,
        "c",
        "u",
        "t",
        {"x": 1},
        2,
    )
    assert row.claim_token is not None and row.started_at >= row.created_at and row.deadline_at is None


async def test_a_claim_whose_columns_drift_is_refused(
    schema: str, conn: psycopg.AsyncConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(claims, "_checked", False)
    monkeypatch.setattr(claims.ClaimedRun, "_fields", ("id", *claims.ClaimedRun._fields[2:], "claim_token"))
    await runrow.enqueue(conn, schema=schema, conversation_id="c", user_id="u", content=1)
    with pytest.raises(RuntimeError, match="not the fields of ClaimedRun"):
        await claims.claim(conn, schema, order="fair", limit=1, lease_seconds=30, worker_id="w")
