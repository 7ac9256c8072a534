"""The `runrow` command's exit statuses, each as its help lists it, and the errors that
must be one line: a malformed database URL, an unresolvable host, a closed pipe, Ctrl-C.

Every case runs the command in a subprocess, as a user would.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

import runrow

from .helpers import wait_for
from .test_cli import ROOT, _reap, cli, closed_url

# The slow tier: the CLI, in processes of its own.
pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def _one_line(out: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.splitlines()) == 1, out.stderr
    return out.stderr.rstrip("\n")


# -- a malformed or unreachable database URL ----------------------------------------


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("nonsense", 'missing "=" after "nonsense"'),
        ("postgresql://[::1", 'matching "]"'),
        ("host=foo port=notanumber", "port 'notanumber' is not a port number (1-65535)"),
        ("postgresql://u@localhost:99999/db", "port '99999' is not a port number (1-65535)"),
    ],
)
def test_a_malformed_database_url_is_one_line_naming_the_problem(url: str, problem: str) -> None:
    out = cli("runs", "list", "--database-url", url)
    line = _one_line(out)
    assert out.returncode == 2, out
    assert line.startswith("runrow: --database-url: not a PostgreSQL URL or conninfo string ("), line
    assert problem in line and line.endswith("e.g. postgresql://user:password@host:5432/dbname"), line
    assert out.stdout == ""


def test_a_malformed_database_url_from_the_environment_names_the_variable() -> None:
    for args in (("stats",), ("worker", "tests.agents:record_agent"), ("send", "c", "hi")):
        out = cli(*args, env={"DATABASE_URL": "nonsense"})
        assert out.returncode == 2, out
        assert _one_line(out).startswith("runrow: DATABASE_URL: not a PostgreSQL URL"), out.stderr


def test_a_malformed_listen_url_is_one_line() -> None:
    url, _ = closed_url()
    out = cli("worker", "tests.agents:record_agent", "--database-url", url, "--listen-database-url", "x")
    assert out.returncode == 2, out
    assert _one_line(out).startswith("runrow: --listen-database-url: not a PostgreSQL URL"), out.stderr


def test_an_unresolvable_host_says_where_and_to_check_the_server() -> None:
    out = cli("runs", "list", "--database-url", "postgresql://u@no-such-host.invalid/db")
    assert out.returncode == 1, out
    line = _one_line(out)
    assert line.startswith("runrow: cannot connect to PostgreSQL at no-such-host.invalid:5432 ("), line
    # Not "check the user, password and database name": the host is what is wrong.
    assert line.endswith(
        "check that PostgreSQL is running there and that --database-url or DATABASE_URL names it"
    )


# -- every documented exit status ---------------------------------------------------


def _documented_codes() -> dict[int, str]:
    text = cli("--help").stdout.split("Exit status:", 1)[1]
    return {int(code): what for code, what in re.findall(r"(?:^|;)\s*(\d+) ([^;]+)", " ".join(text.split()))}


def test_the_help_lists_each_exit_status_these_tests_check() -> None:
    # (7, `workers wait` past its --timeout: tests/test_workers.py checks it; 8, `check`
    # finding a run that would not resume cleanly: tests/test_check.py)
    assert sorted(_documented_codes()) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 130, 141]


async def test_exit_0_1_2_and_3(dsn: str, schema: str, tmp_path: Path) -> None:
    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return cli(*args, env=env)

    ok = await anyio.to_thread.run_sync(
        lambda: run("runs", "list", "--database-url", dsn, "--schema", schema)
    )
    assert (ok.returncode, ok.stderr) == (0, ""), ok
    url, _ = closed_url()
    for args, env in (
        (("stats", "--database-url", url), None),  # the database cannot be reached
        (("stats",), {"DATABASE_URL": ""}),  # no database named
    ):
        out = await anyio.to_thread.run_sync(lambda a=args, e=env: run(*a, env=e))
        assert out.returncode == 1, out
        _one_line(out)
    for args in (
        ("runs", "list", "--limit", "many"),  # argparse's usage error
        ("runs", "show", "not-a-uuid", "--database-url", url),  # an error runrow explains
        ("worker", "no_such_module_here:agent", "--database-url", url),  # an agent that cannot load
        ("worker", "tests.agents", "--database-url", url),  # not module:callable
        ("worker", "tests.agents:nothing_here", "--database-url", url),
        (
            "worker",
            "tests.agents:record_agent",
            "--agent",
            "tests.agents:record_agent",
            "--database-url",
            url,
        ),  # no KEY=
        (
            "worker",
            "tests.agents:record_agent",
            "--agent",
            "k=tests.agents:nothing_here",
            "--database-url",
            url,
        ),
        (
            "worker",
            "tests.agents:record_agent",
            "--agent",
            "k=tests.agents:record_agent",
            "--agent",
            "k=tests.agents:record_agent",
        ),
    ):
        out = await anyio.to_thread.run_sync(lambda a=args: run(*a))
        assert out.returncode == 2, out
        assert "Traceback" not in out.stderr and out.stderr.startswith(("runrow: ", "usage: ")), out.stderr
        if "--agent" in args:  # the keyed agent is what is refused, and said so
            assert "--agent" in out.stderr or "nothing_here" in out.stderr, out.stderr
    status = await anyio.to_thread.run_sync(lambda: run("dev-db", "status", "--data-dir", str(tmp_path)))
    assert status.returncode == 3 and status.stdout.startswith("not running"), status


def _tail(dsn: str, schema: str, run_id: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runrow.cli",
            "runs",
            "tail",
            run_id,
            "--database-url",
            dsn,
            "--schema",
            schema,
        ],
        cwd=ROOT,
        # (PYTHONFAULTHANDLER: a SIGABRT makes a stuck tail print where it is.)
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONFAULTHANDLER": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_a_terminals_foreground_job,
    )


def _as_a_terminals_foreground_job() -> None:
    """Ctrl-C reaches a command run from a terminal with SIGINT at its default. A shell
    starts a background job with SIGINT ignored instead, and its children inherit that
    (Python then leaves it ignored): under a test run started as one, the tail would
    never see the test's SIGINT."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _masks(pid: int | str) -> str:
    status = Path(f"/proc/{pid}/status").read_text()
    return " ".join(
        line
        for line in status.splitlines()
        if line.startswith(("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt"))
    )


