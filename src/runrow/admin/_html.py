"""HTML for the admin's pages: plain strings, every value escaped by :func:`e` (or
built by a helper that escapes), one layout around each page."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from html import escape
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = ["Html", "conversation_url", "e", "layout", "link", "table", "ts"]


class Html(str):
    """Markup already escaped: :func:`e` passes it through unchanged."""

    __slots__ = ()


def e(value: object) -> Html:
    """``value`` as HTML text (escaped), or itself if it is :class:`Html` already."""
    if isinstance(value, Html):
        return value
    return Html(escape("" if value is None else str(value), quote=True))


def join(parts: Iterable[object]) -> Html:
    """Escaped parts, joined."""
    return Html("".join(e(p) for p in parts))


def ts(value: datetime | None) -> Html:
    """A timestamp in UTC, to the millisecond, in a <time> element."""
    if value is None:
        return Html('<span class="none">-</span>')
    utc = value.astimezone(UTC)
    return Html(
        f'<time datetime="{e(utc.isoformat())}">{e(utc.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3])}Z</time>'
    )


def link(href: str, text: object, **attrs: str) -> Html:
    """An <a>; ``href`` and ``text`` escaped."""
    extra = "".join(f' {k.rstrip("_").replace("_", "-")}="{e(v)}"' for k, v in attrs.items())
    return Html(f'<a href="{e(href)}"{extra}>{e(text)}</a>')


def query(base: str, params: Mapping[str, object]) -> str:
    """``base`` with the non-empty ``params`` as its query string."""
    kept = {k: str(v) for k, v in params.items() if v not in (None, "")}
    return f"{base}?{urlencode(kept)}" if kept else base


def status(value: str) -> Html:
    """A run status as a badge (the text says it; the colour only repeats it)."""
    return Html(f'<span class="status status-{e(value)}">{e(value)}</span>')


def pre_json(value: Any) -> Html:
    """A JSON value, pretty-printed in a <pre>."""
    return Html(f"<pre>{e(json.dumps(value, indent=2, ensure_ascii=False, default=str))}</pre>")


def table(caption: str, headers: Iterable[str], rows: Iterable[Iterable[object]], *, empty: str) -> Html:
    """A data table with a caption and column headers; ``empty`` when there are no rows."""
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows)
    if not body:
        return Html(f'<p class="empty">{e(empty)}</p>')
    head = "".join(f'<th scope="col">{e(h)}</th>' for h in headers)
    return Html(
        f"<table><caption>{e(caption)}</caption><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    )


def layout(base: str, title: str, body: Html, *, tenant: str | None, read_only: bool) -> str:
    """The page around ``body``: a skip link, the navigation, the main landmark."""
    scope = f"tenant {tenant}" if tenant is not None else "all tenants"
    mode = "read-only" if read_only else "actions enabled"
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{e(title)} · runrow admin</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="{e(base)}/static/admin.css">
<script src="{e(base)}/static/admin.js" defer></script>
</head>
<body>
<a class="skip" href="#main">Skip to content</a>
<header>
<nav aria-label="Admin">
<span class="brand">runrow admin</span>
<ul>
<li>{link(f"{base}/", "Runs")}</li>
<li>{link(f"{base}/health", "Queue health")}</li>
<li>{link(f"{base}/workers", "Workers")}</li>
<li>{link(f"{base}/schedules", "Schedules")}</li>
<li>{link(f"{base}/webhooks", "Webhooks")}</li>
</ul>
<span class="scope">{e(scope)} · {e(mode)}</span>
</nav>
</header>
<main id="main" tabindex="-1">
<h1>{e(title)}</h1>
{body}
</main>
</body>
</html>
"""


def conversation_url(base: str, conversation_id: str, *, stop: bool = False) -> str:
    """A conversation's page (or its stop), the id in the query string: a conversation id
    is any text its host chose, and in a path its ``/``, ``%2D`` or ``?`` would name
    another page or another conversation."""
    return f"{base}/conversation{'/stop' if stop else ''}?{urlencode({'id': conversation_id})}"
