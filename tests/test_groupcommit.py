"""The group-commit writer's batching, its shutdown and its split of a refused batch,
on its own (the statements it runs in the dispatcher are covered by the dispatcher's
tests against PostgreSQL)."""

from __future__ import annotations

import anyio
import psycopg
import pytest

from runrow._engine.groupcommit import GroupCommit, WriterStopped

pytestmark = pytest.mark.anyio


async def test_a_lone_item_goes_at_once_and_late_ones_ride_the_next_batch() -> None:
    batches: list[list[int]] = []
    release = anyio.Event()

    async def write(items: list[int]) -> list[int]:
        batches.append(list(items))
        if len(batches) == 1:
            await release.wait()  # the first batch is in flight while more arrive
        return [i * 10 for i in items]

    gc: GroupCommit[int, int] = GroupCommit(write)
    answers: dict[int, tuple[int | None, BaseException | None]] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(gc.run)
        results: list[int] = []

        async def submit(i: int) -> None:
            results.append(await gc.submit(i))

        tg.start_soon(submit, 1)
        await anyio.sleep(0.05)
        assert batches == [[1]]  # not held back to fill a batch
        for i in (2, 3):
            tg.start_soon(submit, i)
        gc.hand_over(4, lambda r, e: answers.__setitem__(4, (r, e)))
        with anyio.fail_after(5):  # all three queued behind the batch in flight
            while len(gc._queue) < 3:
                await anyio.sleep(0.01)
        release.set()
        with anyio.fail_after(5):
            while len(results) < 3 or 4 not in answers:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert [sorted(b) for b in batches] == [[1], [2, 3, 4]]
    assert sorted(results) == [10, 20, 30] and answers[4] == (40, None)


async def test_a_stopped_writer_answers_at_once_with_writer_stopped() -> None:
    """After the writer's loop has ended (its owner shut down), nothing handed to it
    waits for an answer that cannot come."""
    written: list[list[int]] = []

    async def write(items: list[int]) -> list[int]:
        written.append(list(items))
        return items

    gc: GroupCommit[int, int] = GroupCommit(write)
    async with anyio.create_task_group() as tg:
        tg.start_soon(gc.run)
        assert await gc.submit(1) == 1
        tg.cancel_scope.cancel()
    late: list[tuple[int | None, BaseException | None]] = []
    gc.hand_over(2, lambda r, e: late.append((r, e)))
    assert len(late) == 1 and late[0][0] is None and isinstance(late[0][1], WriterStopped)
    with anyio.fail_after(1), pytest.raises(WriterStopped):
        await gc.submit(3)
    assert written == [[1]]


async def test_a_batch_the_server_refuses_is_retried_item_by_item(dsn: str) -> None:
    """One item the server rejects (not an integrity error: a value it cannot read)
    fails alone; the items batched with it land."""
    batches: list[list[str]] = []
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:

        async def write(items: list[str]) -> list[int]:
            batches.append(list(items))
            cur = await conn.execute(
                "SELECT x::int FROM unnest(%s::text[]) WITH ORDINALITY AS u(x, i) ORDER BY i", (items,)
            )
            return [int(r[0]) for r in await cur.fetchall()]

        gc: GroupCommit[str, int] = GroupCommit(write)
        answers: dict[str, tuple[int | None, BaseException | None]] = {}
        async with anyio.create_task_group() as tg:
            tg.start_soon(gc.run)
            for item in ("1", "oops", "3"):  # queued together: one batch
                gc.hand_over(item, lambda r, e, item=item: answers.__setitem__(item, (r, e)))
            with anyio.fail_after(10):
                while len(answers) < 3:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    assert batches[0] == ["1", "oops", "3"] and sorted(map(tuple, batches[1:])) == [("1",), ("3",), ("oops",)]
    assert answers["1"] == (1, None) and answers["3"] == (3, None)
    assert answers["oops"][0] is None and isinstance(
        answers["oops"][1], psycopg.errors.InvalidTextRepresentation
    )


