"""The ending writer's statements: ``finalize`` and ``ending_landed`` (``sql/endings.sql``),
and the bounds it sets around them (``ending_budget*``, ``sql/session.sql``)."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, NamedTuple

from psycopg import AsyncRawCursor

from .. import _sql
from . import claims
from ._exec import Plan, Query
from .journal import EventRow, batch_json

if TYPE_CHECKING:
    import uuid
    from collections.abc import Sequence

    from psycopg import AsyncConnection

    from .._names import Channels


class Ending(NamedTuple):
    """One run's terminal write: its status, error and unsaved answer text, and its last
    events (the terminal ``complete`` event is the last of them)."""

    run_id: uuid.UUID
    claim_token: uuid.UUID
    status: str
    error: str | None
    """The error as JSON text, or None."""
    partial: str | None
    """Streamed answer text not yet in the transcript, saved as a draft."""
    events: Sequence[EventRow]
    retry: bool = False
    """A failed run to retry automatically, if its stamped policy allows (finalize decides)."""
    input_timeout: float | None = None
    """A parked run (status ``waiting``): seconds its input may take (None: no limit)."""
    partial_id: uuid.UUID | None = None
    """The id ``partial`` is saved under (None: a fresh one); a park's text has its wait's
    message id, so a retry parking at the same wait does not save it twice."""
    awaiting: Sequence[uuid.UUID] | None = None
    """A park on children (``wait_for_children``): the children (by first run) it waits on."""
    await_any: bool = False
    """With ``awaiting``: the first of them to end is enough."""
    child: bool = False
    retry_after: float | None = None
    """A run queued again (``RetryLater``, status ``queued``): seconds until it is due."""
    gate_key: str | None = None
    """With ``retry_after``: the rate-limit key whose gate shuts as long."""
    """The run has a parent (a spawned child): its ending may wake it (``wake_parents``)."""


def finalize_params(endings: Sequence[Ending], channels: Channels) -> dict[str, Any]:
    """The ``finalize`` statement's parameters for ``endings`` (the benchmarks' bare loops
    send them too)."""
    runs: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    for e in endings:
        run_id = str(e.run_id)  # (once per run: a UUID's text costs a microsecond)
        run: dict[str, Any] = {"id": run_id, "token": str(e.claim_token), "status": e.status}
        # The rest only when set: a key left out reads as NULL, and the usual ending (no
        # error, text, retry, wait or gate) then costs no encoding of nine nulls and falses.
        if e.error is not None:
            run["error"] = e.error
        if e.partial is not None:
            run["partial"] = e.partial
        if e.partial_id is not None:
            run["partial_id"] = str(e.partial_id)
        if e.retry:
            run["retry"] = True
        if e.input_timeout is not None:
            run["input_timeout"] = e.input_timeout
        if e.awaiting is not None:
            run["awaiting"] = [str(c) for c in e.awaiting]
        if e.status == "waiting":  # (a park stores it, false included)
            run["await_any"] = e.await_any
        if e.retry_after is not None:
            run["retry_after"] = e.retry_after
        if e.gate_key is not None:
            run["gate_key"] = e.gate_key
        runs.append(run)
        events.extend(
            {"run_id": run_id, "seq": seq, "type": etype, "payload": payload}
            for seq, etype, payload in e.events
        )
    return {
        "runs": batch_json(runs),
        "events": batch_json(events),
        "events_prefix": channels.events_prefix,
        "wake_channel": channels.wake,
    }


def _off(endings: Sequence[Ending]) -> frozenset[str]:
    """The finalize steps a batch cannot need (fragments switched off, see ``_sql``): each
    reads only rows its input rules out (a retry, a gate to shut, a ``usage`` event,
    unsaved text)."""
    retry = gate = usage = text = False
    for e in endings:
        retry = retry or e.retry
        gate = gate or e.gate_key is not None
        usage = usage or any(etype == "usage" for _, etype, _ in e.events)
        text = text or e.partial is not None
    return _OFF[retry, gate, usage, text]


_STEPS = ("retried", "gate_shut", "usage_rolled", "answer_saved")
_OFF = {
    needed: frozenset(name for name, on in zip(_STEPS, needed, strict=True) if not on)
    for needed in itertools.product((False, True), repeat=len(_STEPS))
}


async def finalize(
    conn: AsyncConnection,
    schema: str,
    endings: Sequence[Ending],
    *,
    channels: Channels,
    local_bound_ms: int | None = None,
    session_bound_ms: int | None = None,
) -> dict[uuid.UUID, str]:
    """Writes the endings in one statement, each fenced by its claim; returns the runs
    whose ending landed, with the status recorded (a failure or a park that found a
    stop asked for is recorded ``cancelled``). ``local_bound_ms`` bounds this statement
    alone (a setting local to its implicit transaction, pipelined ahead of it: same
    round trip, and JIT off);
    ``session_bound_ms`` sets the bound for the connection's session first (undo it
    with :func:`unset_session_bound` before the connection serves anything else)."""
    query = _sql.positional("finalize", schema, _off(endings))
    params = query.bind(finalize_params(endings, channels))
    cur = AsyncRawCursor(conn)
    children = [e.run_id for e in endings if e.child]
    if local_bound_ms is None and session_bound_ms is None and not children:
        await cur.execute(query.query, params)
    else:
        async with conn.pipeline():
            if session_bound_ms is not None:
                await conn.execute(
                    _sql.statement("ending_budget_session", schema), {"timeout": f"{session_bound_ms}ms"}
                )
            elif local_bound_ms is not None:
                await conn.execute(
                    _sql.statement("ending_budget", schema), {"timeout": f"{local_bound_ms}ms"}
                )
            await cur.execute(query.query, params)
            if children:  # (in the same implicit transaction: no sync between them)
                await _wake_parents(conn, schema, children, channels)
    return {row[0]: row[1] for row in await cur.fetchall()}


async def _wake_parents(conn: AsyncConnection, schema: str, ids: list[uuid.UUID], channels: Channels) -> None:
    """Pipelines ``wake_parents`` for the children among a batch's endings."""
    await conn.execute(_sql.statement("wake_parents", schema), {"ids": ids, "wake_channel": channels.wake})


