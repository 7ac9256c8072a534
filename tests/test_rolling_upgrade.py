"""A rolling upgrade: `runrow migrate` first, then the rollout, with the previous release's
processes still running on the migrated schema (docs/howto/upgrading.md).

The previous release is built from git history, as a wheel, and run from it: its worker,
its enqueue and its tail (tests/release_driver.py, which uses only the API every release
has), beside this release's workers. Two previous releases are held to it:

* the commit before the newest migration was added: whatever the newest migration is,
  the release just before it keeps working on it (expand, then contract);
* the commit before ``message.turn`` existed (migration 3 added it NOT NULL, which broke
  that release's every message insert until migration 8 expanded it again).

And this release's side of the rule: a dispatcher that finds its schema migrated past
it stops claiming within a heartbeat, finishes what it holds, and says so once.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path

import anyio
import psycopg
import pytest
from psycopg import sql

import runrow

from .helpers import status_of, table, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "tests" / "release_driver.py"
# main just before migration 3 (message.turn NOT NULL) was merged.
BEFORE_MESSAGE_TURN = "e7b97da6781980a7f71f175e73f5d022828d997e"


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def _before_newest_migration() -> str:
    """The commit before the one that added the newest migration (HEAD while that
    migration is not committed yet)."""
    newest = max((ROOT / "sql" / "migrations").glob("*.sql")).relative_to(ROOT).as_posix()
    # (Along the first parents, each merge diffed against its first: a migration a
    # merge brought in, or renamed on the way, is added by that merge.)
    added = _git("log", "-1", "-m", "--first-parent", "--diff-filter=A", "--format=%H", "--", newest)
    return f"{added}^" if added else "HEAD"


def _history_or_skip() -> None:
    try:
        _git("cat-file", "-e", f"{BEFORE_MESSAGE_TURN}^{{commit}}")
    except (OSError, subprocess.CalledProcessError) as exc:
        # CI clones the repository whole: there, a missing history is a failure.
        if os.environ.get("CI"):
            raise AssertionError(f"the rolling-upgrade test needs the git history: {exc}") from exc
        pytest.skip("not a git checkout with its history (the previous release is built from it)")


REVISIONS = {"before-newest-migration": _before_newest_migration, "before-turn": lambda: BEFORE_MESSAGE_TURN}


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Builds a previous release from git as a wheel, unpacked: a PYTHONPATH entry (once
    per release and test process, when a test first asks for it)."""
    _history_or_skip()
    built: dict[str, Path] = {}

    def build(name: str) -> Path:
        if name in built:
            return built[name]
        base = tmp_path_factory.mktemp(name)
        commit = _git("rev-parse", "--verify", f"{REVISIONS[name]()}^{{commit}}")
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True)
        (base / "src").mkdir()
        subprocess.run(["tar", "-x", "-C", str(base / "src")], input=archive.stdout, check=True)
        command = [sys.executable, "-m", "build", "--wheel", "--no-isolation"]
        subprocess.run(
            [*command, "--outdir", str(base / "dist"), str(base / "src")], check=True, capture_output=True
        )
        (wheel,) = (base / "dist").glob("runrow-*.whl")
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(base / "pkg")
        built[name] = base / "pkg"
        return built[name]

    return build


