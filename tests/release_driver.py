"""Drives whichever runrow is importable: this checkout's, or an earlier release's built
from git history (tests/test_rolling_upgrade.py puts that one first on PYTHONPATH).

It uses only the public API every release has had (``enqueue``, ``Dispatcher``, ``tail``,
``transcript``, ``RunContext.text`` / ``emit`` / ``write_message``), so one script speaks
for both sides of a rolling upgrade. Standalone on purpose: it imports nothing from the
tests package, whose helpers follow the current API.

    python tests/release_driver.py worker DSN SCHEMA WORKER_ID [GATE]
        runs a Dispatcher until SIGTERM; prints "ready", then a drain line. A turn of a
        conversation named "held-..." streams its first word, then waits for the file
        GATE to exist before it goes on (a run held across a migration)
    python tests/release_driver.py enqueue DSN SCHEMA CONVERSATION [CONVERSATION ...]
        one turn per conversation; prints the run ids as a JSON list
    python tests/release_driver.py tail DSN SCHEMA RUN_ID
        prints the run's events, one JSON object a line, until its terminal event
    python tests/release_driver.py transcript DSN SCHEMA CONVERSATION
        prints the transcript as a JSON list of [role, content, status]
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import anyio

import runrow


def _agent(worker_id: str, gate: Path | None) -> Any:
    async def agent(run: runrow.RunContext) -> None:
        for word in ("one ", "two ", "three"):
            await run.text(word)
            if word == "one " and gate is not None and run.conversation_id.startswith("held-"):
                await run.flush()
                while not gate.exists():
                    await anyio.sleep(0.05)
        await run.emit({"type": "tool_call_started", "tool_call_id": "t1", "name": "noop"})
        await run.emit({"type": "tool_call_finished", "tool_call_id": "t1", "name": "noop"})
        await run.write_message(f"answered by {worker_id}")

    return agent


async def _worker(dsn: str, schema: str, worker_id: str, gate: Path | None) -> None:
    async with runrow.Dispatcher(
        dsn,
        _agent(worker_id, gate),
        schema=schema,
        worker_id=worker_id,
        concurrency=4,
        lease=6.0,
        heartbeat=1.0,
        grace=6.0,
        poll=0.5,
        reap_interval=0.5,
    ) as dispatcher:
        print("ready", flush=True)
        with anyio.open_signal_receiver(signal.SIGTERM) as signals:
            async for _ in signals:
                break
        report = await dispatcher.stop(drain_timeout=10.0)
        print(
            f"drained finished={len(report.finished)} interrupted={len(report.interrupted)} "
            f"left={len(report.left_for_reaper)}",
            flush=True,
        )


async def _enqueue(dsn: str, schema: str, conversations: list[str]) -> None:
    ids = []
    for conversation in conversations:
        run = await runrow.enqueue(
            dsn, schema=schema, conversation_id=conversation, user_id="u", content=f"hi {conversation}"
        )
        ids.append(str(run.id))
    print(json.dumps(ids), flush=True)


async def _tail(dsn: str, schema: str, run_id: str) -> None:
    async for event in runrow.tail(dsn, run_id, schema=schema, keepalive=1.0):
        if event.type == "keepalive":
            continue
        print(json.dumps({"seq": event.seq, "type": event.type, "payload": event.payload}), flush=True)
        if event.terminal:
            return


async def _transcript(dsn: str, schema: str, conversation: str) -> None:
    messages = await runrow.transcript(dsn, conversation, schema=schema)
    print(json.dumps([[m.role, m.content, m.status] for m in messages]), flush=True)


def main(argv: list[str]) -> None:
    command, dsn, schema, *rest = argv
    if command == "worker":
        anyio.run(_worker, dsn, schema, rest[0], Path(rest[1]) if len(rest) > 1 else None)
    elif command == "enqueue":
        anyio.run(_enqueue, dsn, schema, rest)
    elif command == "tail":
        anyio.run(_tail, dsn, schema, rest[0])
    elif command == "transcript":
        anyio.run(_transcript, dsn, schema, rest[0])
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
