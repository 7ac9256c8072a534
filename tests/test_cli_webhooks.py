"""`runrow webhooks list|add|remove|test|redeliver|deliveries`, run as a user would."""

from __future__ import annotations

import json

import pytest

import runrow

from .test_cli import cli

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_webhooks_add_list_test_deliveries_redeliver_remove(dsn: str, schema: str) -> None:
    db = ("--database-url", dsn, "--schema", schema)
    refused = cli("webhooks", "add", "h", "http://127.0.0.1:9/x", *db)
    assert refused.returncode != 0 and "url" in refused.stderr
    added = cli("webhooks", "add", "h", "http://127.0.0.1:9/x", "--allow-private", "--endings", "failed", *db)
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith("added h: failed -> http://127.0.0.1:9/x")
    [w] = await runrow.list_webhooks(dsn, schema=schema)
    assert w.endings == ["failed"] and w.secret in added.stdout
    assert [r["name"] for r in json.loads(cli("webhooks", "--json", *db).stdout)] == ["h"]
    tested = cli("webhooks", "test", "h", *db)
    assert tested.returncode == 0 and tested.stdout.startswith("queued test delivery ")
    [d] = json.loads(cli("webhooks", "deliveries", "--json", *db).stdout)
    assert d["event_type"] == "webhook.test" and d["state"] == "pending"
    assert cli("webhooks", "redeliver", d["id"], *db).stdout.strip() == f"redelivering {d['id']}"
    assert cli("webhooks", "test", "nope", *db).returncode != 0
    assert cli("webhooks", "remove", "h", *db).stdout.strip() == "removed h"
    assert await runrow.list_webhooks(dsn, schema=schema) == []
