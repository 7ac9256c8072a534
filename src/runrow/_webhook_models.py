"""Webhooks' records (#42): a subscription and a delivery, as stored (migration 0015)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import uuid
    from datetime import datetime


@dataclass(frozen=True, slots=True)
class Webhook:
    """A subscription (see :func:`runrow.add_webhook`): where the endings named in
    ``endings`` are posted, signed with ``secret`` (Standard Webhooks, ``whsec_...``),
    for every run or only ``tenant_id``'s."""

    name: str
    url: str
    endings: list[str]
    secret: str
    tenant_id: str | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class WebhookDelivery:
    """One delivery of the outbox: an ending (or a test) to post to one subscription.
    ``id`` is the ``webhook-id`` header, the same on every attempt. ``state`` is
    ``pending``, ``delivered`` or ``dead`` (attempts exhausted)."""

    id: uuid.UUID
    seq: int
    webhook: str
    run_id: uuid.UUID | None
    event_type: str
    payload: Any
    state: str
    attempts: int
    next_attempt_at: datetime
    last_status: int | None
    last_error: str | None
    created_at: datetime
    delivered_at: datetime | None
