"""Webhooks on endings (#42): a subscription is a row (``webhook``, migration 0015); every
statement that ends a run (the worker's finalize, the reaper's reap, a stop's cancels)
inserts one delivery per matching subscription into the outbox (``webhook_delivery``)
in the ending's own transaction (the SQL fragment ``webhook_outbox``). A worker's
delivery service (``_engine/webhooks.py``) posts them, signed per Standard Webhooks.
"""

from __future__ import annotations

import base64
import ipaddress
import secrets
import uuid
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from . import _json
from ._db import Database, perform
from ._errors import InvalidInput
from ._gateway import webhooks as _gw
from ._names import DEFAULT_SCHEMA, check_schema
from ._ops import self_contained

if TYPE_CHECKING:
    from collections.abc import Collection

    from ._ops import Operation
    from ._webhook_models import Webhook, WebhookDelivery

__all__ = [
    "ENDINGS",
    "add_webhook",
    "add_webhook_op",
    "list_webhooks",
    "list_webhooks_op",
    "redeliver",
    "redeliver_op",
    "remove_webhook",
    "remove_webhook_op",
    "send_test_webhook",
    "send_test_webhook_op",
    "webhook_deliveries",
    "webhook_deliveries_op",
]

ENDINGS = ("completed", "failed", "cancelled", "expired")
"""The terminal statuses a subscription may name (``endings="all"``: every one)."""
MAX_URL = 2000
MAX_SECRET = 200
_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def check_url(url: object, *, allow_private: bool) -> str:
    """``url`` if it is an http(s) URL without credentials whose host is public (or
    ``allow_private``); else :class:`InvalidInput` naming ``url``. A host name is not
    resolved here (it could resolve elsewhere by the time of a delivery): a literal
    address and the loopback names are checked."""
    if not isinstance(url, str) or not 8 <= len(url) <= MAX_URL:
        raise InvalidInput("url", f"must be a string of 8 to {MAX_URL} characters")
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 (a bad port raises)
    except ValueError as e:
        raise InvalidInput("url", f"is not a valid URL: {e}") from None
    if parts.scheme not in ("http", "https"):
        raise InvalidInput("url", "must be an http:// or https:// URL")
    if parts.username is not None or parts.password is not None:
        raise InvalidInput("url", "must not hold credentials (user:password@)")
    if not host:
        raise InvalidInput("url", "must name a host")
    if not allow_private and _private(host):
        raise InvalidInput("url", f"names a loopback or private host {host!r} (allow_private=True allows it)")
    return url


def _private(host: str) -> bool:
    if host.lower().rstrip(".") in _LOCAL_NAMES or host.lower().endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return not address.is_global


def _check_endings(endings: str | Collection[str]) -> list[str]:
    if endings == "all":
        return list(ENDINGS)
    if isinstance(endings, str) or not endings:
        raise InvalidInput("endings", f"must be 'all' or a non-empty collection of {', '.join(ENDINGS)}")
    chosen = list(dict.fromkeys(endings))
    for ending in chosen:
        if ending not in ENDINGS:
            raise InvalidInput("endings", f"{ending!r} is not one of {', '.join(ENDINGS)}")
    return chosen


