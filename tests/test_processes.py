"""Guarantees under real concurrency and real process death: several OS processes,
SIGKILL, SIGSTOP past the lease, SIGTERM drain."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow
from runrow.demo import store

from .agents import SIDE_EFFECT_DDL, side_effect_table
from .helpers import assert_journal_sound, enqueue_turn, run_row, status_of, table, wait_for
from .test_fold import log_status_changes, status_txs

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]


class Workers:
    """Worker processes of one test; all killed at the end whatever happens."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.env = {**os.environ, "RUNROW_TEST_DSN": dsn, "RUNROW_TEST_SCHEMA": schema}
        self.procs: list[subprocess.Popen[str]] = []

    def start(
        self,
        agent: str,
        *,
        dispatchers: int = 1,
        concurrency: int = 4,
        lease: float = 2.0,
        heartbeat: float = 0.5,
        grace: float = 1.0,
        poll: float = 0.5,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[str]:
        args = [str(a) for a in (dispatchers, concurrency, lease, heartbeat, grace, poll)]
        proc = self._spawn(["tests.worker_proc", agent, *args], env)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "ready", (line, proc.stderr.read() if proc.poll() is not None else "")  # type: ignore[union-attr]
        return proc

    def cli(self, dsn: str, schema: str, agent: str, *args: str) -> subprocess.Popen[str]:
        """`runrow worker tests.agents:AGENT ARGS...` on the test's schema, once ready."""
        proc = self._spawn(
            [
                *("runrow.cli", "worker", f"tests.agents:{agent}"),
                *("--database-url", dsn, "--schema", schema, "--poll-seconds", "0.5", *args),
            ]
        )
        assert proc.stdout is not None and "ready" in proc.stdout.readline()
        return proc

    def _spawn(self, module_args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """``python -m MODULE ARGS...`` from the checkout, with pipes; killed at the test's end."""
        proc = subprocess.Popen(
            [sys.executable, "-m", *module_args],
            cwd=ROOT,
            env={**self.env, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        return proc

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
            p.wait()
            for stream in (p.stdout, p.stderr):
                if stream is not None:
                    stream.close()


@pytest.fixture
def workers(dsn: str, schema: str) -> Iterator[Workers]:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SQL(SIDE_EFFECT_DDL).format(t=side_effect_table(schema)))
    w = Workers(dsn, schema)
    try:
        yield w
    finally:
        w.kill_all()


async def _side_effects(conn: psycopg.AsyncConnection, schema: str, step: str) -> list[tuple[object, ...]]:
    cur = await conn.execute(
        sql.SQL("SELECT run_id, conversation_id, pid, at FROM {} WHERE step = %s").format(
            side_effect_table(schema)
        ),
        (step,),
    )
    return await cur.fetchall()


async def test_eight_dispatchers_in_four_processes_drain_2000_runs(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, workers: Workers
) -> None:
    for _ in range(4):
        workers.start("record_agent", dispatchers=2, concurrency=8)
    runs: list[runrow.Run] = []
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as enq:
        for i in range(2000):
            runs.append(
                await runrow.enqueue(
                    enq, schema=schema, conversation_id=f"conv-{i % 200}", user_id="u", content=i
                )
            )

    async def all_done() -> bool:
        cur = await conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE status = 'completed'").format(table(schema, "agent_run"))
        )
        return (await cur.fetchone())[0] == 2000  # type: ignore[index]

    await wait_for(all_done, timeout=180, interval=0.2, what="2000 runs to complete")
    starts = await _side_effects(conn, schema, "start")
    ends = await _side_effects(conn, schema, "end")
    # Exactly once: one start and one end side effect per run (the key forbids a second).
    assert len(starts) == len(ends) == 2000
    assert {r[0] for r in starts} == {r.id for r in runs}
    assert len({r[2] for r in starts}) == 4  # all four processes did work
    # Per conversation: turns ran in enqueue order and never overlapped.
    order = {r.id: i for i, r in enumerate(runs)}
    span = {r[0]: [r[3], None] for r in starts}
    for r in ends:
        span[r[0]][1] = r[3]
    by_conv: dict[object, list[tuple[object, ...]]] = {}
    for run_id, conv, _pid, _at in starts:
        by_conv.setdefault(conv, []).append((span[run_id][0], span[run_id][1], order[run_id]))
    for conv, turns in by_conv.items():
        turns.sort()
        assert [t[2] for t in turns] == sorted(t[2] for t in turns), f"{conv} ran out of order"
        for before, after in itertools.pairwise(turns):
            assert before[1] <= after[0], f"{conv}: two turns overlapped"
    for r in runs[:50]:
        await assert_journal_sound(conn, schema, r.id)


async def test_sigkill_mid_run_fails_within_lease_plus_grace_then_next_turn_runs(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, workers: Workers
) -> None:
    victim = workers.start("hang_agent", lease=2.0, heartbeat=0.5, grace=1.0)
    r1 = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="doomed")
    r2 = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="next")
    await wait_for(lambda: _side_effects(conn, schema, "start"), what="the run to start")
    victim.kill()
    killed_at = anyio.current_time()
    victim.wait()
    # A survivor (another process) reaps it and runs the conversation's next turn.
    workers.start("record_agent", lease=2.0, heartbeat=0.5, grace=1.0, poll=0.5)
    await wait_for(lambda: _is(conn, schema, r1.id, "failed"), timeout=20, what="the reap")
    reaped_after = anyio.current_time() - killed_at
    assert reaped_after < 2.0 + 1.0 + 0.5 + 3.0  # lease + grace + one tick, plus start-up slack
    row = await run_row(conn, schema, r1.id)
    assert row["error"]["type"] == "worker_lost"
    evs = await assert_journal_sound(conn, schema, r1.id)
    assert evs[-1][2]["reason"] == "worker_lost"
    await wait_for(lambda: _is(conn, schema, r2.id, "completed"), timeout=20, what="the next turn")


