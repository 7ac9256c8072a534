"""asyncio shortcuts for the dispatcher's per-run path.

runrow runs on anyio's asyncio backend only (psycopg's async API is asyncio-only).
anyio looks its backend up for every primitive it creates and every clock read (a
context-variable and current-task probe, about a microsecond or two each, a dozen
times per run); on the hot path these go to asyncio directly, with the same meaning.
Cancel scopes stay anyio's: cancellation still flows through them.
"""

from __future__ import annotations

import asyncio

__all__ = ["Event", "now"]

# An asyncio.Event is what anyio's Event wraps on this backend; waiting on it inside an
# anyio cancel scope is cancelled like any other await. (Unlike anyio's, waiting on an
# event already set does not yield: no caller here relies on that checkpoint.)
Event = asyncio.Event


def now() -> float:
    """``anyio.current_time()`` on the asyncio backend: the running loop's clock, which
    is also the clock of cancel-scope deadlines."""
    return asyncio.get_running_loop().time()
