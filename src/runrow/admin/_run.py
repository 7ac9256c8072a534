"""A run's page (timeline, live journal, error, uncertain tool calls, lineage, steps,
waiting input) and its event stream."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import runrow

from .._gateway import admin as gw
from .._gateway._exec import run
from .._status import CANCELLED, FAILED, LIVE, RUNNING, WAITING
from ..http import _streams
from ._app import AdminAccess, AdminState, Refused
from ._html import Html, conversation_url, e, join, link, pre_json, status, table, ts

if TYPE_CHECKING:
    from collections.abc import Mapping

    from starlette.requests import Request
    from starlette.responses import Response

__all__ = ["REAPED", "RunPage", "visible_run"]

REAPED = {
    "worker_lost": "the reaper ended it: its worker stopped heartbeating and the lease lapsed",
    "deadline_exceeded": "the reaper ended it: the turn's deadline passed",
    "input_expired": "the reaper ended it: nobody answered its input in time",
}
ACTIVE = LIVE
RETRYABLE = (FAILED, CANCELLED)
CHILDREN_SHOWN = 200  # a run page names at most this many of its children


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
            tree=_streams.tree_flag(request.query_params.get("tree"), info),
        )

    async def page(self, request: Request) -> Response:
        """The run's page."""
        access = await self.state.access(request)
        info = await visible_run(self.state, request, access)
        root = info.lineage_id or info.id
        async with self.state.pool.connection() as conn:
            attempts = await run(conn, gw.lineage(self.state.schema, root=root))
            terminal = await run(conn, gw.terminal_event(self.state.schema, run_id=info.id))
            steps = await run(conn, gw.steps(self.state.schema, lineage_id=root, limit=500))
        waiting = await runrow.waiting_inputs(self.state.pool, run_id=info.id, schema=self.state.schema)
        children = await runrow.list_runs(
            self.state.pool, parent_run_id=info.id, limit=CHILDREN_SHOWN, schema=self.state.schema
        )
        usage = await runrow.run_usage(self.state.pool, info.id, schema=self.state.schema)
        base = self.state.base(request)
        parts = [self._summary(base, info, usage), self._actions(base, info, access)]
        parts.append(self._timeline(info, terminal))
        parts.append(
            Html(
                '<section aria-labelledby="journal-h"><h2 id="journal-h">Journal</h2>'
                f'<p id="live-status" role="status">{"live" if not info.terminal else "ended"}</p>'
                f'<ol id="journal" class="journal" data-events="{e(f"{base}/runs/{info.id}/events")}"></ol>'
                "<noscript><p>The journal needs JavaScript.</p></noscript></section>"
            )
        )
        if children and info.root_run_id is None:
            # A root with children: its tree's merged journal too (tail(tree=True)), every
            # event with the run it came from, the root's ending last.
            tree_url = f"{base}/runs/{info.id}/events?tree=true"
            parts.append(
                Html(
                    '<section aria-labelledby="tree-journal-h"><h2 id="tree-journal-h">Tree journal</h2>'
                    f'<ol id="tree-journal" class="journal tree" data-events="{e(tree_url)}" '
                    f'data-root="{e(str(info.id))}"></ol></section>'
                )
            )
        if info.error is not None:
            error = dict(info.error)
            traceback = error.pop("traceback", None)
            parts.append(Html('<section aria-labelledby="error-h"><h2 id="error-h">Error</h2>'))
            parts.append(pre_json(error))
            if isinstance(traceback, str):  # as Python prints it, escaped like any text
                parts.append(Html('<h2 id="traceback-h">Traceback</h2>'))
                parts.append(
                    Html(f'<pre class="traceback" aria-labelledby="traceback-h">{e(traceback)}</pre>')
                )
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
        parts.append(
            Html('<section id="lineage" aria-labelledby="lineage-h"><h2 id="lineage-h">Retry lineage</h2>')
        )
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
        parts.append(Html("</section>"))
        parts.append(
            self._children(base, [c for c in reversed(children) if access.tenant_id in (None, c.tenant_id)])
        )
        parts.append(self.waiting_section(request, access, info, waiting))
        if info.request is not None:
            parts.append(Html('<section aria-labelledby="request-h"><h2 id="request-h">Request</h2>'))
            parts.append(pre_json(info.request))
            parts.append(Html("</section>"))
        return self.state.page(request, access, f"Run {info.id}", join(parts))

    def waiting_section(
        self,
        request: Request,
        access: AdminAccess,
        info: runrow.RunInfo,
        waiting: list[runrow.PendingInput],
        *,
        error: str | None = None,
        kept: Mapping[str, str] | None = None,
    ) -> Html:
        """What the run waits for, each with its form to answer it (when the caller may
        act); ``error`` and the fields ``kept`` go back next to the form they came from."""
        base = self.state.base(request)
        cards = []
        for n, w in enumerate(waiting):
            again = kept is not None and kept.get("key") == w.key
            card = [
                f'<div class="input-wait"><h3>Input <code>{e(w.key)}</code></h3>',
                f"<p>Asked {ts(w.since)}; "
                + (f"expires {ts(w.expires_at)}" if w.expires_at else "no deadline")
                + "</p>",
                f"<p>Request:</p>{pre_json(w.request)}",
            ]
            if again and error is not None:
                card.append(f'<p role="alert" class="error">{e(error)}</p>')
            if info.status == "waiting" and self.state.may_act(access):
                value = (kept or {}).get("value", "") if again else ""
                as_text = again and (kept or {}).get("as") == "text"
                card.append(
                    f'<form method="post" action="{e(f"{base}/runs/{info.id}/input")}" class="answer">'
                    f"{self.state.csrf_field(request)}"
                    f'<input type="hidden" name="key" value="{e(w.key)}">'
                    '<p><button type="submit" name="decision" value="approve">Approve</button> '
                    '<button type="submit" name="decision" value="deny" class="danger">Deny</button></p>'
                    f'<p class="field"><label for="value-{n}">Or answer with a value</label>'
                    f'<textarea id="value-{n}" name="value" rows="3" cols="60">{e(value)}</textarea></p>'
                    f'<p class="field"><label for="as-{n}">Read the value as</label>'
                    f'<select id="as-{n}" name="as"><option value="json">JSON</option>'
                    f'<option value="text"{" selected" if as_text else ""}>text (sent as a string)</option>'
                    "</select></p>"
                    '<p><button type="submit" name="decision" value="value">Send the value</button></p>'
                    "</form>"
                )
            card.append("</div>")
            cards.append("".join(card))
        body = "".join(cards) or '<p class="empty">Not waiting.</p>'
        return Html(
            '<section id="waiting" aria-labelledby="waiting-h"><h2 id="waiting-h">Waiting for input</h2>'
            f"{body}</section>"
        )

    @staticmethod
    def _summary(base: str, info: runrow.RunInfo, usage: runrow.RunUsage) -> Html:
        items = [
            ("Status", status(info.status)),
            ("Conversation", link(conversation_url(base, info.conversation_id), info.conversation_id)),
            ("User", info.user_id),
            ("Tenant", info.tenant_id or "-"),
            ("Attempt", info.attempt),
            ("Version", info.version or "-"),
            ("Priority", info.priority),
            ("Cancel requested", "yes" if info.cancel_requested else "no"),
            (
                "Usage",
                f"{usage.input_tokens} in, {usage.output_tokens} out tokens, cost {usage.cost:g} "
                f"({usage.records} records)",
            ),
        ]
        if info.parent_run_id is not None:  # a sub-agent: its parent, and its tree's root
            items.append(("Agent", info.agent_key or "-"))
            items.append(("Parent run", link(f"{base}/runs/{info.parent_run_id}", str(info.parent_run_id))))
            if info.root_run_id not in (None, info.parent_run_id):
                items.append(("Root run", link(f"{base}/runs/{info.root_run_id}", str(info.root_run_id))))
        if info.absorbed_into is not None:  # a steering message: the run that read it
            items.append(("Read by run", link(f"{base}/runs/{info.absorbed_into}", str(info.absorbed_into))))
        return Html(
            '<dl class="summary">' + "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in items) + "</dl>"
        )

    @staticmethod
    def _children(base: str, children: list[runrow.RunInfo]) -> Html:
        """The child runs this run spawned, in spawn order (stopping the conversation of a
        parent stops them too)."""
        rows = [
            (
                link(f"{base}/runs/{c.id}", str(c.id)),
                c.agent_key or "-",
                status(c.status),
                ts(c.created_at),
                ts(c.finished_at),
            )
            for c in children
        ]
        caption = "Sub-agents this run spawned" + (
            f" (the newest {CHILDREN_SHOWN})" if len(rows) >= CHILDREN_SHOWN else ""
        )
        return join(
            [
                Html('<section id="children" aria-labelledby="children-h"><h2 id="children-h">Children</h2>'),
                table(
                    caption, ("Run", "Agent", "Status", "Created", "Finished"), rows, empty="No child runs."
                ),
                Html("</section>"),
            ]
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
        return Html('<nav id="actions" aria-label="Actions" class="actions">' + " ".join(links) + "</nav>")

    @staticmethod
    def _timeline(info: runrow.RunInfo, terminal: dict[str, Any] | None) -> Html:
        steps: list[tuple[str, Html, str]] = [("Queued", ts(info.created_at), "")]
        if info.started_at is not None:
            steps.append(("Claimed", ts(info.started_at), f"by worker {info.worker_id or '?'}"))
        if info.last_heartbeat_at is not None:
            steps.append(("Last heartbeat", ts(info.last_heartbeat_at), ""))
        if info.status == RUNNING and info.claim_expires_at is not None:
            steps.append(("Lease expires", ts(info.claim_expires_at), "unless the worker heartbeats"))
        if info.status == WAITING and info.input_deadline_at is not None:
            steps.append(("Waiting for input until", ts(info.input_deadline_at), ""))
        elif info.status == WAITING:  # (no input timeout and no turn deadline)
            steps.append(("Waiting for input", Html(""), "no deadline: it waits to be answered or stopped"))
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
            f'<section id="timeline" aria-labelledby="timeline-h"><h2 id="timeline-h">Timeline</h2><ol class="timeline">{items}</ol></section>'
        )
