"""Automatic retries (Dispatcher(retry=RetryPolicy(...))): opt-in, in the ending's commit."""

from __future__ import annotations

import itertools
import uuid
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow

from . import manual
from .helpers import blocked_by, events, is_terminal, rows, run_row, status_of, table, wait_for

pytestmark = pytest.mark.anyio

FAST = {"poll": 0.5, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.2}
NOW = runrow.RetryPolicy(max_attempts=3, backoff=0)


async def _lineage(conn: psycopg.AsyncConnection, schema: str, first: uuid.UUID) -> list[dict[str, Any]]:
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    await cur.execute(
        sql.SQL(
            "SELECT id, status, attempt, retry_of, lineage_id, error, created_at, finished_at, queue_order,"
            " not_before FROM {} WHERE id = %(id)s OR lineage_id = %(id)s ORDER BY attempt"
        ).format(table(schema, "agent_run")),
        {"id": first},
    )
    return await cur.fetchall()


async def _lapsed(conn: psycopg.AsyncConnection, schema: str, run_id: uuid.UUID) -> None:
    """Waits until ``run_id``'s lease has lapsed by the database's clock (a reap candidate
    at grace 0), instead of sleeping past it."""

    async def due() -> bool:
        return run_id in await manual.reap_candidates(conn, schema, grace=0.0)

    await wait_for(due, what="the lease to lapse")


async def _settled(conn: psycopg.AsyncConnection, schema: str, first: uuid.UUID) -> list[dict[str, Any]]:
    """The lineage once its last run has ended and no retry follows it."""

    async def done() -> list[dict[str, Any]] | None:
        runs = await _lineage(conn, schema, first)
        return runs if runs[-1]["finished_at"] is not None else None

    runs = await wait_for(done, timeout=20, what="the lineage to settle")
    # A negative check, so a fixed wait: an ending queues its retry in its own commit (so
    # the read above would see it); what else queues one is the reaper, every reap_interval.
    await anyio.sleep(1.5 * FAST["reap_interval"])
    again = await _lineage(conn, schema, first)
    assert len(again) == len(runs), again
    return again


async def test_a_retryable_failure_is_retried_in_the_same_commit_until_it_succeeds(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    attempts: list[int] = []

    async def agent(run: runrow.RunContext) -> None:
        attempts.append(run.attempt)
        if run.attempt < 3:
            raise TimeoutError(f"model timed out on attempt {run.attempt}")
        await run.write_message("third time lucky")

    async with runrow.Dispatcher(dsn, agent, schema=schema, retry=NOW, **FAST):
        first = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="hi")
        runs = await _settled(conn, schema, first.id)
    assert [r["status"] for r in runs] == ["failed", "failed", "completed"]
    assert [r["attempt"] for r in runs] == attempts == [1, 2, 3]
    assert [r["retry_of"] for r in runs] == [None, runs[0]["id"], runs[1]["id"]]
    assert [r["lineage_id"] for r in runs] == [None, first.id, first.id]
    for failed, retry in itertools.pairwise(runs):
        # now() is the transaction's start: equal stamps mean one transaction wrote both.
        assert retry["created_at"] == failed["finished_at"]
        assert retry["queue_order"] == failed["queue_order"]  # the turn keeps its place
    queued = [e for e in await events(conn, schema, runs[1]["id"]) if e[1] == "run_queued"]
    assert queued[0][2]["attempt"] == 2 and queued[0][2]["retry_of"] == str(runs[0]["id"])
    assert [m.content for m in await runrow.transcript(dsn, "c", schema=schema)] == ["hi", "third time lucky"]


