"""Cross-site request refusal: a request that would change something, sent by a page of
another site, is refused before any route runs.

With cookie sign-in, a browser attaches the user's cookie to a request whatever page
made it, so a form on another site could post to the user's conversation or stop it.
Browsers say where a request comes from: ``Sec-Fetch-Site`` (every current browser),
else ``Origin`` (older ones, on every POST). The check is the one Go's
``net/http.CrossOriginProtection`` makes: a safe method passes; an origin the host
allowed passes; ``Sec-Fetch-Site`` other than ``same-origin`` or ``none`` is refused;
without it, an ``Origin`` whose host is not the request's ``Host`` is refused; a request
with neither header is not a browser's (or is same-origin) and passes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse

if TYPE_CHECKING:
    from collections.abc import Iterable

    from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["SAFE_METHODS", "CrossSiteGuard", "checked_origins", "cross_site"]

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
"""Methods that change nothing (the API's reads): never refused."""


def checked_origins(origins: Iterable[str]) -> frozenset[str]:
    """``origins`` as a browser's ``Origin`` header spells them (``scheme://host[:port]``,
    lower case); ValueError for anything else (a path, a wildcard, a bare host)."""
    if isinstance(origins, str):
        raise ValueError("allowed_origins must be a collection of origins, not one string")
    out = set()
    for origin in origins:
        if not isinstance(origin, str) or not _is_origin(origin):
            raise ValueError(f"allowed_origins: {origin!r} is not an origin (scheme://host[:port])")
        out.add(origin.lower())
    return frozenset(out)


def _is_origin(text: str) -> bool:
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 (raises ValueError for a port that is not one)
    except ValueError:
        return False
    return (
        parts.scheme in ("http", "https")
        and bool(parts.hostname)
        and parts.username is None
        and f"{parts.scheme}://{parts.netloc}".lower() == text.lower()
    )


def cross_site(method: str, headers: Headers, allowed: frozenset[str]) -> str | None:
    """Why a request is refused as cross-site, or None to serve it."""
    if method in SAFE_METHODS:
        return None
    origin = headers.get("origin")
    if origin is not None and origin.lower() in allowed:
        return None
    site = headers.get("sec-fetch-site")
    if site is not None:
        return None if site in ("same-origin", "none") else f"Sec-Fetch-Site is {site}"
    if origin is None:
        return None  # not a browser, or a same-origin request of an old one
    if urlsplit(origin).netloc.lower() == headers.get("host", "").lower() != "":
        return None
    return f"Origin {origin!r} is not this site"


class CrossSiteGuard:
    """ASGI middleware: answers 403 ``cross_site`` for a request :func:`cross_site` refuses."""

    def __init__(self, app: ASGIApp, *, allowed_origins: frozenset[str]) -> None:
        self.app = app
        self.allowed_origins = allowed_origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            why = cross_site(scope["method"], Headers(scope=scope), self.allowed_origins)
            if why is not None:
                message = f"a request from another site may not change anything ({why})"
                response = JSONResponse({"error": {"code": "cross_site", "message": message}}, 403)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
