"""Checks on what callers pass in: JSON for the database (serialisable, NUL-free, as jsonb
requires, and bounded), ids and run ids."""

from __future__ import annotations

import decimal
import json
import logging
import re
import traceback as _traceback
import uuid
from typing import Any

from ._errors import InvalidInput, RunNotFound

# An escaped NUL ("\u0000") that is not itself an escaped backslash followed by "u0000".
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")

MAX_DEPTH = 256
"""The deepest nesting of arrays and objects accepted. Python's JSON decoder recurses once
per level, so a value much deeper than this could be written but not read back (a worker's
claim decoding it would fail with RecursionError); the limit keeps a wide margin."""
# A JSON string (its brackets are not nesting), and a bracket.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKET = re.compile(r"[\[\]{}]")


def _too_deep(text: str) -> bool:
    """Whether ``text`` (valid JSON) nests arrays/objects more than MAX_DEPTH levels."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return False  # the usual case: too few brackets to be that deep
    depth = 0
    for bracket in _BRACKET.findall(_STRING.sub("", text)):
        if bracket in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return True
        else:
            depth -= 1
    return False


# One encoder for every call: json.dumps with options builds a new JSONEncoder each time
# (a few microseconds, paid per emitted event); encode() keeps no state between calls.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def dumps(value: Any, field: str, max_bytes: int | None = None) -> str:
    """``value`` as JSON text that Postgres's jsonb will accept, or :class:`InvalidInput`."""
    try:
        text = _ENCODER.encode(value)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(field, f"must be JSON-serialisable ({exc})") from None
    except RecursionError:
        raise InvalidInput(field, f"is nested more than {MAX_DEPTH} levels deep") from None
    if "\\u0000" in text and _NUL.search(text):
        raise InvalidInput(field, "must not contain NUL characters (\\u0000); jsonb rejects them")
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        raise InvalidInput(field, "must be valid Unicode text (it holds a lone surrogate)") from None
    if max_bytes is not None and size > max_bytes:
        raise InvalidInput(field, f"is larger than the limit of {max_bytes} bytes")
    if _too_deep(text):
        raise InvalidInput(field, f"is nested more than {MAX_DEPTH} levels deep")
    return text


def as_stored(text: str) -> Any:
    """The value PostgreSQL's jsonb keeps for ``text`` (JSON that :func:`dumps` made), as
    psycopg reads it back, without asking the server: object keys in jsonb's order
    (shorter first, then by their UTF-8 bytes), the last of duplicate keys, and numbers
    as jsonb's numeric prints them (no exponent, no negative zero). A step's result is
    returned this way before its record lands (see steps.py); a hypothesis property in
    tests/test_json_stored.py holds it to the server's own answer."""
    return json.loads(text, object_pairs_hook=_jsonb_object, parse_float=_jsonb_number)


def _jsonb_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)  # (a repeated key: the last value wins, as in jsonb)
    if len(found) < 2:
        return found
    return {key: found[key] for key in sorted(found, key=_key_order)}


def _key_order(key: str) -> tuple[int, bytes]:
    raw = key.encode()
    return len(raw), raw


def _jsonb_number(text: str) -> int | float:
    # numeric prints a number without an exponent: one with no digits left after the
    # point ("1e+16") reads back as an integer. It has no negative zero either.
    mantissa, _, exponent = text.lower().partition("e")
    if exponent and len(mantissa.partition(".")[2]) - int(exponent) <= 0:
        return int(decimal.Decimal(text))
    return float(text) or 0.0


def check_id(value: object, field: str, *, optional: bool = False, max_len: int = 256) -> None:
    """Host ids (conversation, user, tenant, keys) are non-empty UTF-8 text without NUL."""
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise InvalidInput(field, f"must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidInput(field, "must not be empty")
    if "\x00" in value:
        raise InvalidInput(field, "must not contain NUL characters")
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:  # the database takes UTF-8 only
            raise InvalidInput(field, "must be valid Unicode text (it holds a lone surrogate)") from None
    if len(value) > max_len:
        raise InvalidInput(field, f"must be at most {max_len} characters")


def parse_run_id(run_id: uuid.UUID | str) -> uuid.UUID:
    """A run id as a UUID, or :class:`RunNotFound` (a malformed id names no run)."""
    if isinstance(run_id, uuid.UUID):
        return run_id
    try:
        return uuid.UUID(str(run_id))
    except ValueError:
        raise RunNotFound(run_id) from None


MAX_TRACEBACK_BYTES = 8 * 1024
"""The most a recorded traceback holds, in UTF-8 bytes; a longer one keeps its end (the
innermost frames and the exception's own line) and says how much it cut."""


def error_of(exc: BaseException, max_chars: int = 2000, *, traceback: bool = False) -> dict[str, str]:
    """An exception as a storable record: its type's name and its message, cut to
    ``max_chars`` and made storable whatever it holds (jsonb refuses NUL; UTF-8 refuses
    lone surrogates; an ``__str__`` may itself fail). ``traceback=True`` adds its
    traceback (see :func:`traceback_of`)."""
    try:
        message = str(exc)[:max_chars]
    except Exception:
        message = f"<{type(exc).__name__} with an unprintable message>"
    fields = {"type": type(exc).__name__, "message": _storable(message)}
    if traceback:
        fields["traceback"] = traceback_of(exc)
    return fields


class TracebackText(logging.Filter):
    """Puts a record's ``traceback`` extra where every formatter prints it after the
    message (``exc_text``, as for ``exc_info``), so the line itself stays one line. The
    text is the bounded, storable one (:func:`traceback_of`): the raw exception may hold
    a NUL or a lone surrogate, which a UTF-8 log stream refuses."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Always keeps the record; sets its ``exc_text`` from its ``traceback`` extra."""
        text = getattr(record, "traceback", None)
        if isinstance(text, str) and not record.exc_text:
            record.exc_text = text.rstrip("\n")
        return True


def traceback_of(exc: BaseException, max_bytes: int = MAX_TRACEBACK_BYTES) -> str:
    """``exc``'s traceback as Python prints it (with its causes, without any frame's
    locals), storable, and at most ``max_bytes`` of UTF-8. A longer one keeps its end,
    from a frame's start: the innermost frames and the exception's line are what an
    author needs, and a deep recursion's outer frames repeat."""
    try:
        text = _storable("".join(_traceback.format_exception(exc)))
    except Exception:  # (formatting reads source files and calls __str__: never let it fail a run)
        return f"<the traceback of {type(exc).__name__} could not be formatted>"
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    marker = "[... {} bytes of outer frames cut ...]\n"
    keep = data[len(data) - (max_bytes - len(marker) - 20) :].decode("utf-8", "ignore")
    # From a frame's start (else a line's): a frame's source line alone says nothing.
    frame = keep.find("\n  File ")
    keep = keep[frame + 1 :] if frame >= 0 else keep[keep.find("\n") + 1 :] if "\n" in keep else keep
    return marker.format(len(data) - len(keep.encode())) + keep


def _storable(text: str) -> str:
    """``text`` without what jsonb (NUL) or UTF-8 (lone surrogates) refuses."""
    return text.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")