async def test_an_answer_written_before_the_failure_is_in_the_transcript_once(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """Attempt 1 writes the turn's answer, then fails (or its worker dies before the
    ending: the same for the transcript). The retry replays the turn and writes the same
    answer: it finds it written (the n-th message of a turn has one id across attempts)
    instead of adding it twice. test_steps_kill.py found the duplicate under kill -9."""
    ids: list[uuid.UUID] = []

    async def agent(run: runrow.RunContext) -> None:
        ids.append(await run.write_message("the answer"))
        ids.append(await run.write_message("and a footnote"))
        if run.attempt == 1:
            raise TimeoutError("the model timed out after answering")

    async with runrow.Dispatcher(dsn, agent, schema=schema, retry=NOW, **FAST):
        first = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="hi")
        runs = await _settled(conn, schema, first.id)
    assert [r["status"] for r in runs] == ["failed", "completed"]
    assert ids[:2] == ids[2:]  # the retry got back the ids the first attempt wrote
    transcript = await runrow.transcript(dsn, "c", schema=schema)
    assert [(m.role, m.content) for m in transcript] == [
        ("user", "hi"),
        ("assistant", "the answer"),
        ("assistant", "and a footnote"),
    ]


async def test_retries_stop_at_max_attempts(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> None:
    async def agent(run: runrow.RunContext) -> None:
        raise RuntimeError("always")

    async with runrow.Dispatcher(dsn, agent, schema=schema, retry=NOW, **FAST):
        first = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="hi")
        runs = await _settled(conn, schema, first.id)
    assert [(r["status"], r["attempt"]) for r in runs] == [("failed", 1), ("failed", 2), ("failed", 3)]


@pytest.mark.parametrize(
    ("policy", "raised", "retried"),
    [
        (runrow.RetryPolicy(backoff=0, retry_on=(TimeoutError,)), ValueError("bad tool input"), False),
        (runrow.RetryPolicy(backoff=0, retry_on=(TimeoutError,)), TimeoutError("slow model"), True),
        (None, TimeoutError("slow model"), False),  # no policy: at-most-once, never retried
        (NOW, runrow.StepMismatch(uuid.uuid4(), 0, "a", "b"), False),  # replay cannot mend it
        (NOW, ExceptionGroup("tools", [runrow.StepMismatch(uuid.uuid4(), 0, "a", "b")]), False),
        (NOW, ExceptionGroup("tools", [TimeoutError("slow")]), True),
    ],
    ids=["not-in-retry_on", "in-retry_on", "no-policy", "step-mismatch", "in-a-group", "group"],
)
async def test_only_the_errors_the_policy_names_are_retried(
    dsn: str,
    schema: str,
    conn: psycopg.AsyncConnection,
    policy: runrow.RetryPolicy | None,
    raised: Exception,
    retried: bool,
) -> None:
    async def agent(run: runrow.RunContext) -> None:
        if run.attempt == 1:
            raise raised

    async with runrow.Dispatcher(dsn, agent, schema=schema, retry=policy, **FAST):
        first = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="hi")
        runs = await _settled(conn, schema, first.id)
    assert [r["status"] for r in runs] == (["failed", "completed"] if retried else ["failed"])


async def test_a_lost_worker_is_retried_by_any_process_reaper(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """The policy travels with the run (its claim stamps it): a reaper in a process that
    has no policy of its own still retries the run, in the reap's own commit."""
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="hi")
    await manual.claim(conn, schema, lease=0.2, worker_id="doomed", retry_policy=NOW.stamp())
    await _lapsed(conn, schema, run.id)
    assert await manual.reap(conn, schema, [run.id], grace=0.0) == [run.id]
    failed, retry = await _lineage(conn, schema, run.id)
    assert failed["error"]["type"] == "worker_lost"
    assert (retry["status"], retry["attempt"], retry["created_at"]) == ("queued", 2, failed["finished_at"])
    # A policy without worker_lost leaves a lost worker's run failed.
    other = await runrow.enqueue(dsn, schema=schema, conversation_id="d", user_id="u", content="hi")
    stamp = runrow.RetryPolicy(backoff=0, worker_lost=False).stamp()
    # (The first run's retry is due too: both are claimed, only `other` is reaped.)
    claimed = await manual.claim(conn, schema, limit=10, lease=0.2, worker_id="doomed", retry_policy=stamp)
    assert other.id in {r["id"] for r in claimed}
    await _lapsed(conn, schema, other.id)
    assert await manual.reap(conn, schema, [other.id], grace=0.0) == [other.id]
    assert len(await _lineage(conn, schema, other.id)) == 1


