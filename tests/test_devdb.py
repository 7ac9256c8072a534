"""`runrow dev-db`: a development PostgreSQL that outlives the command and keeps its data.

Real processes: the command, its keeper, the server; folders directly under /var/tmp (which
every account can traverse, so this works as root, whose server runs as another account).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import pytest

from runrow import _devdb

from .test_embedded import servers_for, wait_until

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parents[1]


def dev_db(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runrow.cli", "dev-db", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})},
    )


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path("/var/tmp") / f"runrow-test-devdb-{uuid.uuid4().hex[:8]}"
    yield path
    with contextlib.suppress(Exception):
        _devdb.stop(path)
    for pid in servers_for(path / "data"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    subprocess.run(["rm", "-rf", str(path)], check=False)


def exported_url(stdout: str) -> str:
    (line,) = stdout.splitlines()
    assert line.startswith("export DATABASE_URL=")
    env = subprocess.run(
        ["sh", "-c", f'{line}; printf %s "$DATABASE_URL"'], capture_output=True, text=True, check=True
    )
    return env.stdout


@pytest.mark.slow
def test_start_stop_status_url_and_the_data_stays(base: Path) -> None:
    d = ("--data-dir", str(base))
    status = dev_db("status", *d)
    assert status.returncode == 3 and status.stdout.startswith("not running")

    started = dev_db("start", *d)
    assert started.returncode == 0, started.stderr
    assert started.stderr == f"runrow dev-db: started (data in {base})\n"
    url = exported_url(started.stdout)
    assert url == f"postgresql:///postgres?host={base}/sock&port=5432&user=postgres"
    (server,) = servers_for(base / "data")  # left running after the command exited
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (x int)")
        conn.execute("INSERT INTO kept VALUES (42)")

    again = dev_db("start", *d)  # reuses the running server
    assert again.returncode == 0 and "already running" in again.stderr
    assert exported_url(again.stdout) == url and servers_for(base / "data") == [server]
    assert dev_db("url", *d).stdout == url + "\n"
    status = dev_db("status", *d)
    assert status.returncode == 0 and status.stdout.startswith("running (pid ")

    stopped = dev_db("stop", *d)
    assert (stopped.returncode, stopped.stdout) == (0, "runrow dev-db: stopped\n")
    assert servers_for(base / "data") == []
    assert dev_db("status", *d).returncode == 3
    assert dev_db("stop", *d).stdout == "runrow dev-db: not running\n"
    url_when_stopped = dev_db("url", *d)
    assert url_when_stopped.stdout == url + "\n" and "not running" in url_when_stopped.stderr

    assert dev_db("start", *d).returncode == 0  # a restart on the kept data
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT x FROM kept").fetchall() == [(42,)]
    assert dev_db("stop", *d).returncode == 0


@pytest.mark.slow
def test_a_killed_keeper_takes_its_server_along_and_the_next_start_recovers(base: Path) -> None:
    d = ("--data-dir", str(base))
    assert dev_db("start", *d).returncode == 0
    keeper = _devdb.status(base)["pid"]
    os.kill(keeper, signal.SIGKILL)
    wait_until(lambda: servers_for(base / "data") == [], 30, "the server to follow its keeper")
    assert dev_db("status", *d).returncode == 3
    restarted = dev_db("start", *d, "--json")
    assert restarted.returncode == 0, restarted.stderr
    with psycopg.connect(_devdb.url_for(base), autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert dev_db("stop", *d).returncode == 0


def test_a_server_that_cannot_start_is_one_line(base: Path) -> None:
    long = base / ("x" * 100)  # too long for a Unix socket path
    out = dev_db("start", "--data-dir", str(long))
    assert out.returncode == 2
    assert len(out.stderr.splitlines()) == 1 and "longer than the 107 bytes" in out.stderr, out.stderr


def test_the_default_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNROW_DEV_DB_DIR", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", "/home/ann")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert _devdb.default_dir() == Path("/home/ann/.local/share/runrow/dev-db")
    monkeypatch.setenv("XDG_DATA_HOME", "/data")
    assert _devdb.default_dir() == Path("/data/runrow/dev-db")
    # root's server runs as another account, which cannot enter root's home
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert _devdb.default_dir() == Path("/var/tmp/runrow-dev-db-root")
    monkeypatch.setenv("RUNROW_DEV_DB_DIR", "/srv/db")
    assert _devdb.default_dir() == Path("/srv/db")


def test_the_export_line_survives_a_shell() -> None:
    url = _devdb.url_for(Path("/var/tmp/a b&c"))
    line = _devdb.export_line(url)
    assert shlex.split(line) == ["export", f"DATABASE_URL={url}"]
