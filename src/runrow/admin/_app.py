"""The admin's shared state: the host's pool, hub and ``authorize``, the access check,
tenant scoping, the CSRF token, and HTML error pages.

CSRF: a signed double-submit cookie. Each page sets a cookie holding a random nonce
and its HMAC under a secret (per process unless the host passes one); every action's
form carries the same token in a hidden field, and a POST is refused (403) unless the
field equals the cookie and the signature holds. A cross-site form cannot read the
cookie, so it cannot send the field; the signature keeps a sibling subdomain that can
plant a cookie from choosing a token; the cookie is SameSite=Strict and HttpOnly too.
This needs no server-side session and nothing from the host's auth beyond ``authorize``.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from starlette.exceptions import HTTPException
from starlette.responses import HTMLResponse, PlainTextResponse, Response

from .. import _json
from .._errors import InvalidInput
from ..http._errors import ApiError
from ._html import Html, e, layout

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine

    from psycopg_pool import AsyncConnectionPool
    from starlette.requests import Request

    import runrow

__all__ = ["CSRF_COOKIE", "MAX_FORM_BYTES", "AdminAccess", "AdminState", "Refused", "form_fields", "query_id"]

CSRF_COOKIE = "runrow_admin_csrf"
CSRF_FIELD = "csrf"
# The admin's action forms carry one short field: more than this is not one of them.
# (The input form carries a value a person typed: it reads more, see _answer.py.)
MAX_FORM_BYTES = 4096


@dataclass(frozen=True, slots=True)
class AdminAccess:
    """What ``authorize(request)`` grants: ``can_act`` allows cancel, retry, stop and answering
    a waiting input (unless the admin is read-only); ``tenant_id`` confines every page to
    that tenant's runs (None: all tenants). Another tenant's run answers 404 and is absent
    from lists and counts."""

    can_act: bool = False
    tenant_id: str | None = None

    def __post_init__(self) -> None:
        if self.tenant_id is not None and (not isinstance(self.tenant_id, str) or not self.tenant_id):
            raise ValueError("AdminAccess.tenant_id must be a non-empty string, or None for every tenant")


class Refused(Exception):
    """An HTML error page with a 4xx status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def query_id(request: Request, name: str, *, strip: bool = False) -> str | None:
    """The query parameter ``name`` naming a host id (conversation, user, tenant, worker):
    None when absent or empty, 400 when no id can be it (a NUL, which the database cannot
    store, or more than an id's length). Never passed on to a statement unchecked: the
    database's refusal would be a 500."""
    raw = request.query_params.get(name, "")
    if strip:
        raw = raw.strip()
    if not raw:
        return None
    try:
        _json.check_id(raw, name)
    except InvalidInput as exc:
        raise Refused(400, str(exc)) from None
    return raw