async def test_an_uncertain_step_blocks_the_retry(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """A lost worker whose turn has a step begun and never recorded: a retry would fail
    with StepUncertain, so none is queued; with only recorded steps, one is."""
    for key, status, retried in (("charge", "started", False), ("lookup", "recorded", True)):
        conversation = f"c-{key}"
        run = await runrow.enqueue(
            dsn, schema=schema, conversation_id=conversation, user_id="u", content="hi"
        )
        (claimed,) = await manual.claim(conn, schema, lease=0.2, retry_policy=NOW.stamp())
        await conn.execute(
            sql.SQL(
                "INSERT INTO {} (lineage_id, key, occurrence, position, run_id, status, idempotent, result,"
                " recorded_at) VALUES (%s, %s, 0, 0, %s, %s, false, %s, %s)"
            ).format(table(schema, "run_step")),
            (
                run.id,
                key,
                run.id,
                status,
                None if status == "started" else psycopg.types.json.Jsonb(1),
                None if status == "started" else claimed["started_at"],
            ),
        )
        await _lapsed(conn, schema, run.id)
        assert await manual.reap(conn, schema, [run.id], grace=0.0) == [run.id]
        assert len(await _lineage(conn, schema, run.id)) == (2 if retried else 1)


async def test_a_stopped_run_is_never_retried(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> None:
    """The ending's retry flag is not enough: a stop already asked for wins (read from the
    row the ending locks, so a stop that committed while the ending waited counts)."""
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="hi")
    (claimed,) = await manual.claim(conn, schema, retry_policy=NOW.stamp())
    await runrow.cancel_run(dsn, run.id, schema=schema)  # the flag; the worker has not seen it
    error = {"type": "RuntimeError", "message": "failed anyway"}
    assert await manual.finalize(
        conn, schema, run.id, claimed["claim_token"], "failed", 3, error=error, retry=True
    )
    assert len(await _lineage(conn, schema, run.id)) == 1


async def test_a_stop_that_waited_on_the_ending_cancels_its_retry(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """stop_conversation blocked on the running run's lock while its ending commits a
    retry: the stop must still land on the retry (a second sweep, in a new snapshot)."""
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="hi")
    (claimed,) = await manual.claim(conn, schema, retry_policy=NOW.stamp())
    stopped: list[runrow.StopResult] = []

    async def stop() -> None:
        stopped.append(await runrow.stop_conversation(dsn, "c", schema=schema))

    # Not autocommit: the ending stays uncommitted, holding the run's lock, until commit().
    async with await psycopg.AsyncConnection.connect(dsn) as ender:
        error = {"type": "RuntimeError", "message": "boom"}
        assert await manual.finalize(
            ender, schema, run.id, claimed["claim_token"], "failed", 3, error=error, retry=True
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(stop)
            pid = ender.info.backend_pid
            await wait_for(lambda: blocked_by(conn, pid), what="the stop to wait for the run's lock")
            assert not stopped
            await ender.commit()
    failed, retry = await _lineage(conn, schema, run.id)
    assert failed["status"] == "failed"
    assert stopped[0].cancelled == [retry["id"]] and retry["status"] == "cancelled"
    assert [d.content for d in stopped[0].drafts] == ["hi"]


async def test_the_retry_runs_before_the_conversations_later_turns(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    order: list[tuple[Any, int]] = []

    async def agent(run: runrow.RunContext) -> None:
        order.append((run.content, run.attempt))
        if run.content == "first" and run.attempt == 1:
            raise TimeoutError("flaky")

    first = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="first")
    second = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="second")
    async with runrow.Dispatcher(dsn, agent, schema=schema, retry=NOW, concurrency=4, **FAST):
        await wait_for(lambda: is_terminal(conn, schema, second.id), timeout=20, what="the later turn")
    assert order == [("first", 1), ("first", 2), ("second", 1)]
    assert len(await _lineage(conn, schema, first.id)) == 2


async def test_backoff_delays_the_retry_and_stop_cancels_it_while_it_waits(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    async def agent(run: runrow.RunContext) -> None:
        raise TimeoutError("flaky")

    policy = runrow.RetryPolicy(backoff=30, max_backoff=45)
    settings = {**FAST, "poll": 0.2}  # a short tick: the negative check below waits three
    async with runrow.Dispatcher(dsn, agent, schema=schema, retry=policy, **settings):
        first = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="hi")
        await wait_for(lambda: is_terminal(conn, schema, first.id), what="the first attempt")
        failed, retry = await _lineage(conn, schema, first.id)
        assert retry["not_before"] - failed["finished_at"] == timedelta(seconds=30)
        later = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="later")
        # A negative check, so a fixed wait: three claim ticks, and neither runs.
        await anyio.sleep(3 * settings["poll"])
        assert await status_of(conn, schema, retry["id"]) == "queued"
        assert await status_of(conn, schema, later.id) == "queued"
        result = await runrow.stop_conversation(dsn, "c", schema=schema)
    assert set(result.cancelled) == {retry["id"], later.id}


