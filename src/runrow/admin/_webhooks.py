"""The webhooks page: every subscription (its secret never shown) and the latest
deliveries, with a redeliver action per delivery (confirmed, CSRF-protected like the
other actions; absent when read-only). A tenant-scoped caller sees and acts on its own
tenant's subscriptions and their deliveries only."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from starlette.responses import RedirectResponse

import runrow

from ._app import Refused
from ._html import Html, e, join, link, query, table, ts

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from .._webhook_models import Webhook, WebhookDelivery
    from ._app import AdminAccess, AdminState

__all__ = ["WebhooksPage"]

RECENT = 50


class WebhooksPage:
    """``GET /webhooks`` and ``GET`` (confirm) / ``POST`` (do) ``/webhooks/redeliver?id=``."""

    def __init__(self, state: AdminState) -> None:
        self.state = state

    async def _visible(self, access: AdminAccess) -> list[Webhook]:
        found = await runrow.list_webhooks(self.state.pool, schema=self.state.schema)
        return [w for w in found if access.tenant_id is None or w.tenant_id == access.tenant_id]

    async def _deliveries(self, hooks: list[Webhook], access: AdminAccess) -> list[WebhookDelivery]:
        found = await runrow.webhook_deliveries(self.state.pool, limit=RECENT, schema=self.state.schema)
        names = {w.name for w in hooks}
        return [d for d in found if access.tenant_id is None or d.webhook in names]

    async def get(self, request: Request) -> Response:
        """The subscriptions and the latest deliveries, a redeliver link per delivery."""
        access = await self.state.access(request)
        hooks = await self._visible(access)
        deliveries = await self._deliveries(hooks, access)
        base, acts = self.state.base(request), self.state.may_act(access)
        subs = table(
            "Subscriptions: each ending is written to the outbox with the ending itself",
            ("Name", "URL", "Endings", "Tenant", "Created"),
            [(w.name, w.url, ", ".join(w.endings), w.tenant_id or "-", ts(w.created_at)) for w in hooks],
            empty="No webhook.",
        )

        def action(d: WebhookDelivery) -> object:
            return link(query(f"{base}/webhooks/redeliver", {"id": str(d.id)}), "Redeliver") if acts else ""

        rows = [
            (
                str(d.id),
                d.webhook,
                d.event_type,
                link(f"{base}/runs/{d.run_id}", str(d.run_id)) if d.run_id else "-",
                d.state,
                str(d.attempts),
                d.last_error or (str(d.last_status) if d.last_status is not None else "-"),
                ts(d.created_at),
                action(d),
            )
            for d in deliveries
        ]
        recent = table(
            f"Latest deliveries (at most {RECENT}, newest first)",
            ("Delivery (webhook-id)", "Webhook", "Type", "Run", "State", "Attempts", "Last", "Created", ""),
            rows,
            empty="No delivery.",
        )
        return self.state.page(request, access, "Webhooks", join([subs, recent]))

    async def act(self, request: Request) -> Response:
        """Redeliver one delivery: a confirmation on GET, the change on POST."""
        if request.path_params["action"] != "redeliver":
            raise Refused(404, "No such action.")
        access = await self.state.actor(request)
        try:
            delivery_id = uuid.UUID(request.query_params.get("id", ""))
        except ValueError:
            raise Refused(404, "No such delivery.") from None
        hooks = await self._visible(access)
        mine = {d.id for d in await self._deliveries(hooks, access)}
        if delivery_id not in mine:
            raise Refused(404, "No such delivery.")
        base = self.state.base(request)
        if request.method != "POST":  # GET (and HEAD) only ever confirm
            body = Html(
                f'<form method="post" class="confirm">{self.state.csrf_field(request)}'
                f"<p>{e('Send this delivery again? It keeps its webhook-id; its attempts start afresh.')}</p>"
                f"<p>Delivery {e(str(delivery_id))}</p>"
                f'<button type="submit">Redeliver</button> '
                f"{link(base + '/webhooks', 'Back to the webhooks')}</form>"
            )
            return self.state.page(request, access, "Redeliver", body)
        await runrow.redeliver(self.state.pool, delivery_id, schema=self.state.schema)
        return RedirectResponse(f"{base}/webhooks", status_code=303)
