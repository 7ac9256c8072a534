"""``runrow schedules list|add|pause|resume|remove|next``: the schedules (#42), through the
public API (docs/howto/schedules.md). A name that names no schedule is a usage error."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from ._cli_support import database_url, out

if TYPE_CHECKING:
    import argparse

    from ._models import Schedule

__all__ = ["add_schedules_parser", "cmd_schedules"]


def add_schedules_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """The ``schedules`` command and its subcommands, under ``sub``."""
    sc = sub.add_parser(
        "schedules",
        parents=[common],
        help="turns enqueued on a cron expression or an interval (list, add, pause, resume, remove, next)",
    )
    ssub = sc.add_subparsers(dest="schedules_command", metavar="COMMAND", required=False)
    ssub.add_parser("list", parents=[common], help="every schedule, with its next tick (the default)")
    add = ssub.add_parser(
        "add",
        parents=[common],
        help="add a schedule: a turn of CONVERSATION with TEXT at each tick",
        description="Adds a schedule (runrow.add_schedule): give --cron or --every.",
    )
    add.add_argument("name", metavar="NAME", help="the schedule's unique name")
    add.add_argument(
        "conversation_id", metavar="CONVERSATION", help="the conversation each tick's turn joins"
    )
    add.add_argument("text", metavar="TEXT", help="the user's message each tick sends")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument(
        "--cron",
        help="a cron expression, read in --timezone (needs runrow[schedules]; default: none, give --every)",
    )
    when.add_argument("--every", type=float, help="an interval, in seconds (default: none, give --cron)")
    add.add_argument("--timezone", default="UTC", help="an IANA time zone for --cron (default: %(default)s)")
    add.add_argument(
        "--user", default="scheduler", help="the user the turns are sent as (default: %(default)s)"
    )
    add.add_argument("--tenant", help="the tenant they count against (default: none, the default tenant)")
    add.add_argument(
        "--overlap",
        choices=("skip", "queue"),
        default="skip",
        help="a tick while the last is live (default: %(default)s)",
    )
    add.add_argument(
        "--catch-up",
        choices=("none", "last", "all"),
        default="last",
        help="ticks missed in downtime (default: %(default)s)",
    )
    add.add_argument(
        "--catch-up-limit", type=int, default=100, help="with --catch-up all: at most (default: %(default)s)"
    )
    add.add_argument("--paused", action="store_true", help="add it paused")
    for verb, what in (
        ("pause", "pause a schedule"),
        ("resume", "resume a paused schedule"),
        ("remove", "delete a schedule"),
    ):
        p = ssub.add_parser(verb, parents=[common], help=what)
        p.add_argument("name", metavar="NAME", help="the schedule's name")
    nx = ssub.add_parser("next", parents=[common], help="a schedule's next ticks, in its time zone")
    nx.add_argument("name", metavar="NAME", help="the schedule's name")
    nx.add_argument("-n", type=int, default=5, help="how many (default: %(default)s)")


def _when(s: Schedule) -> str:
    return f"cron {s.cron} {s.timezone}" if s.cron else f"every {s.interval_seconds:g}s"


def _lines(found: list[Schedule]) -> str:
    if not found:
        return "(no schedules)"
    now = datetime.now(UTC)
    nw = max(len("NAME"), *(len(s.name) for s in found))
    ww = max(len("WHEN"), *(len(_when(s)) for s in found))
    lines = [f"{'NAME':<{nw}}  {'WHEN':<{ww}}  {'NEXT':<25}  {'FIRED':>6}  {'SKIPPED':>7}  STATE"]
    for s in found:
        due = " (due)" if s.next_fire_at <= now and not s.paused else ""
        state = "paused" if s.paused else "active"
        lines.append(
            f"{s.name:<{nw}}  {_when(s):<{ww}}  {s.next_fire_at.astimezone(UTC).isoformat():<25}  "
            f"{s.fired_ticks:>6}  {s.skipped_ticks:>7}  {state}{due}"
        )
    return "\n".join(lines)


async def cmd_schedules(args: argparse.Namespace) -> int:
    """Runs one ``schedules`` subcommand."""
    from . import _schedules as api

    url, schema, verb = database_url(args), args.schema, getattr(args, "schedules_command", None) or "list"
    if verb == "list":
        found = await api.list_schedules(url, schema=schema)
        out(args, found, _lines(found))
        return 0
    if verb == "add":
        added = await api.add_schedule(
            url,
            args.name,
            conversation_id=args.conversation_id,
            user_id=args.user,
            content=args.text,
            cron=args.cron,
            every=args.every,
            timezone=args.timezone,
            tenant_id=args.tenant,
            overlap=args.overlap,
            catch_up=args.catch_up,
            catch_up_limit=args.catch_up_limit,
            paused=args.paused,
            schema=schema,
        )
        out(
            args,
            added,
            f"added {added.name}: {_when(added)}, next {added.next_fire_at.astimezone(UTC).isoformat()}",
        )
        return 0
    if verb == "next":
        ticks = await api.next_fires(url, args.name, args.n, schema=schema)
        if ticks is None:
            raise SystemExit(f"runrow schedules next: no schedule named {args.name!r}")
        out(args, ticks, "\n".join(t.isoformat() for t in ticks))
        return 0
    if verb == "remove":
        if not await api.remove_schedule(url, args.name, schema=schema):
            raise SystemExit(f"runrow schedules remove: no schedule named {args.name!r}")
        out(args, {"name": args.name, "removed": True}, f"removed {args.name}")
        return 0
    call = api.pause_schedule if verb == "pause" else api.resume_schedule
    changed = await call(url, args.name, schema=schema)
    if changed is None:
        raise SystemExit(f"runrow schedules {verb}: no schedule named {args.name!r}")
    state = "paused" if changed.paused else f"active, next {changed.next_fire_at.astimezone(UTC).isoformat()}"
    out(args, changed, f"{changed.name}: {state}")
    return 0