def _stuck(proc: subprocess.Popen[str]) -> str:
    """What a process that did not exit was doing: its signal masks (pending, blocked,
    ignored, caught) and this test process's (which it inherited), and, after a
    SIGABRT, its Python threads' stacks."""
    masks = f"tail: {_masks(proc.pid)}; test process: {_masks('self')}"
    proc.send_signal(signal.SIGABRT)
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        err = "(no stack: it did not die on SIGABRT either)"
    return f"{masks}\n{err}"


async def test_exit_130_on_ctrl_c_without_a_traceback(dsn: str, schema: str) -> None:
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="hi")
    proc = _tail(dsn, schema, str(run.id))
    try:
        assert proc.stdout is not None
        # The queued run's two events are out: the tail now waits for more.
        for _ in range(2):
            await anyio.to_thread.run_sync(proc.stdout.readline)
        proc.send_signal(signal.SIGINT)
        try:
            _, err = await anyio.to_thread.run_sync(lambda: proc.communicate(timeout=30))
        except subprocess.TimeoutExpired:
            pytest.fail(f"the tail did not exit within 30 s of SIGINT: {_stuck(proc)}")
    finally:
        _reap(proc)
    assert (proc.returncode, err) == (130, "")


async def test_exit_141_and_no_traceback_when_the_reader_of_a_tail_goes_away(dsn: str, schema: str) -> None:
    """`runrow runs tail RUN | head -1`: head exits after one line; the tail's next write
    finds the pipe closed."""
    run = await runrow.enqueue(dsn, schema=schema, conversation_id="c", user_id="u", content="hi")
    proc = _tail(dsn, schema, str(run.id))
    try:
        assert proc.stdout is not None and proc.stderr is not None
        first = await anyio.to_thread.run_sync(proc.stdout.readline)
        assert "user_message_created" in first
        proc.stdout.close()  # the reader goes away, as head does

        async def agent(ctx: runrow.RunContext) -> None:
            for i in range(20):
                await ctx.text(f"chunk {i} ")

        async with runrow.Dispatcher(dsn, agent, schema=schema):
            await wait_for(lambda: proc.poll() is not None, timeout=30, what="the tail to exit")
        err = await anyio.to_thread.run_sync(proc.stderr.read)
    finally:
        _reap(proc)
    assert (proc.returncode, err) == (141, "")
