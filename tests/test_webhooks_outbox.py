"""Webhooks' outbox (#42): every statement that makes a run terminal inserts its
deliveries in its own transaction (the fragment webhook_outbox), and only for the
subscriptions that want that ending; an ending rolled back leaves none."""

from __future__ import annotations

import anyio
import psycopg
import pytest

import runrow
from runrow._gateway import statement_text
from runrow._gateway._exec import run
from runrow._stop import _cancel
from runrow._webhooks import add_webhook

from .helpers import enqueue_turn, table, wait_for

pytestmark = pytest.mark.anyio

URL = "http://127.0.0.1:9/hook"


async def _outbox(conn: psycopg.AsyncConnection, schema: str) -> list[tuple[str, str, str]]:
    cur = await conn.execute(
        psycopg.sql.SQL("SELECT webhook, run_id::text, event_type FROM {} ORDER BY seq").format(
            table(schema, "webhook_delivery")
        )
    )
    return [tuple(r) for r in await cur.fetchall()]  # type: ignore[misc]


def test_every_terminal_statement_takes_the_outbox() -> None:
    """The statements that write a terminal status each carry the fragment (a new ending
    path must too: this lists them)."""
    for name in ("finalize", "reap", "cancel_queued", "cancel_paused"):
        assert b'INSERT INTO "s".webhook_delivery' in statement_text(name, "s"), name


async def test_endings_fill_the_outbox_per_subscription(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    await add_webhook(dsn, "all", URL, allow_private=True, schema=schema)
    await add_webhook(dsn, "failures", URL, endings=["failed"], allow_private=True, schema=schema)
    await add_webhook(dsn, "tenant-b", URL, tenant_id="b", allow_private=True, schema=schema)

    async def agent(ctx: runrow.RunContext) -> None:
        if ctx.conversation_id.startswith("fail"):
            raise RuntimeError("boom")

    ok = await enqueue_turn(dsn, schema, "ok-1")
    bad = await enqueue_turn(dsn, schema, "fail-1")
    async with runrow.Dispatcher(dsn, agent, schema=schema, poll=0.2):
        await wait_for(lambda: _n(conn, schema, 3), timeout=30, what="three deliveries")
    # A queued turn cancelled (cancel_queued), of tenant b.
    queued = await enqueue_turn(dsn, schema, "later", tenant_id="b")
    await runrow.cancel_run(dsn, queued.id, schema=schema)
    rows = await _outbox(conn, schema)
    assert sorted((w, e) for w, r, e in rows if r == str(ok.id)) == [("all", "run.completed")]
    assert sorted((w, e) for w, r, e in rows if r == str(bad.id)) == [
        ("all", "run.failed"),
        ("failures", "run.failed"),
    ]
    assert sorted((w, e) for w, r, e in rows if r == str(queued.id)) == [
        ("all", "run.cancelled"),
        ("tenant-b", "run.cancelled"),
    ]
    assert len(rows) == 5


async def _n(conn: psycopg.AsyncConnection, schema: str, n: int) -> bool:
    return len(await _outbox(conn, schema)) >= n


async def test_no_subscription_no_outbox_row(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> None:
    t = await enqueue_turn(dsn, schema, "quiet")
    await runrow.cancel_run(dsn, t.id, schema=schema)
    assert await _outbox(conn, schema) == []


async def test_an_ending_rolled_back_has_no_delivery(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    await add_webhook(dsn, "all", URL, allow_private=True, schema=schema)
    t = await enqueue_turn(dsn, schema, "undone")
    async with await psycopg.AsyncConnection.connect(dsn) as c:
        await run(c, _cancel(schema, t.id))
        inside = await _outbox(c, schema)
        assert [e for _, _, e in inside] == ["run.cancelled"]
        await c.rollback()
    assert await _outbox(conn, schema) == []
    assert (await runrow.get_run(dsn, t.id, schema=schema)).status == "queued"
    # Committed, it has exactly one.
    await runrow.cancel_run(dsn, t.id, schema=schema)
    assert [e for _, _, e in await _outbox(conn, schema)] == ["run.cancelled"]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"url": "ftp://example.com/x"}, "url"),
        ({"url": "https://user:pw@example.com/x"}, "url"),
        ({"url": "http://127.0.0.1/x"}, "url"),
        ({"url": "http://10.0.0.5/x"}, "url"),
        ({"url": "http://localhost:8000/x"}, "url"),
        ({"url": "https://example.com/" + "x" * 3000}, "url"),
        ({"url": "https://example.com/x", "endings": ["done"]}, "endings"),
        ({"url": "https://example.com/x", "endings": []}, "endings"),
        ({"url": "https://example.com/x", "secret": "nope"}, "secret"),
        ({"url": "https://example.com/x", "secret": "whsec_!!"}, "secret"),
        ({"url": "https://example.com/x", "tenant_id": ""}, "tenant_id"),
    ],
)
async def test_bad_input_is_refused_before_any_write(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, kwargs: dict[str, object], field: str
) -> None:
    url = kwargs.pop("url")
    with pytest.raises(runrow.InvalidInput) as e:
        await add_webhook(dsn, "w", url, schema=schema, **kwargs)  # type: ignore[arg-type]
    assert e.value.field == field
    assert await runrow.list_webhooks(dsn, schema=schema) == []


