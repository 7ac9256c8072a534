"""runrow in a Django project: :mod:`runrow.sync` on Django's own database connection.

Add ``"runrow.contrib.django"`` to ``INSTALLED_APPS`` (for the management commands
``runrow_migrate`` and ``runrow_worker`` and the read-only admin), then call these
functions in views: each is its :mod:`runrow.sync` twin on the connection of the
database alias ``using`` (``"default"``), in the schema ``settings.RUNROW_SCHEMA``
(``"runrow"``). Inside ``transaction.atomic()`` a call joins Django's transaction: the
turn commits with the view's rows or rolls back with them. It runs in a savepoint of
that transaction, which also makes Django begin it (``atomic()`` sends no ``BEGIN``
until its first query), and a runrow error rolls back to the savepoint, leaving
Django's transaction usable. Outside ``atomic()`` (autocommit) a call commits on its own.

Needs Django 4.2 or later with its psycopg 3 backend (``pip install 'runrow[django]'``).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.pq import Format

from ... import sync
from ..._names import DEFAULT_SCHEMA
from ..._retry_run import KEEP, RetryDeadline

if TYPE_CHECKING:
    import uuid
    from collections.abc import Iterator

    from ..._models import QueuePosition, Run, RunInfo, StopResult

__all__ = [
    "cancel_run",
    "conninfo",
    "enqueue",
    "get_run",
    "psycopg_connection",
    "queue_position",
    "retry_run",
    "schema",
    "stop_conversation",
]

# libpq's connection parameters: the OPTIONS keys a conninfo can carry.
_LIBPQ_KEYWORDS = frozenset(d.keyword.decode() for d in psycopg.pq.Conninfo.get_defaults())


def schema() -> str:
    """runrow's schema in this project: ``settings.RUNROW_SCHEMA``, else ``"runrow"``."""
    from django.conf import settings

    return str(getattr(settings, "RUNROW_SCHEMA", DEFAULT_SCHEMA))


def conninfo(using: str = "default") -> str:
    """A libpq conninfo string for ``settings.DATABASES[using]`` (for a worker's own pool).

    ``NAME``, ``USER``, ``PASSWORD``, ``HOST``, ``PORT`` and those ``OPTIONS`` that are
    libpq parameters (``sslmode``, ``options``, ``service``...); Django's own options
    (``isolation_level``, ``pool``...) are left out.
    """
    from django.conf import settings

    db: dict[str, Any] = settings.DATABASES[using]
    params: dict[str, Any] = {
        k: v for k, v in (db.get("OPTIONS") or {}).items() if k in _LIBPQ_KEYWORDS and v not in (None, "")
    }
    for key, name in (("NAME", "dbname"), ("USER", "user"), ("PASSWORD", "password")):
        if db.get(key):
            params[name] = db[key]
    for key, name in (("HOST", "host"), ("PORT", "port")):
        if db.get(key):
            params[name] = str(db[key])
    return psycopg.conninfo.make_conninfo(**params)


@contextmanager
def psycopg_connection(using: str = "default") -> Iterator[psycopg.Connection[Any]]:
    """Django's ``psycopg.Connection`` for ``using``, ready for a :mod:`runrow.sync` call.

    Inside ``transaction.atomic()`` the block runs in a savepoint of Django's transaction,
    which has then begun for certain (runrow joins a transaction that has begun, and
    ``atomic()`` has sent nothing until its first query): the block's writes commit or
    roll back with Django's, and an exception rolls back to the savepoint only (then
    propagates), so Django's transaction stays usable if the caller catches it. Make only
    runrow calls in the block: while it lasts, the connection decodes json and jsonb as
    psycopg does (runrow's results need it), not as Django's ``JSONField`` expects.
    """
    from django.db import connections, transaction

    django_conn = connections[using]
    if django_conn.vendor != "postgresql":
        raise RuntimeError(f"runrow needs PostgreSQL; the database {using!r} is {django_conn.vendor}")
    django_conn.ensure_connection()
    raw = django_conn.connection
    if not isinstance(raw, psycopg.Connection):
        raise RuntimeError(f"runrow needs Django's psycopg 3 backend; {using!r} uses {type(raw).__module__}")
    sid = transaction.savepoint(using=using)  # None in autocommit: runrow commits on its own
    try:
        with _json_loaded(raw):
            yield raw
    except BaseException:
        if sid is not None:
            transaction.savepoint_rollback(sid, using=using)
        raise
    if sid is not None:
        transaction.savepoint_commit(sid, using=using)


@contextmanager
def _json_loaded(raw: psycopg.Connection[Any]) -> Iterator[None]:
    """psycopg's own json/jsonb loaders on ``raw`` for the block, Django's after it.

    Django registers a text loader for jsonb on its connections (its ``JSONField``
    decodes the text itself); runrow's reads need psycopg's, which decode it.
    """
    saved = []
    for name in ("json", "jsonb"):
        info = psycopg.adapters.types[name]
        for fmt in (Format.TEXT, Format.BINARY):
            mine, default = raw.adapters.get_loader(info.oid, fmt), psycopg.adapters.get_loader(info.oid, fmt)
            if mine is not default and default is not None:
                saved.append((info.oid, mine))
                raw.adapters.register_loader(info.oid, default)
    try:
        yield
    finally:
        for oid, loader in saved:
            if loader is not None:
                raw.adapters.register_loader(oid, loader)


def enqueue(*, using: str = "default", **kwargs: Any) -> Run:
    """:func:`runrow.sync.enqueue` on Django's connection, joining ``transaction.atomic()``.

    Takes :func:`runrow.enqueue`'s keyword arguments (``conversation_id``, ``user_id``,
    ``content``...); ``schema`` defaults to :func:`schema`.
    """
    kwargs.setdefault("schema", schema())
    with psycopg_connection(using) as conn:
        return sync.enqueue(conn, **kwargs)


def retry_run(run_id: uuid.UUID | str, *, deadline: RetryDeadline = KEEP, using: str = "default") -> Run:
    """:func:`runrow.sync.retry_run` on Django's connection (the retry keeps the turn's
    deadline unless ``deadline`` sets a new one or ``None`` clears it)."""
    with psycopg_connection(using) as conn:
        return sync.retry_run(conn, run_id, deadline=deadline, schema=schema())


def cancel_run(run_id: uuid.UUID | str, *, using: str = "default") -> StopResult:
    """:func:`runrow.sync.cancel_run` on Django's connection."""
    with psycopg_connection(using) as conn:
        return sync.cancel_run(conn, run_id, schema=schema())


def stop_conversation(conversation_id: str, *, using: str = "default") -> StopResult:
    """:func:`runrow.sync.stop_conversation` on Django's connection."""
    with psycopg_connection(using) as conn:
        return sync.stop_conversation(conn, conversation_id, schema=schema())


def get_run(run_id: uuid.UUID | str, *, using: str = "default") -> RunInfo:
    """:func:`runrow.sync.get_run` on Django's connection."""
    with psycopg_connection(using) as conn:
        return sync.get_run(conn, run_id, schema=schema())


def queue_position(run_id: uuid.UUID | str, *, using: str = "default") -> QueuePosition:
    """:func:`runrow.sync.queue_position` on Django's connection."""
    with psycopg_connection(using) as conn:
        return sync.queue_position(conn, run_id, schema=schema())