class Side:
    """One release's processes (its runrow first on PYTHONPATH, or this checkout's)."""

    def __init__(self, dsn: str, schema: str, package: Path | None) -> None:
        self.dsn, self.schema = dsn, schema
        self.env = dict(os.environ)
        if package is not None:
            self.env["PYTHONPATH"] = str(package)
        self.procs: list[subprocess.Popen[str]] = []
        self.logs: dict[int, list[str]] = {}
        self.readers: list[threading.Thread] = []

    def _argv(self, command: str, *args: str) -> list[str]:
        return [sys.executable, str(DRIVER), command, self.dsn, self.schema, *args]

    def call(self, command: str, *args: str) -> str:
        done = subprocess.run(
            self._argv(command, *args), env=self.env, capture_output=True, text=True, timeout=60, cwd=ROOT
        )
        assert done.returncode == 0, f"{command} failed:\n{done.stderr}"
        return done.stdout

    def version(self) -> str:
        code = "import runrow, sys; sys.stdout.write(f'{runrow.__file__} {runrow.latest_version()}')"
        done = subprocess.run(
            [sys.executable, "-c", code], env=self.env, capture_output=True, text=True, cwd=ROOT
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def migrate(self) -> None:
        code = "import asyncio, sys, runrow; asyncio.run(runrow.migrate(sys.argv[1], schema=sys.argv[2]))"
        done = subprocess.run(
            [sys.executable, "-c", code, self.dsn, self.schema], env=self.env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr

    def enqueue(self, *conversations: str) -> list[str]:
        ids: list[str] = json.loads(self.call("enqueue", *conversations))
        return ids

    def tail(self, run_id: str) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.call("tail", run_id).splitlines()]

    async def start_worker(self, worker_id: str, gate: Path) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            self._argv("worker", worker_id, str(gate)),
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        self.procs.append(proc)
        assert proc.stdout is not None
        line = await anyio.to_thread.run_sync(proc.stdout.readline)
        assert line.strip() == "ready", proc.stderr.read() if proc.stderr else line
        # Its log (stderr), read as it comes: the stop-claiming line is looked for there.
        lines = self.logs[proc.pid] = []
        assert proc.stderr is not None
        reader = threading.Thread(target=lambda err=proc.stderr: lines.extend(err), daemon=True)
        reader.start()
        self.readers.append(reader)
        return proc

    def stop(self, proc: subprocess.Popen[str]) -> str:
        proc.send_signal(signal.SIGTERM)
        assert proc.stdout is not None
        out = proc.stdout.read()
        assert proc.wait(timeout=60) == 0, "".join(self.logs.get(proc.pid, []))
        return out

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for reader in self.readers:  # each ends at its process's end of output
            reader.join(timeout=10)
        for p in self.procs:
            for pipe in (p.stdout, p.stderr):
                if pipe is not None:
                    pipe.close()


async def _all_completed(conn: psycopg.AsyncConnection, schema: str, ids: list[str]) -> bool:
    return all([await status_of(conn, schema, i) == "completed" for i in ids])


async def _sound(conn: psycopg.AsyncConnection, schema: str, run_ids: list[str]) -> dict[str, str]:
    """Every run completed once: one terminal event, a gap-free journal, a transcript of
    its question then one answer, every message with its turn. Returns who answered each."""
    answered: dict[str, str] = {}
    for rid in run_ids:
        cur = await conn.execute(
            sql.SQL("SELECT seq, type FROM {} WHERE run_id = %s ORDER BY seq").format(
                table(schema, "run_event")
            ),
            (rid,),
        )
        journal = await cur.fetchall()
        assert [s for s, _ in journal] == list(range(1, len(journal) + 1)), journal
        assert [t for _, t in journal].count("complete") == 1, journal
        assert journal[-1][1] == "complete", journal
        cur = await conn.execute(
            sql.SQL(
                "SELECT m.role, m.content, m.status, m.turn FROM {m} m JOIN {r} r ON r.conversation_id = m.conversation_id"
                " WHERE r.id = %s ORDER BY m.turn, m.position"
            ).format(m=table(schema, "message"), r=table(schema, "agent_run")),
            (rid,),
        )
        messages = await cur.fetchall()
        assert [(role, status) for role, _, status, _ in messages] == [
            ("user", "sent"),
            ("assistant", "complete"),
        ]
        assert all(turn is not None for *_, turn in messages), messages
        answered[rid] = str(messages[1][1])
    return answered


async def _journal_length(conn: psycopg.AsyncConnection, schema: str, run_id: str) -> int:
    cur = await conn.execute(
        sql.SQL("SELECT count(*) FROM {} WHERE run_id = %s").format(table(schema, "run_event")), (run_id,)
    )
    return int((await cur.fetchone())[0])  # type: ignore[index]


@pytest.mark.parametrize("release", list(REVISIONS))
async def test_the_previous_release_keeps_working_on_the_migrated_schema(
    dsn: str,
    schema_name: str,
    conn: psycopg.AsyncConnection,
    releases: Callable[[str], Path],
    release: str,
    tmp_path: Path,
) -> None:
    package = releases(release)
    old, new = Side(dsn, schema_name, package), Side(dsn, schema_name, None)
    old_file, old_version = old.version().split()
    assert str(package) in old_file  # the old side really runs the built release
    assert int(old_version) < runrow.latest_version()
    # A release from schema 8 on stops claiming once it finds the schema ahead of it.
    watches = (package / "runrow" / "_engine" / "schema_watch.py").exists()
    gate = tmp_path / "gate"
    try:
        # The previous release runs on its own schema, as before the deploy, with a turn
        # in flight: its first words streamed, the rest to come after the migration.
        old.migrate()
        old_worker = await old.start_worker("old-worker", gate)
        (held,) = old.enqueue("held-1")
        await wait_for(lambda: _journal_length(conn, schema_name, held), what="the held run streaming")
        assert await status_of(conn, schema_name, held) == "running"
        # The deploy: migrate first. The old worker keeps running through it.
        await runrow.migrate(dsn, schema=schema_name)
        cur = await conn.execute(
            sql.SQL("SELECT max(version) FROM {}").format(table(schema_name, "schema_version"))
        )
        assert (await cur.fetchone()) == (runrow.latest_version(),)
        if watches:
            log = old.logs[old_worker.pid]
            await wait_for(
                lambda: any("stopped claiming" in line for line in log), what="the old worker's line"
            )
        # The held run ends whole on the migrated schema: the rest of its stream, its
        # answer and its ending, all written by the old release.
        gate.touch()
        await wait_for(lambda: _all_completed(conn, schema_name, [held]), timeout=30, what="the held run")
        assert await _sound(conn, schema_name, [held]) == {held: "answered by old-worker"}
        tailed = old.tail(held)
        assert [e["seq"] for e in tailed] == list(range(1, len(tailed) + 1))
        assert tailed[-1]["type"] == "complete" and tailed[-1]["payload"].get("status") == "completed"
        if not watches:
            # A release from before the watch keeps claiming: alone on the migrated
            # schema, it takes turns end to end (its enqueue, worker and endings).
            first = old.enqueue("c-old-1", "c-old-2")
            await wait_for(
                lambda: _all_completed(conn, schema_name, first), timeout=30, what="the old worker's runs"
            )
            assert set((await _sound(conn, schema_name, first)).values()) == {"answered by old-worker"}
        # The rollout: this release's worker beside the old one; both releases enqueue.
        new_worker = await new.start_worker("new-worker", gate)
        second = old.enqueue(*(f"c-mixed-old-{i}" for i in range(6)))
        second += new.enqueue(*(f"c-mixed-new-{i}" for i in range(6)))
        # A second turn in the conversation the old release answered (transcript order).
        second += new.enqueue("held-1")
        await wait_for(lambda: _all_completed(conn, schema_name, second), timeout=30, what="every run")
        assert {e["type"] for e in old.tail(second[-1])} >= {"user_message_created", "complete"}
        answered = await _sound(conn, schema_name, second[:-1])
        if watches:  # it took none of them
            assert set(answered.values()) == {"answered by new-worker"}
        transcript = json.loads(old.call("transcript", "held-1"))
        assert [(m[0], m[1]) for m in transcript][::2] == [("user", "hi held-1"), ("user", "hi held-1")]
        assert [m[0] for m in transcript] == ["user", "assistant", "user", "assistant"]
        for side, proc in ((old, old_worker), (new, new_worker)):
            assert "drained" in side.stop(proc)
    finally:
        old.kill_all()
        new.kill_all()
        await conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema_name)))


