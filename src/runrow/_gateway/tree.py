"""Sub-agents: a run's fenced spawn of child runs (its parent row, locked, and the tree's
limits) and the outcomes of the children a parent waited on (``sql/tree.sql``).

Every function here is a plan (see :mod:`._exec`), run on an async or a sync connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from .. import _sql
from .._events import Event
from .._names import Channels
from ._exec import Plan, Query

if TYPE_CHECKING:
    import uuid
    from collections.abc import Sequence

    from .._status import RunStatus


class SpawningParent(NamedTuple):
    """The spawning run, locked: whether a stop is asked for, its tree, its depth."""

    cancel_requested: bool
    root: uuid.UUID
    """The tree's root turn (its first run)."""
    depth: int
    """The parent's depth (a root is 0)."""


def spawn_parent(
    schema: str, *, run_id: uuid.UUID, claim_token: uuid.UUID, max_depth: int
) -> Plan[SpawningParent | None]:
    """Locks the spawning run, fenced by its claim (None: no longer this worker's), and
    its tree (to the end of the transaction)."""
    rows = yield Query(
        _sql.statement("spawn_parent", schema),
        {"run_id": run_id, "claim_token": claim_token, "max_depth": max_depth},
    )
    return SpawningParent(*rows[0][:3]) if rows else None


def tree_spawned(schema: str, *, root: uuid.UUID) -> Plan[int]:
    """How many runs the tree of ``root`` has spawned (and, at commit, a hint on the
    root's journal channel for the tree's tails)."""
    rows = yield Query(
        _sql.statement("tree_spawned", schema),
        {"root": root, "root_channel": Channels.for_schema(schema).events(root)},
    )
    return int(rows[0][0])


class ChildOutcome(NamedTuple):
    """A child as its latest attempt left it."""

    id: uuid.UUID
    status: RunStatus
    error: dict[str, Any] | None
    answer: Any


def child_outcomes(schema: str, *, parent: uuid.UUID, ids: Sequence[uuid.UUID]) -> Plan[list[ChildOutcome]]:
    """The children of ``parent`` among ``ids`` (by first run), as they stand now."""
    rows = yield Query(_sql.statement("child_outcomes", schema), {"parent": parent, "ids": list(ids)})
    return [ChildOutcome(*r) for r in rows]


# -- the tree's stream (runrow._tailtree; migration 0016) ---------------------------------


def tree_root(schema: str, *, run_id: uuid.UUID) -> Plan[tuple[uuid.UUID, uuid.UUID | None] | None]:
    """The run's first run and its tree's root (None for a root); None if there is no such run."""
    rows = yield Query(_sql.statement("tree_root", schema), {"run_id": run_id})
    return (rows[0][0], rows[0][1]) if rows else None


class TreePass(NamedTuple):
    """One pass of a tree tail: the events read, and how the tree's stream stands."""

    events: list[Event]
    runs: int
    """The tree's runs (0: no such root)."""
    total: int
    """The stream's last position so far."""
    ended: bool
    """Every run of the tree has ended and its journal is in the stream."""
    live: list[uuid.UUID]
    """The runs whose journals may still grow."""


def tree_pass(schema: str, *, root: uuid.UUID, after: int, limit: int) -> Plan[TreePass]:
    """Appends the tree's new events to its stream and reads up to ``limit`` after
    position ``after`` (run in one transaction: the lock holds to its end)."""
    yield Query(_sql.statement("tree_lock", schema), {"root": root})
    rows = yield Query(_sql.statement("tree_extend", schema), {"root": root})
    runs, total, ended, live = rows[0]
    events: list[Event] = []
    if total > after:
        read = yield Query(
            _sql.statement("tree_read", schema), {"root": root, "after": after, "limit": limit}
        )
        events = [Event(ord_, type_, payload, run_id, seq) for ord_, type_, payload, run_id, seq in read]
    return TreePass(events, int(runs), int(total), bool(ended), list(live))
