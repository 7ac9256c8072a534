"""The reaper: ends runs whose worker is gone, and waits for input that are over.

Every dispatcher runs one (and a pass at start). A run whose lease lapsed more than
``grace`` seconds ago is ended ``failed`` (``worker_lost``), or ``cancelled`` if a stop
was pending, with the expiry re-checked inside the write itself; one whose deadline
passed more than ``grace`` ago likewise (``deadline_exceeded``). A run both lost and past
its deadline is ended for whichever passed first (its error, its terminal event's reason
and the log line agree). A run waiting for
input past its wait's timeout is ended ``expired`` (``failed`` if that was the turn's
deadline). Nothing is ever re-run automatically unless a retry policy says so.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

import anyio
import psycopg

from .._db import HeldConnection, describe, statement_conn
from .._gateway import partitions as _partitions
from .._gateway import reaper as _reaper
from .._gateway import workers as _workers
from .._gateway._exec import run
from .._names import DEFAULT_SCHEMA, Channels

if TYPE_CHECKING:
    import uuid
    from collections.abc import Callable
    from datetime import datetime

    from anyio.abc import TaskStatus
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

    from .._gateway.reaper import Reaped
    from .kit import Kit
    from .roster import Roster

log = logging.getLogger("runrow.dispatcher")

# How often a worker makes sure the journal's partitions are made ahead (they are made
# journal_settings.premake intervals ahead, a day each by default: hourly is plenty).
_PARTITIONS_EVERY = 600.0

_WHY = {"input_expired": "its wait for input is over", "deadline_exceeded": "past its deadline"}


class Reaper:
    """A dispatcher's reaper (service ``reaper``)."""

    def __init__(self, kit: Kit, roster: Roster, conn: HeldConnection) -> None:
        self._settings = kit.settings
        self._stranded: frozenset[uuid.UUID] = frozenset()  # the last ones warned of
        self._roster = roster
        self._conn = conn  # kept for the reaper (see parts.py)
        self._stats = kit.stats
        self._observe = kit.observe
        self._signals = kit.signals

    async def run(self, *, task_status: TaskStatus[None]) -> None:
        """A pass now, then one every ``reap_interval`` seconds (counted from each pass's
        start, so a slow pass does not push the next one back)."""
        task_status.started()
        s = self._settings
        partitions_due = 0.0
        while True:
            if anyio.current_time() >= partitions_due:
                partitions_due = anyio.current_time() + _PARTITIONS_EVERY
                await self._ensure_partitions()
            due = anyio.current_time() + s.reap_interval
            try:
                with anyio.CancelScope(shield=True), anyio.fail_after(max(s.poll, 5.0)):
                    await self.reap()
            except (psycopg.Error, OSError, TimeoutError) as exc:
                log.warning("reaper pass failed: %s", describe(exc), extra={"worker_id": s.worker_id})
            await anyio.sleep(max(0.0, due - anyio.current_time()))

    async def _ensure_partitions(self) -> None:
        """Keeps the journal's partitions made ahead of the clock (see _partitions.py):
        every worker does, so a run's first events always find theirs."""
        s = self._settings
        try:
            # Shielded and bounded, like every service's statement: cut by a stop, the
            # statement's cancel request would be interrupted too, and psycopg would
            # close the connection with warnings. (Its lock waits stop at 5 s: see
            # journal_ensure_partitions.)
            with anyio.CancelScope(shield=True), anyio.fail_after(10.0):
                async with statement_conn(self._conn) as conn:
                    made = await run(conn, _partitions.ensure(s.schema))
            if made:
                log.info("made %d journal partition(s) ahead", made, extra={"worker_id": s.worker_id})
        except (psycopg.Error, OSError, TimeoutError) as exc:
            log.warning(
                "making journal partitions failed: %s", describe(exc), extra={"worker_id": s.worker_id}
            )

    async def reap(self, *, now: datetime | None = None, limit: int = 100) -> list[uuid.UUID]:
        """One pass; returns the ids it ended."""
        s = self._settings
        ended = await reap_expired(
            self._conn,
            schema=s.schema,
            grace=s.grace,
            now=now,
            limit=limit,
            on_reaped=self._counted,
            reaper_id=s.worker_id,
        )
        if self._signals is not None and ended:
            self._signals.reaped.fire(ended)
        # The registry's dead, by the same rule as their runs (lease + grace).
        async with statement_conn(self._conn) as conn:
            gone = await run(conn, _workers.reap(s.schema, grace_seconds=s.grace, now=now))
        for w in gone:
            log.info(
                "removed worker %s (pid %d on %s, version %s) from the registry: no heartbeat",
                *(w.id, w.pid, w.host, w.version or "-"),
                extra={"lost_worker_id": w.id, "worker_id": s.worker_id},
            )
        if s.resume_policy == "same_version":
            await self._warn_stranded()
        return ended

    async def _warn_stranded(self) -> None:
        """Under ``same_version``, warns of runs no live worker's version can resume for
        longer than lease + grace (a dead worker's registration is gone by then), once
        per change of the set: never silently stuck."""
        s = self._settings
        async with statement_conn(self._conn) as conn:
            found = await run(conn, _workers.stranded(s.schema, older_than=s.lease + s.grace, limit=100))
        ids = frozenset(r.id for r in found)
        if ids and ids != self._stranded:
            versions = sorted({r.version for r in found})
            log.warning(
                "%d run(s) stranded: queued with recorded steps for version %s, which no live "
                "worker has (resume_policy='same_version'); start a worker of that version or "
                "one with resume_policy='replay' (runrow workers stranded lists them)",
                *(len(ids), ", ".join(versions)),
                extra={"worker_id": s.worker_id, "versions": versions},
            )
        self._stranded = ids

    def _counted(self, n: int) -> None:
        self._stats["reaped"] += n
        if n:
            self._observe(lambda o: o.reaped(count=n))
            self._roster.waker.set()  # a reaped run's conversation may have a next turn


