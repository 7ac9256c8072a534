"""``runrow web``: the admin served on its own, on a port, by uvicorn.

Two ways in. With a token (``--token`` or ``$RUNROW_WEB_TOKEN``), a request must carry it:
``Authorization: Bearer <token>``, or the HttpOnly cookie that ``/login?token=<token>``
sets (the link the command prints). Without one, the server only binds a loopback
address and only answers loopback clients: whoever can reach it is on this machine.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any

from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route

import runrow

from . import AdminAccess, create_admin

if TYPE_CHECKING:
    import argparse
    from collections.abc import AsyncIterator, Callable

    from starlette.requests import Request

__all__ = ["check_bind", "command", "is_local_request", "is_loopback", "serve", "web_app"]

COOKIE = "runrow_web"


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (an address, or localhost) is this machine's loopback."""
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_local_request(request: Request) -> bool:
    """A request from this machine, to this machine by a loopback name. The ``Host`` check
    stops DNS rebinding: a page whose own name re-resolves to 127.0.0.1 reaches a loopback
    server from the user's browser, but under its own name."""
    if request.client is None or not is_loopback(request.client.host):
        return False
    host = request.headers.get("host", "")
    name = host[1 : host.find("]")] if host.startswith("[") else host.rpartition(":")[0] or host
    return is_loopback(name)


def web_app(database_url: str, *, schema: str, token: str | None, read_only: bool) -> Starlette:
    """The admin at ``/`` of an app that opens its own pool and hub."""
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        database_url, min_size=1, max_size=10, open=False, kwargs={"autocommit": True}, name="runrow-web"
    )
    hub = runrow.NotifyHub(database_url)

    def authorize(request: Request) -> AdminAccess | None:
        if token is None:
            return AdminAccess(can_act=True) if is_local_request(request) else None
        sent = request.cookies.get(COOKIE) or ""
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            sent = auth[7:].strip()
        return AdminAccess(can_act=True) if hmac.compare_digest(sent.encode(), token.encode()) else None

    async def login(request: Request) -> Response:
        sent = request.query_params.get("token", "")
        if token is None or not hmac.compare_digest(sent.encode(), token.encode()):
            return PlainTextResponse("wrong or missing token", status_code=401)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(
            COOKIE, token, httponly=True, samesite="strict", secure=request.url.scheme == "https"
        )
        return response

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            await pool.open(wait=True)
            stack.push_async_callback(pool.close)
            await stack.enter_async_context(hub)
            yield

    admin = create_admin(pool, authorize=authorize, hub=hub, schema=schema, read_only=read_only)
    return Starlette(
        routes=[Route("/login", login, methods=["GET"]), Mount("/", app=admin)], lifespan=lifespan
    )


def serve(database_url: str, *, host: str, port: int, schema: str, token: str | None, read_only: bool) -> int:
    """Serves the admin until interrupted; refuses a non-loopback bind without a token
    (check first with :func:`check_bind`)."""
    try:
        import uvicorn
    except ImportError:
        raise SystemExit("runrow web needs uvicorn: pip install 'runrow[web]'") from None
    check_bind(host, token)
    app = web_app(database_url, schema=schema, token=token, read_only=read_only)
    uvicorn.run(app, host=host, port=port, log_level="warning")
    return 0


def check_bind(host: str, token: str | None) -> None:
    """Exits unless ``host`` is loopback or a token guards the server."""
    if token is None and not is_loopback(host):
        raise SystemExit(
            f"runrow web: binding {host} needs a token (--token or RUNROW_WEB_TOKEN); "
            "without one it serves this machine only (--host 127.0.0.1)"
        )


def command(args: argparse.Namespace, database_url: str, *, say: Callable[[str], Any]) -> int:
    """``runrow web``: checks the options, says where to go (through ``say``), serves."""
    if not 0 < args.port < 65536:
        raise SystemExit("runrow web: --port must be 1-65535")
    token = args.token or os.environ.get("RUNROW_WEB_TOKEN") or None
    check_bind(args.host, token)
    where = f"http://{'localhost' if is_loopback(args.host) else args.host}:{args.port}/"
    say(f"runrow admin: {where}login?token=<your token>" if token else f"runrow admin: {where}")
    return serve(
        database_url,
        host=args.host,
        port=args.port,
        schema=args.schema,
        token=token,
        read_only=args.read_only,
    )
