"""The demo's HTTP API and web page: Starlette, served by uvicorn, SSE by sse-starlette.

Routes (all JSON; errors are ``{"error": {"code", "message"}}`` with a 4xx status):

* ``POST /v1/conversations/{conversation_id}/messages`` ``{"content": "..."}`` -> 202
  ``{"run_id", "status", ...}``; an ``Idempotency-Key`` header makes a repeat return the
  first run (409 ``idempotency_conflict`` if the key was used for another message).
* ``GET /v1/runs/{run_id}``; ``GET /v1/runs/{run_id}/position`` (place in line, wait
  estimate); ``GET /v1/conversations/{conversation_id}`` (transcript, turns with their
  tool calls, the tool's notes; a conversation nobody has posted to is empty).
* ``GET /v1/runs/{run_id}/events``: Server-Sent Events, ``id`` = seq, ``event`` = type,
  ``data`` = JSON; resumes after ``?from=N`` or the ``Last-Event-ID`` header; keepalive
  comments; ends after the terminal ``complete`` event. A cursor at or past the end of a
  finished run answers 204, which tells an EventSource to stop reconnecting.
* ``POST /v1/runs/{run_id}/cancel``; ``POST /v1/conversations/{conversation_id}/stop``
  (returns the drafts for the composer).
* ``GET /openapi.json``, and the web page at ``/``.

Authentication is a DEMO STAND-IN: ``Authorization: Bearer demo-<name>`` makes you user
``<name>``, no secret involved. (EventSource cannot set headers, so the events route also
accepts ``?access_token=demo-<name>``.) A host replaces :func:`demo_user` with its own
auth by passing ``authenticate=`` to :func:`create_app`. Each user sees only their own
conversations and runs. Someone else's run answers 404, exactly like an unknown id (a
run id is a secret). Someone else's conversation answers 403 ``forbidden``: its id is a
name anyone may pick, and a post to it must be refused anyway, so saying so at once
gives nothing away and lets the page tell the user before they type.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import asdict
from datetime import datetime
from functools import partial
from importlib import resources
from typing import TYPE_CHECKING, Any

import anyio
from psycopg_pool import AsyncConnectionPool
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

import runrow

from . import queue, store
from .agent import DemoAgent
from .openapi import openapi_document

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping

    from psycopg import AsyncConnection
    from starlette.requests import Request

__all__ = ["ApiError", "create_app", "demo_user"]

log = logging.getLogger("runrow.demo")

MAX_SEQ = 2**31 - 1  # run_event.seq is an integer column
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_CONVERSATION = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_CURSOR = re.compile(r"[0-9]{1,10}")


class ApiError(Exception):
    """An error answered as JSON with a 4xx status."""

    def __init__(
        self, status: int, code: str, message: str, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})


def _not_found(what: str = "run") -> ApiError:
    return ApiError(404, "not_found", f"no such {what}")


def _not_yours(cid: str) -> ApiError:
    return ApiError(403, "forbidden", f"conversation {cid} belongs to another user")


def demo_user(request: Request) -> str | None:
    """DEMO ONLY: ``Bearer demo-<name>`` is user ``<name>``. Replace with real auth."""
    header = request.headers.get("authorization", "")
    token = header[7:].strip() if header[:7].lower() == "bearer " else ""
    if not token and request.url.path.endswith("/events"):
        token = request.query_params.get("access_token", "")
    if token.startswith("demo-") and _NAME.fullmatch(token[5:]):
        return token[5:]
    return None


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def _run_json(info: runrow.RunInfo) -> dict[str, Any]:
    keep = (
        *("id", "conversation_id", "status", "cancel_requested", "error", "retry_of", "user_message_id"),
        *("created_at", "started_at", "finished_at", "worker_id"),
    )
    data = asdict(info)
    out = {k: _jsonable(data[k]) for k in keep}
    out["events_url"] = f"/v1/runs/{info.id}/events"
    return out


def _stop_json(result: runrow.StopResult) -> dict[str, Any]:
    return {
        "noop": result.noop,
        "cancelled": [str(r) for r in result.cancelled],
        "cancel_requested": [str(r) for r in result.cancel_requested],
        "drafts": [
            {"run_id": str(d.run_id), "message_id": str(d.message_id), "content": d.content}
            for d in result.drafts
        ],
    }


def _cursor(raw: str, source: str) -> int:
    if not _CURSOR.fullmatch(raw) or int(raw) > MAX_SEQ:
        raise ApiError(400, "bad_cursor", f"{source} must be a whole number from 0 to {MAX_SEQ}")
    return int(raw)


class _Api:
    def __init__(
        self,
        database_url: str,
        *,
        schema: str,
        demo_schema: str,
        authenticate: Callable[[Request], str | None],
        max_content_bytes: int,
        max_queued_per_conversation: int | None,
        keepalive: float,
        in_process_workers: int,
        agent: runrow.Agent | None,
        dispatcher_options: Mapping[str, Any],
        reap_interval: float | None,
        reap_grace: float,
        worker_slots: int | None,
    ) -> None:
        self.url = database_url
        self.schema = schema
        self.demo_schema = demo_schema
        self.authenticate = authenticate
        self.max_content_bytes = max_content_bytes
        self.max_queued_per_conversation = max_queued_per_conversation
        self.max_body_bytes = 4 * max_content_bytes + 1024
        self.keepalive = keepalive
        self.in_process_workers = in_process_workers
        self.agent = agent
        self.dispatcher_options = dict(dispatcher_options)
        self.reap_interval = reap_interval
        self.reap_grace = reap_grace
        default_slots = in_process_workers * int(self.dispatcher_options.get("concurrency", 8))
        self.worker_slots = worker_slots or default_slots or 1
        self.registry = _metrics_registry()
        self._pool: AsyncConnectionPool[AsyncConnection] | None = None
        self._hub: runrow.NotifyHub | None = None

    @property
    def pool(self) -> AsyncConnectionPool[AsyncConnection]:
        assert self._pool is not None, "the app's lifespan has not started"
        return self._pool

    @asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            pool: AsyncConnectionPool[AsyncConnection] = AsyncConnectionPool(
                self.url,
                min_size=1,
                max_size=20,
                open=False,
                kwargs={"autocommit": True},
                name="runrow-demo-api",
            )
            await pool.open(wait=True)
            stack.push_async_callback(pool.close)
            async with pool.connection() as conn:
                await store.ensure_tables(conn, self.demo_schema)
            self._pool = pool
            self._hub = await stack.enter_async_context(runrow.NotifyHub(self.url))
            observers: list[runrow.Observer] = []
            if self.registry is not None:
                # /metrics: queue depth per tenant (read off the request path) and, for
                # in-process workers, run counters and latencies.
                from runrow.metrics import PrometheusObserver, QueueCollector

                await stack.enter_async_context(
                    QueueCollector(pool, schema=self.schema, hubs=[self._hub], registry=self.registry)
                )
                observers.append(PrometheusObserver(registry=self.registry))
            agent = self.agent or DemoAgent(self.url, demo_schema=self.demo_schema)
            dispatchers = []
            for _ in range(self.in_process_workers):
                d = runrow.Dispatcher(
                    self.url,
                    agent,
                    schema=self.schema,
                    hub=self._hub,
                    observers=observers,
                    **self.dispatcher_options,
                )
                dispatchers.append(await stack.enter_async_context(d))
            app.state.dispatchers = dispatchers
            if self.reap_interval is not None:
                tasks = await stack.enter_async_context(anyio.create_task_group())
                stack.callback(tasks.cancel_scope.cancel)  # runs first: callbacks unwind LIFO
                tasks.start_soon(
                    partial(
                        queue.reap_periodically,
                        pool,
                        schema=self.schema,
                        interval=self.reap_interval,
                        grace=self.reap_grace,
                    )
                )
            try:
                yield
            finally:
                for d in dispatchers:
                    await d.stop(5.0)
                self._pool = None

    async def metrics(self, request: Request) -> Response:
        """Prometheus text exposition of this app's registry."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)

    # -- helpers ------------------------------------------------------------------------

    def user(self, request: Request) -> str:
        user = self.authenticate(request)
        if user is None:
            raise ApiError(
                401,
                "unauthorized",
                "send 'Authorization: Bearer demo-<name>' (demo-only authentication)",
                {"WWW-Authenticate": 'Bearer realm="runrow-demo"'},
            )
        return user

    @staticmethod
    def conversation_id(request: Request) -> str:
        cid: str = request.path_params["conversation_id"]
        if not _CONVERSATION.fullmatch(cid):
            raise ApiError(400, "bad_conversation_id", "conversation ids are 1-128 of A-Z a-z 0-9 _ . : -")
        return cid

    async def own_run(self, request: Request, user: str) -> runrow.RunInfo:
        try:
            info = await runrow.get_run(self.pool, request.path_params["run_id"], schema=self.schema)
        except runrow.RunNotFound:
            raise _not_found() from None
        if info.user_id != user:
            raise _not_found()  # someone else's run looks exactly like no run
        return info

    async def own_conversation(self, cid: str, user: str) -> str | None:
        """The owner: ``user``, or None if nobody has posted yet; 403 if someone else."""
        async with self.pool.connection() as conn:
            owner = await store.conversation_owner(conn, self.demo_schema, cid)
        if owner not in (None, user):
            raise _not_yours(cid)
        return owner

    async def json_body(self, request: Request) -> dict[str, Any]:
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body_bytes):
            raise ApiError(413, "too_large", f"the body must be at most {self.max_body_bytes} bytes")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > self.max_body_bytes:
                raise ApiError(413, "too_large", f"the body must be at most {self.max_body_bytes} bytes")
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise ApiError(400, "bad_json", "the body must be a JSON object") from None
        except RecursionError:  # deep nesting, within the size limit
            raise ApiError(400, "bad_json", "the body is nested too deeply") from None
        if not isinstance(data, dict):
            raise ApiError(400, "bad_json", "the body must be a JSON object")
        return data

    # -- routes -------------------------------------------------------------------------

    async def post_message(self, request: Request) -> Response:
        user = self.user(request)
        cid = self.conversation_id(request)
        data = await self.json_body(request)
        content = data.get("content")
        if not isinstance(content, str) or not content.strip():
            raise ApiError(422, "invalid_input", "content must be a non-empty string")
        key = request.headers.get("idempotency-key")
        if key is not None and not 1 <= len(key) <= 200:
            raise ApiError(400, "bad_idempotency_key", "Idempotency-Key must be 1-200 characters")
        # Ownership and the turn commit together: the enqueue joins this transaction.
        async with self.pool.connection() as conn, conn.transaction():
            owner = await store.claim_conversation(conn, self.demo_schema, cid, user)
            if owner != user:
                raise _not_yours(cid)
            try:
                run = await runrow.enqueue(
                    conn,
                    conversation_id=cid,
                    user_id=user,
                    content=content,
                    idempotency_key=key,
                    schema=self.schema,
                    max_content_bytes=self.max_content_bytes,
                    # Load shedding: a conversation may have this many turns waiting.
                    max_queued_per_conversation=self.max_queued_per_conversation,
                )
            except runrow.Overloaded as exc:
                raise ApiError(
                    429,
                    "overloaded",
                    str(exc),
                    {"Retry-After": str(exc.retry_after)},
                ) from None
        return JSONResponse(
            {
                "run_id": str(run.id),
                "status": run.status,
                "conversation_id": run.conversation_id,
                "created": run.created,
                "events_url": f"/v1/runs/{run.id}/events",
            },
            status_code=202,
            headers={"Location": f"/v1/runs/{run.id}"},
        )

    async def get_run(self, request: Request) -> Response:
        info = await self.own_run(request, self.user(request))
        return JSONResponse(_run_json(info))

    async def get_position(self, request: Request) -> Response:
        """Where a queued run stands: "you're #3", with an estimated wait."""
        info = await self.own_run(request, self.user(request))
        pos = await runrow.queue_position(self.pool, info.id, schema=self.schema)
        durations = await queue.recent_durations(self.pool, schema=self.schema)
        wait = queue.estimate_wait(durations, pos.position, self.worker_slots)
        return JSONResponse(
            {
                "run_id": str(info.id),
                "status": pos.status,
                "position": pos.position,
                "exact": pos.exact,
                "estimated_wait_seconds": None if wait is None else round(wait, 3),
                "finished_samples": len(durations),
            }
        )

    async def get_conversation(self, request: Request) -> Response:
        user = self.user(request)
        cid = self.conversation_id(request)
        owner = await self.own_conversation(cid, user)
        if owner is None:  # nobody has posted yet: empty, not missing
            return JSONResponse(
                {"conversation_id": cid, "owner": None, "turns": [], "messages": [], "notes": []}
            )
        messages = await runrow.transcript(self.pool, cid, schema=self.schema)
        runs = await runrow.list_runs(self.pool, conversation_id=cid, limit=500, schema=self.schema)
        async with self.pool.connection() as conn:
            notes = await store.list_notes(conn, self.demo_schema, cid)
        by_id = {m.id: m for m in messages}
        answers = {m.run_id: m for m in messages if m.role == "assistant" and m.run_id is not None}
        turns = []
        for r in reversed(runs):  # oldest first
            asked = by_id.get(r.user_message_id)
            answer = answers.get(r.id)
            turns.append(
                {
                    "run": _run_json(r),
                    "user_message": None if asked is None else asked.content,
                    "answer": None
                    if answer is None
                    else {"content": answer.content, "status": answer.status},
                    # A live turn's calls arrive on its stream; a finished one's are read here.
                    "tool_calls": await queue.tool_calls(self.pool, r.id, schema=self.schema)
                    if r.terminal
                    else None,
                }
            )
        return JSONResponse(
            {
                "conversation_id": cid,
                "owner": owner,
                "turns": turns,
                "messages": [_jsonable(asdict(m)) for m in messages],
                "notes": notes,
            }
        )

    async def events(self, request: Request) -> Response:
        user = self.user(request)
        # Last-Event-ID is what an EventSource sends when it reconnects to the same URL,
        # so it is newer than the URL's ?from= and wins.
        if (raw := request.headers.get("last-event-id")) is not None:
            start = _cursor(raw.strip(), "Last-Event-ID")
        elif (raw := request.query_params.get("from")) is not None:
            start = _cursor(raw, "from")
        else:
            start = 0
        info = await self.own_run(request, user)
        events = runrow.tail(
            self.pool, info.id, from_seq=start, hub=self._hub, keepalive=self.keepalive, schema=self.schema
        )
        first: runrow.Event | None = None
        if info.terminal:
            # A finished run's tail answers at once: with nothing after the cursor, say
            # 204, the one answer that stops an EventSource from reconnecting for good.
            try:
                first = await anext(events)
            except (StopAsyncIteration, runrow.InvalidInput, runrow.RunNotFound):
                await queue.close(events)
                return Response(status_code=204, headers={"Cache-Control": "no-store"})
        return EventSourceResponse(self._stream(events, first), ping=0, headers={"Cache-Control": "no-store"})

    async def _stream(
        self, events: AsyncIterator[runrow.Event], first: runrow.Event | None
    ) -> AsyncIterator[ServerSentEvent]:
        async def all_events() -> AsyncIterator[runrow.Event]:
            if first is not None:
                yield first
            async for ev in events:
                yield ev

        try:
            async for ev in all_events():
                if ev.keepalive:
                    yield ServerSentEvent(comment="keepalive")
                    continue
                yield ServerSentEvent(
                    data=json.dumps(ev.to_dict(), ensure_ascii=False, default=str),
                    event=ev.type,
                    id=str(ev.seq),
                )
        except runrow.RunNotFound:  # trimmed or deleted meanwhile
            return
        except runrow.InvalidInput as exc:
            # A cursor past the end of a live run's journal (not from this run's stream).
            # Ending the stream makes the client reconnect; once the run ends, that is a 204.
            log.info("event stream refused: %s", exc)
        finally:
            await queue.close(events)

    async def cancel(self, request: Request) -> Response:
        info = await self.own_run(request, self.user(request))
        result = await runrow.cancel_run(self.pool, info.id, schema=self.schema)
        return JSONResponse(_stop_json(result))

    async def stop(self, request: Request) -> Response:
        user = self.user(request)
        cid = self.conversation_id(request)
        await self.own_conversation(cid, user)
        result = await runrow.stop_conversation(self.pool, cid, schema=self.schema)
        return JSONResponse(_stop_json(result))

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(openapi_document())


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return JSONResponse(
        {"error": {"code": exc.code, "message": exc.message}}, status_code=exc.status, headers=exc.headers
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return JSONResponse(
        {"error": {"code": code, "message": str(exc.detail)}},
        status_code=exc.status_code,
        headers=exc.headers,
    )


async def _idempotency_conflict(request: Request, exc: Exception) -> Response:
    # The key names another turn: a client bug or a reused key, never worth retrying as is.
    assert isinstance(exc, runrow.IdempotencyConflict)
    return JSONResponse(
        {
            "error": {
                "code": "idempotency_conflict",
                "message": str(exc),
                "run_id": str(exc.run_id),
                "fields": list(exc.fields),
            }
        },
        409,
    )


async def _invalid_input(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, runrow.InvalidInput)
    # Too large is too_large, whichever limit caught it (the body's, above, or runrow's).
    status, code = (413, "too_large") if "larger than the limit" in str(exc) else (422, "invalid_input")
    return JSONResponse({"error": {"code": code, "field": exc.field, "message": str(exc)}}, status)


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
    api = _Api(
        database_url,
        schema=schema,
        demo_schema=demo_schema or f"{schema}_demo",
        authenticate=authenticate,
        max_content_bytes=max_content_bytes,
        max_queued_per_conversation=max_queued_per_conversation,
        keepalive=keepalive,
        in_process_workers=in_process_workers,
        agent=agent,
        dispatcher_options=dispatcher_options or {},
        reap_interval=reap_interval,
        reap_grace=reap_grace,
        worker_slots=worker_slots,
    )
    static = resources.files("runrow.demo") / "static"

    async def index(request: Request) -> Response:
        return FileResponse(str(static / "index.html"), headers={"Cache-Control": "no-store"})

    routes = [
        Route("/", index, methods=["GET"]),
        *([Route("/metrics", api.metrics, methods=["GET"])] if api.registry is not None else []),
        Route("/openapi.json", api.openapi, methods=["GET"]),
        Route("/v1/conversations/{conversation_id}/messages", api.post_message, methods=["POST"]),
        Route("/v1/conversations/{conversation_id}/stop", api.stop, methods=["POST"]),
        Route("/v1/conversations/{conversation_id}", api.get_conversation, methods=["GET"]),
        Route("/v1/runs/{run_id}/events", api.events, methods=["GET"]),
        Route("/v1/runs/{run_id}/cancel", api.cancel, methods=["POST"]),
        Route("/v1/runs/{run_id}/position", api.get_position, methods=["GET"]),
        Route("/v1/runs/{run_id}", api.get_run, methods=["GET"]),
        Mount("/static", StaticFiles(directory=str(static)), name="static"),
    ]
    app = Starlette(
        routes=routes,
        lifespan=api.lifespan,
        exception_handlers={
            ApiError: _api_error,
            HTTPException: _http_error,
            runrow.InvalidInput: _invalid_input,
            runrow.IdempotencyConflict: _idempotency_conflict,
        },
    )
    app.state.api = api
    return app


def _metrics_registry() -> Any:
    """A registry of this app's own (so several apps can live in one process), or None
    when prometheus-client is not installed (`pip install runrow[metrics]`)."""
    try:
        from prometheus_client import CollectorRegistry
    except ImportError:
        return None
    return CollectorRegistry()