class AdminState:
    """The host's pool, hub and ``authorize``, and the admin's settings."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        *,
        authorize: Callable[[Request], AdminAccess | Awaitable[AdminAccess | None] | None],
        hub: runrow.NotifyHub | None,
        schema: str,
        read_only: bool,
        secret: bytes,
        page_size: int,
        keepalive: float,
    ) -> None:
        self.pool = pool
        self.authorize = authorize
        self.hub = hub
        self.schema = schema
        self.read_only = read_only
        self.secret = secret
        self.page_size = page_size
        self.keepalive = keepalive

    async def access(self, request: Request) -> AdminAccess:
        """The caller's access, or 401."""
        granted = self.authorize(request)
        if inspect.isawaitable(granted):
            granted = await granted
        if granted is None:
            raise Refused(401, "Sign in to see the runrow admin.")
        if not isinstance(granted, AdminAccess):
            raise TypeError(f"authorize() must return an AdminAccess or None, got {granted!r}")
        return granted

    def may_act(self, access: AdminAccess) -> bool:
        """Whether actions are shown to (and accepted from) this caller."""
        return access.can_act and not self.read_only

    async def actor(self, request: Request, *, max_form_bytes: int = MAX_FORM_BYTES) -> AdminAccess:
        """The caller's access for an action: 403 in read-only mode or without ``can_act``,
        and 403 without a valid CSRF token (checked for POSTs, whose form may be at most
        ``max_form_bytes``: 413 past it)."""
        access = await self.access(request)
        if not self.may_act(access):
            raise Refused(403, "Actions are not available here (read-only).")
        if request.method not in ("GET", "HEAD"):  # GET and HEAD only ever confirm
            _same_origin(request)
            sent = (await form_fields(request, max_form_bytes)).get(CSRF_FIELD)
            cookie = request.cookies.get(CSRF_COOKIE)
            if not isinstance(sent, str) or cookie is None or not hmac.compare_digest(sent, cookie):
                raise Refused(
                    403, "The form's security token is missing or stale: reload the page and retry."
                )
            if not self.valid_token(sent):
                raise Refused(403, "The form's security token is not one this admin issued.")
        return access

    # -- CSRF -------------------------------------------------------------------------

    def _sign(self, nonce: str) -> str:
        return hmac.new(self.secret, nonce.encode(), hashlib.sha256).hexdigest()

    def valid_token(self, token: str) -> bool:
        """Whether ``token`` is a nonce signed with this admin's secret."""
        nonce, _, sig = token.partition(".")
        return bool(nonce) and hmac.compare_digest(sig, self._sign(nonce))

    def token(self, request: Request) -> str:
        """The caller's CSRF token: the cookie's if valid, else a new one (set by :meth:`page`)."""
        have = request.cookies.get(CSRF_COOKIE)
        if have is not None and self.valid_token(have):
            return have
        cached = request.scope.setdefault("runrow_admin_csrf", None)
        if cached is None:
            nonce = secrets.token_hex(16)
            cached = request.scope["runrow_admin_csrf"] = f"{nonce}.{self._sign(nonce)}"
        return str(cached)

    def csrf_field(self, request: Request) -> Html:
        """The hidden form field carrying the token."""
        return Html(f'<input type="hidden" name="{CSRF_FIELD}" value="{e(self.token(request))}">')

    # -- pages --------------------------------------------------------------------------

    @staticmethod
    def base(request: Request) -> str:
        """Where the admin is mounted."""
        return str(request.scope.get("root_path", "")).rstrip("/")

    def page(
        self, request: Request, access: AdminAccess, title: str, body: Html, *, status_code: int = 200
    ) -> Response:
        """A full page; sets the CSRF cookie when the caller has none (or a bad one)."""
        html = layout(
            self.base(request), title, body, tenant=access.tenant_id, read_only=not self.may_act(access)
        )
        response = HTMLResponse(html, status_code=status_code, headers=_HEADERS)
        token = self.token(request)
        if request.cookies.get(CSRF_COOKIE) != token:
            response.set_cookie(
                CSRF_COOKIE,
                token,
                path=self.base(request) or "/",
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
            )
        return response


def _same_origin(request: Request) -> None:
    """403 for a request a browser marks as sent by another site (``Sec-Fetch-Site``) or
    whose ``Origin`` is not this host: a second check besides the token, for a token an
    attacker obtained some other way."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        raise Refused(403, "Actions are only accepted from this admin's own pages.")
    origin = request.headers.get("origin")
    if origin is not None and origin != "null" and urlsplit(origin).netloc != request.headers.get("host"):
        raise Refused(403, "Actions are only accepted from this admin's own pages.")


_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "Referrer-Policy": "same-origin",
}


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Refused)
    base = str(request.scope.get("root_path", "")).rstrip("/")
    body = f'<p role="alert">{e(exc.message)}</p><p><a href="{e(base)}/">Back to the runs</a></p>'
    html = layout(base, f"Error {exc.status}", Html(body), tenant=None, read_only=True)
    return HTMLResponse(html, status_code=exc.status, headers=_HEADERS)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return await _refused(request, Refused(exc.status_code, str(exc.detail)))


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return PlainTextResponse(exc.message, status_code=exc.status)


EXCEPTION_HANDLERS: dict[Any, Callable[[Request, Exception], Coroutine[Any, Any, Response]]] = {
    Refused: _refused,
    HTTPException: _http_error,
    ApiError: _api_error,
}


async def form_fields(request: Request, max_bytes: int = MAX_FORM_BYTES) -> dict[str, str]:
    """A URL-encoded form body's fields (the first value of each), parsed here and read
    once per request: Starlette's ``request.form()`` needs python-multipart even for
    these, a dependency the admin has no other use for. Another content type has no
    fields; a body past ``max_bytes`` is refused (413), one that is not UTF-8 too (400)."""
    cached = request.scope.get("runrow_admin_form")
    if cached is not None:
        return dict(cached)
    fields: dict[str, str] = {}
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "application/x-www-form-urlencoded":
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_bytes:
                raise Refused(413, f"The form is too large: this admin reads at most {max_bytes} bytes.")
        try:
            text = body.decode()
            parsed = parse_qs(text, max_num_fields=16, encoding="utf-8", errors="strict")
        except (UnicodeDecodeError, ValueError):
            raise Refused(400, "The form is not URL-encoded UTF-8 text.") from None
        fields = {name: values[0] for name, values in parsed.items()}
    request.scope["runrow_admin_form"] = fields
    return dict(fields)
