"""Sub-agents: a run's fenced spawn of child runs (its parent row, locked, and the tree's
limits) and the outcomes of the children a parent waited on (``sql/tree.sql``).

Every function here is a plan (see :mod:`._exec`), run on an async or a sync connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from .. import _sql
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
    """How many runs the tree of ``root`` has spawned."""
    rows = yield Query(_sql.statement("tree_spawned", schema), {"root": root})
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
