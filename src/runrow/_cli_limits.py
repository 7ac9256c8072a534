"""``runrow limits list|set|remove``: rate limits at the claim (#42), through the public
API (docs/howto/rate-limits.md). Removing a key that has no limit is a usage error."""

from __future__ import annotations

from datetime import UTC
from typing import TYPE_CHECKING

from ._cli_support import database_url, out

if TYPE_CHECKING:
    import argparse

    from ._models import RateLimit

__all__ = ["add_limits_parser", "cmd_limits"]


def add_limits_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """The ``limits`` command and its subcommands, under ``sub``."""
    lc = sub.add_parser(
        "limits",
        parents=[common],
        help="rate limits: at most N runs started per period under a key (list, set, remove)",
    )
    lsub = lc.add_subparsers(dest="limits_command", metavar="COMMAND", required=False)
    lsub.add_parser("list", parents=[common], help="every limited or gated key (the default)")
    st = lsub.add_parser(
        "set",
        parents=[common],
        help="limit KEY to RUNS starts per PER seconds",
        description="Sets a rate limit (runrow.set_rate_limit): KEY is tenant:<id>, agent:<key> or a limit_key.",
    )
    st.add_argument(
        "key", metavar="KEY", help="tenant:<tenant_id>, agent:<agent_key> or an enqueue's limit_key"
    )
    st.add_argument("runs", metavar="RUNS", type=int, help="runs that may start per window")
    st.add_argument(
        "--per", type=float, required=True, help="the window, in seconds (default: none, required)"
    )
    rm = lsub.add_parser("remove", parents=[common], help="remove KEY's limit")
    rm.add_argument("key", metavar="KEY", help="the key whose limit goes")


def _lines(found: list[RateLimit]) -> str:
    if not found:
        return "no rate limits"
    kw = max(3, *(len(r.key) for r in found))
    lines = [f"{'KEY':<{kw}}  {'LIMIT':<22}  {'USED':>6}  GATE"]
    for r in found:
        limit = "-" if r.runs is None else f"{r.runs} per {r.per_seconds:g} s"
        gate = "-" if r.gate_until is None else f"shut until {r.gate_until.astimezone(UTC).isoformat()}"
        lines.append(f"{r.key:<{kw}}  {limit:<22}  {r.used:>6}  {gate}")
    return "\n".join(lines)


async def cmd_limits(args: argparse.Namespace) -> int:
    """Runs one ``limits`` subcommand."""
    from . import _limits as api

    url, schema, verb = database_url(args), args.schema, getattr(args, "limits_command", None) or "list"
    if verb == "list":
        found = await api.list_rate_limits(url, schema=schema)
        out(args, found, _lines(found))
        return 0
    if verb == "set":
        stored = await api.set_rate_limit(url, args.key, runs=args.runs, per=args.per, schema=schema)
        out(args, stored, f"{stored.key}: {stored.runs} per {stored.per_seconds:g} s")
        return 0
    if not await api.remove_rate_limit(url, args.key, schema=schema):
        raise SystemExit(f"runrow limits remove: no rate limit on {args.key!r}")
    out(args, {"key": args.key, "removed": True}, f"removed the limit on {args.key}")
    return 0
