"""Webhooks: subscriptions, their deliveries, and the delivery service's claim and record
(see ``sql/webhooks.sql``; the outbox rows are written by the endings' own statements).

Every function here is a plan (see :mod:`._exec`), run on an async or a sync connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from psycopg.rows import class_row

from .. import _sql
from .._webhook_models import Webhook, WebhookDelivery
from ._exec import Plan, Query

if TYPE_CHECKING:
    import uuid


class Claimed(NamedTuple):
    """A delivery claimed for one attempt: where to post it, how to sign it, what."""

    id: uuid.UUID
    webhook: str
    url: str
    secret: str
    payload: Any
    attempts: int


def add(
    schema: str, *, name: str, url: str, endings: list[str], secret: str, tenant_id: str | None
) -> Plan[Webhook | None]:
    """Inserts the subscription; None if its name is taken (nothing written)."""
    params = {"name": name, "url": url, "endings": endings, "secret": secret, "tenant_id": tenant_id}
    rows = yield Query(_sql.statement("add_webhook", schema), params, class_row(Webhook))
    return rows[0] if rows else None


def list_all(schema: str) -> Plan[list[Webhook]]:
    """Every subscription, by name."""
    rows = yield Query(_sql.statement("list_webhooks", schema), row_factory=class_row(Webhook))
    return rows


def remove(schema: str, *, name: str) -> Plan[bool]:
    """Deletes the subscription and its deliveries; False if there was none."""
    rows = yield Query(_sql.statement("remove_webhook", schema), {"name": name})
    return bool(rows)


def add_test(schema: str, *, name: str) -> Plan[WebhookDelivery | None]:
    """A test delivery to the subscription; None if there is none."""
    rows = yield Query(
        _sql.statement("add_test_delivery", schema), {"name": name}, class_row(WebhookDelivery)
    )
    return rows[0] if rows else None


def redeliver(schema: str, *, delivery_id: uuid.UUID) -> Plan[WebhookDelivery | None]:
    """The delivery due again now, its attempts counted afresh; None if there is none."""
    rows = yield Query(_sql.statement("redeliver", schema), {"id": delivery_id}, class_row(WebhookDelivery))
    return rows[0] if rows else None


def deliveries(
    schema: str,
    *,
    webhook: str | None = None,
    state: str | None = None,
    run_id: uuid.UUID | None = None,
    limit: int = 50,
) -> Plan[list[WebhookDelivery]]:
    """The latest deliveries, newest first, filtered as asked."""
    params = {"webhook": webhook, "state": state, "run_id": run_id, "limit": limit}
    rows = yield Query(_sql.statement("list_deliveries", schema), params, class_row(WebhookDelivery))
    return rows


def claim(schema: str, *, limit: int, lease_seconds: float) -> Plan[list[Claimed]]:
    """Up to ``limit`` due deliveries, leased (see ``claim_deliveries``)."""
    params = {"limit": limit, "lease_seconds": lease_seconds}
    rows = yield Query(_sql.statement("claim_deliveries", schema), params)
    return [Claimed(*row) for row in rows]


def record(
    schema: str,
    *,
    delivery_id: uuid.UUID,
    attempts: int,
    ok: bool,
    status: int | None,
    error: str | None,
    max_attempts: int,
    retry_in: float,
) -> Plan[str | None]:
    """An attempt's outcome; the state it left (None: the claim was no longer this one)."""
    params = {
        "id": delivery_id,
        "attempts": attempts,
        "ok": ok,
        "status": status,
        "error": error,
        "max_attempts": max_attempts,
        "retry_in": retry_in,
    }
    rows = yield Query(_sql.statement("record_attempt", schema), params)
    return str(rows[0][0]) if rows else None


def any_subscription(schema: str) -> Plan[bool]:
    """Whether any subscription exists (the delivery service's idle check)."""
    rows = yield Query(_sql.statement("any_webhook", schema))
    return bool(rows[0][0])
