"""docs/quickstart.md, run as a user runs it: from a folder holding only the quickstart's
files, with the page's own commands, in real processes. ``runrow dev-db`` keeps its server
in a folder under /var/tmp (``RUNROW_DEV_DB_DIR``, as the page says), so the commands stay
exactly as written; ``runrow`` is this checkout's command.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from .test_embedded import servers_for

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "quickstart.md").read_text(encoding="utf-8")
EXAMPLE = ROOT / "examples" / "quickstart"

START = 'eval "$(runrow dev-db start)"'
MIGRATE = "runrow migrate"
WORKER = "runrow worker myapp.agents:agent"
ASK = 'python ask.py "hello"'
ONE_PROCESS = "python one_process.py"
STOP = "runrow dev-db stop"


@pytest.mark.slow
def test_the_quickstart_runs_as_written(tmp_path: Path) -> None:
    for command in (START, MIGRATE, WORKER, ASK, ONE_PROCESS, STOP):
        assert command in PAGE, f"the quickstart no longer says {command!r}; update this test"

    project = tmp_path / "myproject"  # an empty folder, then the page's files
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("__pycache__"))
    bin_dir = tmp_path / "bin"  # `runrow` and `python` as an activated virtualenv has them
    bin_dir.mkdir()
    for name, command in (("runrow", f"{sys.executable} -m runrow.cli"), ("python", sys.executable)):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {command} "$@"\n')
        (bin_dir / name).chmod(0o755)
    data = Path("/var/tmp") / f"runrow-test-qs-{uuid.uuid4().hex[:8]}"
    env = {
        **{k: v for k, v in os.environ.items() if k != "DATABASE_URL"},
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT / "src"),
        "RUNROW_DEV_DB_DIR": str(data),
    }

    def sh(script: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            ["sh", "-ec", script],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert out.returncode == 0, f"{script}\n{out.stdout}\n{out.stderr}"
        return out

    worker = None
    try:
        # 1. a database; the URL it exports is what every later step uses
        env["DATABASE_URL"] = sh(f'{START}\nprintf %s "$DATABASE_URL"').stdout
        assert env["DATABASE_URL"].startswith("postgresql:///postgres?host=")
        assert "applied [1," in sh(MIGRATE).stdout
        # 4. a worker in one shell, the script in another
        worker = subprocess.Popen(
            ["sh", "-ec", f"exec {WORKER}"],
            cwd=project,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert worker.stdout is not None
        assert " ready " in worker.stdout.readline()
        asked = sh(ASK, timeout=60).stdout.splitlines()
        assert asked[0].startswith("enqueued ") and asked[0].endswith(" queued")
        kinds = [line.split()[1] for line in asked[1:-1]]
        assert kinds[:3] == ["user_message_created", "run_queued", "thinking"], asked
        assert "content_delta" in kinds and kinds[-1] == "complete" and "'completed'" in asked[-2]
        assert asked[-1] == "transcript: [('user', 'hello'), ('assistant', \"You said 'hello'.\")]"
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, err
        assert out.splitlines()[-1].startswith("runrow worker stopped: 0 finished")
        # 5. everything in one process
        assert sh(ONE_PROCESS, timeout=60).stdout.splitlines()[-1] == "the agent answered: You said 'hello'."
        # stop; the data stays for the next start
        assert sh(STOP).stdout == "runrow dev-db: stopped\n"
        assert servers_for(data / "data") == []
        assert "applied nothing" in sh(f"{START}\n{MIGRATE}\n{STOP}").stdout
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.communicate()
        subprocess.run(
            [sys.executable, "-m", "runrow.cli", "dev-db", "stop"], env=env, check=False, timeout=60
        )
        for pid in servers_for(data / "data"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(data, ignore_errors=True)
