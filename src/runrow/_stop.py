"""Stop means stop: a durable, cooperative request, and stopping a conversation is one transaction."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _json
from ._db import Database, perform
from ._errors import RunNotFound
from ._gateway import stop as _gw
from ._json import parse_run_id
from ._models import StopResult
from ._names import DEFAULT_SCHEMA, Channels, check_schema
from ._ops import in_transaction
from ._status import QUEUED, RUNNING, WAITING

if TYPE_CHECKING:
    import uuid
    from collections.abc import Sequence

    from ._gateway._exec import Plan
    from ._gateway.stop import LockedRun
    from ._models import Draft
    from ._ops import Operation

__all__ = ["cancel_run", "cancel_run_op", "stop_conversation", "stop_conversation_op"]


async def stop_conversation(
    db: Database, conversation_id: str, *, schema: str = DEFAULT_SCHEMA
) -> StopResult:
    """Stops every active turn of a conversation, in one transaction.

    All of the conversation's queued, running and waiting runs are locked together.
    Queued turns are cancelled at once (their user messages become drafts, returned for
    the composer, and each gets its terminal event), and so is a turn waiting for input
    (no draft: it had started); the running turn gets its durable
    ``cancel_requested`` flag and a NOTIFY on the cancel channel, and its worker ends
    it ``cancelled``. Because the sweep and the flag commit together, a turn that
    finishes meanwhile finds nothing left to start. Nothing active: ``noop`` is True.
    """
    return await perform(db, schema, stop_conversation_op(conversation_id, schema=schema))


def stop_conversation_op(conversation_id: str, *, schema: str) -> Operation[StopResult]:
    """:func:`stop_conversation` as an operation (see ``_ops.py``)."""
    check_schema(schema)
    _json.check_id(conversation_id, "conversation_id")
    result: StopResult = yield in_transaction(stop_locked(schema, conversation_id))
    return result


def stop_locked(schema: str, conversation_id: str) -> Plan[StopResult]:
    """The stop sweep, in a transaction (stop, interrupt): the turns' descendants (child
    runs: see ``lock_descendants`` for why they come first), the turns, then any child
    spawned meanwhile."""
    kin = yield from _gw.lock_descendants(schema, conversation_id=conversation_id)
    yield from _gw.lock_conversation_runs(schema, conversation_id=conversation_id)
    # Once more, in a new snapshot: a run that ended while the first sweep waited for its
    # lock may have queued its automatic retry in the same commit, unseen by that sweep.
    # (A run still running is locked now: its ending waits for this stop, sees the
    # stop's flag and queues no retry.)
    runs = yield from _gw.lock_conversation_runs(schema, conversation_id=conversation_id)
    kin += yield from _gw.lock_descendants(schema, conversation_id=conversation_id)
    return (yield from _stop(schema, runs, kin))


async def cancel_run(db: Database, run_id: uuid.UUID | str, *, schema: str = DEFAULT_SCHEMA) -> StopResult:
    """Stops one run: a queued run is cancelled at once (its message returned as a draft),
    and so is a run waiting for input; a running one is asked to stop (flag + NOTIFY).
    A finished run is left as it is
    (``noop`` is True). Raises :class:`RunNotFound` for an unknown id."""
    return await perform(db, schema, cancel_run_op(run_id, schema=schema))


def cancel_run_op(run_id: uuid.UUID | str, *, schema: str) -> Operation[StopResult]:
    """:func:`cancel_run` as an operation (see ``_ops.py``)."""
    check_schema(schema)
    result: StopResult = yield in_transaction(_cancel(schema, parse_run_id(run_id)))
    return result


def _cancel(schema: str, rid: uuid.UUID) -> Plan[StopResult]:
    """Locks one run and stops it; :class:`RunNotFound` if there is none."""
    kin = yield from _gw.lock_descendants(schema, run_id=rid)
    run = yield from _gw.lock_run(schema, run_id=rid)
    if run is None:
        raise RunNotFound(rid)
    kin += yield from _gw.lock_descendants(schema, run_id=rid)
    return (yield from _stop(schema, [run], kin))


def _stop(schema: str, runs: list[LockedRun], kin: Sequence[LockedRun] = ()) -> Plan[StopResult]:
    """Cancels the queued and waiting runs among ``runs`` and their descendants ``kin``
    and flags the running ones (all locked)."""
    channels = Channels.for_schema(schema)
    seen = {r.id for r in runs}
    runs = [*runs, *(r for r in {k.id: k for k in kin}.values() if r.id not in seen)]
    queued = [r.id for r in runs if r.status == QUEUED and not r.resumed]
    running = [r.id for r in runs if r.status == RUNNING]
    paused = [r.id for r in runs if r.status == WAITING or (r.status == QUEUED and r.resumed)]
    drafts: list[Draft] = []
    flagged: list[uuid.UUID] = []
    ended: list[uuid.UUID] = []
    if queued:
        drafts = yield from _gw.cancel_queued(schema, ids=queued, channels=channels)
    if paused:
        ended = yield from _gw.cancel_paused(schema, ids=paused, channels=channels)
    if running:
        flagged = yield from _gw.request_cancel(schema, ids=running, cancel_channel=channels.cancel)
    order = {r.id: i for i, r in enumerate(runs)}
    drafts.sort(key=lambda d: order[d.run_id])
    cancelled = sorted([d.run_id for d in drafts] + ended, key=order.__getitem__)
    return StopResult(cancelled=cancelled, cancel_requested=flagged, drafts=drafts)
