"""The demo's web app: runrow's mountable HTTP API plus what only the demo has.

Every ``/v1`` route and ``/openapi.json`` come from :func:`runrow.http.create_api`
(its module docstring lists them: post a message, follow a run's events in runrow's,
the AI SDK's or AG-UI's format, cancel, retry, answer an input request, stop a
conversation). Around it this app adds the web page at ``/``, ``/metrics``,
in-process workers and a reaper, and the demo tool's notes in the conversation view;
it opens the pool and the NotifyHub the API runs on in its lifespan.

Authentication is a DEMO STAND-IN: ``Authorization: Bearer demo-<name>`` makes you user
``<name>``, no secret involved. (EventSource cannot set headers, so the events route also
accepts ``?access_token=demo-<name>``.) A host replaces :func:`demo_user` with its own
auth by passing ``authenticate=`` to :func:`create_app`. Each user sees only their own
conversations and runs: someone else's run answers 404, exactly like an unknown id;
someone else's conversation answers 403 ``forbidden``.
"""

from __future__ import annotations

import logging
import re
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from importlib import resources
from typing import TYPE_CHECKING, Any

import anyio
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

import runrow
from runrow.admin import AdminAccess, create_admin
from runrow.admin._web import is_local_request
from runrow.http import ApiError, create_api

from . import queue, store
from .agent import DemoAgent
from .research import RESEARCHER

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping

    from psycopg import AsyncConnection
    from starlette.requests import Request

__all__ = ["ApiError", "create_app", "demo_user"]

log = logging.getLogger("runrow.demo")

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def demo_user(request: Request) -> str | None:
    """DEMO ONLY: ``Bearer demo-<name>`` is user ``<name>``. Replace with real auth."""
    header = request.headers.get("authorization", "")
    token = header[7:].strip() if header[:7].lower() == "bearer " else ""
    if not token and request.url.path.endswith("/events"):
        token = request.query_params.get("access_token", "")
    if token.startswith("demo-") and _NAME.fullmatch(token[5:]):
        return token[5:]
    return None


def demo_admin(request: Request) -> AdminAccess | None:
    """DEMO ONLY: the admin at /admin lets in any browser on this machine that names it by
    a loopback name (not a page whose own name re-resolves to 127.0.0.1), to see and act
    on everything. Replace with the host's own check."""
    return AdminAccess(can_act=True) if is_local_request(request) else None


def create_app(
    database_url: str,
    *,
    schema: str = "runrow",
    demo_schema: str | None = None,
    authenticate: Callable[[Request], str | None] = demo_user,
    max_content_bytes: int = 16 * 1024,
    max_queued_per_conversation: int | None = 5,
    keepalive: float = 15.0,
    in_process_workers: int = 0,
    agent: runrow.Agent | None = None,
    dispatcher_options: Mapping[str, Any] | None = None,
    reap_interval: float | None = None,
    reap_grace: float = 30.0,
    worker_slots: int | None = None,
) -> Starlette:
    """The demo's ASGI app. The schema must be migrated (``runrow migrate``) beforehand.

    ``in_process_workers`` dispatchers run inside the app's lifespan (0: run workers
    elsewhere, e.g. ``runrow worker runrow.demo.agent:agent``), with ``agent`` (default
    :class:`~runrow.demo.agent.DemoAgent`) and ``dispatcher_options`` (lease, poll, ...).
    ``max_queued_per_conversation`` sheds load: a message past it answers 429 with a
    ``Retry-After`` header (None: no limit). ``reap_interval``: run a reaper pass (with
    ``reap_grace``) that often in this process, for workers that run elsewhere and may
    all be gone (None: none here). ``worker_slots``: the runs the workers take at once,
    for the wait estimate (default: the in-process dispatchers' concurrency, else 1).
    """
    demo_schema = demo_schema or f"{schema}_demo"
    options = dict(dispatcher_options or {})
    slots = worker_slots or in_process_workers * int(options.get("concurrency", 8)) or 1
    # The API runs on this pool and hub; the lifespan below opens and closes them (a
    # mounted app's own lifespan never runs, so runrow.http leaves that to its host).
    pool: AsyncConnectionPool[AsyncConnection] = AsyncConnectionPool(
        database_url, min_size=1, max_size=20, open=False, kwargs={"autocommit": True}, name="runrow-demo-api"
    )
    hub = runrow.NotifyHub(database_url)
    registry = _metrics_registry()

    async def notes(conversation_id: str) -> dict[str, Any]:
        """The demo tool's notes, shown under the conversation."""
        async with pool.connection() as conn:
            return {"notes": await store.list_notes(conn, demo_schema, conversation_id)}

    api = create_api(
        pool,
        authenticate=authenticate,
        hub=hub,
        schema=schema,
        max_content_bytes=max_content_bytes,
        max_queued_per_conversation=max_queued_per_conversation,
        keepalive=keepalive,
        worker_slots=slots,
        conversation_extras=notes,
        title="runrow demo chat API",
    )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            await pool.open(wait=True)
            stack.push_async_callback(pool.close)
            async with pool.connection() as conn:
                await store.ensure_tables(conn, demo_schema)
            await stack.enter_async_context(hub)
            observers: list[runrow.Observer] = []
            if registry is not None:
                # /metrics: queue depth per tenant (read off the request path) and, for
                # in-process workers, run counters and latencies.
                from runrow.metrics import PrometheusObserver, QueueCollector

                await stack.enter_async_context(
                    QueueCollector(pool, schema=schema, hubs=[hub], registry=registry)
                )
                observers.append(PrometheusObserver(registry=registry))
            worker_agent = agent or DemoAgent(database_url, demo_schema=demo_schema)
            dispatchers = []
            for _ in range(in_process_workers):
                # The research turn's sub-agents, when the agent is the demo's own.
                keyed = {RESEARCHER: worker_agent.researcher} if isinstance(worker_agent, DemoAgent) else None
                d = runrow.Dispatcher(
                    database_url,
                    worker_agent,
                    agents=keyed,
                    schema=schema,
                    hub=hub,
                    observers=observers,
                    **options,
                )
                dispatchers.append(await stack.enter_async_context(d))
            app.state.dispatchers = dispatchers
            if reap_interval is not None:
                tasks = await stack.enter_async_context(anyio.create_task_group())
                stack.callback(tasks.cancel_scope.cancel)  # runs first: callbacks unwind LIFO
                tasks.start_soon(
                    partial(
                        queue.reap_periodically, pool, schema=schema, interval=reap_interval, grace=reap_grace
                    )
                )
            try:
                yield
            finally:
                for d in dispatchers:
                    await d.stop(5.0)

    static = resources.files("runrow.demo") / "static"

    async def index(request: Request) -> Response:
        return FileResponse(str(static / "index.html"), headers={"Cache-Control": "no-store"})

    async def metrics(request: Request) -> Response:
        """Prometheus text exposition of this app's registry."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    routes = [
        Route("/", index, methods=["GET"]),
        *([Route("/metrics", metrics, methods=["GET"])] if registry is not None else []),
        Mount("/static", StaticFiles(directory=str(static)), name="static"),
        Mount("/admin", app=create_admin(pool, authorize=demo_admin, hub=hub, schema=schema)),
        Mount("", app=api),  # /v1/... and /openapi.json
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.api = api
    app.state.pool = pool
    return app


def _metrics_registry() -> Any:
    """A registry of this app's own (so several apps can live in one process), or None
    when prometheus-client is not installed (`pip install runrow[metrics]`)."""
    try:
        from prometheus_client import CollectorRegistry
    except ImportError:
        return None
    return CollectorRegistry()
