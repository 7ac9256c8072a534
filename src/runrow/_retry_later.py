"""Back-pressure from a provider: an agent raises :class:`RetryLater` (or
``raise retry_later_from(exc)`` on a 429) and its run goes back to the queue for a while,
holding no worker and spending no retry attempt; with a key, every run under that key
waits out the same window (the key's gate in ``rate_limit``, read by the claim)."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from . import _json
from ._errors import InvalidInput

__all__ = ["MAX_RETRY_LATER_SECONDS", "RetryLater", "retry_later_from"]

MAX_RETRY_LATER_SECONDS = 7 * 86400.0
"""The longest wait a RetryLater takes (a week)."""
_DEFAULT_AFTER = 1.0


class RetryLater(Exception):
    """Raised by an agent: put this run back in the queue, due in ``after`` seconds.

    The run holds no worker meanwhile and spends no retry attempt; it is the same run
    (same id, one more resume), and its recorded steps replay when it is claimed again,
    as after a wait for input. The journal says ``retry_later`` ``{"after", "key"}``.
    With ``key`` (a rate-limit key such as ``"provider:openai"``, or ``tenant:<id>`` /
    ``agent:<key>``), the key's gate shuts for ``after`` seconds: no queued run under that
    key starts until it opens, so one 429 does not become a hundred. A stop asked for
    meanwhile ends the run cancelled. Raises :class:`InvalidInput` for ``after`` outside
    0..604800 s or an empty key.
    """

    def __init__(self, after: float = _DEFAULT_AFTER, key: str | None = None) -> None:
        if isinstance(after, bool) or not isinstance(after, int | float):
            raise InvalidInput("after", "must be a number of seconds")
        seconds = float(after)
        if not math.isfinite(seconds) or not 0 <= seconds <= MAX_RETRY_LATER_SECONDS:
            raise InvalidInput("after", f"must be between 0 and {MAX_RETRY_LATER_SECONDS:.0f} seconds")
        _json.check_id(key, "key", optional=True, max_len=300)
        super().__init__(f"retry in {seconds:g} s" + ("" if key is None else f" (key {key!r})"))
        self.after = seconds
        self.key = key


def _headers_of(obj: Any) -> Any:
    """The headers of a response, or of an exception carrying one (httpx's
    ``HTTPStatusError.response``, openai's ``APIStatusError.response``), or None."""
    for candidate in (obj, getattr(obj, "response", None)):
        headers = getattr(candidate, "headers", None)
        if headers is not None:
            return headers
    return None


def _seconds_of(value: str, now: datetime) -> float | None:
    """Retry-After's value in seconds: delta-seconds or an HTTP-date (RFC 9110 10.2.3)."""
    text = value.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


def retry_later_from(
    response_or_exception: Any,
    *,
    key: str | None = None,
    default: float = _DEFAULT_AFTER,
    now: datetime | None = None,
) -> RetryLater:
    """A :class:`RetryLater` for a 429 (or 503): ``after`` from its ``Retry-After`` header
    (seconds or an HTTP-date; ``retry-after-ms`` too), else ``default``. Takes a response
    or an exception with a ``.response`` (httpx, openai and the like), without importing
    them. Use it as ``raise runrow.retry_later_from(exc, key="provider:openai")``."""
    headers = _headers_of(response_or_exception)
    after: float | None = None
    if headers is not None:
        get = getattr(headers, "get", None)
        if callable(get):
            ms = get("retry-after-ms") or get("Retry-After-Ms")
            if ms is not None:
                try:
                    after = max(0.0, float(ms) / 1000.0)
                except (TypeError, ValueError):
                    after = None
            raw = get("retry-after") or get("Retry-After")
            if after is None and isinstance(raw, str):
                after = _seconds_of(raw, now or datetime.now(UTC))
    return RetryLater(after=min(default if after is None else after, MAX_RETRY_LATER_SECONDS), key=key)
