"""The runs list: filters, counts per status, keyset pages newest first."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, get_args

from .._gateway import admin as gw
from .._gateway._exec import run
from .._status import RunStatus
from ._app import AdminState, Refused, query_id
from ._html import Html, conversation_url, e, link, query, status, table, ts

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

__all__ = ["ListPage", "parse_cursor", "parse_time"]

STATUSES: tuple[str, ...] = get_args(RunStatus)
_TEXT_FILTERS = (
    ("tenant", "Tenant"),
    ("conversation", "Conversation"),
    ("user", "User"),
    ("worker", "Worker"),
)


def parse_time(raw: str | None, name: str) -> datetime | None:
    """A ``datetime-local`` value (or ISO 8601) as UTC; naive means UTC."""
    if not raw:
        return None
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise Refused(400, f"{name} must be a date and time like 2026-01-31T13:45") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def parse_cursor(raw: str | None) -> tuple[datetime, uuid.UUID] | None:
    """The keyset cursor ``<created_at ISO>~<run id>`` (None: the first page)."""
    if not raw:
        return None
    # (A "+" of the offset that came through unquoted reads as a space.)
    created, _, rid = raw.replace(" ", "+").rpartition("~")
    try:
        when = datetime.fromisoformat(created)
        return (when if when.tzinfo else when.replace(tzinfo=UTC), uuid.UUID(rid))
    except ValueError:
        raise Refused(400, "bad page cursor") from None


class ListPage:
    """``GET /``: the runs list."""

    def __init__(self, state: AdminState) -> None:
        self.state = state

    async def get(self, request: Request) -> Response:
        access = await self.state.access(request)
        st = request.query_params.get("status", "").strip() or None
        if st is not None and st not in STATUSES:
            raise Refused(400, f"status must be one of: {', '.join(STATUSES)}")
        tenant = access.tenant_id if access.tenant_id is not None else query_id(request, "tenant", strip=True)
        f = gw.RunFilter(
            status=st,
            tenant_id=tenant,
            conversation_id=query_id(request, "conversation", strip=True),
            user_id=query_id(request, "user", strip=True),
            worker_id=query_id(request, "worker", strip=True),
            created_from=parse_time(request.query_params.get("from"), "from"),
            created_to=parse_time(request.query_params.get("to"), "to"),
        )
        before = parse_cursor(request.query_params.get("before"))
        size = self.state.page_size
        async with self.state.pool.connection() as conn:
            runs = await run(conn, gw.list_runs(self.state.schema, f, before=before, limit=size + 1))
            counts = await run(conn, gw.status_counts(self.state.schema, tenant_id=access.tenant_id))
        more, runs = len(runs) > size, runs[:size]
        base = self.state.base(request)
        params = {k: request.query_params.get(k, "") for k in ("status", "tenant", "conversation", "user")}
        params.update({k: request.query_params.get(k, "") for k in ("worker", "from", "to")})
        if access.tenant_id is not None:
            params["tenant"] = ""
        body = [self._counts(base, counts, params), self._form(request, access.tenant_id is not None)]
        rows = [
            (
                ts(r.created_at),
                link(f"{base}/runs/{r.id}", str(r.id), class_="run-link"),
                status(r.status),
                r.tenant_id or "-",
                link(conversation_url(base, r.conversation_id), r.conversation_id),
                r.user_id,
                r.worker_id or "-",
                r.attempt,
            )
            for r in runs
        ]
        body.append(
            table(
                "Runs, newest first",
                ("Created", "Run", "Status", "Tenant", "Conversation", "User", "Worker", "Attempt"),
                rows,
                empty="No runs match these filters.",
            )
        )
        nav = []
        if before is not None:
            nav.append(link(query(f"{base}/", params), "Newest runs"))
        if more:
            last = runs[-1]
            cursor = f"{last.created_at.isoformat()}~{last.id}"
            nav.append(link(query(f"{base}/", {**params, "before": cursor}), "Older runs", rel="next"))
        if nav:
            body.append(Html('<nav aria-label="Pages" class="pages">' + " ".join(nav) + "</nav>"))
        return self.state.page(request, access, "Runs", Html("".join(body)))

    @staticmethod
    def _counts(base: str, counts: dict[str, int], params: dict[str, str]) -> Html:
        items = []
        for s in STATUSES:
            href = query(f"{base}/", {**params, "status": s})
            label = f"{s}: {counts.get(s, 0)}"
            items.append(f'<li data-status="{e(s)}">{link(href, label)}</li>')
        return Html(
            '<section aria-labelledby="counts-h"><h2 id="counts-h">Runs per status</h2>'
            '<p class="hint">Queued, running and waiting: all of them; the others: finished '
            'in the last hour.</p><ul class="counts">' + "".join(items) + "</ul></section>"
        )

    @staticmethod
    def _form(request: Request, scoped: bool) -> Html:
        q = request.query_params
        options = "".join(
            f'<option value="{e(s)}"{" selected" if q.get("status") == s else ""}>{e(s)}</option>'
            for s in STATUSES
        )
        fields = [
            '<div class="field"><label for="f-status">Status</label>'
            f'<select id="f-status" name="status"><option value="">any</option>{options}</select></div>'
        ]
        for name, label in _TEXT_FILTERS:
            if name == "tenant" and scoped:
                continue
            fields.append(
                f'<div class="field"><label for="f-{name}">{e(label)}</label>'
                f'<input id="f-{name}" name="{name}" type="text" maxlength="256" value="{e(q.get(name, ""))}">'
                "</div>"
            )
        for name, label in (("from", "Created from (UTC)"), ("to", "Created before (UTC)")):
            fields.append(
                f'<div class="field"><label for="f-{name}">{e(label)}</label>'
                f'<input id="f-{name}" name="{name}" type="datetime-local" step="1" '
                f'value="{e(q.get(name, ""))}"></div>'
            )
        return Html(
            '<form class="filters" method="get" role="search" aria-label="Filter runs">'
            + "".join(fields)
            + '<div class="field buttons"><button type="submit">Filter</button></div></form>'
        )
