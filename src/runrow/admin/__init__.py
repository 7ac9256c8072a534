"""An operator's dashboard for runrow: see, follow and act on runs without SQL.

:func:`create_admin` returns a Starlette app that a host mounts next to its own routes
(``app.mount("/admin", create_admin(pool, authorize=...))``). It is server-rendered
HTML with a little CSS and JavaScript shipped inside the package (no build step, no
external fetch), on the host's pool and hub (open them in the host's lifespan: a
mounted app's own lifespan never runs). Install it with ``pip install "runrow[web]"``.

Pages:

* ``/``: runs, newest first, filtered by status, tenant, conversation, user, worker
  and creation time; keyset pages on (created_at, id); counts per status.
* ``/runs/{id}``: the timeline (queued, claimed, heartbeat, ending, the reaper's hand),
  the journal tailing live over SSE (``/runs/{id}/events``, runrow's stream format),
  the error, uncertain tool calls, retry lineage, steps and waiting input.
* ``/conversation?id=``: turns in order and the transcript.
* ``/schedules``: every schedule, its next tick and what its fires did; pause and resume.
* ``/webhooks``: the webhook subscriptions and the latest deliveries; redeliver.
* ``/health``: queued and running per tenant, oldest wait, caps and weights, workers,
  throughput and reaped runs as an SVG chart.
* Actions (CSRF-protected, absent when read-only): cancel and retry a run, stop a
  conversation (each confirmed first), and answer a waiting run's input from its page
  (``/runs/{id}/input``: Approve and Deny send ``{"approved": true | false}``, or a value).

Access: ``authorize(request)`` (sync or async) returns an :class:`AdminAccess`, or
None (401). ``AdminAccess(tenant_id=...)`` confines everything to one tenant.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from starlette.applications import Starlette
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .._names import check_schema
from ._actions import Actions
from ._answer import Answers
from ._app import EXCEPTION_HANDLERS, AdminAccess, AdminState
from ._health import HealthPage
from ._list import ListPage
from ._run import RunPage
from ._schedules import SchedulesPage
from ._webhooks import WebhooksPage
from ._workers import WorkersPage

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from psycopg_pool import AsyncConnectionPool
    from starlette.requests import Request

    import runrow

__all__ = ["AdminAccess", "Authorize", "create_admin"]

Authorize: TypeAlias = "Callable[[Request], AdminAccess | Awaitable[AdminAccess | None] | None]"
"""The host's check: what the request may see and do, or None (the admin answers 401)."""

STATIC = Path(__file__).resolve().parent / "static"


def create_admin(
    pool: AsyncConnectionPool[Any],
    *,
    authorize: Authorize,
    hub: runrow.NotifyHub | None = None,
    schema: str = "runrow",
    read_only: bool = False,
    secret: bytes | None = None,
    page_size: int = 50,
    keepalive: float = 15.0,
) -> Starlette:
    """The admin as a Starlette app, to mount (``app.mount("/admin", create_admin(...))``).

    ``pool`` and ``hub`` are the host's (entered in its lifespan; without a hub the live
    journal polls). ``read_only``: no action is rendered and every action route answers
    403, whatever ``authorize`` grants. ``secret`` signs the CSRF tokens; pass the same
    one to every process behind a load balancer (default: random per process, so a
    token from another process is refused and the user reloads the page).
    """
    check_schema(schema)
    if not 1 <= page_size <= 500 or keepalive <= 0:
        raise ValueError("page_size must be 1-500 and keepalive positive")
    state = AdminState(
        pool,
        authorize=authorize,
        hub=hub,
        schema=schema,
        read_only=read_only,
        secret=secret if secret is not None else secrets.token_bytes(32),
        page_size=page_size,
        keepalive=keepalive,
    )
    runs, actions, schedules = RunPage(state), Actions(state), SchedulesPage(state)
    hooks = WebhooksPage(state)
    app = Starlette(
        routes=[
            Route("/", ListPage(state).get, methods=["GET"]),
            Route("/health", HealthPage(state).get, methods=["GET"]),
            Route("/workers", WorkersPage(state).get, methods=["GET"]),
            Route("/schedules", schedules.get, methods=["GET"]),
            Route("/schedules/{action}", schedules.act, methods=["GET", "POST"]),
            Route("/webhooks", hooks.get, methods=["GET"]),
            Route("/webhooks/{action}", hooks.act, methods=["GET", "POST"]),
            Route("/runs/{run_id}", runs.page, methods=["GET"]),
            Route("/runs/{run_id}/events", runs.events, methods=["GET"]),
            Route("/runs/{run_id}/input", Answers(state).answer, methods=["GET", "POST"]),
            Route("/runs/{run_id}/{action}", actions.run_action, methods=["GET", "POST"]),
            Route("/conversation", actions.conversation, methods=["GET"]),
            Route("/conversation/stop", actions.stop, methods=["GET", "POST"]),
            Mount("/static", StaticFiles(directory=str(STATIC)), name="static"),
        ],
        exception_handlers=EXCEPTION_HANDLERS,
    )
    app.state.runrow_admin = state
    return app
