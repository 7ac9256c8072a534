"""Loads the named SQL statements under ``sql/`` once and renders them per schema.

Statements are written with ``{schema}`` placeholders. The schema name is inserted
with :class:`psycopg.sql.Identifier` in exactly one place (:func:`statement`); values
are always bound parameters.

Fragments: a ``-- fragment: name`` block is a piece of SQL text that statements in any
file take as ``{name}``, expanded once, when the statements are loaded (so the text sent,
and each statement's plan, is as if written out). They write once what must read the
same everywhere: the live set of statuses, which every query meant to use a partial
index on the live states must spell as that index's predicate does (the schema cannot
hold it in a function or a view without a migration, and a predicate can name neither),
and CTEs two statements share. ``tests/test_status_vocabulary.py`` holds the live set
together with the partial indexes' predicates, and ``tests/test_sql_catalogue.py`` checks
that every fragment is used and every ``{name}`` is one.

Variants: a fragment ``name`` with a sibling ``name_off`` can be switched off per call
(``positional(..., off=...)``, ``statement(..., off=...)``): the statement is then written
with ``name_off`` in its place. The hot statements (the claim, finalize, append_events)
carry steps that most calls do not need (rate limits, a tree cap, retries, usage):
PostgreSQL builds every node of a plan each time it runs it, needed or not, so a call
that needs none of them sends the smaller text. Each variant is its own statement,
prepared and planned on its own (``tests/test_statement_variants.py``).
"""

from __future__ import annotations

import functools
import importlib.resources
import itertools
import re
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

from psycopg import sql

if TYPE_CHECKING:
    from collections.abc import Mapping

