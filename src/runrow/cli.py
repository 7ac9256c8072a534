"""The ``runrow`` command: migrate, run workers, inspect and stop runs, a development database."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import psycopg

from ._cli_args import build_parser
from ._cli_check import cmd_check
from ._cli_journal import cmd_journal, cmd_trim
from ._cli_limits import cmd_limits
from ._cli_schedules import cmd_schedules
from ._cli_send import cmd_send
from ._cli_support import (
    CHILDREN_SHOWN,
    EXIT_BROKEN_PIPE,
    EXIT_INTERRUPTED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    DatabaseUnreachable,
    check_url,
    configure_logging,
    describe_connect_error,
    load_agent,
    load_keyed_agents,
    run_id_arg,
    run_text,
    silence_stdout,
    wait_for_database,
    web,
)
from ._cli_support import database_url as _database_url
from ._cli_support import jsonable as _jsonable
from ._cli_support import out as _out
from ._cli_usage import cmd_stats
from ._cli_webhooks import cmd_webhooks
from ._cli_workers import cmd_workers
from ._errors import RunrowError

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Coroutine, Sequence

__all__ = ["build_parser", "main", "run_command"]

log = logging.getLogger("runrow.cli")


# -- commands ------------------------------------------------------------------------


async def cmd_migrate(args: argparse.Namespace) -> int:
    from ._migrate import latest_version, migrate

    applied = await migrate(_database_url(args), schema=args.schema, dashboard_indexes=args.dashboard_indexes)
    _out(
        args,
        {"schema": args.schema, "applied": applied, "version": latest_version()},
        f"schema {args.schema}: applied {applied or 'nothing'}; now at version {latest_version()}",
    )
    return 0


async def cmd_worker(args: argparse.Namespace) -> int:
    from ._engine.dispatcher import Dispatcher
    from ._retry import RetryPolicy

    agent = load_agent(args.agent)
    agents = load_keyed_agents(args.keyed_agents or ())
    url = _database_url(args)
    if args.listen_database_url:
        check_url(args.listen_database_url, "--listen-database-url")

    def say(text: str, data: dict[str, Any]) -> None:
        print(json.dumps(data) if args.json else text, flush=True)

    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        # Wait here, interruptibly, rather than in the Dispatcher's pool (which retries
        # silently for its whole timeout and logs every failed attempt).
        if not await wait_for_database(url, signals, say):
            return 0
        dispatcher = Dispatcher(
            url,
            agent,
            agents=agents or None,
            max_running_per_tree=args.max_running_per_tree,
            schema=args.schema,
            concurrency=args.concurrency,
            lease=args.lease_seconds,
            heartbeat=args.heartbeat_seconds,
            grace=args.grace_seconds,
            poll=args.poll_seconds,
            worker_id=args.worker_id,
            version=args.code_version,
            resume_policy=args.resume_policy,
            notifications=not args.no_notify,
            claim_with_endings=args.claim_with_endings,
            prepared_statements=not args.no_prepared_statements,
            listen_conninfo=args.listen_database_url,
            log_error_messages=args.log_error_messages,
            record_tracebacks=args.record_tracebacks,
            retry=None
            if args.retry_attempts <= 1
            else RetryPolicy(max_attempts=args.retry_attempts, backoff=args.retry_backoff_seconds),
        )
        async with dispatcher:
            say(
                f"runrow worker {dispatcher.worker_id} ready (concurrency {args.concurrency}), "
                f"version {dispatcher.settings.version or '-'}",
                {
                    "event": "ready",
                    "worker_id": dispatcher.worker_id,
                    "concurrency": args.concurrency,
                    "version": dispatcher.settings.version,
                },
            )
            async for signum in signals:
                name = signal.Signals(signum).name
                say(
                    f"runrow worker: {name}, draining (up to {args.drain_seconds}s)",
                    {"event": "draining", "signal": name, "drain_seconds": args.drain_seconds},
                )
                break
            report = await dispatcher.stop(args.drain_seconds)
    left = report.left_for_reaper
    say(
        f"runrow worker stopped: {len(report.finished)} finished, {len(report.interrupted)} "
        f"interrupted, {len(left)} left for the reaper" + (f": {', '.join(map(str, left))}" if left else ""),
        {
            "event": "stopped",
            "started": True,
            **{
                k: [str(r) for r in getattr(report, k)]
                for k in ("finished", "interrupted", "left_for_reaper")
            },
        },
    )
    return 0


def _run_lines(runs: list[Any]) -> str:
    """`runs list`: a header row over aligned columns (the conversation's as wide as its longest)."""
    if not runs:
        return "(no runs)"
    wide = max(len("CONVERSATION"), *(len(r.conversation_id) for r in runs))
    lines = [f"{'RUN ID':<36}  {'STATUS':<9}  {'CONVERSATION':<{wide}}  CREATED"]
    for r in runs:
        err = f"  {r.error.get('type')}: {r.error.get('message', '')}" if r.error else ""
        attempt = f"  attempt {r.attempt}" if r.attempt > 1 else ""
        attempt += f"  version {r.version}" if r.version else ""
        lines.append(
            f"{r.id}  {r.status:<9}  {r.conversation_id:<{wide}}  {r.created_at:%Y-%m-%d %H:%M:%S}{attempt}{err}"
        )
    return "\n".join(lines)


async def cmd_runs(args: argparse.Namespace) -> int:
    from ._queries import get_run, list_runs
    from ._retry_run import KEEP, RetryDeadline, retry_run
    from ._stop import cancel_run
    from ._tail import tail
    from ._usage import run_usage

    url = _database_url(args)
    if args.runs_command not in ("list", "waiting"):
        args.run_id = run_id_arg(args.run_id)
    if args.runs_command in ("waiting", "input"):
        return await _inputs(args, url)
    if args.runs_command == "list":
        parent = None if args.parent is None else run_id_arg(args.parent)
        filters = {"conversation_id": args.conversation, "status": args.status, "parent_run_id": parent}
        runs = await list_runs(url, **filters, limit=args.limit, schema=args.schema)
        _out(args, runs, _run_lines(runs))
    elif args.runs_command == "show":
        run = await get_run(url, args.run_id, schema=args.schema)
        children = await list_runs(url, parent_run_id=run.id, limit=CHILDREN_SHOWN, schema=args.schema)
        fields = {**_jsonable(run), "usage": _jsonable(await run_usage(url, args.run_id, schema=args.schema))}
        _out(args, fields, run_text(fields, children=[_jsonable(c) for c in reversed(children)]))
    elif args.runs_command == "tail":
        prepared = not args.no_prepared_statements
        async for ev in tail(
            url, args.run_id, from_seq=args.from_seq, schema=args.schema, prepared_statements=prepared
        ):
            if args.json:
                print(json.dumps(ev.to_dict()), flush=True)
            elif not ev.keepalive:
                print(f"{ev.seq:>5} {ev.type:<22} {json.dumps(ev.payload)}", flush=True)
    elif args.runs_command == "cancel":
        result = await cancel_run(url, args.run_id, schema=args.schema)
        text = (
            "nothing to do: the run had already finished"
            if result.noop
            else f"cancelled {len(result.cancelled)} queued or waiting, "
            f"asked {len(result.cancel_requested)} running to stop"
        )
        _out(args, result, text)
    elif args.runs_command == "position":
        from ._tenants import queue_position

        pos = await queue_position(url, args.run_id, schema=args.schema)
        if pos.position is None:
            text = f"run {pos.run_id} is {pos.status}, not queued"
        else:
            wait = (
                "unknown (nothing finished in the last 5 minutes)"
                if pos.estimated_wait_seconds is None
                else f"about {pos.estimated_wait_seconds:.0f}s"
            )
            text = (
                f"{'' if pos.exact else 'about '}#{pos.position} in the queue (#{pos.rank_in_tenant} in its tenant); "
                f"estimated wait {wait} at {pos.throughput_per_minute:.1f} runs/min"
            )
        _out(args, pos, text)
    elif args.runs_command == "retry":
        deadline: RetryDeadline = KEEP
        if args.no_deadline:
            deadline = None
        elif args.deadline_seconds is not None:
            deadline = timedelta(seconds=args.deadline_seconds)
        retried = await retry_run(url, args.run_id, deadline=deadline, schema=args.schema)
        _out(
            args,
            retried,
            f"{'created' if retried.created else 'already retried as'} run {retried.id} ({retried.status})",
        )
    return 0


async def _inputs(args: argparse.Namespace, url: str) -> int:
    """`runrow runs waiting` and `runrow runs input RUN_ID KEY VALUE`."""
    from ._inputs import provide_input, waiting_inputs

    if args.runs_command == "waiting":
        pending = await waiting_inputs(
            url, conversation_id=args.conversation, limit=args.limit, schema=args.schema
        )
        lines = [
            f"{p.run_id}  {p.conversation_id}  {p.key}  since {p.since:%Y-%m-%d %H:%M:%S}"
            f"{'' if p.expires_at is None else f'  until {p.expires_at:%Y-%m-%d %H:%M:%S}'}  "
            f"{json.dumps(p.request)[:120]}"
            for p in pending
        ]
        _out(args, [p._asdict() for p in pending], "\n".join(lines) or "(no run is waiting for input)")
        return 0
    try:
        value = json.loads(args.value)
    except ValueError:
        raise RunrowError(
            f"value: {args.value!r} is not JSON; quote text as JSON ('\"yes\"') or pass true, 42, {{...}}"
        ) from None
    recorded = await provide_input(url, args.run_id, args.key, value, schema=args.schema)
    text = "recorded; the run is queued to resume" if recorded else "already recorded (nothing changed)"
    _out(args, {"run_id": args.run_id, "key": args.key, "recorded": recorded}, text)
    return 0


async def cmd_stop(args: argparse.Namespace) -> int:
    from ._stop import stop_conversation

    result = await stop_conversation(_database_url(args), args.conversation_id, schema=args.schema)
    if result.noop:
        text = "nothing to do: no queued or running turns in that conversation"
    else:
        text = (
            f"cancelled {len(result.cancelled)} queued turn(s), asked {len(result.cancel_requested)} "
            f"running turn(s) to stop; {len(result.drafts)} draft(s) returned"
        )
    _out(args, result, text)
    return 0


async def cmd_dev_db(args: argparse.Namespace) -> int:
    from . import _devdb

    base = Path(args.data_dir) if args.data_dir else _devdb.default_dir()
    action = args.dev_db_command
    if action == "start":
        state = await anyio.to_thread.run_sync(_devdb.start, base)
        how = "started" if state["started"] else "already running"
        print(f"runrow dev-db: {how} (data in {state['data_dir']})", file=sys.stderr)
        _out(args, state, _devdb.export_line(state["url"]))
    elif action == "stop":
        stopped = await anyio.to_thread.run_sync(_devdb.stop, base)
        _out(
            args, {"stopped": stopped}, "runrow dev-db: stopped" if stopped else "runrow dev-db: not running"
        )
    else:
        state = _devdb.status(base)
        if action == "url":
            if not state["running"]:
                print("runrow dev-db: not running; start it with `runrow dev-db start`", file=sys.stderr)
            _out(args, state, state["url"])
        else:
            running = f"running (pid {state['pid']})" if state["running"] else "not running"
            _out(args, state, f"{running}; data in {state['data_dir']}\n{_devdb.export_line(state['url'])}")
            return 0 if state["running"] else 3
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]] = {
    "migrate": cmd_migrate,
    "worker": cmd_worker,
    "runs": cmd_runs,
    "stop": cmd_stop,
    "send": cmd_send,
    "workers": cmd_workers,
    "schedules": cmd_schedules,
    "limits": cmd_limits,
    "webhooks": cmd_webhooks,
    "check": cmd_check,
    "trim": cmd_trim,
    "journal": cmd_journal,
    "stats": cmd_stats,
    "dev-db": cmd_dev_db,
}


