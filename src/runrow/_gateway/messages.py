"""A run's fenced transcript writes (``write_message``, ``write_message_after_events``,
``message_landed`` in ``sql/messages.sql``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import _sql
from ._exec import Plan, Query
from .journal import append_params, flush_landed

if TYPE_CHECKING:
    import uuid
    from collections.abc import Mapping

    from .._names import Channels
    from .journal import Appended


@dataclass(frozen=True, slots=True)
class MessageState:
    """What a read-back found after a transcript write of unknown outcome."""

    landed: bool
    owned: bool
    """Whether the claim is still this worker's."""


def write(
    schema: str,
    *,
    message_id: uuid.UUID,
    run_id: uuid.UUID,
    claim_token: uuid.UUID,
    role: str,
    content: str,
) -> Plan[bool]:
    """Appends a message to the run's conversation, fenced by the claim; False if the
    fence matched nothing (or the id exists already: an earlier attempt landed)."""
    rows = yield Query(
        _sql.statement("write_message", schema),
        {
            "message_id": message_id,
            "run_id": run_id,
            "claim_token": claim_token,
            "role": role,
            "content": content,
        },
    )
    return bool(rows)


def write_after_events(
    schema: str, events: Appended, *, channels: Channels, notify: bool, message: Mapping[str, Any]
) -> Plan[bool]:
    """:func:`write` (``message``: its keyword arguments) with the run's pending journal
    rows (``events``: no ``usage`` rows) in the same statement: True if the fence held
    (the rows landed, and the message did or an earlier write of its id had), False if
    it did not (nothing landed)."""
    (row,) = yield Query(  # EXISTS columns: always one row
        _sql.statement("write_message_after_events", schema),
        {**append_params([events], channels, notify=notify), **message},
    )
    return bool(row[0])


def rows_landed(
    schema: str, *, run_id: uuid.UUID, claim_token: uuid.UUID, seqs: list[int]
) -> Plan[MessageState]:
    """After :func:`write_after_events` failed without an answer: whether its rows
    landed (then all of it did: one statement), and whether the claim holds. (Not the
    message: an earlier attempt of the turn may have written one with its id.)"""
    state = yield from flush_landed(schema, run_id, claim_token, seqs)
    return MessageState(state.landed == len(seqs), state.owned)


def landed(
    schema: str, *, message_id: uuid.UUID, run_id: uuid.UUID, claim_token: uuid.UUID
) -> Plan[MessageState]:
    """Whether the message exists, and whether the claim still holds."""
    (row,) = yield Query(  # two tests: always one row
        _sql.statement("message_landed", schema),
        {"message_id": message_id, "run_id": run_id, "claim_token": claim_token},
    )
    return MessageState(bool(row[0]), bool(row[1]))
