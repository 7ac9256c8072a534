"""The group-commit writer's batching and its shutdown, on its own (the statements it
runs in the dispatcher are covered by the dispatcher's tests against PostgreSQL)."""

from __future__ import annotations

import anyio
import pytest

from runrow._groupcommit import GroupCommit, WriterStopped

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
        await anyio.sleep(0.05)
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
