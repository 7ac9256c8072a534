"""Webhook delivery (#42) against a real local HTTP receiver (tests/webhook_receiver.py)
that verifies each Standard Webhooks signature, and fails, times out, answers slowly or
goes away: every ending is delivered exactly once by delivery id after retries, a dead
delivery can be sent again, and a worker killed mid-delivery leaves it to be redelivered."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

import runrow
from runrow._engine.webhooks import DeliveryService, backoff

from .bulk import seed
from .helpers import table, wait_for
from .webhook_receiver import Receiver

pytestmark = pytest.mark.anyio

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


async def _noop(run: runrow.RunContext) -> None:
    return None


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retries within a test's patience (the service's knobs, not the database)."""
    monkeypatch.setattr(DeliveryService, "backoff_base", 0.02)
    monkeypatch.setattr(DeliveryService, "backoff_cap", 0.2)
    monkeypatch.setattr(DeliveryService, "idle_wait", 0.05)
    monkeypatch.setattr(DeliveryService, "max_attempts", 60)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver(SECRET) as r:
        yield r


async def _states(conn: psycopg.AsyncConnection, schema: str) -> dict[str, int]:
    cur = await conn.execute(
        sql.SQL("SELECT state, count(*) FROM {} GROUP BY state").format(table(schema, "webhook_delivery"))
    )
    return {s: int(n) for s, n in await cur.fetchall()}


async def _delivered(conn: psycopg.AsyncConnection, schema: str, n: int) -> bool:
    return (await _states(conn, schema)).get("delivered", 0) >= n


async def _exactly_once(conn: psycopg.AsyncConnection, schema: str, receiver: Receiver, n: int) -> None:
    cur = await conn.execute(
        sql.SQL("SELECT id::text, run_id::text, state FROM {}").format(table(schema, "webhook_delivery"))
    )
    rows = await cur.fetchall()
    assert len(rows) == n and {s for _, _, s in rows} == {"delivered"}
    assert set(receiver.accepted) == {i for i, _, _ in rows}
    assert set(receiver.accepted.values()) == {1}, "a delivery accepted twice"
    assert {receiver.bodies[i]["data"]["run_id"] for i, _, _ in rows} == {r for _, r, _ in rows}
    assert receiver.bad_signatures == 0


@pytest.mark.parametrize("n", [60, pytest.param(1000, marks=pytest.mark.slow)])
async def test_every_ending_is_delivered_exactly_once_through_failures(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, receiver: Receiver, fast: None, n: int
) -> None:
    receiver.fail_rate = 1 / 3
    await runrow.add_webhook(dsn, "r", receiver.url, secret=SECRET, allow_private=True, schema=schema)
    await seed(conn, schema, tenant=None, n=n, conversations=n)
    async with runrow.Dispatcher(dsn, _noop, schema=schema, poll=0.5, concurrency=16):
        await wait_for(lambda: _delivered(conn, schema, n), timeout=120 if n > 100 else 60, what="delivered")
    await _exactly_once(conn, schema, receiver, n)
    assert sum(receiver.attempts.values()) > n  # (it did fail, and was retried)
    [one] = await runrow.webhook_deliveries(dsn, limit=1, schema=schema)
    assert one.payload["type"] == "run.completed" and one.attempts >= 1


