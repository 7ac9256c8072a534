"""The schedules page: every schedule with its next tick and what its fires did, and
pause and resume (confirmed, CSRF-protected like the other actions; absent when
read-only). A tenant-scoped caller sees and acts on its own tenant's schedules only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.responses import RedirectResponse

import runrow

from ._app import Refused, query_id
from ._html import Html, e, join, link, query, table, ts

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from .._models import Schedule
    from ._app import AdminAccess, AdminState

__all__ = ["SchedulesPage"]

_ACTIONS = {
    "pause": ("Pause schedule", "Pause this schedule? No worker fires it until it is resumed."),
    "resume": (
        "Resume schedule",
        "Resume this schedule? It goes on from its next tick after now (ticks missed while "
        "paused are not caught up).",
    ),
}


class SchedulesPage:
    """``GET /schedules`` and ``GET`` (confirm) / ``POST`` (do) ``/schedules/pause?name=``
    and ``/schedules/resume?name=``."""

    def __init__(self, state: AdminState) -> None:
        self.state = state

    async def _visible(self, access: AdminAccess) -> list[Schedule]:
        found = await runrow.list_schedules(self.state.pool, schema=self.state.schema)
        return [s for s in found if access.tenant_id is None or s.tenant_id == access.tenant_id]

    async def get(self, request: Request) -> Response:
        """The list, with a pause or resume link per schedule for a caller who may act."""
        access = await self.state.access(request)
        schedules = await self._visible(access)
        base, acts = self.state.base(request), self.state.may_act(access)

        def action(s: Schedule) -> object:
            verb = "resume" if s.paused else "pause"
            return (
                link(query(f"{base}/schedules/{verb}", {"name": s.name}), verb.capitalize()) if acts else ""
            )

        rows = [
            (
                s.name,
                f"cron {s.cron} ({s.timezone})" if s.cron else f"every {s.interval_seconds:g} s",
                s.conversation_id,
                s.tenant_id or "-",
                f"{s.overlap} / {s.catch_up}",
                "paused" if s.paused else ts(s.next_fire_at),
                ts(s.last_tick_at),
                f"{s.fired_ticks} / {s.skipped_ticks}",
                action(s),
            )
            for s in schedules
        ]
        body = table(
            "Schedules: each tick is enqueued once, by whichever worker fires it",
            (
                "Name",
                "When",
                "Conversation",
                "Tenant",
                "Overlap / catch-up",
                "Next tick",
                "Last tick",
                "Fired / skipped",
                "",
            ),
            rows,
            empty="No schedule.",
        )
        return self.state.page(request, access, "Schedules", join([body]))

    async def act(self, request: Request) -> Response:
        """Pause or resume one schedule: a confirmation on GET, the change on POST."""
        verb = request.path_params["action"]
        if verb not in _ACTIONS:
            raise Refused(404, "No such action.")
        access = await self.state.actor(request)
        name = query_id(request, "name")
        mine = {s.name: s for s in await self._visible(access)}
        if name is None or name not in mine:
            raise Refused(404, "No such schedule.")
        base = self.state.base(request)
        title, question = _ACTIONS[verb]
        if request.method != "POST":  # GET (and HEAD) only ever confirm
            body = Html(
                f'<form method="post" class="confirm">{self.state.csrf_field(request)}'
                f"<p>{e(question)}</p><p>Schedule {e(name)}</p>"
                f'<button type="submit">{e(title)}</button> '
                f"{link(base + '/schedules', 'Back to the schedules')}</form>"
            )
            return self.state.page(request, access, title, body)
        call = runrow.pause_schedule if verb == "pause" else runrow.resume_schedule
        await call(self.state.pool, name, schema=self.state.schema)
        return RedirectResponse(f"{base}/schedules", status_code=303)