async def test_sigkill_during_a_demo_tool_call_lists_it_as_uncertain(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, workers: Workers
) -> None:
    """The demo agent's tool events use the documented vocabulary, so the reaper can name
    the tool call whose side effect is uncertain when its worker dies mid-call."""
    demo_schema = f"{schema}_demo"
    await store.ensure_tables(conn, demo_schema)
    try:
        victim = workers.start(
            "demo_agent",
            lease=2.0,
            heartbeat=0.5,
            grace=1.0,
            env={"DATABASE_URL": dsn, "RUNROW_DEMO_SCHEMA": schema, "RUNROW_DEMO_TOKEN_DELAY": "0.01"},
        )
        async with await psycopg.AsyncConnection.connect(dsn) as locker, locker.transaction():
            # Holds the tool's INSERT in flight: the note table takes no writes until this ends.
            await locker.execute(
                sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(table(demo_schema, "note"))
            )
            run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="hi")
            started = await wait_for(
                lambda: _event_of_type(conn, schema, run.id, "tool_call_started"),
                what="the tool call to start",
            )
            victim.kill()
            victim.wait()
        async with runrow.Dispatcher(
            dsn, _never, schema=schema, lease=2.0, heartbeat=0.5, grace=1.0, poll=0.2, reap_interval=0.2
        ):
            await wait_for(lambda: _is(conn, schema, run.id, "failed"), timeout=20, what="the reap")
        evs = await assert_journal_sound(conn, schema, run.id)
        assert "tool_call_finished" not in [t for _, t, _ in evs]
        assert started.get("tool_call_id") and started.get("name") == "save_note", started
        assert evs[-1][2]["reason"] == "worker_lost"
        assert evs[-1][2]["uncertain_tool_calls"] == [
            {"tool_call_id": started["tool_call_id"], "name": "save_note"}
        ]
    finally:
        await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(demo_schema)))


async def _event_of_type(
    conn: psycopg.AsyncConnection, schema: str, run_id: object, etype: str
) -> dict[str, object] | None:
    cur = await conn.execute(
        sql.SQL("SELECT payload FROM {} WHERE run_id = %s AND type = %s ORDER BY seq LIMIT 1").format(
            table(schema, "run_event")
        ),
        (run_id, etype),
    )
    row = await cur.fetchone()
    return None if row is None else row[0]


async def _is(conn: psycopg.AsyncConnection, schema: str, run_id: object, status: str) -> bool:
    return await status_of(conn, schema, run_id) == status