async def test_a_drain_cut_is_retried_as_a_lost_worker(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    started = anyio.Event()

    async def agent(run: runrow.RunContext) -> None:
        started.set()
        await anyio.sleep_forever()

    d = runrow.Dispatcher(dsn, agent, schema=schema, retry=runrow.RetryPolicy(backoff=60), **FAST)
    async with d:
        first = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="hi")
        await started.wait()
        report = await d.stop(drain_timeout=0.2)
    assert report.interrupted == [first.id]
    failed, retry = await _lineage(conn, schema, first.id)
    assert failed["error"]["type"] == "worker_shutdown" and retry["status"] == "queued"


async def test_a_retry_keeps_the_turns_deadline_and_none_is_queued_past_it(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    async def agent(run: runrow.RunContext) -> None:
        raise TimeoutError("flaky")

    policy = runrow.RetryPolicy(max_attempts=5, backoff=2.0)
    async with runrow.Dispatcher(dsn, agent, schema=schema, retry=policy, **FAST):
        first = await runrow.enqueue(
            dsn, schema=schema, conversation_id="c", user_id="u", content="hi", deadline=timedelta(seconds=3)
        )
        # Attempt 1 fails at once; its retry is due 2 s later, within the deadline, and
        # keeps it; attempt 2's retry would be due 4 s after that, past it: none.
        runs = await _settled(conn, schema, first.id)
    assert [(r["attempt"], r["status"]) for r in runs] == [(1, "failed"), (2, "failed")]
    info = [await runrow.get_run(dsn, r["id"], schema=schema) for r in runs]
    assert info[0].deadline_at is not None and info[1].deadline_at == info[0].deadline_at


async def test_a_deadline_is_not_retried(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> None:
    async def agent(run: runrow.RunContext) -> None:
        await anyio.sleep_forever()

    async with runrow.Dispatcher(dsn, agent, schema=schema, retry=NOW, **FAST):
        first = await runrow.enqueue(
            dsn,
            schema=schema,
            conversation_id="c",
            user_id="u",
            content="hi",
            deadline=timedelta(seconds=0.5),
        )
        runs = await _settled(conn, schema, first.id)
    assert [(r["status"], r["error"]["type"]) for r in runs] == [("failed", "deadline_exceeded")]


# -- retry_run: a person's retry is the same turn, with the same deadline ----------------


async def _ended(dsn: str, schema: str, conversation: str, deadline: timedelta) -> runrow.RunInfo:
    """A cancelled turn (retryable) whose deadline is ``deadline`` from now."""
    run = await runrow.enqueue(
        dsn, schema=schema, conversation_id=conversation, user_id="u", content="hi", deadline=deadline
    )
    await runrow.cancel_run(dsn, run.id, schema=schema)
    return await runrow.get_run(dsn, run.id, schema=schema)


async def test_retry_run_keeps_the_turns_deadline_or_sets_or_clears_it_when_told(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    kept = await _ended(dsn, schema, "kept", timedelta(hours=1))
    retry = await runrow.retry_run(dsn, kept.id, schema=schema)
    assert kept.deadline_at is not None
    assert (await runrow.get_run(dsn, retry.id, schema=schema)).deadline_at == kept.deadline_at

    none = await runrow.enqueue(dsn, schema=schema, conversation_id="none", user_id="u", content="hi")
    await runrow.cancel_run(dsn, none.id, schema=schema)
    retry = await runrow.retry_run(dsn, none.id, schema=schema)  # no deadline to keep
    assert retry.created and (await runrow.get_run(dsn, retry.id, schema=schema)).deadline_at is None

    cleared = await _ended(dsn, schema, "cleared", timedelta(hours=1))
    retry = await runrow.retry_run(dsn, cleared.id, deadline=None, schema=schema)
    assert (await runrow.get_run(dsn, retry.id, schema=schema)).deadline_at is None

    moved = await _ended(dsn, schema, "moved", timedelta(hours=1))
    before = await manual.db_now(conn)
    retry = await runrow.retry_run(dsn, moved.id, deadline=timedelta(hours=3), schema=schema)
    new = (await runrow.get_run(dsn, retry.id, schema=schema)).deadline_at
    assert new is not None and timedelta(hours=3) <= new - before < timedelta(hours=3, minutes=1)


async def test_retry_run_refuses_a_kept_deadline_that_has_passed_and_names_the_override(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    late = await _ended(dsn, schema, "late", timedelta(seconds=-1))
    written = await rows(conn, sql.SQL("SELECT count(*) FROM {}").format(table(schema, "agent_run")))
    with pytest.raises(runrow.DeadlinePassed) as refused:
        await runrow.retry_run(dsn, late.id, schema=schema)
    assert isinstance(refused.value, runrow.InvalidInput)
    assert refused.value.run_id == late.id and refused.value.deadline_at == late.deadline_at
    assert "deadline=" in str(refused.value) and "deadline=None" in str(refused.value)
    assert await rows(conn, sql.SQL("SELECT count(*) FROM {}").format(table(schema, "agent_run"))) == written
    # Told what to do instead, it retries.
    retry = await runrow.retry_run(dsn, late.id, deadline=timedelta(minutes=5), schema=schema)
    assert retry.created and retry.status == "queued"
    # A repeat returns that retry, whatever its deadline argument says.
    again = await runrow.retry_run(dsn, late.id, schema=schema)
    assert (again.id, again.created) == (retry.id, False)


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": True}, "max_attempts"),
        ({"max_attempts": 101}, "max_attempts"),
        ({"max_backoff": 1e12}, "max_backoff"),
        ({"backoff": -1}, "backoff"),
        ({"max_backoff": float("inf")}, "max_backoff"),
        ({"retry_on": ValueError}, "retry_on"),
        ({"retry_on": ("ValueError",)}, "retry_on"),
        ({"worker_lost": 1}, "worker_lost"),
    ],
)
def test_a_bad_policy_is_refused(kwargs: dict[str, Any], problem: str) -> None:
    with pytest.raises(runrow.ConfigurationError, match=problem):
        runrow.RetryPolicy(**kwargs)


def test_the_dispatcher_refuses_what_is_not_a_policy() -> None:
    async def agent(run: runrow.RunContext) -> None:
        pass

    with pytest.raises(runrow.ConfigurationError, match="RetryPolicy"):
        runrow.Dispatcher("dbname=unused", agent, retry={"max_attempts": 3})  # type: ignore[arg-type]


async def test_get_run_and_the_journal_show_the_attempt(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    async def agent(run: runrow.RunContext) -> None:
        if run.attempt == 1:
            raise TimeoutError("flaky")

    async with runrow.Dispatcher(dsn, agent, schema=schema, retry=NOW, **FAST):
        first = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="hi")
        _, second = await _settled(conn, schema, first.id)
    info = await runrow.get_run(dsn, second["id"], schema=schema)
    assert (info.attempt, info.lineage_id, info.retry_of, info.status) == (2, first.id, first.id, "completed")
    assert [r.attempt for r in await runrow.list_runs(dsn, schema=schema)] == [2, 1]
    assert await rows(conn, sql.SQL("SELECT count(*) FROM {}").format(table(schema, "run_step"))) == [(0,)]
    assert (await run_row(conn, schema, first.id))["retry_policy"]["max_attempts"] == 3
