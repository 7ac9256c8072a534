"""The journal: coalescing writer, fenced flushes, and a tail that resumes exactly."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta

import anyio
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

import runrow
import runrow.sync
from runrow import _json
from runrow._gateway import _exec
from runrow._gateway import journal as _gw
from runrow._names import Channels

from . import manual
from .helpers import (
    assert_journal_sound,
    drop_time_partitions,
    events,
    hourly_partitions,
    is_terminal,
    run_row,
    table,
    wait_for,
)

pytestmark = pytest.mark.anyio
FAST = {"poll": 0.5, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.2}


async def test_deltas_merge_on_the_flush_clock(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> None:
    """200 deltas over about a second become a handful of rows, text intact and in order."""

    async def agent(run: runrow.RunContext) -> None:
        for i in range(200):
            await run.text(f"{i},")
            await anyio.sleep(0.005)
        await run.emit({"type": "message_done"})

    async with runrow.Dispatcher(dsn, agent, schema=schema, flush_interval=0.25, **FAST):
        run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="terminal")
    evs = await assert_journal_sound(conn, schema, run.id)
    deltas = [p["delta"] for _, t, p in evs if t == "content_delta"]
    assert "".join(deltas) == "".join(f"{i}," for i in range(200))
    assert 2 <= len(deltas) <= 12  # ~1 s of text on a 250 ms clock, never one row per delta
    assert [t for _, t, _ in evs][-2:] == ["message_done", "complete"]


async def test_streams_do_not_merge_and_structural_events_flush_first(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    async def agent(run: runrow.RunContext) -> None:
        await run.text("a")
        await run.text("b")
        await run.text("thinking", stream="reasoning")
        await run.text("c")
        await run.emit({"type": "tool_call_started", "tool_call_id": "1"})
        await run.text("d")

    async with runrow.Dispatcher(dsn, agent, schema=schema, flush_interval=60, **FAST):
        run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
        await wait_for(lambda: is_terminal(conn, schema, run.id), what="terminal")
    evs = await assert_journal_sound(conn, schema, run.id)
    assert [(t, p) for _, t, p in evs[2:]] == [
        ("content_delta", {"delta": "ab"}),
        ("content_delta", {"delta": "thinking", "stream": "reasoning"}),
        ("content_delta", {"delta": "c"}),
        ("tool_call_started", {"tool_call_id": "1"}),
        ("content_delta", {"delta": "d"}),  # flushed with the terminal write
        ("complete", {"status": "completed"}),
    ]
    # Never written by the agent, the default stream's text is kept as its answer.
    msgs = await runrow.transcript(dsn, "c", schema=schema)
    assert [(m.content, m.status) for m in msgs if m.role == "assistant"] == [("abcd", "complete")]


async def test_a_zombie_flush_writes_nothing_and_announces_nothing(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    (claimed,) = await manual.claim(conn, schema)
    channel = Channels.for_schema(schema).events(run.id)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
        await listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        # The claim changes hands: the old token is a zombie's.
        await conn.execute(
            sql.SQL("UPDATE {} SET claim_token = gen_random_uuid() WHERE id = %s").format(
                table(schema, "agent_run")
            ),
            (run.id,),
        )
        assert not await manual.append(
            conn, schema, run.id, claimed["claim_token"], [(3, "content_delta", {"delta": "boo"})]
        )
        await conn.execute("SELECT pg_notify(%s, 'sentinel')", (channel,))
        got = [n.payload async for n in listener.notifies(timeout=5, stop_after=1)]
    assert got == ["sentinel"]  # the zombie's flush sent nothing before it
    assert [s for s, _, _ in await events(conn, schema, run.id)] == [1, 2]


async def test_a_flush_lands_with_its_notify(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> None:
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    (claimed,) = await manual.claim(conn, schema)
    channel = Channels.for_schema(schema).events(run.id)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
        await listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        assert await manual.append(
            conn, schema, run.id, claimed["claim_token"], [(3, "content_delta", {"delta": "hi"})]
        )
        got = [n.channel async for n in listener.notifies(timeout=5, stop_after=1)]
    assert got == [channel]


async def _journal(
    conn: psycopg.AsyncConnection, schema: str, run_id: uuid.UUID
) -> list[tuple[int, str, dict[str, object]]]:
    return [(s, t, p) for s, t, p in await events(conn, schema, run_id)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batches=st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=8),
    cuts=st.lists(st.integers(min_value=1, max_value=5), min_size=0, max_size=10),
)
async def test_resuming_from_any_cursor_yields_exactly_the_missing_suffix(
    dsn: str, schema: str, batches: list[int], cuts: list[int]
) -> None:
    """Events are appended in random batches while a reader repeatedly reads a few
    events, disconnects, and resumes from its last seq: the concatenation is the journal."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        run = await runrow.enqueue(
            conn, schema=schema, conversation_id=f"c-{uuid.uuid4().hex[:6]}", user_id="u", content="x"
        )
        (claimed,) = await manual.claim(conn, schema, limit=1)
        assert claimed["id"] == run.id
        token = claimed["claim_token"]
        seen: list[int] = []
        cursor = 0
        seq = 3

        async def writer() -> None:
            nonlocal seq
            for size in batches:
                evs = [(seq + i, "content_delta", {"delta": f"d{seq + i}"}) for i in range(size)]
                assert await manual.append(conn, schema, run.id, token, evs)
                seq += size
                await anyio.sleep(0.003)
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as fin:
                assert await manual.finalize(fin, schema, run.id, token, "completed", seq)

        async with runrow.NotifyHub(dsn) as hub, anyio.create_task_group() as tg:
            tg.start_soon(writer)
            pending_cuts = list(cuts)
            done = False
            while not done:
                take = pending_cuts.pop(0) if pending_cuts else 10_000
                got = 0
                async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as reader:
                    async for ev in runrow.tail(
                        reader, run.id, from_seq=cursor, hub=hub, schema=schema, keepalive=5
                    ):
                        if ev.keepalive:
                            continue
                        seen.append(ev.seq)
                        cursor = ev.seq
                        got += 1
                        if ev.terminal:
                            done = True
                            break
                        if got >= take:
                            break  # the client drops the stream here
        journal = await _journal(conn, schema, run.id)
        assert seen == [s for s, _, _ in journal]  # no gap, no duplicate, in order
        assert journal[-1][1] == "complete"


