"""A step's result is handed back before its record lands (see steps.py), so runrow
predicts what jsonb keeps without asking the server: these hold the prediction to the
server's own answer, value for value and key order for key order."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runrow import _json

pytestmark = pytest.mark.anyio

# Text jsonb takes (dumps refuses NUL and lone surrogates before anything is written).
_TEXT = st.text(max_size=8).filter(
    lambda t: "\x00" not in t and not any(0xD800 <= ord(c) <= 0xDFFF for c in t)
)
# Keys as hosts write them, and the awkward ones: empty, multi-byte, escapes, numbers
# that dumps turns into strings (and so into duplicates of a string key).
_KEYS = st.one_of(_TEXT, st.sampled_from(["", "a", "é", "aa", "\u00ff", "\u2603", "\\", '"']))
_FLOATS = st.floats(allow_nan=False, allow_infinity=False)
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**40), max_value=10**40),
    _FLOATS,
    st.sampled_from([0.0, -0.0, 1e16, -1e16, 1e-05, 2.5e-320, 1.2345678901234567e20, 1e308, 5e-324]),
    _TEXT,
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(_KEYS, st.integers(-3, 3)), inner, max_size=5),
    ),
    max_leaves=20,
)


def _exact(value: Any) -> str:
    # json.dumps keeps key order and tells 1 from 1.0 and 0.0 from -0.0.
    return json.dumps(value, ensure_ascii=False)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=_VALUES)
async def test_the_prediction_is_what_jsonb_keeps(conn: psycopg.AsyncConnection, value: Any) -> None:
    text = _json.dumps(value, "result")
    cur = await conn.execute("SELECT %s::jsonb", (text,))
    row = await cur.fetchone()
    assert row is not None
    assert _exact(_json.as_stored(text)) == _exact(row[0])


async def test_the_cases_that_differ_from_python(conn: psycopg.AsyncConnection) -> None:
    """The differences themselves, named: without them the prediction would be json.loads."""
    value = {"bb": 1, "a": [1e16, -0.0, 1.5e-07], "é": 3, "aa": 4, 1: "x", "1": "y"}
    text = _json.dumps(value, "result")
    cur = await conn.execute("SELECT %s::jsonb", (text,))
    row = await cur.fetchone()
    assert row is not None
    stored = _json.as_stored(text)
    assert _exact(stored) == _exact(row[0])
    assert list(stored) == ["1", "a", "aa", "bb", "é"]  # by byte length, then bytes
    assert stored["1"] == "y"  # the last of the two "1" keys
    assert stored["a"] == [10**16, 0.0, 1.5e-07]
    assert isinstance(stored["a"][0], int)
    assert _exact(stored["a"][1]) == "0.0"
    assert _exact(json.loads(text)) != _exact(stored)  # plain json.loads would be wrong
