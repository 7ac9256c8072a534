"""The webhook delivery service (service ``webhooks``, #42): posts the outbox's due
deliveries (``webhook_delivery``, filled by the endings themselves) to their
subscriptions, signed per Standard Webhooks.

Started by every dispatcher whose process has ``runrow[webhooks]`` installed (httpx and
standardwebhooks; :func:`available`): without the extra a worker runs no such service
and pays nothing. With it, a pass first asks whether any subscription exists (one probe
of a small table); with none it sleeps ``poll``. Otherwise it claims up to
:attr:`DeliveryService.batch` due deliveries under ``FOR UPDATE SKIP LOCKED`` with a
lease (``claim_deliveries``: their attempt counted, their next attempt moved to the
lease's end), posts them concurrently, and records each outcome fenced by its attempt
(``record_attempt``). A worker killed mid-delivery leaves its rows due again once the
lease lapses: redelivered, never dropped, with the same ``webhook-id`` (a receiver
deduplicates by it). A failure is retried after an exponential backoff with full jitter;
after :attr:`DeliveryService.max_attempts` attempts the delivery is dead (redeliver
sends it again). A run's later delivery to a subscription waits for its earlier one.
Idle, it polls every :attr:`DeliveryService.idle_wait` seconds (at most ``poll``): the
endings send no NOTIFY of their own for it.
"""

from __future__ import annotations

import importlib.util
import logging
import random
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio

from .. import _json
from .._db import describe, statement_conn
from .._gateway import webhooks as _gw
from .._gateway._exec import run

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

    from .kit import Kit

log = logging.getLogger("runrow.dispatcher")

# Seconds a claim or a record may take (shielded from a stop, so bounded).
_DB_BUDGET = 5.0


def available() -> bool:
    """Whether ``runrow[webhooks]`` is installed here (httpx and standardwebhooks)."""
    return all(importlib.util.find_spec(m) is not None for m in ("httpx", "standardwebhooks"))


def backoff(attempts: int, base: float, cap: float) -> float:
    """Seconds before the next attempt after ``attempts`` failed ones: exponential, capped,
    with full jitter (so a receiver back up is not met by every retry at once)."""
    return random.uniform(0, min(cap, base * 2.0 ** min(attempts - 1, 30)))  # noqa: S311


class DeliveryService:
    """Claims due deliveries, posts them, records each attempt; sleeps when idle."""

    batch = 32
    """Deliveries claimed (and posted concurrently) per pass."""
    timeout = 10.0
    """Seconds an attempt may take (connect, send, answer) before it fails."""
    max_attempts = 10
    """Attempts before a delivery is dead."""
    backoff_base = 2.0
    backoff_cap = 3600.0
    idle_wait = 1.0
    """Seconds between passes that found nothing due while subscriptions exist."""

    def __init__(self, kit: Kit) -> None:
        self._kit = kit
        self._client: Any = None

    @property
    def lease(self) -> float:
        """How long a claim holds its rows: an attempt's timeout with a margin."""
        return self.timeout * 2 + 5

    async def run(self, *, task_status: TaskStatus[None]) -> None:
        """The loop (service ``webhooks``). The HTTP client (its TLS context costs tens
        of milliseconds of CPU) is made at the first delivery, never by an idle worker."""
        task_status.started()
        poll = self._kit.settings.poll
        try:
            while True:
                # (The posts are not shielded: a stop cuts them, and their rows, left
                # claimed, are claimed again once their lease lapses. Only the claim and
                # each record are: a cancelled query is a broken connection.)
                wait = await self.deliver_due(poll)
                if wait:
                    await anyio.sleep(wait)
        finally:
            if self._client is not None:
                with anyio.CancelScope(shield=True), anyio.move_on_after(_DB_BUDGET):
                    await self._client.aclose()

    def _http(self) -> Any:
        if self._client is None:
            import httpx

            self._client = httpx.AsyncClient(timeout=self.timeout, follow_redirects=False)
        return self._client

    async def deliver_due(self, poll: float) -> float:
        """One pass; returns the seconds to wait before the next (0: more may be due)."""
        s, pool = self._kit.settings, self._kit.pool()
        try:
            claimed: list[_gw.Claimed] = []
            with anyio.CancelScope(shield=True), anyio.move_on_after(_DB_BUDGET):
                async with statement_conn(pool) as conn:
                    if not await run(conn, _gw.any_subscription(s.schema)):
                        return poll
                    claimed = await run(conn, _gw.claim(s.schema, limit=self.batch, lease_seconds=self.lease))
            if not claimed:
                return min(self.idle_wait, poll)
            client = self._http()
            async with anyio.create_task_group() as tg:
                for one in claimed:
                    tg.start_soon(self._deliver, client, one)
        except Exception as exc:  # a claim lost with its connection lapses and is claimed again
            log.warning("delivering webhooks failed: %s", describe(exc), extra=self._kit.extra)
            return min(self.idle_wait, poll)
        return 0.0

    async def _deliver(self, client: Any, one: _gw.Claimed) -> None:
        status, error = await self._post(client, one)
        ok = status is not None and 200 <= status < 300
        retry_in = 0.0 if ok else backoff(one.attempts, self.backoff_base, self.backoff_cap)
        state = None
        with anyio.CancelScope(shield=True), anyio.move_on_after(_DB_BUDGET):
            async with statement_conn(self._kit.pool()) as conn:
                state = await run(
                    conn,
                    _gw.record(
                        self._kit.settings.schema,
                        delivery_id=one.id,
                        attempts=one.attempts,
                        ok=ok,
                        status=status,
                        error=error,
                        max_attempts=self.max_attempts,
                        retry_in=retry_in,
                    ),
                )
        if state == "dead":
            log.warning(
                "webhook delivery %s to %s is dead after %d attempts: %s",
                *(one.id, one.webhook, one.attempts, error or status),
                extra=self._kit.extra,
            )

    async def _post(self, client: Any, one: _gw.Claimed) -> tuple[int | None, str | None]:
        from standardwebhooks.webhooks import Webhook

        body = _json.dumps(one.payload, "payload")
        now = datetime.now(UTC)
        msg_id = str(one.id)
        headers = {
            "content-type": "application/json",
            "webhook-id": msg_id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": Webhook(one.secret).sign(msg_id, now, body),
            "user-agent": "runrow-webhooks",
        }
        try:
            answer = await client.post(one.url, content=body.encode(), headers=headers)
        except Exception as exc:  # (httpx.HTTPError, an invalid URL, ...: a failed attempt)
            return None, f"{type(exc).__name__}: {exc}"[:1000]
        if 200 <= answer.status_code < 300:
            return answer.status_code, None
        return answer.status_code, answer.text[:500] or None
