"""The SQL gateway: the only code that loads statements from ``sql/`` and binds them.

Each module is the part of the gateway one service or API uses. Its functions take a
connection (and the schema), bind named parameters, and return typed records, never
positional rows. Statements run through :func:`._exec.execute`, which keeps JIT off. The
functions the sync API shares (``submit``, ``stop``, the tail's, ``get_run``,
``throughput``, ``queue_position``, ``schema.version``) are plans instead: they take no
connection, and ``_exec.run`` or ``_exec.run_sync`` executes them.
"""

from __future__ import annotations

from .. import _sql

__all__ = ["statement_positional", "statement_text"]


def statement_text(name: str, schema: str) -> bytes:
    """The named statement as written, rendered for ``schema`` with its named
    placeholders, for the tests and benchmarks that EXPLAIN, prepare or time it raw
    (runrow's own code calls the typed functions of the gateway's modules instead)."""
    return _sql.statement(name, schema)


def statement_positional(name: str, schema: str) -> _sql.Positional:
    """The named statement as runrow sends the claim and finalize: the same text with
    ``$n`` placeholders, for a raw cursor (see :class:`runrow._sql.Positional`); the
    benchmarks' bare loops send them so too."""
    return _sql.positional(name, schema)
