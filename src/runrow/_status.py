"""The run-status vocabulary: every status a run can have, and the sets runrow reasons with.

One place on the Python side. The schema's ``agent_run_status_check`` rule (in the
function ``agent_run_rules`` that agent_run's check constraint calls) and the
OpenAPI document of :mod:`runrow.http` must list the same statuses, and the live set is
written once in SQL (the ``live_status`` fragment in ``sql/fragments.sql``):
``tests/test_status_vocabulary.py`` holds all of them together.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

__all__ = [
    "ABSORBED",
    "CANCELLED",
    "COMPLETED",
    "EXPIRED",
    "FAILED",
    "LIVE",
    "QUEUED",
    "RETRYABLE",
    "RUNNING",
    "STATUSES",
    "TERMINAL",
    "WAITING",
    "RunStatus",
]

RunStatus = Literal["queued", "running", "waiting", "completed", "failed", "cancelled", "expired", "absorbed"]
"""A run's status, as the ``agent_run.status`` column holds it."""

QUEUED: Final = "queued"
RUNNING: Final = "running"
WAITING: Final = "waiting"
COMPLETED: Final = "completed"
FAILED: Final = "failed"
CANCELLED: Final = "cancelled"
EXPIRED: Final = "expired"
ABSORBED: Final = "absorbed"
"""A steering message's turn whose message a running turn read (``RunContext.steering``):
it ended there, its message delivered into that run (``RunInfo.absorbed_into``)."""

STATUSES: Final[tuple[RunStatus, ...]] = get_args(RunStatus)
"""Every status, in the order of the life of a run (the OpenAPI enum's order)."""

LIVE: Final[frozenset[RunStatus]] = frozenset({QUEUED, RUNNING, WAITING})
"""A turn still in its conversation's way: queued, running, or waiting for input."""

TERMINAL: Final[frozenset[RunStatus]] = frozenset(STATUSES) - LIVE
"""A run that has ended: it never changes status again (a retry is a new run)."""

RETRYABLE: Final[frozenset[RunStatus]] = frozenset({FAILED, CANCELLED, EXPIRED})
"""The endings :func:`runrow.retry` accepts (the ``retry`` statement's own filter)."""
