"""What the ``runrow`` command needs besides its commands: its exit statuses, output,
checking and naming the database (or why it cannot be reached), waiting for it, JSON
log lines, and checking run ids."""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import re
import signal
import sys
import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any

import anyio
import psycopg

from ._errors import InvalidInput, RunNotFound, RunrowError
from ._json import parse_run_id

if TYPE_CHECKING:
    import argparse
    from collections.abc import AsyncIterator, Callable, Iterable, Sequence

__all__ = [
    "CHILDREN_SHOWN",
    "EXIT_BROKEN_PIPE",
    "EXIT_INTERRUPTED",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "DatabaseUnreachable",
    "JsonFormatter",
    "check_url",
    "database_url",
    "describe_connect_error",
    "jsonable",
    "load_agent",
    "load_keyed_agents",
    "out",
    "run_id_arg",
    "run_text",
    "silence_stdout",
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
    "failed to resolve host",  # (psycopg's async connect resolves names itself)
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


# The exit statuses `runrow --help` lists (its epilog, in _cli_args.py), besides 0 and
# the commands' own (`dev-db status`: 3; `send --wait`: 4-6).
EXIT_UNREACHABLE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a program Ctrl-C ended
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports `yes | head`'s yes

_URL_EXAMPLE = "postgresql://user:password@host:5432/dbname"


class DatabaseUnreachable(RunrowError):
    """The command could not connect; the message names where and what to check."""


def jsonable(value: Any) -> Any:
    """``value`` (records, lists, ids, times) as plain JSON values, for ``--json``."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, uuid.UUID | datetime):
        return str(value)
    return value


def out(args: argparse.Namespace, data: Any, text: str) -> None:
    """Prints ``data`` as one JSON line with ``--json``, else ``text``."""
    sys.stdout.write(f"{json.dumps(jsonable(data)) if args.json else text}\n")


def _is_port(text: str) -> bool:
    return text.isascii() and text.isdigit() and 1 <= int(text) <= 65535


def check_url(url: str, name: str) -> str:
    """``url`` if libpq can read it (a URL or a conninfo string, its ports numbers);
    else :class:`~runrow.InvalidInput` naming ``name`` (the flag or variable it came from)
    and the problem, in one line: the command's usage error, not a traceback."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        # libpq quotes a malformed URI whole: drop that, it may hold a password.
        problem = re.sub(r'\s+in URI: ".*"\s*$', "", str(exc).strip(), flags=re.S)
    else:
        ports = [p for p in str(params.get("port") or "").split(",") if p and not _is_port(p)]
        if not ports:
            return url
        problem = f"port {ports[0]!r} is not a port number (1-65535)"
    raise InvalidInput(name, f"not a PostgreSQL URL or conninfo string ({problem}); e.g. {_URL_EXAMPLE}")


def database_url(args: argparse.Namespace) -> str:
    """The database the command names (``--database-url``, else ``DATABASE_URL``), checked."""
    url: str | None = args.database_url
    if url:
        return check_url(url, "--database-url")
    url = os.environ.get("DATABASE_URL")
    if url:
        return check_url(url, "DATABASE_URL")
    raise DatabaseUnreachable(
        "no database: pass --database-url URL or set DATABASE_URL "
        '(for a local one: eval "$(runrow dev-db start)")'
    )


def load_agent(spec: str) -> Callable[..., Any]:
    """``package.module:callable`` -> the callable (the agent for ``runrow worker``)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise SystemExit(f"runrow: agent must look like module:callable, got {spec!r}")
    sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise SystemExit(f"runrow: cannot import {module_name!r}: {exc}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise SystemExit(f"runrow: {module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise SystemExit(f"runrow: {spec} is not callable")
    return obj  # type: ignore[no-any-return]


def load_keyed_agents(specs: Iterable[str]) -> dict[str, Callable[..., Any]]:
    """``KEY=module:callable`` specs (``runrow worker --agent``) -> agents by key."""
    agents: dict[str, Callable[..., Any]] = {}
    for spec in specs:
        key, sep, target = spec.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"runrow: --agent must look like KEY=module:callable, got {spec!r}")
        if key in agents:
            raise SystemExit(f"runrow: --agent {key!r} is given twice")
        agents[key] = load_agent(target)
    return agents


def silence_stdout() -> None:
    """Points stdout at /dev/null after its reader went away (a closed pipe), so that
    the interpreter's last flush at exit does not fail again (the recipe in Python's
    documentation of SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout without a file (an embedding host's)
        pass


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


def run_id_arg(value: str) -> uuid.UUID:
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


CHILDREN_SHOWN = 100
"""How many of a run's children ``runrow runs show`` names (``runs list --parent`` lists more)."""


def run_text(fields: dict[str, Any], children: Sequence[dict[str, Any]] = ()) -> str:
    """``runrow runs show``'s text: a run's fields (as JSON values), one a line; its error
    as ``type: message``; the child runs it spawned, one a line (id, agent key, status);
    and its traceback, if one was recorded, after them as Python prints it."""
    error = fields.get("error") or {}
    traceback = error.get("traceback")
    if error:
        fields = {**fields, "error": f"{error.get('type')}: {error.get('message', '')}"}
    text = "\n".join(f"{k:>18}: {v}" for k, v in fields.items())
    if children:
        more = (
            f" (the newest {CHILDREN_SHOWN}: runs list --parent lists all)"
            if len(children) >= CHILDREN_SHOWN
            else ""
        )
        text += f"\n\nchildren{more}:\n" + "\n".join(
            f"  {c['id']}  {c.get('agent_key') or '-':<16} {c['status']}" for c in children
        )
    return text + (f"\n\n{traceback.rstrip()}" if isinstance(traceback, str) else "")


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
