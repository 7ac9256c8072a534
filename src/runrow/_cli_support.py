"""What the ``runrow`` command needs besides its commands: naming the database it cannot
reach, waiting for it, JSON log lines, and checking run ids."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

import anyio
import psycopg

from ._errors import RunNotFound, RunrowError
from ._json import parse_run_id

if TYPE_CHECKING:
    import argparse
    from collections.abc import AsyncIterator, Callable
    from uuid import UUID

__all__ = [
    "DatabaseUnreachable",
    "JsonFormatter",
    "describe_connect_error",
    "run_id_arg",
    "target",
    "wait_for_database",
    "web",
]

# Connection failures that a server coming up (or back) cures; anything else (a wrong
# password, a missing database or role) will not get better by waiting.
_TRANSIENT = (
    "connection refused",
    "no such file or directory",
    "timeout expired",
    "could not translate host name",
    "network is unreachable",
    "no route to host",
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "too many clients",
    "server closed the connection",
    "connection reset",
)
BACKOFF_START = 0.5
BACKOFF_MAX = 10.0


class DatabaseUnreachable(RunrowError):
    """The command could not connect; the message names where and what to check."""


def target(url: str) -> str:
    """``host:port`` that ``url`` connects to (libpq's defaults filled in), for messages."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "the server in the URL"
    host = str(params.get("host") or params.get("hostaddr") or os.environ.get("PGHOST") or "the local socket")
    port = str(params.get("port") or os.environ.get("PGPORT") or 5432)
    return f"{host}:{port}"


def _reason(exc: BaseException) -> str:
    """libpq's reason for a failed connect, one line: 'Connection refused', 'FATAL: ...'."""
    first = (str(exc).strip().splitlines() or ["unknown error"])[0]
    return " ".join(first.rsplit(" failed: ", 1)[-1].removeprefix("connection failed: ").split())


def is_transient(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(marker in text for marker in _TRANSIENT)


def describe_connect_error(url: str, exc: BaseException) -> str:
    """One line: where runrow tried to connect, why it failed, and what to check."""
    check = (
        "check that PostgreSQL is running there and that --database-url or DATABASE_URL names it"
        if is_transient(exc)
        else "check the user, password and database name in --database-url or DATABASE_URL"
    )
    return f"cannot connect to PostgreSQL at {target(url)} ({_reason(exc)}): {check}"


async def wait_for_database(
    url: str,
    signals: AsyncIterator[int],
    say: Callable[[str, dict[str, Any]], None],
) -> bool:
    """Connects once to ``url``; while that fails for a reason time can cure, says so once
    and retries with backoff (0.5 s doubling to 10 s). True once it connects; False if a
    signal from ``signals`` came first. A permanent failure raises :class:`DatabaseUnreachable`.
    """
    reached = False
    waited = False
    refused: DatabaseUnreachable | None = None

    async def probe(scope: anyio.CancelScope) -> None:
        nonlocal reached, waited, refused
        delay = BACKOFF_START
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(url, autocommit=True, connect_timeout=5)
            except psycopg.OperationalError as exc:
                if not is_transient(exc):
                    refused = DatabaseUnreachable(describe_connect_error(url, exc))
                    scope.cancel()
                    return
                if not waited:
                    waited = True
                    say(
                        f"runrow worker: waiting for the database at {target(url)} ({_reason(exc)}); "
                        "retrying with backoff until it answers (SIGTERM or Ctrl-C stops)",
                        {"event": "waiting_for_database", "target": target(url), "reason": _reason(exc)},
                    )
                await anyio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX)
                continue
            await conn.close()
            reached = True
            if waited:
                say(
                    f"runrow worker: the database at {target(url)} answers",
                    {"event": "database_reachable", "target": target(url)},
                )
            scope.cancel()
            return

    async def watch(scope: anyio.CancelScope) -> None:
        async for signum in signals:
            name = signal.Signals(signum).name
            say(
                f"runrow worker: {name} while waiting for the database; exiting",
                {"event": "stopped", "signal": name, "started": False},
            )
            scope.cancel()
            return

    async with anyio.create_task_group() as tg:
        tg.start_soon(probe, tg.cancel_scope)
        tg.start_soon(watch, tg.cancel_scope)
    if refused is not None:
        raise refused
    return reached


def run_id_arg(value: str) -> UUID:
    """A run id from the command line, checked as the HTTP API checks one (a UUID)."""
    try:
        return parse_run_id(value)
    except RunNotFound:
        raise RunrowError(
            f"run_id: {value!r} is not a run id; run ids are UUIDs such as "
            "6f1c2a9e-3b7d-4c8e-9a05-1d2e3f4a5b6c (see `runrow runs list`)"
        ) from None


# Attributes every LogRecord has; anything else was passed as ``extra``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per log record: time, level, logger, message, and any extras."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure_logging(*, verbose: bool, json_lines: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if json_lines
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler])


def web(args: argparse.Namespace, database_url: str, *, say: Callable[[str], Any]) -> int:
    """``runrow web`` (see :mod:`runrow.admin._web`), its extras imported only now."""
    try:
        from .admin._web import command
    except ImportError as exc:  # runrow[web]'s starlette or uvicorn
        raise SystemExit(f"runrow web needs {exc.name}: pip install 'runrow[web]'") from None
    return command(args, database_url, say=say)
