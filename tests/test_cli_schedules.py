"""`runrow schedules list|add|pause|resume|remove|next`, run as a user would."""

from __future__ import annotations

import itertools
import json
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

import runrow

from .test_cli import cli

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
BERLIN = ZoneInfo("Europe/Berlin")


async def test_schedules_add_list_next_pause_resume_remove(dsn: str, schema: str) -> None:
    db = ("--database-url", dsn, "--schema", schema)
    added = cli(
        "schedules",
        "add",
        "digest",
        "c1",
        "write the digest",
        "--cron",
        "30 2 * * *",
        "--timezone",
        "Europe/Berlin",
        "--overlap",
        "queue",
        *db,
    )
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith("added digest: cron 30 2 * * * Europe/Berlin")
    [s] = await runrow.list_schedules(dsn, schema=schema)
    assert (s.content, s.user_id, s.overlap, s.timezone) == (
        "write the digest",
        "scheduler",
        "queue",
        "Europe/Berlin",
    )

    listed = cli("schedules", "list", *db)
    assert listed.returncode == 0 and "digest" in listed.stdout and "active" in listed.stdout
    as_json = json.loads(cli("schedules", "--json", *db).stdout)
    assert [row["name"] for row in as_json] == ["digest"]

    nxt = cli("schedules", "next", "digest", "-n", "3", *db)
    assert nxt.returncode == 0
    ticks = [datetime.fromisoformat(line) for line in nxt.stdout.split()]
    # Local 02:30 in Berlin each day (03:00 on a spring-forward day: cronsim's reading).
    assert len(ticks) == 3 and all(t < u for t, u in itertools.pairwise(ticks))
    assert all(t.astimezone(BERLIN).strftime("%H:%M") in ("02:30", "03:00") for t in ticks)
    assert ticks == await runrow.next_fires(dsn, "digest", 3, schema=schema)

    assert cli("schedules", "pause", "digest", *db).stdout.strip() == "digest: paused"
    assert (await runrow.list_schedules(dsn, schema=schema))[0].paused
    assert cli("schedules", "resume", "digest", *db).stdout.startswith("digest: active, next ")
    assert cli("schedules", "remove", "digest", *db).returncode == 0
    assert await runrow.list_schedules(dsn, schema=schema) == []
    assert cli("schedules", *db).stdout.strip() == "(no schedules)"


async def test_schedules_refusals_exit_2_naming_the_problem(dsn: str, schema: str) -> None:
    db = ("--database-url", dsn, "--schema", schema)
    bad = cli("schedules", "add", "x", "c", "t", "--cron", "61 * * * *", *db)
    assert bad.returncode == 2 and "cron: invalid cron expression" in bad.stderr
    zone = cli("schedules", "add", "x", "c", "t", "--every", "60", "--timezone", "Mars/Olympus", *db)
    assert zone.returncode == 2 and "timezone: unknown time zone" in zone.stderr
    for verb in ("pause", "resume", "remove", "next"):
        missing = cli("schedules", verb, "nope", *db)
        assert missing.returncode == 2 and "no schedule named 'nope'" in missing.stderr, verb
    neither = cli("schedules", "add", "x", "c", "t", *db)
    assert neither.returncode == 2  # argparse: one of --cron --every is required
    assert await runrow.list_schedules(dsn, schema=schema) == []