def new_secret() -> str:
    """A fresh Standard Webhooks secret: ``whsec_`` and 32 random bytes in base64."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def _check_secret(secret: object) -> str:
    if secret is None:
        return new_secret()
    if not isinstance(secret, str) or not secret.startswith("whsec_") or len(secret) > MAX_SECRET:
        raise InvalidInput("secret", f"must be 'whsec_' and base64, at most {MAX_SECRET} characters")
    try:
        key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except ValueError:
        raise InvalidInput("secret", "must be 'whsec_' followed by base64") from None
    if not 24 <= len(key) <= 64:
        raise InvalidInput("secret", "must hold a key of 24 to 64 bytes")
    return secret


def _check_name(name: object) -> None:
    _json.check_id(name, "name", max_len=100)


async def add_webhook(
    db: Database,
    name: str,
    url: str,
    *,
    endings: str | Collection[str] = "all",
    secret: str | None = None,
    tenant_id: str | None = None,
    allow_private: bool = False,
    schema: str = DEFAULT_SCHEMA,
) -> Webhook:
    """Subscribes ``url`` to runs' endings: each ending named in ``endings`` (``"all"``,
    or some of ``completed``, ``failed``, ``cancelled``, ``expired``), of every run or
    only ``tenant_id``'s, is posted to it by a worker's delivery service (needs
    ``runrow[webhooks]``), signed per Standard Webhooks with ``secret`` (``whsec_`` and
    base64; generated if not given: read it back from the result).

    Raises :class:`InvalidInput` naming the field, writing nothing: a URL that is not
    http(s), holds credentials, or names a loopback or private host (unless
    ``allow_private``); an unknown ending; a bad secret; a name taken.
    """
    op = add_webhook_op(
        name,
        url,
        endings=endings,
        secret=secret,
        tenant_id=tenant_id,
        allow_private=allow_private,
        schema=schema,
    )
    return await perform(db, schema, op)


def add_webhook_op(
    name: str,
    url: str,
    *,
    endings: str | Collection[str],
    secret: str | None,
    tenant_id: str | None,
    allow_private: bool,
    schema: str,
) -> Operation[Webhook]:
    """:func:`add_webhook` as an operation (see ``_ops.py``)."""
    check_schema(schema)
    _check_name(name)
    checked_url = check_url(url, allow_private=allow_private)
    chosen = _check_endings(endings)
    key = _check_secret(secret)
    _json.check_id(tenant_id, "tenant_id", optional=True)
    added: Webhook | None = yield self_contained(
        _gw.add(schema, name=name, url=checked_url, endings=chosen, secret=key, tenant_id=tenant_id)
    )
    if added is None:
        raise InvalidInput("name", f"a webhook named {name!r} exists")
    return added


async def list_webhooks(db: Database, *, schema: str = DEFAULT_SCHEMA) -> list[Webhook]:
    """Every webhook subscription, by name."""
    return await perform(db, schema, list_webhooks_op(schema=schema))


def list_webhooks_op(*, schema: str) -> Operation[list[Webhook]]:
    """:func:`list_webhooks` as an operation."""
    check_schema(schema)
    found: list[Webhook] = yield self_contained(_gw.list_all(schema))
    return found


async def remove_webhook(db: Database, name: str, *, schema: str = DEFAULT_SCHEMA) -> bool:
    """Deletes the subscription and its deliveries, sent or not; False if there was none."""
    return await perform(db, schema, remove_webhook_op(name, schema=schema))


def remove_webhook_op(name: str, *, schema: str) -> Operation[bool]:
    """:func:`remove_webhook` as an operation."""
    check_schema(schema)
    _check_name(name)
    found: bool = yield self_contained(_gw.remove(schema, name=name))
    return found


async def redeliver(
    db: Database, delivery_id: uuid.UUID | str, *, schema: str = DEFAULT_SCHEMA
) -> WebhookDelivery | None:
    """Sends a delivery again (delivered, dead or pending: due now, attempts counted
    afresh, the same ``webhook-id``); None if there is none."""
    return await perform(db, schema, redeliver_op(delivery_id, schema=schema))


def redeliver_op(delivery_id: uuid.UUID | str, *, schema: str) -> Operation[WebhookDelivery | None]:
    """:func:`redeliver` as an operation."""
    check_schema(schema)
    try:
        parsed = delivery_id if isinstance(delivery_id, uuid.UUID) else uuid.UUID(str(delivery_id))
    except ValueError:
        raise InvalidInput("delivery_id", "must be a delivery's id (a UUID)") from None
    found: WebhookDelivery | None = yield self_contained(_gw.redeliver(schema, delivery_id=parsed))
    return found


async def send_test_webhook(
    db: Database, name: str, *, schema: str = DEFAULT_SCHEMA
) -> WebhookDelivery | None:
    """Queues a ``webhook.test`` delivery to the subscription; None if there is none."""
    return await perform(db, schema, send_test_webhook_op(name, schema=schema))


def send_test_webhook_op(name: str, *, schema: str) -> Operation[WebhookDelivery | None]:
    """:func:`send_test_webhook` as an operation."""
    check_schema(schema)
    _check_name(name)
    found: WebhookDelivery | None = yield self_contained(_gw.add_test(schema, name=name))
    return found


async def webhook_deliveries(
    db: Database,
    *,
    webhook: str | None = None,
    state: str | None = None,
    run_id: uuid.UUID | None = None,
    limit: int = 50,
    schema: str = DEFAULT_SCHEMA,
) -> list[WebhookDelivery]:
    """The latest deliveries, newest first: of one subscription, in one state
    (``pending``, ``delivered``, ``dead``), of one run, or all; at most ``limit``."""
    op = webhook_deliveries_op(webhook=webhook, state=state, run_id=run_id, limit=limit, schema=schema)
    return await perform(db, schema, op)


def webhook_deliveries_op(
    *, webhook: str | None, state: str | None, run_id: uuid.UUID | None, limit: int, schema: str
) -> Operation[list[WebhookDelivery]]:
    """:func:`webhook_deliveries` as an operation."""
    check_schema(schema)
    if webhook is not None:
        _check_name(webhook)
    if state not in (None, "pending", "delivered", "dead"):
        raise InvalidInput("state", "must be 'pending', 'delivered' or 'dead'")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10000:
        raise InvalidInput("limit", "must be an integer from 1 to 10000")
    found: list[WebhookDelivery] = yield self_contained(
        _gw.deliveries(schema, webhook=webhook, state=state, run_id=run_id, limit=limit)
    )
    return found
