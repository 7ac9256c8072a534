"""The API's operations, written once for the async API and for :mod:`runrow.sync`.

An operation is a generator: it checks its inputs when first advanced (before any
connection is taken), then yields :class:`Step` s, each a gateway plan (see
``_gateway/_exec.py``) and the kind of connection it runs on; it gets each plan's result
back, and returns the call's result or raises its typed error. ``_db.perform`` runs one
on an ``AsyncConnection`` (or pool, or conninfo), ``_syncdb.perform`` on a ``Connection``.

Why generators and not a generated copy of the code (psycopg's own way): runrow's
operations are short sequences of statements with branches between them (an enqueue may
lock, stop the conversation, insert, read the key's first run back, or refuse), and each
rule (a check, a parameter, an answer read from a row, a typed error) must exist once.
Written as plans, the rules are plain Python with no I/O in them. What exists twice is
what does I/O: the executors (a dozen lines each), the connection handling (``_db.py``,
``_syncdb.py``) and the public signatures (``tests/test_sync_api.py`` compares them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypeVar

if TYPE_CHECKING:
    from collections.abc import Generator

    from ._gateway._exec import Plan

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Step(Generic[T]):
    """One plan of an operation and where it runs: ``atomic`` in one transaction (the
    caller's, if its connection is inside one), else as a self-contained statement (one
    round trip on an idle autocommit connection, joined to a caller's open transaction)."""

    plan: Plan[T]
    atomic: bool


Operation: TypeAlias = "Generator[Step[Any], Any, T]"
"""An operation of the API: yields its steps, gets each step's result, returns its own."""


def in_transaction(plan: Plan[T]) -> Step[T]:
    """A step whose statements commit together (or join the caller's transaction)."""
    return Step(plan, atomic=True)


def self_contained(plan: Plan[T]) -> Step[T]:
    """A step of self-contained statements (see :class:`Step`)."""
    return Step(plan, atomic=False)
