"""Loads the named SQL statements under ``sql/`` once and renders them per schema.

Statements are written with ``{schema}`` placeholders. The schema name is inserted
with :class:`psycopg.sql.Identifier` in exactly one place (:func:`statement`); values
are always bound parameters.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

from psycopg import sql

if TYPE_CHECKING:
    from collections.abc import Mapping

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
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


def _parse(text: str, source: str) -> dict[str, str]:
    found: dict[str, str] = {}
    marks = list(_NAME.finditer(text))
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        body = "\n".join(
            line for line in text[mark.end() : end].splitlines() if not line.lstrip().startswith("--")
        ).strip()
        name = mark.group(1)
        if not body:
            raise RuntimeError(f"{source}: statement {name!r} is empty")
        if name in found:
            raise RuntimeError(f"{source}: statement {name!r} is defined twice")
        found[name] = body
    return found


@functools.cache
def statements() -> Mapping[str, str]:
    """Every named statement, by name, across ``sql/*.sql``."""
    merged: dict[str, str] = {}
    for path in sorted(_sql_dir().glob("*.sql")):
        for name, body in _parse(path.read_text(encoding="utf-8"), path.name).items():
            if name in merged:
                raise RuntimeError(f"{path.name}: statement {name!r} is defined in two files")
            merged[name] = body
    return MappingProxyType(merged)


@functools.cache
def migrations() -> tuple[tuple[int, str, str], ...]:
    """``(version, name, text)`` of every migration, in order."""
    found = []
    for path in sorted((_sql_dir() / "migrations").glob("*.sql")):
        number, _, rest = path.stem.partition("_")
        if not number.isdigit():
            raise RuntimeError(f"migration file {path.name} must start with its number")
        found.append((int(number), rest or path.stem, path.read_text(encoding="utf-8")))
    versions = [v for v, _, _ in found]
    if versions != list(range(1, len(versions) + 1)):
        raise RuntimeError(f"migrations must be numbered 1..n without gaps, found {versions}")
    return tuple(found)


def render(text: str, schema: str) -> bytes:
    """``text`` with ``{schema}`` replaced by the quoted identifier, as query bytes."""
    return sql.SQL(text).format(schema=sql.Identifier(schema)).as_bytes()


def _text(name: str) -> str:
    try:
        return statements()[name]
    except KeyError:
        raise KeyError(f"no SQL statement named {name!r} under sql/") from None


@functools.lru_cache(maxsize=512)
def statement(name: str, schema: str) -> bytes:
    """The named statement rendered for ``schema``; cached, since it never changes."""
    return render(_text(name), schema)


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


@functools.lru_cache(maxsize=64)
def positional(name: str, schema: str) -> Positional:
    """The named statement rendered for ``schema`` with positional placeholders (see
    :class:`Positional`). Converted before the schema's name goes in, so an identifier
    holding ``%`` is never read as a placeholder."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        found = match.group(1)
        if found is None:
            if match.group(0) == "%%":
                return "%"
            raise ValueError(f"statement {name!r}: only %(name)s placeholders can be made positional")
        if found not in names:
            names.append(found)
        return f"${names.index(found) + 1}"

    return Positional(render(_PLACEHOLDER.sub(number, _text(name)), schema), tuple(names))
