"""Observers see what the dispatcher does; a broken observer cannot break a run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import runrow

from .helpers import status_of, wait_for

pytestmark = pytest.mark.anyio


class Recorder(runrow.Observer):
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.in_scope = False

    def claimed(self, *, count: int, seconds: float) -> None:
        self.calls.append(("claimed", count))
        assert seconds >= 0

    def run_started(self, run: runrow.RunContext, *, queue_wait: float) -> None:
        self.calls.append(("started", run.content))
        assert queue_wait >= 0

    @contextlib.contextmanager
    def run_scope(self, run: runrow.RunContext) -> Iterator[None]:
        self.in_scope = True
        try:
            yield
        finally:
            self.in_scope = False

    def first_event(self, run: runrow.RunContext, *, seconds: float) -> None:
        self.calls.append(("first_event", run.content))

    def journal_flush(self, run: runrow.RunContext, *, rows: int) -> None:
        self.calls.append(("flush", rows))

    def run_finished(self, run: runrow.RunContext, *, status: str, seconds: float, recorded: bool) -> None:
        self.calls.append(("finished", (run.content, status, recorded)))


class Broken(runrow.Observer):
    def run_started(self, run: runrow.RunContext, *, queue_wait: float) -> None:
        raise RuntimeError("observer bug")


async def test_observers_see_claims_starts_flushes_and_endings(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    rec = Recorder()
    scoped: list[bool] = []

    async def agent(run: runrow.RunContext) -> None:
        scoped.append(rec.in_scope)
        await run.emit({"type": "tool_call_started", "tool_call_id": "1"})
        if run.content == "bad":
            raise ValueError("nope")

    async with runrow.Dispatcher(dsn, agent, schema=schema, observers=[Broken(), rec], poll=0.5):
        runs = [
            await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content=c)
            for c in ("ok", "bad")
        ]
        for r in runs:
            await wait_for(lambda r=r: _ended(conn, schema, r.id), what="runs to end")
    names = [c[0] for c in rec.calls]
    assert names.count("claimed") >= 1 and names.count("started") == 2 and names.count("first_event") == 2
    assert ("finished", ("ok", "completed", True)) in rec.calls
    assert ("finished", ("bad", "failed", True)) in rec.calls
    assert ("flush", 1) in rec.calls
    assert scoped == [True, True]


async def _ended(conn: psycopg.AsyncConnection, schema: str, run_id: object) -> bool:
    return await status_of(conn, schema, run_id) in ("completed", "failed")
