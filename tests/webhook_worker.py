"""A worker process for the webhook tests: one dispatcher (a no-op agent) whose delivery
service gives an attempt RUNROW_TEST_HOOK_TIMEOUT seconds; prints "ready".

    python -m tests.webhook_worker
"""

from __future__ import annotations

import os
import sys

import anyio

import runrow
from runrow._engine.webhooks import DeliveryService


async def _agent(run: runrow.RunContext) -> None:
    return None


async def main() -> None:
    DeliveryService.timeout = float(os.environ.get("RUNROW_TEST_HOOK_TIMEOUT", "30"))
    DeliveryService.idle_wait = 0.1
    dsn, schema = os.environ["RUNROW_TEST_DSN"], os.environ["RUNROW_TEST_SCHEMA"]
    async with runrow.Dispatcher(dsn, _agent, schema=schema, poll=0.5):
        print("ready", flush=True)
        await anyio.sleep_forever()


if __name__ == "__main__":
    anyio.run(main)
    sys.exit(0)
