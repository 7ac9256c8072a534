"""``runrow journal``: the journal's partitions, listed or made ahead; ``runrow trim``:
retention (docs/howto/retention.md)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from ._cli_support import database_url, jsonable, out

if TYPE_CHECKING:
    import argparse

__all__ = ["add_journal_parser", "cmd_journal", "cmd_trim"]


def add_journal_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """The ``journal`` command, under ``sub``."""
    j = sub.add_parser("journal", parents=[common], help="the journal's partitions")
    what = j.add_subparsers(dest="journal_command", metavar="COMMAND", required=False)
    what.add_parser(
        "partitions", parents=[common], help="list them, oldest first, with estimates (the default)"
    )
    what.add_parser("ensure", parents=[common], help="make them ahead of the clock (workers do)")


async def cmd_journal(args: argparse.Namespace) -> int:
    from ._partitions import ensure_journal_partitions, journal_partitions

    url = database_url(args)
    if args.journal_command == "ensure":
        made = await ensure_journal_partitions(url, schema=args.schema)
        out(args, {"made": made}, f"made {made} journal partition(s)")
        return 0
    parts = await journal_partitions(url, schema=args.schema)
    lines = [
        f"{p.name}  {'(before schema 20)' if p.starts is None else f'{p.starts:%Y-%m-%d %H:%M} .. {p.ends:%Y-%m-%d %H:%M} UTC'}"
        f"  ~{p.rows_estimate} events"
        for p in parts
    ]
    out(args, jsonable(parts), "\n".join(lines) or "no partitions (schema before version 20)")
    return 0


async def cmd_trim(args: argparse.Namespace) -> int:
    """``runrow trim``: retires old journal partitions (and, asked, erases requests)."""
    from ._retention import trim

    result = await trim(
        database_url(args),
        retention=timedelta(hours=args.retention_hours),
        schema=args.schema,
        erase_requests=args.erase_requests,
    )
    what = f"dropped {result.partitions} journal partitions and {result.events} journal rows one by one"
    out(args, result, f"trimmed {result.runs} finished runs; {what}")
    return 0