async def test_add_list_remove_and_the_generated_secret(dsn: str, schema: str) -> None:
    w = await add_webhook(dsn, "w", "https://example.com/hook", schema=schema)
    assert w.secret.startswith("whsec_") and w.endings == ["completed", "failed", "cancelled", "expired"]
    with pytest.raises(runrow.InvalidInput) as e:
        await add_webhook(dsn, "w", "https://example.com/hook", schema=schema)
    assert e.value.field == "name"
    assert [x.name for x in await runrow.list_webhooks(dsn, schema=schema)] == ["w"]
    test = await runrow.send_test_webhook(dsn, "w", schema=schema)
    assert test is not None and test.event_type == "webhook.test"
    assert await runrow.remove_webhook(dsn, "w", schema=schema)
    assert not await runrow.remove_webhook(dsn, "w", schema=schema)


async def test_the_sync_api_adds_lists_and_removes(dsn: str, schema: str) -> None:
    await anyio.to_thread.run_sync(_sync_round, dsn, schema)


def _sync_round(dsn: str, schema: str) -> None:
    from runrow import sync

    with pytest.raises(runrow.InvalidInput) as e:
        sync.add_webhook(dsn, "s", "http://192.168.1.4/x", schema=schema)
    assert e.value.field == "url"
    w = sync.add_webhook(
        dsn, "s", "http://192.168.1.4/x", allow_private=True, endings=["completed"], schema=schema
    )
    assert [x.name for x in sync.list_webhooks(dsn, schema=schema)] == ["s"] and w.endings == ["completed"]
    sent = sync.send_test_webhook(dsn, "s", schema=schema)
    assert sent is not None
    assert [d.id for d in sync.webhook_deliveries(dsn, webhook="s", schema=schema)] == [sent.id]
    again = sync.redeliver(dsn, sent.id, schema=schema)
    assert again is not None and again.state == "pending"
    with pytest.raises(runrow.InvalidInput):
        sync.redeliver(dsn, "not-a-uuid", schema=schema)
    assert sync.remove_webhook(dsn, "s", schema=schema)


async def test_the_reaper_and_a_parked_runs_stop_fill_it_and_a_park_does_not(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    from datetime import timedelta

    from . import manual

    await add_webhook(dsn, "all", URL, allow_private=True, schema=schema)
    lost = await enqueue_turn(dsn, schema, "lost")
    parked = await enqueue_turn(dsn, schema, "parked")
    claimed = {r["id"]: r for r in await manual.claim(conn, schema, limit=2, lease=5)}
    # A park (finalize, status waiting) is no ending: no delivery.
    p = claimed[parked.id]
    assert await manual.park(conn, schema, parked.id, p["claim_token"], 3, key="approve")
    assert await _outbox(conn, schema) == []
    # The reaper's ending of a lost worker's run (reap).
    later = await manual.db_now(conn) + timedelta(seconds=60)
    assert await manual.reap(conn, schema, [lost.id], grace=1, now=later) == [lost.id]
    # A stop of the parked run (cancel_paused).
    await runrow.cancel_run(dsn, parked.id, schema=schema)
    rows = await _outbox(conn, schema)
    assert sorted((r, e) for _, r, e in rows) == sorted(
        [(str(lost.id), "run.failed"), (str(parked.id), "run.cancelled")]
    )
