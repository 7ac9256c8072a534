"""The journal's partitions (migrations 18-20): made ahead, listed, detached and dropped.

DDL runs plainly (no JIT guard, never prepared): each statement is planned once anyway.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from .. import _sql
from ._exec import Plan, Query

if TYPE_CHECKING:
    from datetime import datetime


class PartitionRow(NamedTuple):
    """One partition as the catalog has it (bounds in ms of run creation; None: legacy)."""

    name: str
    lo: int | None
    hi: int | None
    detach_pending: bool
    rows_estimate: int


def ensure(schema: str, *, at: datetime | None = None) -> Plan[int]:
    """Makes the partitions up to the schema's premake intervals past ``at``; how many."""
    # (Not plain: the function's own queries must run with JIT off, as every statement's.)
    rows = yield Query(_sql.statement("journal_ensure_partitions", schema), {"at": at}, prepare=False)
    return int(rows[0][0])


def partitions(schema: str) -> Plan[list[PartitionRow]]:
    """Every partition of the journal, oldest first, the legacy one first of all."""
    rows = yield Query(_sql.statement("journal_partitions", schema), prepare=False)
    return [PartitionRow(*row) for row in rows]


def retired(schema: str) -> Plan[list[tuple[int, int]]]:
    """The retired ranges ``[lo, hi)`` (ms of run creation): runs made in them are
    trimmed (migration 28)."""
    rows = yield Query(_sql.statement("journal_retired", schema), prepare=False)
    return [(int(lo), int(hi)) for lo, hi in rows]


def lock_retiring(schema: str) -> Plan[None]:
    """Holds the retire lock row FOR UPDATE until the transaction ends (trim's side of
    the lock with retry: see migration 28)."""
    yield Query(_sql.statement("journal_retire_lock", schema), prepare=False)


def retire(
    schema: str, *, lo: int, hi: int, retention_seconds: float, now: datetime | None
) -> Plan[tuple[int, int] | None]:
    """Retires the partition of runs made in ``[lo, hi)`` ms (writes its range) and
    deletes the step records and tree streams keyed by them, if nobody needs it; returns the
    runs made in it and how many were not marked trimmed before, or None (kept)."""
    rows = yield Query(
        _sql.statement("journal_retire_partition", schema),
        {"lo": lo, "hi": hi, "retention_seconds": retention_seconds, "now": now},
        prepare=False,
    )
    return (int(rows[0][0]), int(rows[0][1])) if rows else None


def detach_pending(schema: str) -> Plan[list[str]]:
    """Partitions a detach left half done."""
    rows = yield Query(_sql.statement("journal_partitions_detach_pending", schema), prepare=False)
    return [str(row[0]) for row in rows]


def detach(schema: str, partition: str, *, concurrently: bool) -> Plan[None]:
    """Detaches ``partition`` (concurrently: outside any transaction block only)."""
    if concurrently:
        yield Query(_sql.partition_statement("journal_detach_partition", schema, partition), plain=True)
    else:
        yield Query(
            _sql.partition_statement("journal_detach_partition_in_transaction", schema, partition), plain=True
        )


def finish_detach(schema: str, partition: str) -> Plan[None]:
    """Completes a detach that was interrupted."""
    yield Query(_sql.partition_statement("journal_finish_detach", schema, partition), plain=True)


def drop(schema: str, partition: str) -> Plan[None]:
    """Drops a detached partition."""
    yield Query(_sql.partition_statement("journal_drop_partition", schema, partition), plain=True)
