"""How a host wires the bundled chat example into its own process.

    DATABASE_URL=postgresql://... python examples/chat/run.py

One process serves the API and the page and runs one dispatcher. Two things a host
would change are shown here: authentication (the demo's ``Bearer demo-<name>`` is
replaced by a header a trusted proxy sets) and the agent (the fake model, or your own
``async def agent(run)``). `runrow demo` does the same with an embedded database.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import anyio
import uvicorn

import runrow
from runrow.demo import DemoAgent, create_app, demo_user

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request


def proxy_user(request: Request) -> str | None:
    """Stand-in for real auth: trust an ``X-User`` header set by your proxy, else the demo token.

    Whatever it returns is the user id runrow stores on each run; returning None answers 401.
    """
    user = request.headers.get("x-user")
    return user if user and user.isidentifier() else demo_user(request)


async def my_agent(run: runrow.RunContext) -> None:
    """The smallest agent: stream a reply, then save it to the transcript."""
    reply = f"echo: {run.content}"
    for word in reply.split(" "):
        await run.text(word + " ")
        await anyio.sleep(0.05)
    await run.write_message(reply)


def build_app(database_url: str, *, echo: bool = False) -> Starlette:
    agent = my_agent if echo else DemoAgent(database_url)
    return create_app(database_url, authenticate=proxy_user, in_process_workers=1, agent=agent)


async def main() -> None:
    url = os.environ["DATABASE_URL"]
    await runrow.migrate(url)  # creates or upgrades runrow's tables (idempotent)
    app = build_app(url, echo=os.environ.get("CHAT_AGENT") == "echo")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8000"))))
    print(f"serving on http://127.0.0.1:{server.config.port}/")
    await server.serve()


if __name__ == "__main__":
    anyio.run(main, backend="asyncio")
