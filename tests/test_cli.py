"""The `runrow` command line: help and defaults, ids, error lines, an unreachable database.

Most of these run the command as a user would, in a subprocess; the ones that need no
database point it at a closed port (nothing listens there, so nothing connects).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

import runrow
from runrow._cli_support import BACKOFF_START, JsonFormatter
from runrow.cli import build_parser
from runrow.embedded import EmbeddedPostgres

from .demo_support import free_port

# The slow tier: the CLI, in processes of its own.
pytestmark = [pytest.mark.anyio, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]


def cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runrow.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})},
    )


def closed_url() -> tuple[str, int]:
    port = free_port()  # bound and released: nothing listens there
    return f"postgresql://postgres@127.0.0.1:{port}/postgres", port


# -- help ----------------------------------------------------------------------------


def _parsers(
    parser: argparse.ArgumentParser, name: str = "runrow"
) -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(name, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                found += _parsers(sub, f"{name} {sub_name}")
    return found


def test_every_option_has_help_and_shows_its_default() -> None:
    missing = []
    for name, parser in _parsers(build_parser()):
        text = parser.format_help()
        for action in parser._actions:
            if isinstance(
                action, argparse._HelpAction | argparse._VersionAction | argparse._SubParsersAction
            ):
                continue
            label = f"{name} {'/'.join(action.option_strings) or action.dest}"
            if not action.help:
                missing.append(f"{label}: no help")
            elif action.option_strings and not isinstance(action, argparse._StoreTrueAction):
                # Every valued option says what happens without it.
                if "default:" not in action.help:
                    missing.append(f"{label}: no default shown")
                if action.default not in (None, False) and str(action.default) not in text:
                    missing.append(f"{label}: default {action.default!r} not in the help")
    assert missing == []


def test_the_worker_help_names_each_timing_default() -> None:
    text = " ".join(cli("worker", "--help").stdout.split("options:", 1)[1].split())
    for flag, default in (
        ("--concurrency", "8"),
        ("--lease-seconds", "30.0"),
        ("--heartbeat-seconds", "10.0"),
        ("--grace-seconds", "30.0"),
        ("--poll-seconds", "10.0"),
        ("--drain-seconds", "30.0"),
    ):
        entry = text.split(f"{flag} {flag[2:].upper().replace('-', '_')} ", 1)[1].split(" --", 1)[0]
        assert entry.endswith(f"(default: {default})"), (flag, entry)


def test_a_bare_runrow_prints_the_help_with_an_example_and_exits_2() -> None:
    out = cli()
    assert out.returncode == 2
    assert out.stdout.startswith("usage: runrow")
    assert "runrow worker myapp.agents:agent" in out.stdout  # an example
    assert "DATABASE_URL" in out.stdout and "dev-db" in out.stdout
    assert cli("--help").stdout == out.stdout
    runs = cli("runs")  # a bare group does the same
    assert runs.returncode == 2 and "position" in runs.stdout and "tail" in runs.stdout


def test_the_demo_data_dir_help_names_the_folder_the_demo_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    server = pytest.importorskip("runrow.demo.server")
    monkeypatch.delenv("RUNROW_DEMO_DIR", raising=False)

    def data_dir_help() -> str:
        demo = dict(_parsers(build_parser()))["runrow demo"]
        return next(a.help for a in demo._actions if a.dest == "data_dir") or ""

    assert f"else {server.default_data_dir()})" in data_dir_help()
    if os.geteuid() == 0:
        assert "/var/tmp/runrow-demo-root" in data_dir_help()  # not root's private home
    monkeypatch.setattr(os, "geteuid", lambda: 4321)
    monkeypatch.setenv("HOME", "/home/ann")
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    assert f"else {server.default_data_dir()})" in data_dir_help()
    assert "/home/ann/.local/share/runrow/demo" in data_dir_help()


def test_the_readme_lists_every_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    listed = " ".join(readme.split("The `runrow` command:", 1)[1].split("\n\n", 1)[0].split())
    groups = {name: parser for name, parser in _parsers(build_parser()) if name.count(" ") == 1}
    for name, parser in groups.items():
        command = name.split()[1]
        subs = sorted(n.split()[2] for n, _ in _parsers(parser, name) if n.count(" ") == 2)
        if subs:
            pattern = f"`{command} " + "|".join(subs)
            entry = next((e for e in listed.split("`")[1::2] if e.startswith(f"{command} ")), "")
            assert sorted(entry.split()[1].split("|")) == subs, (pattern, entry)
        else:
            assert f"`{command}" in listed, command


def test_no_database_names_both_ways_and_the_dev_db() -> None:
    out = cli("stats", env={"DATABASE_URL": ""})
    assert out.returncode == 1
    assert out.stderr == (
        "runrow: no database: pass --database-url URL or set DATABASE_URL "
        '(for a local one: eval "$(runrow dev-db start)")\n'
    )


# -- ids -----------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["show", "tail", "cancel", "retry", "position"])
def test_a_malformed_run_id_is_one_clear_line(command: str) -> None:
    url, _ = closed_url()
    out = cli("runs", command, "not-a-uuid", "--database-url", url)
    assert out.returncode == 2, out
    assert out.stderr.splitlines() == [
        "runrow: run_id: 'not-a-uuid' is not a run id; run ids are UUIDs such as "
        "6f1c2a9e-3b7d-4c8e-9a05-1d2e3f4a5b6c (see `runrow runs list`)"
    ]


def test_an_empty_conversation_id_is_one_clear_line() -> None:
    url, _ = closed_url()
    for args in (("stop", ""), ("runs", "list", "--conversation", "")):
        out = cli(*args, "--database-url", url)
        assert (out.returncode, out.stderr) == (2, "runrow: conversation_id: must not be empty\n")


async def test_a_refused_retry_names_the_run_once(dsn: str, schema: str) -> None:
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="hi")
    out = await anyio.to_thread.run_sync(
        lambda: cli("runs", "retry", str(run.id), "--database-url", dsn, "--schema", schema)
    )
    assert out.returncode == 2
    assert out.stderr == (
        f"runrow: run_id: {run.id} is queued; only failed, cancelled or expired runs can be retried\n"
    )


async def test_a_retry_keeps_the_deadline_and_past_it_says_how_to_set_or_clear_it(
    dsn: str, schema: str
) -> None:
    run = await runrow.enqueue(
        dsn, schema=schema, conversation_id="c", user_id="u", content="hi", deadline=timedelta(seconds=-1)
    )
    await runrow.cancel_run(dsn, run.id, schema=schema)

    def retry(*flags: str) -> Any:
        return cli("runs", "retry", str(run.id), *flags, "--database-url", dsn, "--schema", schema)

    out = await anyio.to_thread.run_sync(retry)
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out
    assert "--deadline-seconds" in out.stderr and "--no-deadline" in out.stderr
    assert (await anyio.to_thread.run_sync(lambda: retry("--deadline-seconds", "nan"))).returncode == 2
    out = await anyio.to_thread.run_sync(lambda: retry("--deadline-seconds", "600"))
    assert out.returncode == 0 and out.stdout.startswith("created run"), out
    new = uuid.UUID(out.stdout.split()[2])
    deadline = (await runrow.get_run(dsn, new, schema=schema)).deadline_at
    assert deadline is not None and deadline > datetime.now(UTC) + timedelta(seconds=500)
    help_text = (await anyio.to_thread.run_sync(lambda: cli("runs", "retry", "--help"))).stdout
    assert "keeps the turn's deadline" in " ".join(help_text.split())


# -- an unreachable database ---------------------------------------------------------


def test_migrate_against_a_closed_port_says_where_in_one_line() -> None:
    url, port = closed_url()
    out = cli("migrate", "--database-url", url)
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        f"runrow: cannot connect to PostgreSQL at 127.0.0.1:{port} (Connection refused): check that "
        "PostgreSQL is running there and that --database-url or DATABASE_URL names it"
    ]
    assert "Traceback" not in out.stderr and out.stdout == ""


async def test_a_wrong_database_name_is_not_waited_for(dsn: str) -> None:
    url = f"{dsn} dbname=no_such_db_{uuid.uuid4().hex[:6]}"
    for args in (("migrate",), ("worker", "tests.agents:record_agent")):
        out = await anyio.to_thread.run_sync(lambda args=args: cli(*args, "--database-url", url))
        assert out.returncode == 1, out
        assert len(out.stderr.splitlines()) == 1, out.stderr
        line = out.stderr
        assert "does not exist" in line and "check the user, password and database name" in line


def _start_waiting_worker(url: str, *extra: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runrow.cli",
            "worker",
            "tests.agents:record_agent",
            "--database-url",
            url,
            *extra,
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc


def _reap(proc: subprocess.Popen[str]) -> None:
    """Kills ``proc`` if it still runs and closes its pipes (an unclosed pipe warns later,
    in whichever test the garbage collector happens to run)."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def test_a_worker_waits_quietly_for_the_database_and_stops_at_once_on_sigterm() -> None:
    url, port = closed_url()
    proc = _start_waiting_worker(url)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith(
            f"runrow worker: waiting for the database at 127.0.0.1:{port} (Connection refused)"
        )
        # A negative check, so a fixed wait (a refused connect leaves nothing here to wait
        # on): three attempts, 0.5 s then 1 s apart, and still the one line above.
        time.sleep(3 * BACKOFF_START + 0.5)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
        took = time.monotonic() - sent
    finally:
        _reap(proc)
    assert took < 2.0, took
    assert proc.returncode == 0
    assert out == "runrow worker: SIGTERM while waiting for the database; exiting\n"  # said once
    assert err == ""  # no pool warnings, no traceback


