"""``runrow webhooks list|add|remove|test|redeliver|deliveries``: the webhook
subscriptions and their deliveries (#42), through the public API
(docs/howto/webhooks.md). A name or id that names nothing is a usage error."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._cli_support import database_url, out

if TYPE_CHECKING:
    import argparse

    from ._webhook_models import Webhook, WebhookDelivery

__all__ = ["add_webhooks_parser", "cmd_webhooks"]


def add_webhooks_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """The ``webhooks`` command and its subcommands, under ``sub``."""
    wc = sub.add_parser(
        "webhooks",
        parents=[common],
        help="runs' endings posted to URLs (list, add, remove, test, redeliver, deliveries)",
    )
    wsub = wc.add_subparsers(dest="webhooks_command", metavar="COMMAND", required=False)
    wsub.add_parser("list", parents=[common], help="every subscription (the default)")
    add = wsub.add_parser("add", parents=[common], help="subscribe URL to runs' endings")
    add.add_argument("name", metavar="NAME", help="the subscription's unique name")
    add.add_argument("url", metavar="URL", help="the http(s) URL the endings are posted to")
    add.add_argument(
        "--endings",
        default="all",
        help="comma-separated: completed, failed, cancelled, expired (default: %(default)s)",
    )
    add.add_argument("--secret", help="a whsec_ signing secret (default: none, one is generated)")
    add.add_argument("--tenant", help="only this tenant's runs (default: every run)")
    add.add_argument(
        "--allow-private", action="store_true", help="allow a loopback or private host (default: refused)"
    )
    for verb, what in (
        ("remove", "delete a subscription and its deliveries"),
        ("test", "send a test delivery"),
    ):
        p = wsub.add_parser(verb, parents=[common], help=what)
        p.add_argument("name", metavar="NAME", help="the subscription's name")
    re = wsub.add_parser("redeliver", parents=[common], help="send a delivery again")
    re.add_argument("delivery_id", metavar="DELIVERY_ID", help="the delivery's id (its webhook-id)")
    dl = wsub.add_parser("deliveries", parents=[common], help="the latest deliveries, newest first")
    dl.add_argument("--webhook", help="only this subscription's (default: none, every subscription's)")
    dl.add_argument(
        "--state",
        choices=("pending", "delivered", "dead"),
        help="only in this state (default: none, any state)",
    )
    dl.add_argument("--limit", type=int, default=20, help="how many (default: %(default)s)")


def _hooks(found: list[Webhook]) -> str:
    if not found:
        return "(no webhooks)"
    nw = max(len("NAME"), *(len(w.name) for w in found))
    lines = [f"{'NAME':<{nw}}  {'ENDINGS':<34}  {'TENANT':<10}  URL"]
    lines += [f"{w.name:<{nw}}  {','.join(w.endings):<34}  {w.tenant_id or '-':<10}  {w.url}" for w in found]
    return "\n".join(lines)


def _deliveries(found: list[WebhookDelivery]) -> str:
    if not found:
        return "(no deliveries)"
    lines = [f"{'ID':<36}  {'WEBHOOK':<16}  {'TYPE':<14}  {'STATE':<9}  {'TRIES':>5}  LAST"]
    for d in found:
        last = d.last_error or (str(d.last_status) if d.last_status is not None else "-")
        lines.append(
            f"{d.id!s:<36}  {d.webhook:<16}  {d.event_type:<14}  {d.state:<9}  {d.attempts:>5}  {last[:60]}"
        )
    return "\n".join(lines)


async def cmd_webhooks(args: argparse.Namespace) -> int:
    """Runs one ``webhooks`` subcommand."""
    from . import _webhooks as api

    url, schema, verb = database_url(args), args.schema, getattr(args, "webhooks_command", None) or "list"
    if verb == "list":
        found = await api.list_webhooks(url, schema=schema)
        out(args, found, _hooks(found))
        return 0
    if verb == "add":
        endings = (
            "all" if args.endings == "all" else [e.strip() for e in args.endings.split(",") if e.strip()]
        )
        added = await api.add_webhook(
            url,
            args.name,
            args.url,
            endings=endings,
            secret=args.secret,
            tenant_id=args.tenant,
            allow_private=args.allow_private,
            schema=schema,
        )
        out(
            args,
            added,
            f"added {added.name}: {','.join(added.endings)} -> {added.url}\nsecret {added.secret}",
        )
        return 0
    if verb == "remove":
        if not await api.remove_webhook(url, args.name, schema=schema):
            raise SystemExit(f"runrow webhooks remove: no webhook named {args.name!r}")
        out(args, {"name": args.name, "removed": True}, f"removed {args.name}")
        return 0
    if verb == "test":
        sent = await api.send_test_webhook(url, args.name, schema=schema)
        if sent is None:
            raise SystemExit(f"runrow webhooks test: no webhook named {args.name!r}")
        out(args, sent, f"queued test delivery {sent.id}")
        return 0
    if verb == "redeliver":
        again = await api.redeliver(url, args.delivery_id, schema=schema)
        if again is None:
            raise SystemExit(f"runrow webhooks redeliver: no delivery {args.delivery_id!r}")
        out(args, again, f"redelivering {again.id}")
        return 0
    found_d = await api.webhook_deliveries(
        url, webhook=args.webhook, state=args.state, limit=args.limit, schema=schema
    )
    out(args, found_d, _deliveries(found_d))
    return 0