_NAME = re.compile(r"^--\s*(name|fragment):\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_BRACED = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
# Identifiers a statement may name as ``{...}``, rendered by :func:`render` with
# psycopg.sql.Identifier: the schema's name, and a journal partition's (which the
# partitions' statements take from the catalog, see sql/partitions.sql).
_IDENTIFIERS = frozenset({"schema", "partition"})
_PLACEHOLDER = re.compile(r"%\(([a-z_][a-z0-9_]*)\)s|%%|%")


def _sql_dir() -> Path:
    """The packaged ``runrow/sql`` in a wheel, else the checkout's top-level ``sql/``."""
    packaged = importlib.resources.files("runrow").joinpath("sql")
    if packaged.is_dir():
        return Path(str(packaged))
    checkout = Path(__file__).resolve().parents[2] / "sql"
    if checkout.is_dir():
        return checkout
    raise RuntimeError(
        "runrow's SQL files are missing: reinstall runrow (the wheel ships them as runrow/sql)"
    )


class _Parsed(NamedTuple):
    statements: dict[str, str]
    fragments: dict[str, str]
    raw: dict[str, str]
    """The statements as written, fragments not yet expanded (for variants)."""


def _parse(text: str, source: str) -> _Parsed:
    found = _Parsed({}, {}, {})
    marks = list(_NAME.finditer(text))
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        body = "\n".join(
            line for line in text[mark.end() : end].splitlines() if not line.lstrip().startswith("--")
        ).strip()
        kind, name = mark.group(1), mark.group(2)
        into = found.statements if kind == "name" else found.fragments
        if not body:
            raise RuntimeError(f"{source}: {'statement' if kind == 'name' else kind} {name!r} is empty")
        if name in found.statements or name in found.fragments:
            raise RuntimeError(f"{source}: {name!r} is defined twice")
        into[name] = body
    return found


def _expand(name: str, body: str, fragments: Mapping[str, str], off: frozenset[str] = frozenset()) -> str:
    """``body`` with each ``{fragment}`` written out (``{schema}`` stays for :func:`render`),
    those in ``off`` as their ``_off`` form."""

    def text(match: re.Match[str]) -> str:
        found = match.group(1)
        if found in _IDENTIFIERS:
            return match.group(0)
        if found not in fragments:
            raise RuntimeError(f"statement {name!r}: no SQL fragment named {found!r} under sql/")
        if found in off:
            found += "_off"
        return _expand(name, fragments[found], fragments, off)  # (a fragment may use another)

    return _BRACED.sub(text, body)


@functools.cache
def _load() -> _Parsed:
    merged = _Parsed({}, {}, {})
    for path in sorted(_sql_dir().glob("*.sql")):
        parsed = _parse(path.read_text(encoding="utf-8"), path.name)
        for into, found in ((merged.statements, parsed.statements), (merged.fragments, parsed.fragments)):
            for name, body in found.items():
                if name in merged.statements or name in merged.fragments:
                    raise RuntimeError(f"{path.name}: {name!r} is defined in two files")
                into[name] = body
    if "schema" in merged.fragments:
        raise RuntimeError("a SQL fragment may not be named 'schema'")
    return _Parsed(
        {name: _expand(name, body, merged.fragments) for name, body in merged.statements.items()},
        merged.fragments,
        merged.statements,
    )


def statements() -> Mapping[str, str]:
    """Every named statement, by name, across ``sql/*.sql``, its fragments written out."""
    return MappingProxyType(_load().statements)


def fragments() -> Mapping[str, str]:
    """Every named fragment (``-- fragment: name``), by name, across ``sql/*.sql``."""
    return MappingProxyType(_load().fragments)


@functools.cache
def migrations() -> tuple[tuple[int, str, str], ...]:
    """``(version, name, text)`` of every migration, in order (numbers may skip, see below)."""
    found = []
    for path in sorted((_sql_dir() / "migrations").glob("*.sql")):
        number, _, rest = path.stem.partition("_")
        if not number.isdigit():
            raise RuntimeError(f"migration file {path.name} must start with its number")
        found.append((int(number), rest or path.stem, path.read_text(encoding="utf-8")))
    versions = [v for v, _, _ in found]
    # Strictly increasing from 1. A gap is allowed: branches developed side by side each
    # take a number, and one may land before another (``migrate`` applies whichever
    # versions a schema lacks; the schema's version is its highest).
    if not versions or versions[0] != 1 or any(b <= a for a, b in itertools.pairwise(versions)):
        raise RuntimeError(f"migrations must be numbered from 1, strictly increasing, found {versions}")
    return tuple(found)


def render(text: str, schema: str, *, partition: str | None = None) -> bytes:
    """``text`` with ``{schema}`` (and ``{partition}``, if given) replaced by quoted
    identifiers, as query bytes."""
    names = {"schema": sql.Identifier(schema)}
    if partition is not None:
        names["partition"] = sql.Identifier(partition)
    return sql.SQL(text).format(**names).as_bytes()


def partition_statement(name: str, schema: str, partition: str) -> bytes:
    """The named statement rendered for ``schema`` and one journal ``partition``."""
    return render(_text(name), schema, partition=partition)


def _text(name: str) -> str:
    try:
        return statements()[name]
    except KeyError:
        raise KeyError(f"no SQL statement named {name!r} under sql/") from None


@functools.lru_cache(maxsize=128)
def _variant(name: str, off: frozenset[str]) -> str:
    """The named statement with the fragments in ``off`` switched off (see the module's
    docstring)."""
    loaded = _load()
    if name not in loaded.raw:
        raise KeyError(f"no SQL statement named {name!r} under sql/")
    unknown = sorted(f for f in off if f + "_off" not in loaded.fragments)
    if unknown:
        raise ValueError(f"statement {name!r}: no fragment {unknown} can be switched off")
    text = _expand(name, loaded.raw[name], loaded.fragments, off)
    if text == loaded.statements[name]:
        raise ValueError(f"statement {name!r} takes none of the fragments {sorted(off)}")
    return text


@functools.lru_cache(maxsize=512)
def statement(name: str, schema: str, off: frozenset[str] = frozenset()) -> bytes:
    """The named statement rendered for ``schema``, with the fragments in ``off`` switched
    off (see the module's docstring); cached, since it never changes."""
    return render(_variant(name, off) if off else _text(name), schema)


class Positional(NamedTuple):
    """A named statement with its ``%(name)s`` placeholders turned into ``$1, $2, ...``,
    for a :class:`psycopg.AsyncRawCursor`: psycopg caches its own conversion only for
    statements up to 4 KB, and the claim and finalize are longer, so without this each
    execution would parse the statement again (about 0.1 ms of CPU per fold)."""

    query: bytes
    names: tuple[str, ...]
    """The parameter behind each ``$n``, in order."""

    def bind(self, params: Mapping[str, Any]) -> tuple[Any, ...]:
        """``params`` (the named statement's) in this statement's order."""
        return tuple(params[name] for name in self.names)


@functools.lru_cache(maxsize=128)
def positional(name: str, schema: str, off: frozenset[str] = frozenset()) -> Positional:
    """The named statement rendered for ``schema`` with positional placeholders (see
    :class:`Positional`), with the fragments in ``off`` switched off (see the module's
    docstring). Converted before the schema's name goes in, so an identifier holding
    ``%`` is never read as a placeholder."""
    names: list[str] = []
    text = _variant(name, off) if off else _text(name)

    def number(match: re.Match[str]) -> str:
        found = match.group(1)
        if found is None:
            if match.group(0) == "%%":
                return "%"
            raise ValueError(f"statement {name!r}: only %(name)s placeholders can be made positional")
        if found not in names:
            names.append(found)
        return f"${names.index(found) + 1}"

    return Positional(render(_PLACEHOLDER.sub(number, text), schema), tuple(names))