def _demo(args: argparse.Namespace) -> int:
    try:
        from .demo.server import run_demo
    except ImportError as exc:
        raise SystemExit(
            f"runrow demo needs its extras ({exc.name} is missing): pip install 'runrow[demo,embedded]'"
        ) from None
    if args.workers < 0:
        raise SystemExit("runrow demo: --workers must be 0 or more")
    if args.database_url:
        check_url(args.database_url, "--database-url")
    return run_demo(
        host=args.host,
        port=args.port,
        workers=args.workers,
        database_url=args.database_url,
        schema=args.schema,
        data_dir=Path(args.data_dir) if args.data_dir else None,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``runrow`` console script."""
    return run_command(build_parser().parse_args(argv))


def run_command(args: argparse.Namespace) -> int:
    """Runs one parsed ``runrow`` command and returns its exit status: ``main`` after
    parsing, and the Django app's ``runrow_worker`` and ``runrow_migrate`` commands
    (``runrow.contrib.django``), which build ``args`` from Django's options and settings."""
    configure_logging(verbose=getattr(args, "verbose", False), json_lines=getattr(args, "json", False))
    try:
        if args.command in ("demo", "web"):  # each runs its own event loop (demo: the database first)
            return _demo(args) if args.command == "demo" else web(args, _database_url(args), say=print)
        return anyio.run(COMMANDS[args.command], args, backend="asyncio")
    except DatabaseUnreachable as exc:
        print(f"runrow: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except psycopg.OperationalError as exc:  # a connect that failed: where, why, what to check
        url = getattr(args, "database_url", None) or os.environ.get("DATABASE_URL", "")
        print(f"runrow: {describe_connect_error(url, exc)}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except RunrowError as exc:
        print(f"runrow: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:
        if not isinstance(exc.code, str):
            raise
        # A message (an agent that does not load, an extra not installed): Python would
        # exit 1, which the help reserves for a database that cannot be reached.
        print(exc.code, file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the output's reader went away (`runrow runs tail RUN | head`)
        silence_stdout()
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