async def test_dead_after_the_bound_then_redelivered(
    dsn: str,
    schema: str,
    conn: psycopg.AsyncConnection,
    receiver: Receiver,
    fast: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(DeliveryService, "max_attempts", 3)
    receiver.fail_rate = 1.0
    await runrow.add_webhook(dsn, "r", receiver.url, secret=SECRET, allow_private=True, schema=schema)
    sent = await runrow.send_test_webhook(dsn, "r", schema=schema)
    assert sent is not None
    async with runrow.Dispatcher(dsn, _noop, schema=schema, poll=0.5):
        await wait_for(lambda: _state_is(dsn, schema, sent.id, "dead"), timeout=30, what="dead")
        [dead] = await runrow.webhook_deliveries(dsn, state="dead", schema=schema)
        assert dead.attempts == 3 and dead.last_status == 500
        assert receiver.attempts[str(sent.id)] == 3
        receiver.fail_rate = 0.0
        again = await runrow.redeliver(dsn, sent.id, schema=schema)
        assert again is not None and again.state == "pending"
        await wait_for(lambda: _state_is(dsn, schema, sent.id, "delivered"), timeout=30, what="delivered")
    assert receiver.accepted[str(sent.id)] == 1
    assert receiver.bodies[str(sent.id)]["type"] == "webhook.test"


async def _state_is(dsn: str, schema: str, delivery_id: uuid.UUID, state: str) -> bool:
    found = await runrow.webhook_deliveries(dsn, state=state, schema=schema)
    return any(d.id == delivery_id for d in found)


async def test_a_timeout_and_a_receiver_gone_are_retried(
    dsn: str, schema: str, receiver: Receiver, fast: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(DeliveryService, "timeout", 0.5)
    receiver.delay = 2.0  # slower than the timeout: each attempt times out
    await runrow.add_webhook(dsn, "slow", receiver.url, secret=SECRET, allow_private=True, schema=schema)
    # A receiver gone: a port nothing listens on (bound, then closed).
    with Receiver(SECRET) as gone:
        url = gone.url
    await runrow.add_webhook(dsn, "gone", url, secret=SECRET, allow_private=True, schema=schema)
    slow = await runrow.send_test_webhook(dsn, "slow", schema=schema)
    lost = await runrow.send_test_webhook(dsn, "gone", schema=schema)
    assert slow is not None and lost is not None
    async with runrow.Dispatcher(dsn, _noop, schema=schema, poll=0.5):
        await wait_for(lambda: _retried(dsn, schema, 2), timeout=30, what="both failed twice")
        by_hook = {d.webhook: d for d in await runrow.webhook_deliveries(dsn, schema=schema)}
        assert "Timeout" in (by_hook["slow"].last_error or "")
        assert by_hook["gone"].last_error and by_hook["gone"].last_status is None
        receiver.delay = 0.0  # answers in time now
        await wait_for(lambda: _state_is(dsn, schema, slow.id, "delivered"), timeout=30, what="delivered")
    assert receiver.accepted[str(slow.id)] == 1


async def _retried(dsn: str, schema: str, attempts: int) -> bool:
    found = await runrow.webhook_deliveries(dsn, schema=schema)
    return len(found) == 2 and all(d.attempts >= attempts and d.last_error for d in found)


async def test_a_runs_later_delivery_waits_for_its_earlier_one(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Two deliveries of one lineage to one subscription: the claim takes the later only
    once the earlier is no longer pending."""
    from runrow._gateway import webhooks as gw
    from runrow._gateway._exec import run

    await runrow.add_webhook(dsn, "r", "http://127.0.0.1:9/x", allow_private=True, schema=schema)
    lineage = uuid.uuid4()
    await conn.execute(
        sql.SQL(
            "INSERT INTO {} (webhook, run_id, lineage, event_type, payload) "
            "SELECT 'r', %s, %s, 'run.failed', jsonb_build_object('n', g) FROM generate_series(1, 2) g"
        ).format(table(schema, "webhook_delivery")),
        (lineage, lineage),
    )
    first = await run(conn, gw.claim(schema, limit=10, lease_seconds=30))
    assert [c.payload["n"] for c in first] == [1]
    assert await run(conn, gw.claim(schema, limit=10, lease_seconds=30)) == []  # (leased, and blocking)
    await run(
        conn,
        gw.record(
            schema,
            delivery_id=first[0].id,
            attempts=1,
            ok=True,
            status=204,
            error=None,
            max_attempts=5,
            retry_in=0,
        ),
    )
    second = await run(conn, gw.claim(schema, limit=10, lease_seconds=30))
    assert [c.payload["n"] for c in second] == [2]


def test_backoff_grows_and_is_capped() -> None:
    assert all(0 <= backoff(1, 2.0, 3600) <= 2.0 for _ in range(100))
    assert all(0 <= backoff(40, 2.0, 60) <= 60 for _ in range(100))
    assert max(backoff(6, 2.0, 3600) for _ in range(200)) > 2.0


@pytest.mark.slow
async def test_a_worker_killed_mid_delivery_leaves_it_to_be_redelivered(
    dsn: str,
    schema: str,
    conn: psycopg.AsyncConnection,
    receiver: Receiver,
    fast: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    receiver.hang = True  # the first attempt is held open until the worker is killed
    await runrow.add_webhook(dsn, "r", receiver.url, secret=SECRET, allow_private=True, schema=schema)
    sent = await runrow.send_test_webhook(dsn, "r", schema=schema)
    assert sent is not None
    env = {
        **os.environ,
        "RUNROW_TEST_DSN": dsn,
        "RUNROW_TEST_SCHEMA": schema,
        "RUNROW_TEST_HOOK_TIMEOUT": "2",
    }
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.webhook_worker"], cwd=root, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        assert receiver.arrived.wait(30), "the worker never posted"
        proc.kill()  # SIGKILL, mid-delivery: no answer read, no outcome recorded
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
    [held] = await runrow.webhook_deliveries(dsn, schema=schema)
    assert held.state == "pending" and held.attempts == 1 and held.last_status is None
    receiver.hang = False
    receiver.release.set()
    async with runrow.Dispatcher(dsn, _noop, schema=schema, poll=0.5):
        # (Claimed again once the killed claim's lease lapses: 2 * 2 s + 5 s.)
        await wait_for(lambda: _state_is(dsn, schema, sent.id, "delivered"), timeout=60, what="redelivered")
    [done] = await runrow.webhook_deliveries(dsn, schema=schema)
    assert done.attempts == 2
    assert receiver.attempts[str(sent.id)] == 2 and receiver.accepted[str(sent.id)] >= 1
