"""Steering (#41 point 6): a message sent with ``on_busy="steer"`` while a turn runs is
delivered into that turn where its agent reads it (``run.steering()``), as a recorded
step; a replay delivers the same messages at the same place; a message no turn read runs
as a turn of its own. Never lost, never delivered twice."""

from __future__ import annotations

import random
import uuid
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow
from runrow._engine.steering import STEERING

from .helpers import assert_journal_sound, is_terminal, rows, run_row, status_of, table, wait_for

pytestmark = pytest.mark.anyio

FAST = {"poll": 0.2, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.1}


async def _send(dsn: str, schema: str, content: str, on_busy: Any = "steer", conv: str = "c") -> runrow.Run:
    return await runrow.enqueue(
        dsn, schema=schema, conversation_id=conv, user_id="u", content=content, on_busy=on_busy
    )


async def _ended(conn: psycopg.AsyncConnection, schema: str, *ids: uuid.UUID) -> bool:
    return all([await is_terminal(conn, schema, i) for i in ids])


async def _deliveries(conn: psycopg.AsyncConnection, schema: str) -> list[dict[str, Any]]:
    query = sql.SQL(
        "SELECT lineage_id, run_id, occurrence, position, result FROM {} WHERE key = %s"
        " ORDER BY lineage_id, occurrence"
    ).format(table(schema, "run_step"))
    names = ("lineage_id", "run_id", "occurrence", "position", "result")
    return [dict(zip(names, r, strict=True)) for r in await rows(conn, query, (STEERING,))]


async def _transcript(dsn: str, schema: str, conv: str = "c") -> list[tuple[str, Any]]:
    return [(m.role, m.content) for m in await runrow.transcript(dsn, conv, schema=schema)]