async def test_sigstop_past_the_lease_then_sigcont_writes_nothing_after_the_reap(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, workers: Workers
) -> None:
    sleeper = workers.start(
        "chatty_agent", lease=1.0, heartbeat=0.25, grace=0.5, env={"RUNROW_TEST_STEPS": "200"}
    )
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    await wait_for(lambda: _event_count(conn, schema, run.id, 5), what="the stream to be flowing")
    sleeper.send_signal(signal.SIGSTOP)
    async with runrow.Dispatcher(
        dsn,
        _never,
        schema=schema,
        lease=1.0,
        heartbeat=0.25,
        grace=0.5,
        poll=0.2,
        reap_interval=0.2,
        concurrency=1,
    ):
        await wait_for(lambda: _is(conn, schema, run.id, "failed"), timeout=15, what="the reap")
    frozen = await _events(conn, schema, run.id)
    sleeper.send_signal(signal.SIGCONT)
    # It wakes, its next fenced write matches nothing, and it stands down on its own.
    assert sleeper.stderr is not None
    await wait_for(lambda: _stood_down(sleeper), timeout=15, what="the worker to stand down")
    assert await _events(conn, schema, run.id) == frozen
    evs = await assert_journal_sound(conn, schema, run.id)
    assert evs[-1][2]["reason"] == "worker_lost"
    assert await status_of(conn, schema, run.id) == "failed"
    msgs = await runrow.transcript(dsn, "c", schema=schema)
    assert [m.role for m in msgs] == ["user"]  # its late answer never landed
    assert await _side_effects(conn, schema, "end") == []


_stderr_seen: dict[int, str] = {}


def _stood_down(proc: subprocess.Popen[str]) -> bool:
    # Read what the worker logged so far without blocking.
    import fcntl

    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    try:
        chunk = os.read(fd, 65536).decode(errors="replace")
    except BlockingIOError:
        chunk = ""
    _stderr_seen[proc.pid] = _stderr_seen.get(proc.pid, "") + chunk
    return "standing down" in _stderr_seen[proc.pid]


async def _never(run: runrow.RunContext) -> None:
    raise AssertionError("this dispatcher only reaps")


async def _events(conn: psycopg.AsyncConnection, schema: str, run_id: object) -> list[tuple[object, ...]]:
    cur = await conn.execute(
        sql.SQL("SELECT seq, type FROM {} WHERE run_id = %s ORDER BY seq").format(table(schema, "run_event")),
        (run_id,),
    )
    return await cur.fetchall()


async def _event_count(conn: psycopg.AsyncConnection, schema: str, run_id: object, n: int) -> bool:
    return len(await _events(conn, schema, run_id)) >= n


async def test_sigterm_drains_ten_running_runs(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, workers: Workers
) -> None:
    proc = workers.start(
        "slow_agent",
        concurrency=10,
        lease=5.0,
        heartbeat=1.0,
        grace=2.0,
        env={"RUNROW_TEST_SLEEP": "1.5", "RUNROW_TEST_DRAIN": "20"},
    )
    runs = [
        await runrow.enqueue(dsn, schema=schema, conversation_id=f"c{i}", user_id="u", content=i)
        for i in range(10)
    ]

    async def ten_started() -> bool:
        return len(await _side_effects(conn, schema, "start")) == 10

    await wait_for(ten_started, what="ten runs running")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    assert "drained finished=10 interrupted=0 left=0" in out
    for r in runs:
        row = await run_row(conn, schema, r.id)
        assert row["status"] == "completed", row
        await assert_journal_sound(conn, schema, r.id)
    assert len(await _side_effects(conn, schema, "end")) == 10