async def test_a_dispatcher_stops_claiming_once_its_schema_is_ahead(
    schema: str, conn: psycopg.AsyncConnection, caplog: pytest.LogCaptureFixture, dsn: str
) -> None:
    release = anyio.Event()

    async def agent(run: runrow.RunContext) -> None:
        await release.wait()
        await run.write_message("done")

    caplog.set_level(logging.WARNING, logger="runrow.dispatcher")
    held = (await runrow.enqueue(dsn, schema=schema, conversation_id="held", user_id="u", content="x")).id
    poll = 0.2
    async with runrow.Dispatcher(dsn, agent, schema=schema, heartbeat=0.2, poll=poll, lease=5, grace=5) as d:
        await wait_for(lambda: d.in_flight == [held], what="the first run claimed")
        # Another release migrated the schema past this one.
        await conn.execute(
            sql.SQL("INSERT INTO {} (version, name) VALUES (%s, 'from a later release')").format(
                table(schema, "schema_version")
            ),
            (runrow.latest_version() + 1,),
        )
        await wait_for(lambda: "stopped claiming" in caplog.text, timeout=5, what="the stop-claiming line")
        ahead = [r for r in caplog.records if "stopped claiming" in r.getMessage()]
        assert len(ahead) == 1
        assert f"version {runrow.latest_version() + 1}" in ahead[0].getMessage()
        later = (
            await runrow.enqueue(dsn, schema=schema, conversation_id="later", user_id="u", content="y")
        ).id
        # What it holds still ends.
        release.set()
        await wait_for(lambda: _all_completed(conn, schema, [str(held)]), what="the held run's ending")
        await wait_for(lambda: d.in_flight == [], what="the held run finished")
        assert await status_of(conn, schema, held) == "completed"
        # And nothing more is claimed, by the loop or with an ending. A negative check, so
        # a fixed wait: three poll ticks.
        claims = d.get_stats()["claims"]
        await anyio.sleep(3 * poll)
        assert await status_of(conn, schema, later) == "queued"
        assert d.get_stats()["claims"] == claims
    # Said once, however many beats it lived after.
    assert len([r for r in caplog.records if "stopped claiming" in r.getMessage()]) == 1
