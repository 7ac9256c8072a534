"""A run's fenced transcript write (``RunContext.write_message``), resolved when its
answer is lost: read back, and sent again only if it did not land."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import anyio
import psycopg

from .._db import describe, out_of_budget, statement_conn
from .._gateway import messages
from .._gateway._exec import run

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._gateway._exec import Plan
    from .._gateway.messages import MessageState
    from .flight import ActiveRun, RunHost

__all__ = ["write_resolving"]

log = logging.getLogger("runrow.run")

# Failures that leave a write's outcome unknown: read it back before retrying.
_TRANSIENT = (psycopg.OperationalError, psycopg.InterfaceError, TimeoutError)
_TRANSCRIPT_WRITE = "a transcript write (write_message)"  # as a timed-out run's error names it


async def write_resolving(
    host: RunHost,
    claimed: ActiveRun,
    params: dict[str, Any],
    plan: Callable[[], Plan[bool]] | None = None,
    read_back: Callable[[], Plan[MessageState]] | None = None,
) -> bool:
    """The fenced write; after a failure without an answer (a cut connection, a
    database restart), reads back whether the message landed and retries only if
    it did not. False: the claim is no longer this worker's. ``plan`` (default: the
    message alone) may make a statement that writes more with it, all or nothing,
    returning whether its fence held (messages.write_after_events), with ``read_back``
    telling whether it landed (messages.rows_landed)."""
    schema = host.settings.schema
    fence_told = plan is not None  # (its False is the fence's, never an earlier write's)
    write = plan or (lambda: messages.write(schema, **params))
    budget = host.settings.lease / 2
    deadline = anyio.current_time() + budget
    delay = 0.05
    attempt = 0
    while True:
        attempt += 1
        try:
            with anyio.fail_after(max(deadline - anyio.current_time(), delay)):
                # (With the step writes: runs in flight share its commit.)
                written = await host.write_together(write)
            if written:
                return True
            if fence_told or (attempt == 1 and claimed.row.lineage_id is None):
                return False  # the fence matched nothing (a first attempt's id is fresh)
            # Nothing written: the fence, or the id taken by an earlier write (this
            # one's, whose answer was lost, or an earlier attempt's of this turn, for a
            # retry). The read-back below tells which.
        except _TRANSIENT as exc:
            if anyio.current_time() + delay > deadline:
                if (named := out_of_budget(exc, _TRANSCRIPT_WRITE, budget)) is not None:
                    raise named from exc
                raise
            host.db_trouble()
            log.info(
                "transcript write of run %s failed (%s); checking whether it landed",
                claimed.id,
                describe(exc),
                extra={"run_id": str(claimed.id)},
            )
        while True:
            await anyio.sleep(delay)
            delay = min(delay * 2, 1.0)
            try:
                with anyio.fail_after(max(deadline - anyio.current_time(), delay)):
                    async with statement_conn(host.pool()) as conn:
                        got = await run(
                            conn,
                            read_back()
                            if read_back is not None
                            else messages.landed(
                                schema,
                                message_id=params["message_id"],
                                run_id=claimed.id,
                                claim_token=claimed.token,
                            ),
                        )
                landed, owned = got.landed, got.owned
                break
            except _TRANSIENT as exc:
                if anyio.current_time() + delay > deadline:
                    if (named := out_of_budget(exc, _TRANSCRIPT_WRITE, budget)) is not None:
                        raise named from exc
                    raise
        if landed:
            return True
        if not owned:
            return False