async def test_tail_ends_with_a_synthesised_terminal_when_none_was_journaled(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    await manual.claim(conn, schema)
    got: list[runrow.Event] = []

    async def follow() -> None:
        async for ev in runrow.tail(dsn, run.id, schema=schema, poll=0.05):
            got.append(ev)

    async with anyio.create_task_group() as tg:
        tg.start_soon(follow)
        await wait_for(lambda: len(got) == 2, what="catch-up")
        # An ending that never journaled its event (a finalize cut off mid-way, or trimmed).
        await conn.execute(
            sql.SQL("UPDATE {} SET status = 'failed', finished_at = now(), error = %s WHERE id = %s").format(
                table(schema, "agent_run")
            ),
            (psycopg.types.json.Jsonb({"type": "boom"}), run.id),
        )
    assert [e.seq for e in got] == [1, 2, 3]
    assert got[-1].type == "complete" and got[-1].payload == {
        "status": "failed",
        "error": {"type": "boom"},
        "synthesized": True,
    }


async def test_tail_keepalives_and_works_without_a_hub(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    (claimed,) = await manual.claim(conn, schema)
    kinds: list[str] = []
    async for ev in runrow.tail(dsn, run.id, schema=schema, keepalive=0.1, poll=0.02):
        kinds.append(ev.type)
        if kinds.count("keepalive") == 2 and "x" not in kinds:
            assert await manual.append(conn, schema, run.id, claimed["claim_token"], [(3, "x", {})])
        if "x" in kinds and "complete" not in kinds and kinds[-1] == "x":
            assert await manual.finalize(conn, schema, run.id, claimed["claim_token"], "completed", 4)
    assert kinds[:2] == ["user_message_created", "run_queued"]
    assert kinds[2:4] == ["keepalive", "keepalive"]
    assert kinds[-2:] == ["x", "complete"]


async def test_tail_rejects_bad_cursors_and_unknown_runs(dsn: str, schema: str) -> None:
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    for bad in (-1, "3", 1.5, True):
        with pytest.raises(runrow.InvalidInput):
            async for _ in runrow.tail(dsn, run.id, from_seq=bad, schema=schema):  # type: ignore[arg-type]
                pass
    with pytest.raises(runrow.RunNotFound):
        async for _ in runrow.tail(dsn, uuid.uuid4(), schema=schema):
            pass


async def test_trim_marks_old_runs_then_drops_their_partition_whole_and_keeps_the_transcript(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Retention by partition (#44): a trimmed run's snapshot goes at once; its events go
    with its partition, dropped whole once every run made in it is trimmed. Nothing is
    deleted row by row from a live partition."""
    await hourly_partitions(conn, schema)
    old = await runrow.enqueue(
        dsn, schema=schema, conversation_id="a", user_id="u", content="old", request={"pii": 1}
    )
    live = await runrow.enqueue(
        dsn, schema=schema, conversation_id="b", user_id="u", content="live", request={"pii": 2}
    )
    rows = await manual.claim(conn, schema, limit=2)
    token = {r["id"]: r["claim_token"] for r in rows}
    assert await manual.finalize(conn, schema, old.id, token[old.id], "completed", 3)
    now = await manual.db_now(conn)
    assert await runrow.trim(dsn, schema=schema, now=now, erase_requests=True) == runrow.TrimResult(
        0, 0, 0
    )  # too recent
    result = await runrow.trim(dsn, schema=schema, now=now + timedelta(hours=25), erase_requests=True)
    # The live run, made in the same hour, holds the partition: the old run's events stay.
    assert result == runrow.TrimResult(runs=1, events=0, partitions=0)
    assert len(await events(conn, schema, old.id)) == 3
    assert (await run_row(conn, schema, old.id))["request"] is None
    assert (await run_row(conn, schema, live.id))["request"] == {"pii": 2}  # running: untouched
    assert len(await events(conn, schema, live.id)) == 2
    assert [m.content for m in await runrow.transcript(dsn, "a", schema=schema)] == ["old"]
    got = [e async for e in runrow.tail(dsn, old.id, schema=schema)]  # still whole
    assert [e.seq for e in got] == [1, 2, 3] and got[-1].type == "complete"
    # The live run ends; a day after, every run of its hour is trimmed and the
    # partitions go whole (its hour's and the two empty ones made ahead).
    assert await manual.finalize(conn, schema, live.id, token[live.id], "completed", 3)
    later = now + timedelta(days=2, hours=1)
    before = await runrow.journal_partitions(dsn, schema=schema)
    assert await runrow.trim(dsn, schema=schema, now=later, erase_requests=True) == runrow.TrimResult(
        runs=1, events=0, partitions=3
    )
    after = await runrow.journal_partitions(dsn, schema=schema)
    assert {p.name for p in before} - {p.name for p in after} == {p.name for p in before if p.starts}
    assert await events(conn, schema, old.id) == [] and await events(conn, schema, live.id) == []
    # A trimmed run's tail still ends, from the row.
    got = [e async for e in runrow.tail(dsn, old.id, schema=schema)]
    assert [(e.type, e.payload["status"]) for e in got] == [("complete", "completed")]
    assert await runrow.trim(dsn, schema=schema, now=later, erase_requests=True) == runrow.TrimResult(0, 0, 0)
    # A run made now finds its partition again (made on demand by the next ensure).
    assert await runrow.ensure_journal_partitions(dsn, schema=schema) >= 1
    again = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="again")
    assert len(await events(conn, schema, again.id)) == 2


async def test_retry_after_trim_is_refused_rather_than_run_without_its_request(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Trim deletes the request snapshot; a retry must not run the turn without it."""
    early = await runrow.enqueue(
        dsn, schema=schema, conversation_id="a", user_id="u", content="a", request={"model": "m"}
    )
    late = await runrow.enqueue(
        dsn, schema=schema, conversation_id="b", user_id="u", content="b", request={"model": "m"}
    )
    for row in await manual.claim(conn, schema, limit=2):
        assert await manual.finalize(conn, schema, row["id"], row["claim_token"], "failed", 3)
    retried = await runrow.retry_run(dsn, early.id, schema=schema)  # before the trim: keeps it
    assert (await run_row(conn, schema, retried.id))["request"] == {"model": "m"}
    now = await manual.db_now(conn)
    assert (
        await runrow.trim(dsn, schema=schema, now=now + timedelta(hours=25), erase_requests=True)
    ).runs == 2
    before = await runrow.list_runs(dsn, schema=schema)
    with pytest.raises(runrow.RunTrimmed) as info:
        await runrow.retry_run(dsn, late.id, schema=schema)
    assert isinstance(info.value, runrow.InvalidInput) and info.value.field == "run_id"
    assert info.value.run_id == late.id and "trimmed" in str(info.value)
    assert await runrow.list_runs(dsn, schema=schema) == before  # nothing written
    # A retry made before the trim is still the retry.
    again = await runrow.retry_run(dsn, early.id, schema=schema)
    assert again.id == retried.id and not again.created


async def test_resuming_after_the_ending_yields_nothing(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """A client that already saw the terminal event and reconnects gets no phantom ending."""
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    (claimed,) = await manual.claim(conn, schema)
    assert await manual.finalize(conn, schema, run.id, claimed["claim_token"], "completed", 3)
    assert [e.seq async for e in runrow.tail(dsn, run.id, schema=schema)] == [1, 2, 3]
    assert [e async for e in runrow.tail(dsn, run.id, from_seq=3, schema=schema)] == []
    assert [e.seq async for e in runrow.tail(dsn, run.id, from_seq=2, schema=schema)] == [3]


def test_deltas_are_checked_without_serialising_the_whole_event() -> None:
    from runrow._events import validate_event

    assert validate_event({"type": "content_delta", "delta": "hé"}, 10) == ("content_delta", {"delta": "hé"})
    for bad in (
        {"type": "content_delta", "delta": "a\x00b"},  # jsonb rejects NUL
        {"type": "content_delta", "delta": "x" * 11},  # over the limit
        {"type": "content_delta", "delta": "\ud800"},  # a lone surrogate is not text
        {"type": "content_delta", "delta": "ok", "stream": object()},  # other keys: still JSON
        {"type": "content_delta", "delta": "ok", "stream": "nul\x00"},
        {"type": "tool_call", "name": "lone \ud800"},  # structural events too: InvalidInput
    ):
        with pytest.raises(runrow.InvalidInput):
            validate_event(bad, 10)


def test_a_structural_event_is_encoded_once_and_its_text_kept() -> None:
    """checked_event hands back the JSON it checked, which the writer stores as is; a
    delta has none yet (its text is merged with its neighbours' first)."""
    import json

    from runrow._events import checked_event

    etype, payload, text = checked_event({"type": "tool_call", "name": "é", "args": {"n": [1, 2.5]}}, 100)
    assert (etype, payload) == ("tool_call", {"name": "é", "args": {"n": [1, 2.5]}})
    assert text == '{"name":"é","args":{"n":[1,2.5]}}'
    assert json.loads(text) == payload
    assert checked_event({"type": "content_delta", "delta": "hi"}, 100) == (
        "content_delta",
        {"delta": "hi"},
        None,
    )
    with pytest.raises(runrow.InvalidInput, match="larger than the limit"):
        checked_event({"type": "tool_call", "name": "x" * 100}, 100)


def test_event_types_are_short_identifiers() -> None:
    """A type is an ASCII identifier of at most 64 characters (#17): a lone surrogate,
    a NUL, a newline or an endless type is refused at emit, before it reaches a batch."""
    from runrow._events import MAX_EVENT_TYPE_LENGTH, validate_event

    for good in ("tool_call_started", "http.response.start", "ns:step-2", "x", "T" * MAX_EVENT_TYPE_LENGTH):
        assert validate_event({"type": good, "v": 1}, 100) == (good, {"v": 1})
    for bad in (
        "bad\ud800",  # a lone surrogate: cannot be encoded at all
        "x\x00",  # NUL: jsonb and text reject it
        "two\nlines",  # would break an SSE "event:" line
        "has space",
        "1starts_with_a_digit",
        "_leading_underscore",
        "é",
        "T" * (MAX_EVENT_TYPE_LENGTH + 1),
    ):
        with pytest.raises(runrow.InvalidInput, match="type"):
            validate_event({"type": bad}, 100)


async def test_a_tail_whose_hub_hears_nothing_polls(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """The hub is connected, but the run's flushes announce nothing (journal_notify=False,
    or a hub that hears another session than the writers'): the first unannounced rows
    are found by the keepalive's read, and from then on the tail reads at its poll
    interval, not once per keepalive."""
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    (claimed,) = await manual.claim(conn, schema)
    token = claimed["claim_token"]
    got: list[int] = []
    async with runrow.NotifyHub(dsn) as hub, anyio.create_task_group() as tg:
        await wait_for(lambda: hub.connected, what="the hub connected")

        async def follow() -> None:
            async for ev in runrow.tail(dsn, run.id, schema=schema, hub=hub, poll=0.1, keepalive=2.0):
                if not ev.keepalive:
                    got.append(ev.seq)

        tg.start_soon(follow)
        await wait_for(lambda: got == [1, 2], what="catch-up")
        assert await manual.append(conn, schema, run.id, token, [(3, "x", {})], notify=False)
        # Nothing says the hub is deaf yet: the keepalive's read finds the row.
        await wait_for(lambda: 3 in got, timeout=4, what="event 3 by the keepalive's read")
        for seq in (4, 5, 6):
            t0 = anyio.current_time()
            assert await manual.append(conn, schema, run.id, token, [(seq, "x", {})], notify=False)
            await wait_for(lambda s=seq: s in got, timeout=4, what=f"event {seq} without a notification")
            # Well under the 2 s keepalive: the tail now polls.
            assert anyio.current_time() - t0 < 1.0, f"event {seq} waited for the keepalive"
        assert await manual.finalize(conn, schema, run.id, token, "completed", 7)
    assert got == [1, 2, 3, 4, 5, 6, 7]


async def test_a_tail_whose_notifications_work_does_not_poll(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Once its run's flushes have announced themselves, an idle tail waits for the next
    hint (or its keepalive) instead of reading every poll interval."""
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    (claimed,) = await manual.claim(conn, schema)
    token = claimed["claim_token"]
    async with _counted_tail(dsn, schema, run.id) as seen:
        await wait_for(lambda: seen.got == [1, 2], what="catch-up")
        for seq in (3, 4, 5):
            assert await manual.append(conn, schema, run.id, token, [(seq, "x", {})])
            await wait_for(lambda s=seq: s in seen.got, timeout=3, what=f"event {seq}")
        seen.pool.pop_stats()
        before = seen.keepalives
        # A second of idleness (the keepalive) at a 0.05 s poll would be about 20 reads.
        await wait_for(lambda: seen.keepalives > before, timeout=5, what="an idle keepalive")
        reads = seen.pool.pop_stats().get("requests_num", 0)
        assert reads <= 2, f"{reads} reads in one idle keepalive: the tail polls although hints work"
        assert await manual.append(conn, schema, run.id, token, [(6, "x", {})])
        await wait_for(lambda: 6 in seen.got, timeout=3, what="event 6, announced")
        assert await manual.finalize(conn, schema, run.id, token, "completed", 7)
    assert seen.got == [1, 2, 3, 4, 5, 6, 7]


async def test_a_cursor_past_the_end_of_the_journal_is_refused(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """A cursor past the last event of a run's journal cannot come from this run's
    stream (seq is gap-free and a tail yields only committed events): waiting would
    silently skip the events up to it, or hang until the run ends and then yield
    nothing. The tail refuses it at once, for a running and for a finished run; a
    cursor at the end is a normal resume."""
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    (claimed,) = await manual.claim(conn, schema)
    token = claimed["claim_token"]
    assert await manual.append(conn, schema, run.id, token, [(3, "x", {})])
    with anyio.fail_after(5), pytest.raises(runrow.InvalidInput, match="from_seq"):
        async for _ in runrow.tail(dsn, run.id, from_seq=10, schema=schema, poll=0.05):
            pass
    with anyio.fail_after(5), pytest.raises(runrow.InvalidInput, match="from_seq"):
        async for _ in runrow.tail(dsn, run.id, from_seq=4, schema=schema, poll=0.05):
            pass
    got: list[int] = []
    async with anyio.create_task_group() as tg:

        async def follow() -> None:
            async for ev in runrow.tail(dsn, run.id, from_seq=3, schema=schema, poll=0.05):
                got.append(ev.seq)

        tg.start_soon(follow)
        assert await manual.append(conn, schema, run.id, token, [(4, "x", {})])
        await wait_for(lambda: got == [4], what="the next event after a cursor at the end")
        assert await manual.finalize(conn, schema, run.id, token, "completed", 5)
    assert got == [4, 5]
    with anyio.fail_after(5), pytest.raises(runrow.InvalidInput, match="from_seq"):
        async for _ in runrow.tail(dsn, run.id, from_seq=6, schema=schema):
            pass


async def test_an_idle_tail_of_a_queued_run_does_not_poll(dsn: str, schema: str) -> None:
    """A run still queued has nothing to announce yet: with a connected hub, its tail
    waits for a hint, reading about once per keepalive, not every poll interval (a
    thousand viewers of a deep queue would otherwise read all the time)."""
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    async with _counted_tail(dsn, schema, run.id) as seen:
        await wait_for(lambda: seen.keepalives >= 1, timeout=5, what="the first keepalive")
        seen.pool.pop_stats()
        await wait_for(lambda: seen.keepalives >= 3, timeout=5, what="two more keepalives")
        reads = seen.pool.pop_stats().get("requests_num", 0)
        # Two keepalives at a 0.05 s poll would be about 40 reads.
        assert reads <= 4, f"{reads} reads over two idle keepalives: the tail polls a queued run"
        seen.stop()


class _Seen:
    """What a counted tail saw: its events' seqs, its keepalives, and its pool."""

    def __init__(self, pool: AsyncConnectionPool, stop: Callable[[], None]) -> None:
        self.pool = pool
        self.stop = stop
        self.got: list[int] = []
        self.keepalives = 0


@asynccontextmanager
async def _counted_tail(dsn: str, schema: str, run_id: uuid.UUID) -> AsyncIterator[_Seen]:
    """A tail (poll 0.05 s, keepalive 1 s) with a hub, reading through a small pool whose
    requests the test counts; the block ends when the tail does (or ``stop()``)."""
    async with (
        AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False, kwargs={"autocommit": True}) as pool,
        runrow.NotifyHub(dsn) as hub,
        anyio.create_task_group() as tg,
    ):
        await wait_for(lambda: hub.connected, what="the hub connected")
        seen = _Seen(pool, tg.cancel_scope.cancel)

        async def follow() -> None:
            async for ev in runrow.tail(pool, run_id, schema=schema, hub=hub, poll=0.05, keepalive=1.0):
                if ev.keepalive:
                    seen.keepalives += 1
                else:
                    seen.got.append(ev.seq)

        tg.start_soon(follow)
        yield seen


async def test_an_enqueue_with_no_partition_for_now_names_the_fix_and_writes_nothing(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """If no worker nor migrate made partitions for a long while, the journal has none
    for runs made now: the enqueue is refused whole, with the fix in the message."""
    await drop_time_partitions(conn, schema)
    with pytest.raises(runrow.JournalPartitionMissing, match="ensure_journal_partitions"):
        await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="hi")
    cur = await conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table(schema, "agent_run")))
    assert await cur.fetchone() == (0,)
    with pytest.raises(runrow.JournalPartitionMissing):
        runrow.sync.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="hi")
    assert await runrow.ensure_journal_partitions(dsn, schema=schema) >= 1
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="hi")
    assert [e[0] for e in await events(conn, schema, run.id)] == [1, 2]


_JSON_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    # (Within 1e15: jsonb keeps a number's decimal text, which reads back as an int
    # once a float is that large, and as a different one if its shortest repr is not exact.)
    | st.floats(min_value=-1e15, max_value=1e15)
    | _JSON_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_JSON_TEXT, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batch=st.lists(
        st.tuples(
            st.sampled_from(["tool_call", "a.b:c-d", "X_9", "content_delta"]),
            st.dictionaries(_JSON_TEXT, _JSON, max_size=4),
        ),
        min_size=1,
        max_size=6,
    )
)
async def test_an_append_stores_each_payload_as_the_writer_encoded_it(
    dsn: str, schema: str, batch: list[tuple[str, dict[str, object]]]
) -> None:
    """The append statement's rows are written out as JSON text directly, each payload
    nested in place as the writer's encoder made it: whatever the payload holds
    (quotes, backslashes, line separators, any plane of Unicode, deep values, big
    numbers), the journal reads back the same value, under its type and seq."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await runrow.enqueue(
            conn, schema=schema, conversation_id=f"c-{uuid.uuid4().hex}", user_id="u", content="x"
        )
        (claimed,) = await manual.claim(conn, schema)
        run_id, token = claimed["id"], claimed["claim_token"]
        first = len(await events(conn, schema, run_id)) + 1
        rows = [(first + i, etype, _json.dumps(payload, "event")) for i, (etype, payload) in enumerate(batch)]
        landed = await _exec.run(
            conn,
            _gw.append(
                schema,
                [_gw.Appended(run_id, token, rows, _gw.row_head(run_id, token))],
                channels=Channels.for_schema(schema),
            ),
        )
        assert landed == {run_id}
        got = (await events(conn, schema, run_id))[first - 1 :]
    assert got == [(first + i, etype, payload) for i, (etype, payload) in enumerate(batch)]
