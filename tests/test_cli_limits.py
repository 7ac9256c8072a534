"""`runrow limits list|set|remove`, run as a user would."""

from __future__ import annotations

import json

import pytest

import runrow

from .test_cli import cli

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_limits_set_list_remove(dsn: str, schema: str) -> None:
    db = ("--database-url", dsn, "--schema", schema)
    assert cli("limits", *db).stdout.strip() == "no rate limits"
    done = cli("limits", "set", "provider:openai", "60", "--per", "60", *db)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "provider:openai: 60 per 60 s"
    [lim] = await runrow.list_rate_limits(dsn, schema=schema)
    assert (lim.key, lim.runs, lim.per_seconds) == ("provider:openai", 60, 60.0)
    listed = cli("limits", "list", *db)
    assert "provider:openai" in listed.stdout and "60 per 60 s" in listed.stdout
    assert [r["key"] for r in json.loads(cli("limits", "--json", *db).stdout)] == ["provider:openai"]
    bad = cli("limits", "set", "provider:openai", "0", "--per", "60", *db)
    assert bad.returncode != 0 and "runs" in bad.stderr
    assert cli("limits", "remove", "provider:openai", *db).returncode == 0
    again = cli("limits", "remove", "provider:openai", *db)
    assert again.returncode != 0 and "no rate limit" in again.stderr
    assert await runrow.list_rate_limits(dsn, schema=schema) == []
