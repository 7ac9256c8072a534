"""Shared pieces of the admin's tests: an admin app on a pool, an HTTP client through
ASGI, the CSRF token out of a page, and the runs a page lists."""

from __future__ import annotations

import re
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import httpx
from psycopg_pool import AsyncConnectionPool
from starlette.requests import Request

from runrow.admin import AdminAccess, create_admin

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

RUN_LINK = re.compile(r'class="run-link"[^>]*>([0-9a-f-]{36})<')
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def header_access(request: Request) -> AdminAccess | None:
    """The tests' authorize: ``x-admin: act|view[:tenant]``; no header, no access."""
    raw = request.headers.get("x-admin")
    if not raw:
        return None
    mode, _, tenant = raw.partition(":")
    return AdminAccess(can_act=mode == "act", tenant_id=tenant or None)


@asynccontextmanager
async def admin_client(
    dsn: str, schema: str, *, who: str | None = "act", **options: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """A client for an admin app mounted at /admin (the host's pool, opened here)."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    async with AsyncConnectionPool(
        dsn, min_size=1, max_size=4, open=False, kwargs={"autocommit": True}
    ) as pool:
        await pool.open(wait=True)
        admin = create_admin(pool, authorize=header_access, schema=schema, **options)
        host = Starlette(routes=[Mount("/admin", app=admin)])
        headers = {"x-admin": who} if who else {}
        transport = httpx.ASGITransport(app=host)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://admin.test", headers=headers
        ) as client:
            yield client


def listed(html: str) -> list[str]:
    """The run ids a list page shows, in order."""
    return RUN_LINK.findall(html)


def csrf_of(html: str) -> str:
    """The CSRF token in a page's form."""
    m = CSRF.search(html)
    assert m, "no CSRF field in the page"
    return m.group(1)