async def test_cli_worker_runs_and_drains_on_sigterm(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, workers: Workers
) -> None:
    """The `runrow worker module:callable` command itself."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runrow.cli",
            "worker",
            "tests.agents:record_agent",
            "--database-url",
            dsn,
            "--schema",
            schema,
            "--concurrency",
            "2",
            "--lease-seconds",
            "4",
            "--heartbeat-seconds",
            "1",
            "--poll-seconds",
            "0.5",
        ],
        cwd=ROOT,
        env=workers.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    workers.procs.append(proc)
    assert proc.stdout is not None
    assert "ready" in proc.stdout.readline()
    runs = [
        await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content=i)
        for i in range(3)
    ]
    for r in runs:
        await wait_for(lambda r=r: _is(conn, schema, r.id, "completed"), what="runs via the CLI worker")
    # A row reads `completed` as soon as its ending commits, a moment before the worker
    # has let the run go; a SIGTERM in between is drained as "1 finished". The worker
    # logs "run ... completed" as it lets go: wait for the three lines, not for the rows.
    assert proc.stderr is not None
    stderr = proc.stderr
    early: list[str] = []

    def read_until_all_let_go() -> None:
        while sum(f"run {r.id} completed" in line for r in runs for line in early) < len(runs):
            line = stderr.readline()
            if not line:
                return
            early.append(line)

    with anyio.fail_after(30):
        await anyio.to_thread.run_sync(read_until_all_let_go)
    proc.send_signal(signal.SIGTERM)
    out, rest = proc.communicate(timeout=30)
    err = "".join(early) + rest
    assert proc.returncode == 0, err[-2000:]
    assert out.splitlines()[-1] == "runrow worker stopped: 0 finished, 0 interrupted, 0 left for the reaper"
    assert err.count("started") >= 3 and "completed" in err  # one log line per run start/end


async def test_cli_worker_json_reports_ready_and_drain_and_logs_json(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, workers: Workers
) -> None:
    """`runrow worker --json`: JSON events on stdout, JSON log lines on stderr."""
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "runrow.cli", "worker", "tests.agents:record_agent", "--json"),
            *("--database-url", dsn, "--schema", schema, "--concurrency", "2", "--poll-seconds", "0.5"),
        ],
        cwd=ROOT,
        env=workers.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    workers.procs.append(proc)
    assert proc.stdout is not None
    ready = json.loads(proc.stdout.readline())
    assert (ready["event"], ready["concurrency"]) == ("ready", 2) and ready["worker_id"]
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")
    await wait_for(lambda: _is(conn, schema, run.id, "completed"), what="a run via the JSON worker")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    events = [json.loads(line) for line in out.splitlines()]
    assert events[0] == {"event": "draining", "signal": "SIGTERM", "drain_seconds": 30.0}
    assert events[1]["event"] == "stopped" and events[1]["left_for_reaper"] == []
    logs = [json.loads(line) for line in err.splitlines()]
    assert any(line.get("run_id") == str(run.id) for line in logs), logs
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in logs)


@pytest.mark.parametrize("opt_in", [True, False], ids=["default", "no-log-error-messages"])
async def test_cli_worker_logs_error_messages_unless_told_not_to(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, workers: Workers, opt_in: bool
) -> None:
    """A failed run's log line names the error's type and message; `--no-log-error-messages`
    leaves the message out."""
    proc = workers.cli(dsn, schema, "failing_agent", *([] if opt_in else ["--no-log-error-messages"]))
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="left-pad")
    await wait_for(lambda: _is(conn, schema, run.id, "failed"), what="the run to fail")
    assert proc.stderr is not None
    stderr = proc.stderr

    def read_the_line() -> str:
        while line := stderr.readline():
            if f"run {run.id} failed" in line:
                return line
        return ""

    with anyio.fail_after(30):
        line = await anyio.to_thread.run_sync(read_the_line)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    said = "RuntimeError: the tool broke on 'left-pad'" if opt_in else "RuntimeError ("
    assert said in line and f"runrow runs show {run.id}" in line, line
    assert ("left-pad" in line) is opt_in


async def test_cli_worker_claims_with_endings_when_asked(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, workers: Workers
) -> None:
    """`runrow worker --claim-with-endings`: each turn of a conversation queued behind
    another is claimed in the very transaction that ends the turn before it."""
    await log_status_changes(conn, schema)
    turns = [await enqueue_turn(dsn, schema, "c") for _ in range(3)]
    proc = workers.cli(dsn, schema, "record_agent", "--claim-with-endings")

    async def ended() -> bool:
        return all([await status_of(conn, schema, t.id) == "completed" for t in turns])

    await wait_for(ended, timeout=20, what="three turns completed")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    txs = [await status_txs(conn, schema, t.id) for t in turns]
    for before, after in itertools.pairwise(txs):
        assert before["completed"] == after["running"], (before, after)


async def test_cli_worker_retries_when_asked(
    dsn: str, schema: str, conn: psycopg.AsyncConnection, workers: Workers
) -> None:
    """`runrow worker --retry-attempts 2`: a failed run is retried once, as attempt 2."""
    proc = workers.cli(dsn, schema, "failing_agent", "--retry-attempts", "2", "--retry-backoff-seconds", "0")
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="x")

    async def retried() -> list[runrow.RunInfo] | None:
        runs = await runrow.list_runs(dsn, schema=schema)
        return runs if len(runs) == 2 and all(r.terminal for r in runs) else None

    retry, first = await wait_for(retried, timeout=20, what="the retry to fail too")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert (first.id, first.attempt, retry.attempt, retry.retry_of) == (run.id, 1, 2, run.id)
    assert first.status == retry.status == "failed"
