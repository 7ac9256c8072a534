"""The conversation view and the actions: cancel and retry a run, stop a conversation.

Each action is a link to a confirmation page whose form POSTs with the CSRF token; the
POST does it and redirects (303) to what it changed. In read-only mode, or for a caller
whose access has no ``can_act``, the links are not rendered and both the confirmation
page and the POST answer 403.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from starlette.responses import RedirectResponse, Response

import runrow

from .._gateway import admin as gw
from .._gateway._exec import run
from .._models import holder
from ._app import AdminAccess, AdminState, Refused, query_id
from ._html import Html, conversation_url, e, join, link, status, table, ts
from ._run import visible_run

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = ["Actions"]

MAX_TURNS = 500
_RUN_ACTIONS = {
    "cancel": (
        "Cancel run",
        "Cancel this run? A queued or waiting run ends now; a running one is asked to stop.",
    ),
    "retry": (
        "Retry run",
        "Retry this run? A new run answers the same message (once, however often you press), "
        "keeping the turn's deadline.",
    ),
}


class Actions:
    """Conversation pages and the action routes."""

    def __init__(self, state: AdminState) -> None:
        self.state = state

    async def _conversation(self, cid: str, access: AdminAccess) -> tuple[list[gw.Attempt], bool]:
        """The conversation's turns the caller may see, and whether it sees all of them; 404 if none."""
        async with self.state.pool.connection() as conn:
            turns = await run(
                conn, gw.conversation_runs(self.state.schema, conversation_id=cid, limit=MAX_TURNS + 1)
            )
        # Past MAX_TURNS the rest is unseen: it could hold another tenant's turns.
        complete = len(turns) <= MAX_TURNS
        turns = turns[:MAX_TURNS]
        visible = [t for t in turns if access.tenant_id is None or t.tenant_id == access.tenant_id]
        if not visible:
            raise Refused(404, "No such conversation.")
        return visible, complete and len(visible) == len(turns)

    def _confirm(
        self, request: Request, access: AdminAccess, title: str, question: str, what: Html
    ) -> Response:
        body = Html(
            f'<form method="post" class="confirm">{self.state.csrf_field(request)}'
            f"<p>{e(question)}</p><p>{what}</p>"
            f'<button type="submit" class="danger">{e(title)}</button> '
            f"{link(self.state.base(request) + '/', 'Back to the runs')}</form>"
        )
        return self.state.page(request, access, title, body)

    async def run_action(self, request: Request) -> Response:
        """``GET`` (confirm) and ``POST`` (do) ``/runs/{run_id}/cancel`` and ``.../retry``."""
        action = request.path_params["action"]
        if action not in _RUN_ACTIONS:
            raise Refused(404, "No such action.")
        access = await self.state.actor(request)
        info = await visible_run(self.state, request, access)
        base = self.state.base(request)
        title, question = _RUN_ACTIONS[action]
        if request.method != "POST":  # GET (and HEAD) only ever show the confirmation
            what = Html(f"Run {link(f'{base}/runs/{info.id}', str(info.id))} ({status(info.status)})")
            return self._confirm(request, access, title, question, what)
        if action == "cancel":
            await runrow.cancel_run(self.state.pool, info.id, schema=self.state.schema)
            return RedirectResponse(f"{base}/runs/{info.id}", status_code=303)
        try:
            run = await runrow.retry_run(self.state.pool, info.id, schema=self.state.schema)
        except runrow.InvalidInput as exc:
            raise Refused(409, f"This run cannot be retried: {exc}") from None
        return RedirectResponse(f"{base}/runs/{run.id}", status_code=303)

    async def stop(self, request: Request) -> Response:
        """``GET`` (confirm) and ``POST`` (do) ``/conversation/stop?id=``."""
        access = await self.state.actor(request)
        cid = _conversation_id(request)
        _, whole = await self._conversation(cid, access)
        if not whole:  # it has another tenant's turns: not this caller's to stop
            raise Refused(404, "No such conversation.")
        base = self.state.base(request)
        if request.method != "POST":  # GET (and HEAD) only ever show the confirmation
            what = Html(f"Conversation {link(conversation_url(base, cid), cid)}")
            question = "Stop this conversation? Every queued, waiting and running turn of it ends."
            return self._confirm(request, access, "Stop conversation", question, what)
        await runrow.stop_conversation(self.state.pool, cid, schema=self.state.schema)
        return RedirectResponse(conversation_url(base, cid), status_code=303)

    async def conversation(self, request: Request) -> Response:
        """``GET /conversation?id=``: turns in order, and the transcript."""
        access = await self.state.access(request)
        cid = _conversation_id(request)
        turns, whole = await self._conversation(cid, access)
        base = self.state.base(request)
        parts: list[object] = []
        if self.state.may_act(access) and whole:
            parts.append(
                Html(
                    '<nav aria-label="Actions" class="actions">'
                    + link(
                        conversation_url(base, cid, stop=True),
                        "Stop the conversation…",
                        class_="button danger",
                    )
                    + "</nav>"
                )
            )
        rows = [
            (
                i,
                link(f"{base}/runs/{t.id}", str(t.id)),
                status(t.status),
                t.attempt,
                t.user_id,
                holder(t.status, t.worker_id) or "-",
                ts(t.created_at),
                ts(t.finished_at),
            )
            for i, t in enumerate(turns, 1)
        ]
        parts.append(Html('<section aria-labelledby="turns-h"><h2 id="turns-h">Turns</h2>'))
        parts.append(
            table(
                "Turns in order",
                ("#", "Run", "Status", "Attempt", "User", "Worker", "Created", "Finished"),
                rows,
                empty="No turns.",
            )
        )
        parts.append(
            Html('</section><section aria-labelledby="transcript-h"><h2 id="transcript-h">Transcript</h2>')
        )
        if whole:
            messages = await runrow.transcript(self.state.pool, cid, schema=self.state.schema)
            items = "".join(
                f'<li class="msg msg-{e(m.role)}"><span class="role">{e(m.role)}</span> '
                f'<span class="msg-status">({e(m.status)})</span> <span class="content">{e(_text(m.content))}</span></li>'
                for m in messages
            )
            parts.append(
                Html(f'<ol class="transcript">{items}</ol>' if items else '<p class="empty">No messages.</p>')
            )
        else:
            parts.append(Html('<p class="empty">Hidden: the conversation has other tenants\' turns.</p>'))
        parts.append(Html("</section>"))
        return self.state.page(request, access, f"Conversation {cid}", join(parts))


def _conversation_id(request: Request) -> str:
    """``?id=``, required: 400 when absent or when no conversation id can be it."""
    cid = query_id(request, "id")
    if cid is None:
        raise Refused(400, "id: the conversation's id is required")
    return cid


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    return json.dumps(content, ensure_ascii=False, default=str)