async def reap_expired(
    db: AsyncConnectionPool[AsyncConnection] | AsyncConnection | str | HeldConnection,
    *,
    schema: str = DEFAULT_SCHEMA,
    grace: float = 30.0,
    now: datetime | None = None,
    limit: int = 100,
    on_reaped: Callable[[int], Any] | None = None,
    reaper_id: str | None = None,
) -> list[uuid.UUID]:
    """Ends runs whose lease lapsed more than ``grace`` seconds ago; returns their ids.
    ``now`` moves the clock (tests); ``on_reaped(n)`` is told each batch's count."""
    channels = Channels.for_schema(schema)
    reaped: list[uuid.UUID] = []

    async def reap(ids: list[uuid.UUID]) -> list[Reaped]:
        async with statement_conn(db) as conn:
            return await run(conn, _reaper.reap(schema, ids, grace_seconds=grace, channels=channels, now=now))

    while True:
        async with statement_conn(db) as conn:
            ids = await run(conn, _reaper.candidates(schema, grace_seconds=grace, limit=limit, now=now))
        if not ids:
            break
        try:
            ended = await reap(ids)
        except psycopg.errors.UniqueViolation:
            # A dying worker's last append raced one run's terminal event (same seq). That
            # run must not hold back the others: each goes again alone (a fresh snapshot
            # sees the append, so the victim usually goes through too; if not, next pass).
            ended = []
            for one in ids if len(ids) > 1 else []:
                with contextlib.suppress(psycopg.errors.UniqueViolation):
                    ended.extend(await reap([one]))
            if not ended:
                break
        for r in ended:
            reaped.append(r.run_id)
            why = _WHY.get(r.reason) or f"worker {r.worker_id} lost"
            log.warning(
                "reaped run %s (%s): %s",
                r.run_id,
                why,
                r.status,
                extra={
                    "run_id": str(r.run_id),
                    "conversation_id": r.conversation_id,
                    "lost_worker_id": r.worker_id,
                    "worker_id": reaper_id,
                },
            )
        if on_reaped is not None:
            on_reaped(len(ended))
        if len(ids) < limit or not ended:
            break  # (none ended: the rest are held by others, for the next pass)
    return reaped
