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


def expired(schema: str, *, retention_seconds: float, now: datetime | None) -> Plan[list[tuple[str, int]]]:
    """The partitions whose every run was made before the cutoff (``now`` less the
    retention) and is trimmed, with their row estimates: nobody needs their events."""
    rows = yield Query(
        _sql.statement("journal_partitions_expired", schema),
        {"retention_seconds": retention_seconds, "now": now},
        prepare=False,
    )
    return [(str(name), int(estimate)) for name, estimate in rows]


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
