"""Human in the loop, from the host's side: answer what a waiting run waits for, and
list the inputs waiting runs wait for.

A run parks itself with ``await run.wait_for_input(key, request)`` (see
``RunContext.wait_for_input``): its status is ``waiting`` and no worker holds it.
:func:`provide_input` records a person's answer and queues the run again, in one
statement; a worker then claims it and its agent replays up to the wait, which returns
the answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _json
from ._db import Database, perform
from ._engine.steps import MAX_STEP_BYTES
from ._errors import InvalidInput, NotWaitingForInput, RunNotFound
from ._gateway import inputs as _gw
from ._gateway.inputs import PendingInput
from ._json import parse_run_id
from ._names import DEFAULT_SCHEMA, Channels, check_schema
from ._ops import in_transaction, self_contained

if TYPE_CHECKING:
    import uuid

    from ._ops import Operation

__all__ = ["PendingInput", "provide_input", "provide_input_op", "waiting_inputs", "waiting_inputs_op"]

MAX_INPUT_KEY = 200


async def provide_input(
    db: Database, run_id: uuid.UUID | str, key: str, value: Any, *, schema: str = DEFAULT_SCHEMA
) -> bool:
    """Records ``value`` (any JSON value) as the answer to the input ``key`` the run waits
    for, and queues the run again, atomically (with the host's transaction, if ``db``
    is a connection inside one). A worker then resumes the run, and its
    ``wait_for_input(key, ...)`` returns ``value``.

    Returns True when this call recorded the value, False when that same value was
    already recorded for ``key`` (a repeated call: nothing changes). Raises
    :class:`NotWaitingForInput` when the run does not wait for ``key`` (another key,
    not waiting at all, or another value already recorded), :class:`RunNotFound` for an
    unknown run, :class:`InvalidInput` for a bad key or a value that is not JSON.
    """
    return await perform(db, schema, provide_input_op(run_id, key, value, schema=schema))


def provide_input_op(run_id: uuid.UUID | str, key: str, value: Any, *, schema: str) -> Operation[bool]:
    """:func:`provide_input` as an operation (see ``_ops.py``)."""
    check_schema(schema)
    rid = parse_run_id(run_id)
    _json.check_id(key, "key", max_len=MAX_INPUT_KEY)
    text = _json.dumps(value, "value", MAX_STEP_BYTES)
    found: _gw.Provided = yield in_transaction(
        _gw.provide_input(schema, run_id=rid, key=key, value=text, channels=Channels.for_schema(schema))
    )
    if found.status is None:
        raise RunNotFound(rid)
    if found.recorded:
        return True
    if found.same:
        return False
    raise NotWaitingForInput(rid, key, found.status)


async def waiting_inputs(
    db: Database,
    *,
    run_id: uuid.UUID | str | None = None,
    conversation_id: str | None = None,
    limit: int = 100,
    schema: str = DEFAULT_SCHEMA,
) -> list[PendingInput]:
    """The inputs waiting runs wait for, newest first; optionally those of one run or one
    conversation. A run whose parallel tool calls wait at once has one entry per input:
    any of them may be answered first."""
    return await perform(
        db,
        schema,
        waiting_inputs_op(run_id=run_id, conversation_id=conversation_id, limit=limit, schema=schema),
    )


def waiting_inputs_op(
    *, run_id: uuid.UUID | str | None, conversation_id: str | None, limit: int, schema: str
) -> Operation[list[PendingInput]]:
    """:func:`waiting_inputs` as an operation (see ``_ops.py``)."""
    check_schema(schema)
    rid = None if run_id is None else parse_run_id(run_id)
    _json.check_id(conversation_id, "conversation_id", optional=True)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
        raise InvalidInput("limit", "must be an integer from 1 to 10000")
    pending: list[PendingInput] = yield self_contained(
        _gw.waiting_inputs(schema, run_id=rid, conversation_id=conversation_id, limit=limit)
    )
    return pending