def test_a_waiting_worker_stops_on_sigint_and_speaks_json() -> None:
    url, port = closed_url()
    proc = _start_waiting_worker(url, "--json")
    try:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline()) == {
            "event": "waiting_for_database",
            "target": f"127.0.0.1:{port}",
            "reason": "Connection refused",
        }
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
        assert time.monotonic() - sent < 2.0
    finally:
        _reap(proc)
    assert proc.returncode == 0 and err == ""
    assert [json.loads(line) for line in out.splitlines()] == [
        {"event": "stopped", "signal": "SIGINT", "started": False}
    ]


@pytest.mark.slow
def test_a_waiting_worker_starts_once_the_database_answers(tmp_path: Path) -> None:
    port = free_port()
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    base = Path("/var/tmp") / f"runrow-test-{uuid.uuid4().hex[:10]}"
    pg = EmbeddedPostgres(base, tcp=True, port=port, fast=True, cleanup=False)
    # Migrate first, then take the server away: the worker must find a ready schema the
    # moment the server answers (migrating after the restart would race its first probe).
    pg.start()
    proc: subprocess.Popen[str] | None = None
    try:
        anyio.run(runrow.migrate, url)
        pg.stop()
        proc = _start_waiting_worker(url, "--poll-seconds", "0.5")
        assert proc.stdout is not None
        assert "waiting for the database" in proc.stdout.readline()
        pg.start()
        assert proc.stdout.readline() == f"runrow worker: the database at 127.0.0.1:{port} answers\n"
        assert " ready (concurrency 8)" in proc.stdout.readline()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "psycopg.pool" not in err
    finally:
        if proc is not None:
            _reap(proc)
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)


# -- logs ----------------------------------------------------------------------------


def test_json_log_lines_carry_the_extras() -> None:
    record = logging.LogRecord("runrow.worker", logging.INFO, __file__, 1, "run %s completed", ("r1",), None)
    record.run_id = "r1"
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "run r1 completed" and line["run_id"] == "r1"
    assert (line["level"], line["logger"]) == ("INFO", "runrow.worker")