async def test_a_steering_message_is_delivered_into_the_running_turn(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    started, go = anyio.Event(), anyio.Event()
    got: list[runrow.SteeringMessage] = []

    async def agent(run: runrow.RunContext) -> None:
        if run.content != "first":
            await run.write_message("a turn of its own")
            return
        started.set()
        await go.wait()
        await run.write_message("before reading")
        async for message in run.steering():
            got.append(message)
        await run.write_message(f"read {[m.content for m in got]}")

    first = await _send(dsn, schema, "first", on_busy="enqueue")
    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        with anyio.fail_after(30):
            await started.wait()
        steer = await _send(dsn, schema, "also this")
        assert steer.status == "queued" and steer.created
        go.set()
        await wait_for(lambda: _ended(conn, schema, first.id, steer.id), what="both turns ended")
    assert [(m.content, m.run_id, m.user_id) for m in got] == [("also this", steer.id, "u")]
    assert got[0].message_id == steer.user_message_id
    assert await status_of(conn, schema, first.id) == "completed"
    info = await runrow.get_run(dsn, steer.id, schema=schema)
    assert info.status == "absorbed" and info.absorbed_into == first.id and info.steerable and info.terminal
    # The absorbed turn's journal ends with its one terminal event, naming where it went.
    evs = await assert_journal_sound(conn, schema, steer.id)
    assert evs[-1][2] == {"status": "absorbed", "reason": "steered", "into": str(first.id)}
    # The reading run journals the delivery, once, where it read it.
    evs = await assert_journal_sound(conn, schema, first.id)
    delivered = [e for e in evs if e[1] == "steering_delivered"]
    assert [e[2] for e in delivered] == [
        {
            "message_id": str(steer.user_message_id),
            "run_id": str(steer.id),
            "content": "also this",
            "user_id": "u",
        }
    ]
    # The transcript shows the message where the turn read it (sent before "before
    # reading" was written, it comes after it), and no turn answered it on its own.
    assert await _transcript(dsn, schema) == [
        ("user", "first"),
        ("assistant", "before reading"),
        ("user", "also this"),
        ("assistant", "read ['also this']"),
    ]
    # The delivery is a recorded step of the reading run: the ids, in order.
    (step,) = await _deliveries(conn, schema)
    assert step["run_id"] == first.id and step["occurrence"] == 0
    assert step["result"] == [{"message_id": str(steer.user_message_id), "run_id": str(steer.id)}]


async def test_several_messages_come_in_the_order_sent_and_an_empty_delivery_is_recorded(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    started, go = anyio.Event(), anyio.Event()
    seen: list[list[str]] = []

    async def agent(run: runrow.RunContext) -> None:
        seen.append([m.content for m in await run.steering()])  # nothing sent yet
        started.set()
        await go.wait()
        seen.append([m.content for m in await run.steering()])
        seen.append([m.content for m in await run.steering()])  # all taken already

    first = await _send(dsn, schema, "first", on_busy="enqueue")
    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        with anyio.fail_after(30):
            await started.wait()
        sent = [await _send(dsn, schema, f"m{i}") for i in range(5)]
        go.set()
        await wait_for(lambda: _ended(conn, schema, first.id, *(s.id for s in sent)), what="the turns ended")
    assert seen == [[], [f"m{i}" for i in range(5)], []]
    steps = await _deliveries(conn, schema)
    assert [s["occurrence"] for s in steps] == [0, 1, 2]
    assert [len(s["result"]) for s in steps] == [0, 5, 0]
    assert [await status_of(conn, schema, s.id) for s in sent] == ["absorbed"] * 5
    assert [c for _, c in await _transcript(dsn, schema)] == ["first", "m0", "m1", "m2", "m3", "m4"]


async def test_an_unread_message_runs_as_the_next_turn(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    started, go = anyio.Event(), anyio.Event()

    async def agent(run: runrow.RunContext) -> None:
        if run.content == "first":
            started.set()
            await go.wait()  # and never reads steering
        await run.write_message(f"answer to {run.content}")

    first = await _send(dsn, schema, "first", on_busy="enqueue")
    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        with anyio.fail_after(30):
            await started.wait()
        steer = await _send(dsn, schema, "unread")
        go.set()
        await wait_for(lambda: _ended(conn, schema, first.id, steer.id), what="both turns ended")
    assert await status_of(conn, schema, steer.id) == "completed"
    assert await _transcript(dsn, schema) == [
        ("user", "first"),
        ("assistant", "answer to first"),
        ("user", "unread"),
        ("assistant", "answer to unread"),
    ]


async def test_a_steer_into_an_idle_conversation_is_an_ordinary_turn(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    async def agent(run: runrow.RunContext) -> None:
        assert await run.steering() == []
        await run.write_message("ok")

    steer = await _send(dsn, schema, "hello")
    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        await wait_for(lambda: _ended(conn, schema, steer.id), what="the turn ended")
    assert await status_of(conn, schema, steer.id) == "completed"


async def test_a_turn_of_another_kind_is_a_barrier_messages_keep_their_order(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Running R, then an ordinary turn Q, then steer S: R cannot take S (it would jump Q);
    Q, once it runs, reads S."""
    started, go = anyio.Event(), anyio.Event()
    read: dict[str, list[str]] = {}

    async def agent(run: runrow.RunContext) -> None:
        if run.content == "first":
            started.set()
            await go.wait()
        read[run.content] = [m.content for m in await run.steering()]

    first = await _send(dsn, schema, "first", on_busy="enqueue")
    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        with anyio.fail_after(30):
            await started.wait()
        q = await _send(dsn, schema, "q", on_busy="enqueue")
        s = await _send(dsn, schema, "s")
        go.set()
        await wait_for(lambda: _ended(conn, schema, first.id, q.id, s.id), what="the turns ended")
    assert read == {"first": [], "q": ["s"]}
    assert (await run_row(conn, schema, s.id))["absorbed_into"] == q.id


async def test_a_run_asked_to_stop_reads_no_steering_message_and_it_runs_as_a_turn(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    started, go = anyio.Event(), anyio.Event()
    read: list[list[str]] = []

    async def agent(run: runrow.RunContext) -> None:
        if run.content == "first":
            started.set()
            with anyio.CancelScope(shield=True):
                await go.wait()
                read.append([m.content for m in await run.steering()])
        else:
            await run.write_message("own")

    first = await _send(dsn, schema, "first", on_busy="enqueue")
    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        with anyio.fail_after(30):
            await started.wait()
        steer = await _send(dsn, schema, "later")
        await runrow.cancel_run(dsn, first.id, schema=schema)  # this run alone: S stays queued
        await wait_for(lambda: _flag(conn, schema, first.id), what="the stop flag on the running run")
        go.set()
        await wait_for(lambda: _ended(conn, schema, first.id, steer.id), what="both ended")
    assert read == [[]]
    assert await status_of(conn, schema, steer.id) == "completed"  # ran as its own turn


async def _flag(conn: psycopg.AsyncConnection, schema: str, run_id: uuid.UUID) -> bool:
    return bool((await run_row(conn, schema, run_id))["cancel_requested"])


async def test_bad_input_and_a_lost_claim(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> None:
    with pytest.raises(runrow.InvalidInput, match="steer"):
        await _send(dsn, schema, "x", on_busy="nudge")
    from runrow import sync

    with psycopg.connect(dsn, autocommit=True) as sconn:
        made = sync.enqueue(
            sconn, conversation_id="s", user_id="u", content="sync steer", on_busy="steer", schema=schema
        )
    assert (await run_row(conn, schema, made.id))["steerable"] is True

    lost: list[BaseException] = []
    started, go = anyio.Event(), anyio.Event()

    async def agent(run: runrow.RunContext) -> None:
        started.set()
        with anyio.CancelScope(shield=True):
            await go.wait()
            try:
                await run.steering()
            except runrow.LeaseLost as exc:
                lost.append(exc)

    first = await _send(dsn, schema, "first", on_busy="enqueue", conv="l")
    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        with anyio.fail_after(30):
            await started.wait()
        steer = await _send(dsn, schema, "kept", conv="l")
        # The claim is taken from under the worker (as a reaper would): its delivery is fenced out.
        await conn.execute(
            sql.SQL("UPDATE {} SET claim_token = gen_random_uuid() WHERE id = %s").format(
                table(schema, "agent_run")
            ),
            (first.id,),
        )
        go.set()
        await wait_for(lambda: _any(lost), what="LeaseLost")
    assert await status_of(conn, schema, steer.id) == "queued"  # nothing absorbed
    assert [d for d in await _deliveries(conn, schema) if d["run_id"] == first.id] == []


async def _any(found: list[Any]) -> bool:
    return bool(found)


async def test_a_resumed_run_replays_its_delivery_at_the_same_place_and_absorbs_nothing_there(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    started, go = anyio.Event(), anyio.Event()
    passes: list[dict[str, Any]] = []

    async def agent(run: runrow.RunContext) -> None:
        seen: dict[str, Any] = {"resumes": run.resumes}
        passes.append(seen)
        if run.resumes == 0:
            started.set()
            await go.wait()
        seen["before"] = [m.content for m in await run.transcript()]
        seen["one"] = [m.content for m in await run.steering()]
        seen["after"] = [m.content for m in await run.transcript()]
        value = await run.wait_for_input("ok")
        seen["two"] = [m.content for m in await run.steering()]
        await run.write_message(f"done {value}")

    first = await _send(dsn, schema, "first", on_busy="enqueue")
    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        with anyio.fail_after(30):
            await started.wait()
        s1 = await _send(dsn, schema, "s1")
        go.set()
        await wait_for(lambda: _is(conn, schema, first.id, "waiting"), what="the run to park")
        s2 = await _send(dsn, schema, "s2")  # sent while it waits: queued behind it
        assert await status_of(conn, schema, s2.id) == "queued"
        await runrow.provide_input(dsn, first.id, "ok", True, schema=schema)
        await wait_for(lambda: _ended(conn, schema, first.id, s2.id), what="the turn to end")
    assert [p["resumes"] for p in passes] == [0, 1]
    # The replay got s1 at the same call (not s2, queued and steerable by then), and its
    # transcript before that call is the first pass's; s2 came at the next call.
    assert passes[0]["one"] == passes[1]["one"] == ["s1"]
    assert passes[0]["before"] == passes[1]["before"] == ["first"]
    assert passes[0]["after"] == passes[1]["after"] == ["first", "s1"]
    assert passes[1]["two"] == ["s2"]
    assert [await status_of(conn, schema, s.id) for s in (s1, s2)] == ["absorbed", "absorbed"]
    # Each delivery journaled once: the replay's journal was muted up to the pause.
    evs = await assert_journal_sound(conn, schema, first.id)
    assert [e[2]["content"] for e in evs if e[1] == "steering_delivered"] == ["s1", "s2"]
    assert [s["result"] for s in await _deliveries(conn, schema)] == [
        [{"message_id": str(s1.user_message_id), "run_id": str(s1.id)}],
        [{"message_id": str(s2.user_message_id), "run_id": str(s2.id)}],
    ]
    assert [c for _, c in await _transcript(dsn, schema)] == ["first", "s1", "s2", "done True"]


async def _is(conn: psycopg.AsyncConnection, schema: str, run_id: uuid.UUID, status: str) -> bool:
    return await status_of(conn, schema, run_id) == status


async def test_a_retry_replays_the_deliveries_of_the_failed_attempt(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """An attempt that failed after a delivery: its retry (same queue place, same lineage)
    gets the same messages at the same call, and takes new ones only at later calls."""
    started, go = anyio.Event(), anyio.Event()
    retrying, go_on = anyio.Event(), anyio.Event()
    attempts: list[list[list[str]]] = []

    async def agent(run: runrow.RunContext) -> None:
        got: list[list[str]] = []
        attempts.append(got)
        if run.attempt == 1:
            started.set()
            await go.wait()
        got.append([m.content for m in await run.steering()])
        if run.attempt == 1:
            raise RuntimeError("the model broke")
        retrying.set()
        await go_on.wait()
        got.append([m.content for m in await run.steering()])

    first = await _send(dsn, schema, "first", on_busy="enqueue")
    policy = runrow.RetryPolicy(max_attempts=2, backoff=0)
    async with runrow.Dispatcher(dsn, agent, schema=schema, retry=policy, **FAST):
        with anyio.fail_after(30):
            await started.wait()
        await _send(dsn, schema, "s1")
        go.set()
        with anyio.fail_after(30):
            await retrying.wait()  # the retry has replayed its first delivery
        s2 = await _send(dsn, schema, "s2")
        go_on.set()
        await wait_for(lambda: _is(conn, schema, s2.id, "absorbed"), what="the retry's second delivery")
    assert attempts == [[["s1"]], [["s1"], ["s2"]]]
    retry = (await run_row(conn, schema, s2.id))["absorbed_into"]
    assert retry != first.id and (await run_row(conn, schema, retry))["lineage_id"] == first.id


async def test_concurrent_steering_messages_are_each_delivered_exactly_once(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Many connections send steering messages while the turn reads them in a loop (and the
    turns that run later read too): each message is delivered by exactly one delivery or
    runs as a turn of its own; none is lost, none is read twice; each sender's messages
    come in the order it sent them."""
    started = anyio.Event()
    done = anyio.Event()
    read: dict[uuid.UUID, list[list[str]]] = {}

    async def agent(run: runrow.RunContext) -> None:
        got = read.setdefault(run.run_id, [])
        if run.content == "lead":
            started.set()
            while not done.is_set():
                got.append([m.content for m in await run.steering()])
                await anyio.sleep(0.005)
        got.append([m.content for m in await run.steering()])

    lead = await _send(dsn, schema, "lead", on_busy="enqueue")
    senders, each = 8, 12
    sent: list[runrow.Run] = []
    async with runrow.Dispatcher(dsn, agent, schema=schema, concurrency=4, **FAST):
        with anyio.fail_after(30):
            await started.wait()

        async def sender(k: int) -> None:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as own:
                for i in range(each):
                    sent.append(
                        await runrow.enqueue(
                            own,
                            schema=schema,
                            conversation_id="c",
                            user_id="u",
                            content=f"{k}:{i}",
                            on_busy="steer",
                        )
                    )
                    if len(sent) >= senders * each // 2:
                        done.set()  # the lead ends: later messages run as turns, or are read by them
                    await anyio.sleep(random.uniform(0, 0.03))  # interleaved with the deliveries

        async with anyio.create_task_group() as tg:
            for k in range(senders):
                tg.start_soon(sender, k)
        done.set()
        await wait_for(lambda: _ended(conn, schema, lead.id), what="the lead turn ended")
        for i in range(2):  # after it: these run as a turn of their own (the first may read the second)
            sent.append(await _send(dsn, schema, f"{senders}:{i}"))
        await wait_for(lambda: _ended(conn, schema, *(s.id for s in sent)), what="every turn ended")
    assert len(sent) == senders * each + 2
    deliveries = [(rid, place) for rid, places in read.items() for place in places]
    delivered = [c for _, place in deliveries for c in place]
    assert len(delivered) == len(set(delivered)), "a message delivered twice"
    statuses = {s.id: await status_of(conn, schema, s.id) for s in sent}
    own_turns = {rid for rid in read if rid != lead.id}
    for s in sent:
        if statuses[s.id] == "absorbed":
            assert s.id not in own_turns
        else:
            assert statuses[s.id] == "completed" and s.id in own_turns
    # What was read (anywhere) is exactly what was absorbed.
    absorbed = {s.id for s in sent if statuses[s.id] == "absorbed"}
    assert len(delivered) == len(absorbed) and own_turns
    assert read[lead.id] and any(read[lead.id])
    # A sender's messages keep their order (the lead's deliveries, in call order).
    flat = [c for place in read[lead.id] for c in place]
    for k in range(senders):
        mine = [c for c in flat if c.startswith(f"{k}:")]
        assert mine == sorted(mine, key=lambda c: int(c.split(":")[1]))


async def test_an_absorbed_turn_is_not_retried_and_the_schema_holds_its_shape(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Retrying an absorbed turn would deliver its message twice: retry_run refuses it
    (absorbed is no retryable ending). The schema holds that an absorbed run names the
    run that read it, and only an absorbed run does."""
    started, go = anyio.Event(), anyio.Event()

    async def agent(run: runrow.RunContext) -> None:
        if run.content == "first":
            started.set()
            await go.wait()
            await run.steering()

    first = await _send(dsn, schema, "first", on_busy="enqueue")
    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        with anyio.fail_after(30):
            await started.wait()
        steer = await _send(dsn, schema, "s")
        go.set()
        await wait_for(lambda: _ended(conn, schema, first.id, steer.id), what="both ended")
    assert await status_of(conn, schema, steer.id) == "absorbed"
    with pytest.raises(runrow.RunrowError, match="absorbed"):
        await runrow.retry_run(dsn, steer.id, schema=schema)
    # The dashboard's run page names the run that read it, and lists it under its status.
    from .admin_support import admin_client

    async with admin_client(dsn, schema) as client:
        page = (await client.get(f"/admin/runs/{steer.id}")).text
        assert "Read by run" in page and f"/admin/runs/{first.id}" in page
        assert str(steer.id) in (await client.get("/admin/", params={"status": "absorbed"})).text
    runs = table(schema, "agent_run")
    for change in (
        sql.SQL("UPDATE {} SET absorbed_into = NULL WHERE id = %s").format(runs),
        sql.SQL("UPDATE {} SET status = 'completed' WHERE id = %s").format(runs),
    ):
        with pytest.raises(psycopg.errors.CheckViolation, match="agent_run_absorbed_into_check"):
            await conn.execute(change, (steer.id,))


# -- the HTTP API ----------------------------------------------------------------------


async def test_the_http_api_takes_the_steer_policy_and_the_streams_show_the_delivery(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    import httpx
    from psycopg_pool import AsyncConnectionPool
    from starlette.requests import Request

    from runrow.http import create_api

    def user(request: Request) -> str | None:
        return request.headers.get("x-user") or None

    started, go = anyio.Event(), anyio.Event()

    async def agent(run: runrow.RunContext) -> None:
        started.set()
        await go.wait()
        read = [m.content for m in await run.steering()]
        await run.write_message(f"read {read}")

    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, open=False, kwargs={"autocommit": True})
    api = create_api(pool, authenticate=user, schema=schema)
    me = {"x-user": "ann"}
    async with (
        pool,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://api") as client,
        runrow.Dispatcher(dsn, agent, schema=schema, **FAST),
    ):
        post = "/v1/conversations/h/messages"
        bad = await client.post(post, json={"content": "x", "on_busy": "interrupt"}, headers=me)
        assert bad.status_code == 422 and "on_busy" in bad.json()["error"]["message"]
        first = (await client.post(post, json={"content": "first"}, headers=me)).json()["run_id"]
        with anyio.fail_after(30):
            await started.wait()
        answer = await client.post(post, json={"content": "also", "on_busy": "steer"}, headers=me)
        assert answer.status_code == 202, answer.text
        steer = answer.json()["run_id"]
        go.set()
        await wait_for(lambda: _ended(conn, schema, uuid.UUID(first), uuid.UUID(steer)), what="both ended")
        run = (await client.get(f"/v1/runs/{steer}", headers=me)).json()
        assert run["status"] == "absorbed" and run["absorbed_into"] == first
        # runrow's SSE stream of the reading run carries the delivery; the absorbed run's
        # ends with its terminal event naming the reading run.
        text = (await client.get(f"/v1/runs/{first}/events", headers=me)).text
        assert "event: steering_delivered" in text and '"content": "also"' in text.replace('":"', '": "')
        text = (await client.get(f"/v1/runs/{steer}/events", headers=me)).text
        assert '"absorbed"' in text and first in text
        # The AI SDK stream: a data part for the delivery, and no error for the absorbed run.
        text = (await client.get(f"/v1/runs/{first}/events?format=ai-sdk", headers=me)).text
        assert "data-runrow-steering" in text
        text = (await client.get(f"/v1/runs/{steer}/events?format=ai-sdk", headers=me)).text
        assert "data-runrow-absorbed" in text and '"type":"error"' not in text.replace(" ", "")
        # AG-UI: a custom event, and the absorbed run finishes.
        text = (await client.get(f"/v1/runs/{first}/events?format=ag-ui", headers=me)).text
        assert "runrow.steering_delivered" in text
        text = (await client.get(f"/v1/runs/{steer}/events?format=ag-ui", headers=me)).text
        assert "runrow.absorbed" in text and "RUN_FINISHED" in text and "RUN_ERROR" not in text


async def test_runrow_check_replays_a_delivery_of_a_waiting_run(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """``runrow check`` replays a parked run's deliveries from their records (reading the
    messages, writing nothing) and stops where the run waits."""
    from runrow._check import check_runs

    started, go = anyio.Event(), anyio.Event()
    seen: list[list[str]] = []

    async def agent(run: runrow.RunContext) -> None:
        if run.worker_id != "runrow-check" and run.resumes == 0:
            started.set()
            await go.wait()
        seen.append([m.content for m in await run.steering()])
        await run.wait_for_input("ok")

    first = await _send(dsn, schema, "first", on_busy="enqueue")
    async with runrow.Dispatcher(dsn, agent, schema=schema, **FAST):
        with anyio.fail_after(30):
            await started.wait()
        await _send(dsn, schema, "read it")
        go.set()
        await wait_for(lambda: _is(conn, schema, first.id, "waiting"), what="the run to park")
    (result,) = await check_runs(dsn, agent, schema=schema)
    assert result.ok and "waits for it" in result.stopped, result
    assert seen == [["read it"], ["read it"]]

    async def reads_later(run: runrow.RunContext) -> None:
        await run.wait_for_input("ok")  # the delivery was recorded before this: a mismatch

    (result,) = await check_runs(dsn, reads_later, schema=schema)
    assert not result.ok and "mismatch" in result.stopped
