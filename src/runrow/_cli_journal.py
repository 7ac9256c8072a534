"""``runrow journal``: the journal's partitions, listed or made ahead
(docs/howto/retention.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._cli_support import database_url, jsonable, out

if TYPE_CHECKING:
    import argparse

__all__ = ["add_journal_parser", "cmd_journal"]


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
