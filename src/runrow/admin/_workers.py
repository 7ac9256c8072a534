"""The workers page: the live worker registry (one row per running Dispatcher), by
version, so a deploy can be watched: new workers appear, old ones drain and leave."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from .._gateway import workers as gw
from .._gateway._exec import run
from ._app import Refused
from ._html import Html, e, join, table, ts

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from ._app import AdminState

__all__ = ["WorkersPage"]


class WorkersPage:
    """``GET /workers``: every registered worker (admins of every tenant only: workers
    serve all tenants)."""

    def __init__(self, state: AdminState) -> None:
        self.state = state

    async def get(self, request: Request) -> Response:
        access = await self.state.access(request)
        if access.tenant_id is not None:
            raise Refused(403, "The workers serve every tenant: only an admin of all tenants sees them.")
        async with self.state.pool.connection() as conn:
            workers = await run(conn, gw.list_workers(self.state.schema))
        now = datetime.now(UTC)
        versions = Counter(w.version or "-" for w in workers)
        summary = "".join(
            f"<dt>Version {e(v)}</dt><dd>{n} worker(s)</dd>" for v, n in sorted(versions.items())
        )
        parts: list[object] = [
            Html(f'<dl class="summary" id="versions">{summary}</dl>'),
            table(
                "Live workers, by version (a dead one stays until its lease and grace lapse)",
                ("Worker", "Version", "Agent", "Host", "PID", "Runs in flight", "Started", "Last heartbeat"),
                [
                    (
                        w.id,
                        w.version or "-",
                        w.agent,
                        w.host,
                        w.pid,
                        f"{w.in_flight} / {w.concurrency}"
                        + (" (lease lapsed)" if w.expires_at < now else ""),
                        ts(w.started_at),
                        ts(w.heartbeat_at),
                    )
                    for w in workers
                ],
                empty="No worker is registered.",
            ),
        ]
        return self.state.page(request, access, "Workers", join(parts))