async def finalize_then_claim(
    conn: AsyncConnection,
    schema: str,
    endings: Sequence[Ending],
    claim: claims.ClaimRequest,
    *,
    channels: Channels,
    local_bound_ms: int | None = None,
    session_bound_ms: int | None = None,
) -> tuple[dict[uuid.UUID, str], list[claims.ClaimedRun]]:
    """:func:`finalize`, then the claim for the slots those runs free, pipelined: one
    round trip and one transaction (the statements between two pipeline syncs form one
    implicit transaction), so a steady run costs one commit, not two.

    The claim sees the endings (a conversation whose turn just ended can give its next
    one). If either statement fails, neither lands: the caller writes the endings again
    without the claim. Without a bound, the connection must already have JIT off for its
    session (a bound turns it off for the transaction)."""
    final = _sql.positional("finalize", schema, _off(endings))
    params = final.bind(finalize_params(endings, channels))
    query, claim_params = claims.statement(schema, claim)
    cur = AsyncRawCursor(conn)
    claimed = claims.rows_cursor(conn)
    async with conn.pipeline():
        if session_bound_ms is not None:
            await conn.execute(
                _sql.statement("ending_budget_session", schema), {"timeout": f"{session_bound_ms}ms"}
            )
        elif local_bound_ms is not None:
            await conn.execute(_sql.statement("ending_budget", schema), {"timeout": f"{local_bound_ms}ms"})
        await cur.execute(final.query, params)
        if children := [e.run_id for e in endings if e.child]:
            await _wake_parents(conn, schema, children, channels)
        await claimed.execute(query, claim_params)
    landed = {row[0]: row[1] for row in await cur.fetchall()}
    return landed, await claims.fetch(claimed)


async def unset_session_bound(conn: AsyncConnection, schema: str) -> None:
    """Takes the session bound that ``finalize(session_bound_ms=...)`` set off again."""
    await conn.execute(_sql.statement("ending_budget_unset", schema))


def landed(schema: str, ending: Ending) -> Plan[str | None]:
    """The status recorded if ``ending`` is the one recorded (an earlier attempt whose
    answer was lost), else None."""
    seq, etype, payload = ending.events[-1]  # the terminal event (a park's input_requested)
    rows = yield Query(
        _sql.statement("ending_landed", schema),
        {
            "run_id": ending.run_id,
            "claim_token": ending.claim_token,
            "status": ending.status,
            "seq": seq,
            "type": etype,
            "payload": payload,
        },
    )
    return str(rows[0][0]) if rows else None
