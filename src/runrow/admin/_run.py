"""A run's page (timeline, live journal, error, uncertain tool calls, lineage, steps,
waiting input) and its event stream."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import runrow

from .._gateway import admin as gw
from ..http import _streams
from ._app import AdminAccess, AdminState, Refused
from ._html import Html, conversation_url, e, join, link, pre_json, status, table, ts

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

__all__ = ["REAPED", "RunPage", "visible_run"]

REAPED = {
    "worker_lost": "the reaper ended it: its worker stopped heartbeating and the lease lapsed",
    "deadline_exceeded": "the reaper ended it: the turn's deadline passed",
    "input_expired": "the reaper ended it: nobody answered its input in time",
}
ACTIVE = ("queued", "running", "waiting")
RETRYABLE = ("failed", "cancelled")


async def visible_run(state: AdminState, request: Request, access: AdminAccess) -> runrow.RunInfo:
    """The path's run, or 404 if unknown or another tenant's (the two look alike)."""
    try:
        info = await runrow.get_run(state.pool, request.path_params["run_id"], schema=state.schema)
    except (runrow.RunNotFound, runrow.InvalidInput):
        raise Refused(404, "No such run.") from None
    if access.tenant_id is not None and info.tenant_id != access.tenant_id:
        raise Refused(404, "No such run.")
    return info


class RunPage:
    """``GET /runs/{run_id}`` and ``GET /runs/{run_id}/events``."""

    def __init__(self, state: AdminState) -> None:
        self.state = state

    async def events(self, request: Request) -> Response:
        """The journal as SSE in runrow's format (the HTTP API's stream), resumable."""
        access = await self.state.access(request)
        info = await visible_run(self.state, request, access)
        fmt = _streams.RUNROW_FORMAT
        return await _streams.stream_run(
            self.state.pool,
            info,
            fmt=fmt,
            cursor=_streams.read_cursor(request.headers, request.query_params, fmt),
            hub=self.state.hub,
            keepalive=self.state.keepalive,
            schema=self.state.schema,
        )

    async def page(self, request: Request) -> Response:
        """The run's page."""
        access = await self.state.access(request)
        info = await visible_run(self.state, request, access)
        root = info.lineage_id or info.id
        async with self.state.pool.connection() as conn:
            attempts = await gw.lineage(conn, self.state.schema, root=root)
            terminal = await gw.terminal_event(conn, self.state.schema, run_id=info.id)
            steps = await gw.steps(conn, self.state.schema, lineage_id=root, limit=500)
        waiting = await runrow.waiting_inputs(self.state.pool, run_id=info.id, schema=self.state.schema)
        base = self.state.base(request)
        parts = [self._summary(base, info), self._actions(base, info, access)]
        parts.append(self._timeline(info, terminal))
        parts.append(
            Html(
                '<section aria-labelledby="journal-h"><h2 id="journal-h">Journal</h2>'
                f'<p id="live-status" role="status">{"live" if not info.terminal else "ended"}</p>'
                f'<ol id="journal" class="journal" data-events="{e(f"{base}/runs/{info.id}/events")}"></ol>'
                "<noscript><p>The journal needs JavaScript.</p></noscript></section>"
            )
        )
        if info.error is not None:
            parts.append(Html('<section aria-labelledby="error-h"><h2 id="error-h">Error</h2>'))
            parts.append(pre_json(info.error))
            parts.append(Html("</section>"))
        uncertain = (terminal or {}).get("uncertain_tool_calls") or []
        if terminal is not None and "uncertain_tool_calls" in terminal:
            rows = [(c.get("tool_call_id"), c.get("name")) for c in uncertain]
            parts.append(
                Html('<section aria-labelledby="uncertain-h"><h2 id="uncertain-h">Uncertain tool calls</h2>')
            )
            parts.append(table("Started, never ended", ("Tool call", "Name"), rows, empty="None."))
            parts.append(Html("</section>"))
        visible = [a for a in attempts if access.tenant_id is None or a[4] == access.tenant_id]
        lineage_rows = [
            (
                a[2],
                link(f"{base}/runs/{a[0]}", str(a[0])) if a[0] != info.id else Html(f"{e(a[0])} (this run)"),
                status(a[1]),
                a[3] or "-",
                ts(a[5]),
                ts(a[6]),
            )
            for a in visible
        ]
        parts.append(Html('<section aria-labelledby="lineage-h"><h2 id="lineage-h">Retry lineage</h2>'))
        parts.append(
            table(
                "Attempts of this turn",
                ("Attempt", "Run", "Status", "Retry of", "Created", "Finished"),
                lineage_rows,
                empty="Only this attempt.",
            )
        )
        parts.append(Html("</section>"))
        step_rows = [
            (
                s.position,
                s.key,
                s.occurrence,
                s.status,
                "yes" if s.idempotent else "no",
                ts(s.started_at),
                ts(s.recorded_at),
            )
            for s in steps
        ]
        parts.append(Html('<section aria-labelledby="steps-h"><h2 id="steps-h">Steps</h2>'))
        parts.append(
            table(
                "Durable steps in call order",
                ("#", "Key", "Occurrence", "Status", "Idempotent", "Started", "Recorded"),
                step_rows,
                empty="No durable steps.",
            )
        )
        wait_rows = [(w.key, Html(pre_json(w.request)), ts(w.since), ts(w.expires_at)) for w in waiting]
        parts.append(
            Html('</section><section aria-labelledby="waiting-h"><h2 id="waiting-h">Waiting for input</h2>')
        )
        parts.append(
            table("Inputs asked for", ("Key", "Request", "Since", "Expires"), wait_rows, empty="Not waiting.")
        )
        parts.append(Html("</section>"))
        if info.request is not None:
            parts.append(Html('<section aria-labelledby="request-h"><h2 id="request-h">Request</h2>'))
            parts.append(pre_json(info.request))
            parts.append(Html("</section>"))
        return self.state.page(request, access, f"Run {info.id}", join(parts))

    @staticmethod
    def _summary(base: str, info: runrow.RunInfo) -> Html:
        items = [
            ("Status", status(info.status)),
            ("Conversation", link(conversation_url(base, info.conversation_id), info.conversation_id)),
            ("User", info.user_id),
            ("Tenant", info.tenant_id or "-"),
            ("Attempt", info.attempt),
            ("Priority", info.priority),
            ("Cancel requested", "yes" if info.cancel_requested else "no"),
        ]
        return Html(
            '<dl class="summary">' + "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in items) + "</dl>"
        )

    def _actions(self, base: str, info: runrow.RunInfo, access: AdminAccess) -> Html:
        if not self.state.may_act(access):
            return Html("")
        links = []
        if info.status in ACTIVE:
            links.append(link(f"{base}/runs/{info.id}/cancel", "Cancel this run…", class_="button danger"))
        if info.status in RETRYABLE:
            links.append(link(f"{base}/runs/{info.id}/retry", "Retry this run…", class_="button"))
        links.append(
            link(
                conversation_url(base, info.conversation_id, stop=True),
                "Stop the conversation…",
                class_="button danger",
            )
        )
        return Html('<nav aria-label="Actions" class="actions">' + " ".join(links) + "</nav>")

    @staticmethod
    def _timeline(info: runrow.RunInfo, terminal: dict[str, Any] | None) -> Html:
        steps: list[tuple[str, Html, str]] = [("Queued", ts(info.created_at), "")]
        if info.started_at is not None:
            steps.append(("Claimed", ts(info.started_at), f"by worker {info.worker_id or '?'}"))
        if info.last_heartbeat_at is not None:
            steps.append(("Last heartbeat", ts(info.last_heartbeat_at), ""))
        if info.status == "running" and info.claim_expires_at is not None:
            steps.append(("Lease expires", ts(info.claim_expires_at), "unless the worker heartbeats"))
        if info.status == "waiting":
            steps.append(("Waiting for input", ts(info.input_deadline_at), "until"))
        if info.finished_at is not None:
            # The reaper's terminal event, and only it, lists uncertain tool calls: a
            # worker ending its own run at the deadline has the same error type.
            reaped = terminal is not None and "uncertain_tool_calls" in terminal
            note = REAPED.get(str((terminal or {}).get("reason")), "") if reaped else ""
            steps.append((f"Ended: {info.status}", ts(info.finished_at), note))
        items = "".join(
            f'<li><span class="what">{e(what)}</span> {when} <span class="note">{e(note)}</span></li>'
            for what, when, note in steps
        )
        return Html(
            f'<section aria-labelledby="timeline-h"><h2 id="timeline-h">Timeline</h2><ol class="timeline">{items}</ol></section>'
        )
