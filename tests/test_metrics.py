"""Prometheus metrics: counters move by exactly what the dispatcher did; queue depth per
tenant and hub reconnects are read off the request path, with a bounded read."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import psycopg
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import runrow
from runrow.metrics import PrometheusObserver, QueueCollector, with_metrics

from .helpers import status_of, table, wait_for

pytestmark = pytest.mark.anyio


async def _not_found(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 404, "headers": []})
    await send({"type": "http.response.body", "body": b"app"})


async def get(app: Any, path: str) -> tuple[int, bytes]:
    """One HTTP GET through an ASGI app, no server needed."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "query_string": b"", "headers": []}
    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


async def scrape(app: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, body = await get(app, "/metrics")
    assert status == 200
    return samples(body.decode())


async def test_counters_move_by_exactly_the_runs_done(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)
    app = with_metrics(_not_found, registry=registry)
    hanging = anyio.Event()

    async def agent(run: runrow.RunContext) -> None:
        if run.content == "fail":
            raise ValueError("no")
        if run.content == "hang":
            hanging.set()
            await anyio.sleep_forever()
        await run.text("hi ")
        await run.emit({"type": "tool_call_started", "tool_call_id": "1", "name": "x"})

    before = await scrape(app)
    assert value(before, "runrow_runs_started_total") == 0
    async with runrow.Dispatcher(dsn, agent, schema=schema, observers=[observer], poll=0.5) as d:
        runs = {
            c: await runrow.enqueue(d.pool, schema=schema, conversation_id=f"c-{c}", user_id="u", content=c)
            for c in ("ok1", "ok2", "fail", "hang")
        }
        await wait_for(hanging.is_set, what="the hanging run to start")
        await runrow.stop_conversation(d.pool, "c-hang", schema=schema)
        expect = {"ok1": "completed", "ok2": "completed", "fail": "failed", "hang": "cancelled"}
        for c, r in runs.items():
            await wait_for(lambda r=r, c=c: _is(conn, schema, r.id, expect[c]), what=f"{c} to end")
        # run_finished is observed after the ending commits: wait for the last count.
        await wait_for(
            lambda: (
                sum(
                    registry.get_sample_value("runrow_runs_finished_total", {"status": s, "recorded": "true"})
                    or 0
                    for s in ("completed", "failed", "cancelled")
                )
                == 4
            ),
            what="four endings observed",
        )
        after = await scrape(app)

    assert value(after, "runrow_runs_started_total") == 4
    assert value(after, "runrow_runs_claimed_total") == 4
    assert value(after, "runrow_queue_wait_seconds_count") == 4
    assert value(after, "runrow_runs_finished_total", status="completed", recorded="true") == 2
    assert value(after, "runrow_runs_finished_total", status="failed", recorded="true") == 1
    assert value(after, "runrow_runs_finished_total", status="cancelled", recorded="true") == 1
    assert value(after, "runrow_run_duration_seconds_count", status="completed") == 2
    # Each completing run flushed once: its merged text and its tool event, two rows.
    assert value(after, "runrow_journal_flushes_total") == 2
    assert value(after, "runrow_journal_rows_total") == 4
    assert value(after, "runrow_first_event_seconds_count") == 2
    assert value(after, "runrow_claims_lost_total") == 0
    assert value(after, "runrow_runs_reaped_total") == 0
    assert 1 <= value(after, "runrow_claims_total") <= 4
    assert value(after, "runrow_claim_seconds_count") == value(after, "runrow_claims_total")
    # Other paths still reach the app.
    assert await get(app, "/other") == (404, b"app")


async def test_reaped_and_lost_claims_and_heartbeats_are_counted(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)
    started = anyio.Event()

    async def agent(run: runrow.RunContext) -> None:
        started.set()
        await anyio.sleep_forever()

    async with runrow.Dispatcher(
        dsn, agent, schema=schema, observers=[observer], lease=1.0, heartbeat=0.2, grace=1.0, poll=60
    ) as d:
        run = await runrow.enqueue(d.pool, schema=schema, conversation_id="c", user_id="u", content="x")
        await wait_for(started.is_set, what="the run to start")
        await wait_for(
            lambda: (registry.get_sample_value("runrow_heartbeat_lag_seconds_count") or 0) >= 1,
            what="a heartbeat",
        )
        # The database's clock moved on (injected): the reaper fails the run, and the
        # worker's next heartbeat finds the claim gone and stands down.
        reaped = await d.reap(now=datetime.now(UTC) + timedelta(hours=1))
        assert reaped == [run.id]
        await wait_for(
            lambda: registry.get_sample_value("runrow_claims_lost_total") == 1, what="the stand-down"
        )
        assert await status_of(conn, schema, run.id) == "failed"
        text = (await get(with_metrics(_not_found, registry=registry), "/metrics"))[1].decode()
    found = samples(text)
    assert value(found, "runrow_runs_reaped_total") == 1
    assert value(found, "runrow_claims_lost_total") == 1
    assert value(found, "runrow_heartbeat_lag_seconds_count") >= 1
    assert value(found, "runrow_runs_finished_total", status="failed", recorded="true") == 0


async def test_queue_depth_per_tenant_and_hub_reconnects(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    registry = CollectorRegistry()
    app = with_metrics(_not_found, registry=registry)
    async with runrow.NotifyHub(dsn) as hub:
        await wait_for(lambda: hub.connected, what="the hub to connect")
        collector = QueueCollector(dsn, schema=schema, hubs=[hub], interval=0.05, registry=registry)
        for i in range(2):
            await runrow.enqueue(
                dsn, schema=schema, conversation_id=f"a{i}", user_id="u", content="x", tenant_id="acme"
            )
        await runrow.enqueue(dsn, schema=schema, conversation_id="n", user_id="u", content="x")
        async with collector:
            await wait_for(lambda: collector.refreshes >= 1, what="a refresh")
            found = await scrape(app)
            assert value(found, "runrow_queue_depth", tenant="acme") == 2
            assert value(found, "runrow_queue_depth", tenant="") == 1
            assert value(found, "runrow_runs_running", tenant="acme") == 0
            assert 0 <= value(found, "runrow_oldest_queued_seconds", tenant="acme") < 60
            assert 0 <= value(found, "runrow_queue_stats_age_seconds") < 5
            assert value(found, "runrow_hub_reconnects_total") == 0
            assert value(found, "runrow_hub_connected") == 1

            # Drain the queue: the tenants stay, at zero; their oldest age disappears.
            for c in ("a0", "a1", "n"):
                await runrow.stop_conversation(dsn, c, schema=schema)
            seen = collector.refreshes
            await wait_for(lambda: collector.refreshes >= seen + 2, what="refreshes after the stop")
            found = await scrape(app)
            assert value(found, "runrow_queue_depth", tenant="acme") == 0
            assert ("runrow_oldest_queued_seconds", (("tenant", "acme"),)) not in found

            # Kill the hub's session: it reconnects, and the counter says so.
            await conn.execute("SELECT pg_terminate_backend(%s)", (hub.backend_pid,))
            await wait_for(lambda: hub.reconnects == 1 and hub.connected, what="the hub to reconnect")
            found = await scrape(app)
            assert value(found, "runrow_hub_reconnects_total") == 1


async def test_a_refresh_is_bounded_and_a_scrape_never_waits(dsn: str, schema: str) -> None:
    registry = CollectorRegistry()
    collector = QueueCollector(dsn, schema=schema, interval=0.05, timeout=0.3, registry=registry)
    await collector.refresh()
    async with await psycopg.AsyncConnection.connect(dsn) as locker:
        # Someone holds the table: the read must give up, not hang the refresher.
        await locker.execute(
            psycopg.sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(table(schema, "agent_run"))
        )
        t0 = anyio.current_time()
        with pytest.raises((psycopg.errors.QueryCanceled, TimeoutError)):
            await collector.refresh()
        assert anyio.current_time() - t0 < 2.0
        async with collector:
            await wait_for(lambda: collector.errors >= 2, what="failed refreshes to be counted")
            t0 = anyio.current_time()
            status, body = await get(with_metrics(_not_found, registry=registry), "/metrics")
            assert anyio.current_time() - t0 < 0.5
        await locker.rollback()
    found = samples(body.decode())
    assert status == 200
    assert value(found, "runrow_queue_stats_errors_total") >= 2
    assert value(found, "runrow_queue_stats_age_seconds") > 0


async def _is(conn: psycopg.AsyncConnection, schema: str, run_id: uuid.UUID, status: str) -> bool:
    return await status_of(conn, schema, run_id) == status


async def test_queue_stats_agrees_with_the_collector(dsn: str, schema: str) -> None:
    """runrow.queue_stats (the `runrow stats` command) and the collector read the same rows."""
    for i in range(3):
        await runrow.enqueue(
            dsn, schema=schema, conversation_id=f"q{i}", user_id="u", content="x", tenant_id="t"
        )
    stats = await runrow.queue_stats(dsn, schema=schema)
    assert stats.queued == 3 and stats.running == 0
    assert stats.oldest_queued_seconds is not None and 0 <= stats.oldest_queued_seconds < 60
    collector = QueueCollector(dsn, schema=schema, register=False)
    await collector.refresh()
    found = {(m.name, tuple(s.labels.items())): s.value for m in collector.collect() for s in m.samples}
    assert found[("runrow_queue_depth", (("tenant", "t"),))] == 3


async def test_retries_are_counted_by_attempt(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> None:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)

    async def agent(run: runrow.RunContext) -> None:
        if run.attempt < 3:
            raise TimeoutError("flaky")

    policy = runrow.RetryPolicy(max_attempts=3, backoff=0)
    async with runrow.Dispatcher(dsn, agent, schema=schema, observers=[observer], poll=0.5, retry=policy):
        await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
        await wait_for(
            lambda: registry.get_sample_value(
                "runrow_runs_finished_total", {"status": "completed", "recorded": "true"}
            ),
            what="the third attempt to complete",
        )
    assert registry.get_sample_value("runrow_runs_started_total") == 3
    assert registry.get_sample_value("runrow_retries_started_total", {"attempt": "2"}) == 1
    assert registry.get_sample_value("runrow_retries_started_total", {"attempt": "3"}) == 1


async def _idle(run: runrow.RunContext) -> None:
    await run.write_message("ok")


async def test_live_workers_are_counted_per_version(dsn: str, schema: str) -> None:
    registry = CollectorRegistry()
    app = with_metrics(_not_found, registry=registry)
    collector = QueueCollector(dsn, schema=schema, interval=0.05, registry=registry)
    async with collector:
        async with (
            runrow.Dispatcher(dsn, _idle, schema=schema, version="old", notifications=False),
            runrow.Dispatcher(dsn, _idle, schema=schema, version="new", notifications=False),
            runrow.Dispatcher(dsn, _idle, schema=schema, version="new", notifications=False),
        ):
            # Two refreshes: the one in flight when the dispatchers had started may have
            # read the registry before the last of them registered.
            seen = collector.refreshes
            await wait_for(lambda: collector.refreshes >= seen + 2, what="a refresh")
            found = await scrape(app)
            assert value(found, "runrow_workers", version="old") == 1
            assert value(found, "runrow_workers", version="new") == 2
        seen = collector.refreshes
        await wait_for(lambda: collector.refreshes >= seen + 2, what="a refresh after the stops")
        found = await scrape(app)
        assert value(found, "runrow_workers", version="old") == 0  # drained: 0, not gone
