"""Reading runs, transcripts and queue statistics; the CLI's read commands."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import anyio
import psycopg
import pytest

import runrow

from . import manual

pytestmark = pytest.mark.anyio


async def test_get_list_and_stats(dsn: str, schema: str, conn: psycopg.AsyncConnection) -> None:
    a = await runrow.enqueue(
        dsn, schema=schema, conversation_id="a", user_id="u", content="1", tenant_id="t1"
    )
    b = await runrow.enqueue(dsn, schema=schema, conversation_id="b", user_id="u", content="2")
    c = await runrow.enqueue(dsn, schema=schema, conversation_id="a", user_id="u", content="3")
    (claimed,) = await manual.claim(conn, schema, limit=1)
    assert claimed["id"] == a.id

    info = await runrow.get_run(dsn, a.id, schema=schema)
    assert (info.status, info.tenant_id, info.worker_id, info.terminal) == ("running", "t1", "manual", False)
    with pytest.raises(runrow.RunNotFound):
        await runrow.get_run(dsn, uuid.uuid4(), schema=schema)

    assert [r.id for r in await runrow.list_runs(dsn, schema=schema)] == [c.id, b.id, a.id]
    assert [r.id for r in await runrow.list_runs(dsn, conversation_id="a", schema=schema)] == [c.id, a.id]
    assert [r.id for r in await runrow.list_runs(dsn, status="running", schema=schema)] == [a.id]
    with pytest.raises(runrow.InvalidInput):
        await runrow.list_runs(dsn, status="sleeping", schema=schema)

    stats = await runrow.queue_stats(dsn, schema=schema)
    assert (stats.queued, stats.running) == (2, 1)
    assert stats.oldest_queued_seconds is not None and stats.oldest_queued_seconds >= 0
    assert await manual.finalize(conn, schema, a.id, claimed["claim_token"], "completed", 3)
    stats = await runrow.queue_stats(dsn, schema=schema)
    assert stats.by_status == {"queued": 2, "completed": 1}


async def _cli(dsn: str, schema: str, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    out = await anyio.to_thread.run_sync(
        lambda: subprocess.run(
            [sys.executable, "-m", "runrow.cli", *args, "--database-url", dsn, "--schema", schema],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    )
    assert out.returncode == code, out.stderr
    return out


async def test_runs_list_has_a_header_row_over_its_columns_and_json_has_none(dsn: str, schema: str) -> None:
    for conversation in ("c", "a-much-longer-conversation-id"):
        await runrow.enqueue(dsn, schema=schema, conversation_id=conversation, user_id="u", content="hi")
    header, *lines = (await _cli(dsn, schema, "runs", "list")).stdout.splitlines()
    assert len(lines) == 2
    for name, column in (("STATUS", "queued"), ("CONVERSATION", None), ("CREATED", None)):
        at = header.index(name)
        for line in lines:  # each column starts under its name
            assert line[at - 2 : at] == "  " and line[at] != " ", (header, line)
            if column:
                assert line[at:].startswith(column)
    assert {line[header.index("CONVERSATION") :].split()[0] for line in lines} == {
        "c",
        "a-much-longer-conversation-id",
    }
    listed = json.loads((await _cli(dsn, schema, "runs", "list", "--json")).stdout)
    assert len(listed) == 2  # one JSON document, no header
    empty = await _cli(dsn, schema, "runs", "list", "--status", "failed")
    assert empty.stdout == "(no runs)\n"


@pytest.mark.slow  # (the CLI, in processes of its own)
async def test_cli_reads_and_stops(dsn: str, schema: str) -> None:
    async def cli(*args: str) -> str:
        return (await _cli(dsn, schema, *args)).stdout

    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="hi")
    assert json.loads(await cli("stats", "--json"))["by_status"] == {"queued": 1}
    listed = json.loads(await cli("runs", "list", "--json"))
    assert [r["id"] for r in listed] == [str(run.id)]
    assert json.loads(await cli("runs", "show", str(run.id), "--json"))["status"] == "queued"
    stopped = json.loads(await cli("stop", "c", "--json"))
    assert stopped["cancelled"] == [str(run.id)] and stopped["drafts"][0]["content"] == "hi"
    assert "nothing to do" in await cli("runs", "cancel", str(run.id))
    assert "created run" in await cli("runs", "retry", str(run.id))
    # The retry is the turn's second attempt, in the first run's lineage.
    header, retry_line, first_line = (await cli("runs", "list")).splitlines()
    assert header.split() == ["RUN", "ID", "STATUS", "CONVERSATION", "CREATED"]
    assert "attempt 2" in retry_line and "attempt" not in first_line
    (retry,) = [r for r in json.loads(await cli("runs", "list", "--json")) if r["id"] != str(run.id)]
    assert (retry["attempt"], retry["lineage_id"]) == (2, str(run.id))
    assert "trimmed 0 finished runs; dropped 0 journal partitions" in await cli("trim")
    parts = json.loads(await cli("journal", "partitions", "--json"))
    assert parts[0]["name"] == "run_event_legacy" and parts[0]["starts"] is None
    assert len(parts) >= 5 and all(p["starts"] < p["ends"] for p in parts[1:])
    assert "UTC" in (await cli("journal", "partitions")).splitlines()[1]
    assert "made 0 journal partition(s)" in await cli("journal", "ensure")  # made ahead already
    tail = [json.loads(line) for line in (await cli("runs", "tail", str(run.id), "--json")).splitlines()]
    assert [e["seq"] for e in tail] == [1, 2, 3] and tail[-1]["type"] == "complete"
    # The cancelled run ended before now: with no retention and --erase-requests, the
    # per-run pass takes it (its partition stays: the queued retry was made in it).
    erased = await cli("trim", "--retention-hours", "0", "--erase-requests")
    assert "trimmed 1 finished runs; dropped 0 journal partitions" in erased


async def test_cli_errors_are_one_clear_line(dsn: str) -> None:
    out = await _cli(dsn, "nope_x", "stats", code=2)
    assert "runrow migrate" in out.stderr


async def test_every_entry_point_names_the_fix_for_a_missing_schema(dsn: str) -> None:
    missing = f"gone_{uuid.uuid4().hex[:6]}"
    calls = [
        runrow.get_run(dsn, uuid.uuid4(), schema=missing),
        runrow.list_runs(dsn, schema=missing),
        runrow.transcript(dsn, "c", schema=missing),
        runrow.queue_stats(dsn, schema=missing),
        runrow.stop_conversation(dsn, "c", schema=missing),
        runrow.cancel_run(dsn, uuid.uuid4(), schema=missing),
        runrow.retry_run(dsn, uuid.uuid4(), schema=missing),
        runrow.trim(dsn, schema=missing),
    ]
    for call in calls:
        with pytest.raises(runrow.SchemaOutOfDate, match="runrow migrate"):
            await call
    with pytest.raises(runrow.SchemaOutOfDate, match="runrow migrate"):
        async for _ in runrow.tail(dsn, uuid.uuid4(), schema=missing):
            pass