async def test_a_batch_failing_for_the_server_s_reasons_is_not_split(dsn: str) -> None:
    """A fault that is nobody's item (here the statement is cancelled by its timeout)
    fails the batch as a whole, once: going item by item would only repeat it."""
    batches: list[list[str]] = []
    async with await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, options="-c statement_timeout=50"
    ) as conn:

        async def write(items: list[str]) -> list[int]:
            batches.append(list(items))
            await conn.execute("SELECT pg_sleep(1)")
            return [1 for _ in items]

        gc: GroupCommit[str, int] = GroupCommit(write)
        answers: dict[str, tuple[int | None, BaseException | None]] = {}
        async with anyio.create_task_group() as tg:
            tg.start_soon(gc.run)
            for item in ("a", "b", "c"):
                gc.hand_over(item, lambda r, e, item=item: answers.__setitem__(item, (r, e)))
            with anyio.fail_after(10):
                while len(answers) < 3:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    assert batches == [["a", "b", "c"]]
    assert all(r is None and isinstance(e, psycopg.errors.QueryCanceled) for r, e in answers.values())


async def test_an_item_that_cannot_be_encoded_fails_alone(dsn: str) -> None:
    """An item whose parameters cannot even be encoded (a lone surrogate: the driver
    refuses it before sending) fails alone; the items batched with it land (#17)."""
    batches: list[list[str]] = []
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:

        async def write(items: list[str]) -> list[str]:
            batches.append(list(items))
            cur = await conn.execute(
                "SELECT x FROM unnest(%s::text[]) WITH ORDINALITY AS u(x, i) ORDER BY i", (items,)
            )
            return [str(r[0]) for r in await cur.fetchall()]

        gc: GroupCommit[str, str] = GroupCommit(write)
        answers: dict[str, tuple[str | None, BaseException | None]] = {}
        async with anyio.create_task_group() as tg:
            tg.start_soon(gc.run)
            for item in ("a", "bad\ud800", "c"):  # queued together: one batch
                gc.hand_over(item, lambda r, e, item=item: answers.__setitem__(item, (r, e)))
            with anyio.fail_after(10):
                while len(answers) < 3:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    assert batches[0] == ["a", "bad\ud800", "c"]
    assert answers["a"] == ("a", None) and answers["c"] == ("c", None)
    assert answers["bad\ud800"][0] is None and isinstance(answers["bad\ud800"][1], UnicodeEncodeError)


@pytest.mark.parametrize("fails", [False, True])
async def test_a_cancelled_unshielded_wait_learns_the_outcome_before_the_cancellation_goes_on(
    fails: bool,
) -> None:
    """``settle``: the caller waits unshielded; cancelled while its item is in flight, it
    waits for the batch to end, hands a result (not an error) to ``settle``, and only
    then lets the cancellation through."""
    release = anyio.Event()
    in_flight = anyio.Event()

    async def write(items: list[int]) -> list[int]:
        in_flight.set()
        await release.wait()
        if fails:
            raise psycopg.OperationalError("the connection dropped")
        return [i * 10 for i in items]

    gc: GroupCommit[int, int] = GroupCommit(write)
    settled: list[int] = []
    events: list[str] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(gc.run)
        with anyio.CancelScope() as scope:

            async def cancel_then_release() -> None:
                await in_flight.wait()
                scope.cancel()
                await anyio.sleep(0.05)  # the cancelled wait must still be waiting
                events.append("released")
                release.set()

            tg.start_soon(cancel_then_release)
            try:
                await gc.submit(7, settle=settled.append)
                events.append("returned")
            except anyio.get_cancelled_exc_class():
                events.append("cancelled")
                raise
        assert scope.cancelled_caught
        tg.cancel_scope.cancel()
    assert events == ["released", "cancelled"]
    assert settled == ([] if fails else [70])
