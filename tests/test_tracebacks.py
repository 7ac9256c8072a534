"""A failed run's traceback (#40 point 1): recorded with its error, bounded, without the
agent's locals, and shown where a failed run is read: the worker's log line, the run's
row (``runrow runs show``, the HTTP API's run resource, the dashboard's run page) and a
failing ``run_agent`` test."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import httpx
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

import runrow
from runrow import _json
from runrow.http import create_api
from runrow.testing import run_agent

from .admin_support import admin_client
from .helpers import is_terminal, wait_for

pytestmark = pytest.mark.anyio

# The agent's local variable holds this, built at run time so that no source line (which
# a traceback quotes) carries it: a traceback must never show the agent's locals.
LOCAL_SECRET = "".join(("LOCAL", "-", "SECRET", "-", "9c1e"))


def _innermost_helper(n: int) -> None:
    secret = LOCAL_SECRET  # noqa: F841 (a local the traceback must not show)
    raise ValueError(f"the model said no at depth {n}")


async def failing_agent(run: runrow.RunContext) -> None:
    """Fails two frames down, so the traceback has the agent's frame and a helper's."""
    _innermost_helper(1)


def _deep(n: int) -> None:
    # (Two functions in turn: Python folds a run of identical frames into one line.)
    if n == 0:
        raise KeyError("innermost-key")
    _deeper(n - 1)


def _deeper(n: int) -> None:
    _deep(n)


async def _failed(dsn: str, schema: str, agent: Any = failing_agent, **options: Any) -> runrow.RunInfo:
    result = await run_agent(dsn, agent, "hi", schema=schema, **options)
    assert result.status == "failed"
    return result.run


def test_a_traceback_is_bounded_keeping_the_innermost_frames_and_no_locals() -> None:
    try:
        _deep(300)  # about 600 frames: far past the bound
    except KeyError as exc:
        record = _json.error_of(exc, traceback=True)
        plain = _json.error_of(exc)
    text = record["traceback"]
    assert len(text.encode()) <= _json.MAX_TRACEBACK_BYTES
    # The cut keeps the end: the innermost frames and the exception's own line, whole.
    assert text.rstrip().endswith("KeyError: 'innermost-key'")
    assert 'raise KeyError("innermost-key")' in text
    # What was cut is said at the top, and the rest starts at a line's start.
    first, second = text.splitlines()[:2]
    assert "cut" in first and second.startswith("  File ")
    assert record["type"] == "KeyError" and record["message"] == "'innermost-key'"
    # Without the switch, the record is what it was.
    assert plain == {"type": "KeyError", "message": "'innermost-key'"}


def test_a_traceback_is_storable_whatever_the_exception_holds() -> None:
    class Hostile(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no str for you")

    for exc in (ValueError("nul \x00 and lone \ud800 surrogate"), Hostile()):
        try:
            raise exc
        except Exception as caught:
            record = _json.error_of(caught, traceback=True)
        _json.dumps(record, "error")  # jsonb takes it: no NUL, no lone surrogate
        assert "Traceback (most recent call last)" in record["traceback"]


async def test_a_failed_run_records_its_traceback_without_the_agents_locals(dsn: str, schema: str) -> None:
    run = await _failed(dsn, schema)
    assert run.error is not None
    assert run.error["type"] == "ValueError"
    assert run.error["message"] == "the model said no at depth 1"
    text = run.error["traceback"]
    assert text.startswith("Traceback (most recent call last):")
    assert "in failing_agent" in text and "in _innermost_helper" in text
    assert text.rstrip().endswith("ValueError: the model said no at depth 1")
    assert LOCAL_SECRET not in text


async def test_record_tracebacks_false_records_type_and_message_only(dsn: str, schema: str) -> None:
    run = await _failed(dsn, schema, record_tracebacks=False)
    assert run.error == {"type": "ValueError", "message": "the model said no at depth 1"}


@pytest.mark.parametrize("log_messages", [True, False], ids=["messages-logged", "messages-off"])
async def test_the_log_line_carries_the_traceback_only_when_error_messages_are_logged(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, caplog: pytest.LogCaptureFixture, log_messages: bool
) -> None:
    with caplog.at_level(logging.INFO, logger="runrow.dispatcher"):
        async with runrow.Dispatcher(
            dsn, failing_agent, schema=schema, poll=0.5, log_error_messages=log_messages
        ):
            run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="hi")
            await wait_for(lambda: is_terminal(conn, schema, run.id), what="terminal")
            await wait_for(
                lambda: any(f"run {run.id} failed" in r.getMessage() for r in caplog.records),
                what="the log line",
            )
    (line,) = [r for r in caplog.records if f"run {run.id} failed" in r.getMessage()]
    text = logging.Formatter().format(line)
    assert "\n" not in line.getMessage()  # the line itself stays one line; the traceback follows it
    if log_messages:
        assert line.exc_text is not None and text.endswith(line.exc_text)
        assert "in failing_agent" in text and "in _innermost_helper" in text
        assert "ValueError: the model said no at depth 1" in text
    else:
        # A traceback's last line is the message, which may quote a user.
        assert line.exc_text is None and "Traceback" not in text and "model said no" not in text


async def test_runs_show_prints_the_traceback_as_lines(dsn: str, schema: str) -> None:
    from .test_cli import cli

    run = await _failed(dsn, schema)
    out = await anyio.to_thread.run_sync(
        lambda: cli("runs", "show", str(run.id), "--database-url", dsn, "--schema", schema)
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(line.strip() == "error: ValueError: the model said no at depth 1" for line in lines), (
        out.stdout
    )
    # The traceback as the agent's author reads one: its own lines, not an escaped string.
    assert "Traceback (most recent call last):" in lines, out.stdout
    assert any(line.strip().startswith('raise ValueError(f"the model said no') for line in lines)
    assert "\\n" not in out.stdout


async def test_the_http_api_run_resource_has_the_traceback_and_documents_it(dsn: str, schema: str) -> None:
    async def user(request: Any) -> str:
        return "test-user"  # run_agent enqueues as this user

    run = await _failed(dsn, schema)
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(dsn, open=False, kwargs={"autocommit": True})
    api = create_api(pool, authenticate=user, schema=schema)
    async with (
        pool,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://api") as client,
    ):
        body = (await client.get(f"/v1/runs/{run.id}")).json()
        doc = (await client.get("/openapi.json")).json()
    assert body["error"]["type"] == "ValueError"
    assert "in _innermost_helper" in body["error"]["traceback"]
    error_schema = doc["components"]["schemas"]["Run"]["properties"]["error"]
    assert set(error_schema["properties"]) == {"type", "message", "traceback"}


HOSTILE = "</pre><script>window.pwned=1</script><img src=x onerror=alert(1)>"


async def test_the_run_page_shows_the_traceback_escaped(dsn: str, schema: str) -> None:
    async def hostile_agent(run: runrow.RunContext) -> None:
        raise RuntimeError(HOSTILE)

    run = await _failed(dsn, schema, hostile_agent)
    async with admin_client(dsn, schema) as client:
        html = (await client.get(f"/admin/runs/{run.id}")).text
    assert '<h2 id="traceback-h">Traceback</h2>' in html
    assert "in hostile_agent" in html
    assert "<script>window.pwned" not in html and "<img src=x" not in html
    assert "&lt;/pre&gt;&lt;script&gt;window.pwned=1&lt;/script&gt;" in html
