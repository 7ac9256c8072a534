"""The claimer's statements (``claim``, ``claim_fifo`` in ``sql/claims.sql``); the ending
writer sends the same claim after a batch of endings (see ``endings.finalize_then_claim``)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from psycopg import AsyncRawCursor

from .. import _sql
from ._exec import execute

if TYPE_CHECKING:
    import uuid
    from collections.abc import Callable, Sequence
    from datetime import datetime

    from psycopg import AsyncConnection, AsyncCursor

ClaimOrder = Literal["fair", "fifo"]
ResumePolicy = Literal["replay", "same_version"]


class ClaimedRun(NamedTuple):
    """One run a claim took: the row, stamped with this claim's token and lease.

    A named tuple, built straight from the row (the claim's RETURNING list has these
    columns in this order; :func:`_check_columns` checks the names once per process): the claim is
    the hot path, and a tuple costs less to build than any other record."""

    id: uuid.UUID
    claim_token: uuid.UUID
    conversation_id: str
    user_id: str
    tenant_id: str | None
    request: Any
    user_message_id: uuid.UUID
    cancel_requested: bool
    created_at: datetime
    started_at: datetime
    deadline_at: datetime | None
    priority: int
    lineage_id: uuid.UUID | None
    attempt: int
    resumes: int
    content: Any
    last_seq: int
    agent_key: str | None
    """The agent that runs it (None: the default agent)."""
    parent_run_id: uuid.UUID | None
    """A child's parent (its turn's first run); None for a turn a host enqueued."""
    root_run_id: uuid.UUID | None
    """A child's tree root (its turn's first run); None for a turn a host enqueued."""
    limited: bool
    """Whether any rate limit or gate was defined when it was claimed (the claimer's
    choice of the next claim's statement: see :attr:`ClaimRequest.limits`)."""


class ClaimRequest(NamedTuple):
    """What one claim asks for (the claim statement's parameters, and its order)."""

    order: ClaimOrder
    limit: int
    lease_seconds: float
    worker_id: str
    retry_policy: str | None = None
    """JSON text stamped on each claimed run (None: not retried)."""
    now: datetime | None = None
    version: str | None = None
    """The claiming worker's version: the run's own if it has none yet (see ``claim``)."""
    same_version: bool = False
    """Take a run with recorded steps only if its version is ``version`` (see ``claim``)."""
    agent_keys: Sequence[str] = ()
    """The agent keys this worker serves (see ``claim``)."""
    serves_default: bool = True
    """Whether it serves the default agent (runs whose agent_key is NULL)."""
    tree_cap: int | None = None
    """At most this many of a tree's spawned runs running (see ``claim``); None: no cap."""
    limits: bool = True
    """False: the claim without the rate-limit steps (a smaller plan), which claims
    nothing at all if any rate limit or gate is defined. Ask for it only after a claim
    whose runs said none was (``ClaimedRun.limited``), and ask again with the full
    claim when it comes back empty."""


@functools.cache
def _off(tree_cap: bool, same_version: bool, limits: bool, one: bool) -> frozenset[str]:
    """The claim's steps a request does not need (fragments switched off: see ``_sql``).
    ``one``: the request is for one run, whose id the last step compares as a scalar."""
    off: list[str] = ["stamp_many"] if one else []
    if not tree_cap:
        off += ("tree_open", "tree_capped")
    if not same_version:
        off.append("version_open")
    if not limits:
        off += ("limits_open", "limits_grant")
    return frozenset(off)


def statement(schema: str, req: ClaimRequest) -> tuple[bytes, tuple[Any, ...]]:
    """The claim statement for ``req``'s order, with positional placeholders (run it on a
    :func:`rows_cursor`), and its parameters."""
    off = _off(req.tree_cap is not None, req.same_version, req.limits, req.limit == 1)
    if req.order == "fair":
        query = _sql.positional("claim", schema, off)
    else:
        query = _sql.positional("claim_fifo", schema, off)
    return query.query, query.bind(_params(req))


def _params(req: ClaimRequest) -> dict[str, Any]:
    """The claim's named parameters for ``req`` (a variant binds those it takes)."""
    return {
        "limit": req.limit,
        "lease_seconds": req.lease_seconds,
        "worker_id": req.worker_id,
        "now": req.now,
        "retry_policy": req.retry_policy,
        "version": req.version,
        "same_version": req.same_version,
        "agent_keys": _text_array(tuple(req.agent_keys)),
        "serves_default": req.serves_default,
        "tree_cap": req.tree_cap,
    }


@functools.lru_cache(maxsize=64)
def _text_array(items: tuple[str, ...]) -> str:
    """``items`` as a text[] literal (the statement casts it): a worker's keys are the same
    on every claim, and psycopg would inspect and adapt the list again each time."""
    quoted = ('"' + i.replace("\\", "\\\\").replace('"', '\\"') + '"' for i in items)
    return "{" + ",".join(quoted) + "}"


def rows_cursor(conn: AsyncConnection) -> AsyncRawCursor[ClaimedRun]:
    """A cursor for the claim's positional statement whose rows are ClaimedRuns (read
    them with :func:`fetch`)."""
    return AsyncRawCursor(conn, row_factory=_rows)


async def fetch(cur: AsyncCursor[ClaimedRun]) -> list[ClaimedRun]:
    """The claim's rows from ``cur``, its columns checked once per process."""
    rows = await cur.fetchall()
    if not _checked:
        _check_columns(cur)
    return rows


async def claim(
    conn: AsyncConnection,
    schema: str,
    *,
    order: ClaimOrder,
    limit: int,
    lease_seconds: float,
    worker_id: str,
    now: datetime | None = None,
    retry_policy: str | None = None,
    version: str | None = None,
    same_version: bool = False,
    agent_keys: Sequence[str] = (),
    serves_default: bool = True,
    tree_cap: int | None = None,
    limits: bool = True,
) -> list[ClaimedRun]:
    """Claims up to ``limit`` runs (at most one per conversation) in ``order``, stamping
    each with ``retry_policy`` (JSON text; None: not retried) and ``version`` (the run's
    own only if it has none yet); ``same_version``: a run with recorded steps only if its
    version is ``version``; only runs of ``agent_keys`` (and of the default agent, with
    ``serves_default``); a spawned run only while fewer than ``tree_cap`` runs of its
    tree run (None: no cap); ``limits``: see :attr:`ClaimRequest.limits`."""
    req = ClaimRequest(
        order,
        limit,
        lease_seconds,
        worker_id,
        retry_policy,
        now,
        version,
        same_version,
        agent_keys,
        serves_default,
        tree_cap,
        limits,
    )
    return await run(conn, schema, req)


async def run(conn: AsyncConnection, schema: str, req: ClaimRequest) -> list[ClaimedRun]:
    """Sends the claim ``req`` asks for (see :func:`claim`)."""
    query, params = statement(schema, req)
    cur = rows_cursor(conn)
    await execute(conn, query, params, cursor=cur)
    return await fetch(cur)


def _check_columns(cursor: AsyncCursor[Any]) -> None:
    """Checks, once per process, that the claim's columns are ClaimedRun's fields in order
    (rows are built by position; reading the names is not free, and the statement is
    fixed). Called after the rows are read: never while a pipeline is being processed,
    where an exception would leave the connection unusable."""
    global _checked
    result = cursor.pgresult
    if result is None or not result.nfields:
        return
    names = [(result.fname(i) or b"").decode() for i in range(result.nfields)]
    if names != list(ClaimedRun._fields):
        raise RuntimeError(f"the claim returns {names}, not the fields of ClaimedRun")
    _checked = True


def _rows(cursor: AsyncCursor[Any]) -> Callable[[Sequence[Any]], ClaimedRun]:
    """The claim's row factory: each row as a ClaimedRun, by position."""
    return ClaimedRun._make


_checked = False
