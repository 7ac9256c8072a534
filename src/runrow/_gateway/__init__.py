"""The SQL gateway: the only code that loads statements from ``sql/`` and binds them.

Each module is the part of the gateway one service or API uses. One convention: every
function that runs SQL is a *plan* (see :mod:`._exec`). It takes the schema and typed
arguments, never a connection; it binds named parameters, yields each statement as a
:class:`._exec.Query`, gets its rows back, and returns a typed record, never positional
rows. The caller runs it: ``await _exec.run(conn, gw.f(schema, ...))``, or
``_exec.run_sync(conn, ...)`` on a synchronous connection, so the sync API shares every
plan, and the JIT guard (see :func:`._exec.execute`) is decided once for all.

The exceptions, each on the worker's hot path, take a connection because a plan's
executor cannot send them as they must go (``tests/test_layout.py`` names them and
fails on any other):

- ``claims.claim`` and ``claims.run`` (with ``claims.rows_cursor`` and ``claims.fetch``): the claim runs
  on a raw cursor with ``$n`` placeholders; it is over psycopg's 4 KB cache limit, so
  sent as named placeholders it would be parsed again on every call (about 0.1 ms of CPU
  each, see :class:`runrow._sql.Positional`).
- ``endings.finalize``, ``endings.finalize_then_claim`` and
  ``endings.unset_session_bound``: the ending is the same raw-cursor case, pipelined
  with its time bound and with the claim for the slots it frees, in one round trip and
  one transaction; statement by statement it would cost a round trip more per ending.
"""

from __future__ import annotations

from .. import _sql

__all__ = ["statement_positional", "statement_text"]


def statement_text(name: str, schema: str) -> bytes:
    """The named statement as written, rendered for ``schema`` with its named
    placeholders, for the tests and benchmarks that EXPLAIN, prepare or time it raw
    (runrow's own code calls the typed functions of the gateway's modules instead)."""
    return _sql.statement(name, schema)


def statement_positional(name: str, schema: str, off: frozenset[str] = frozenset()) -> _sql.Positional:
    """The named statement as runrow sends the claim and finalize: the same text with
    ``$n`` placeholders, for a raw cursor (see :class:`runrow._sql.Positional`), with the
    fragments in ``off`` switched off; the benchmarks' bare loops send them so too."""
    return _sql.positional(name, schema, off)
