"""A FastAPI app that mounts runrow's HTTP API next to its own routes and lifespan.

    pip install "runrow[http]" fastapi uvicorn
    DATABASE_URL=postgresql://... uvicorn app:app          # from this folder

The host keeps what is the host's: its routes (``/healthz``, ``/me``), its
authentication (``current_user``), its pool and its lifespan, which opens the pool and
the process's NotifyHub and runs a Dispatcher in the same process. runrow's API is
mounted at ``/chat``: ``POST /chat/v1/conversations/{id}/messages``, the run's events at
``/chat/v1/runs/{id}/events`` (``?format=ai-sdk`` or ``ag-ui`` for those frontends),
``POST /chat/v1/ai-sdk/chat`` for ``useChat``, and the OpenAPI document at
``/chat/openapi.json``.
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio
from fastapi import Depends, FastAPI, HTTPException, Request
from psycopg_pool import AsyncConnectionPool

import runrow
from runrow.http import create_api

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


def current_user(request: Request) -> str | None:
    """Your authentication goes here. This stand-in trusts ``Authorization: Bearer user-<name>``
    (no secret: replace it). Returning None makes runrow's routes answer 401."""
    header = request.headers.get("authorization", "")
    token = header.removeprefix("Bearer ").strip()
    name = token.removeprefix("user-")
    return name if token.startswith("user-") and name.isalnum() else None


async def agent(run: runrow.RunContext) -> None:
    """Your agent goes here: this one streams an echo of the message, word by word."""
    reply = f"You said: {run.content}"
    for word in reply.split(" "):
        await run.text(word + " ")
        await anyio.sleep(0.02)
    await run.write_message(reply)


def build_app(database_url: str, *, schema: str = "runrow") -> FastAPI:
    """The host app; ``app`` below is this on ``$DATABASE_URL``."""
    pool: AsyncConnectionPool = AsyncConnectionPool(database_url, open=False, kwargs={"autocommit": True})
    hub = runrow.NotifyHub(database_url)  # one LISTEN connection per process

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await runrow.migrate(database_url, schema=schema)  # idempotent; or run `runrow migrate` at deploy
        async with pool, hub, runrow.Dispatcher(database_url, agent, schema=schema, hub=hub):
            yield

    app = FastAPI(title="my product", lifespan=lifespan)

    @app.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/me")
    async def me(user: str | None = Depends(current_user)) -> dict[str, str]:
        if user is None:
            raise HTTPException(401, "who are you?")
        return {"user": user}

    app.mount("/chat", create_api(pool, authenticate=current_user, hub=hub, schema=schema))
    return app


if os.environ.get("DATABASE_URL"):
    app = build_app(os.environ["DATABASE_URL"])
