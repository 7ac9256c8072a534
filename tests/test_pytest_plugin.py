"""runrow's pytest plugin as an agent author's project meets it: in a pytest of its own.

The sample project ``examples/agent-testing`` is copied to a temporary folder and run
with ``python -m pytest`` in a subprocess. The plugin loads as pip installs it, through
the ``pytest11`` entry point; where this checkout is on ``PYTHONPATH`` without being
installed (no entry point), ``-p runrow.pytest_plugin`` loads the same module.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import pytest

from runrow.pytest_plugin import URL_ENV

# The slow tier: each test runs pytest on a sample project, which starts its servers.
pytestmark = pytest.mark.slow

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "examples" / "agent-testing"
SAMPLE_TESTS = SAMPLE / "tests" / "test_weather_agent.py"
FIXTURES = {"runrow_database_url", "runrow_schema", "runrow_dispatcher", "runrow_run_agent"}


def _sample_test_count() -> int:
    tree = ast.parse(SAMPLE_TESTS.read_text(encoding="utf-8"))
    return sum(
        isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name.startswith("test_")
        for n in tree.body
    )


def _plugin_args() -> list[str]:
    installed = any(
        ep.value == "runrow.pytest_plugin" for ep in importlib.metadata.entry_points(group="pytest11")
    )
    return [] if installed else ["-p", "runrow.pytest_plugin"]


def _pytest(project: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in (URL_ENV, "PYTEST_ADDOPTS")}
    environ["PYTHONPATH"] = str(ROOT / "src")  # this checkout's runrow
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *_plugin_args(), *args],
        cwd=project,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    project = tmp_path / "agent-testing"
    shutil.copytree(SAMPLE, project, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    return project


def _test_schemas(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'runrow\\_test\\_%'"
        ).fetchall()
    return [r[0] for r in rows]


def test_the_entry_point_names_the_plugin() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["entry-points"]["pytest11"] == {"runrow": "runrow.pytest_plugin"}


def test_the_sample_passes_on_the_database_it_is_given(sample: Path, dsn: str) -> None:
    out = _pytest(sample, env={URL_ENV: dsn})
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{_sample_test_count()} passed" in out.stdout, out.stdout
    assert _test_schemas(dsn) == []  # each test's schema was dropped after it


def test_a_wrong_expectation_about_the_journal_fails(sample: Path, dsn: str) -> None:
    tests = sample / "tests" / "test_weather_agent.py"
    right = '["user_message_created", "run_queued", "content_delta", "complete"]'
    text = tests.read_text(encoding="utf-8")
    assert right in text, "the sample's first test changed; update this test"
    tests.write_text(
        text.replace(right, '["user_message_created", "run_queued", "complete"]'), encoding="utf-8"
    )
    out = _pytest(sample, "-k", "test_it_streams_the_answer", env={URL_ENV: dsn})
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 failed" in out.stdout, out.stdout
    assert "'content_delta'" in out.stdout  # pytest's report shows what the journal held
    assert _test_schemas(dsn) == []  # a failed test's schema goes too


def test_a_wrong_expectation_about_the_transcript_fails(sample: Path, dsn: str) -> None:
    (sample / "tests" / "test_wrong.py").write_text(
        "import pytest\n"
        "from weather_agent import make_agent\n"
        "from runrow.testing import ScriptedModel\n\n\n"
        "@pytest.mark.anyio\n"
        "async def test_expects_another_answer(runrow_run_agent):\n"
        "    result = await runrow_run_agent(make_agent(ScriptedModel(['Hello!'])), 'hi')\n"
        "    assert result.transcript[-1].content == 'Goodbye!'\n",
        encoding="utf-8",
    )
    out = _pytest(sample, "tests/test_wrong.py", env={URL_ENV: dsn})
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 failed" in out.stdout and "assert 'Hello!' == 'Goodbye!'" in out.stdout, out.stdout


def test_a_run_that_fails_shows_the_agents_traceback_in_the_failing_test(sample: Path, dsn: str) -> None:
    (sample / "tests" / "test_broken.py").write_text(
        "import pytest\n\n\n"
        "def look_up(city):\n"
        "    return {'Paris': 'sunny'}[city]\n\n\n"
        "async def broken_agent(run):\n"
        "    await run.text(look_up(run.content))\n\n\n"
        "@pytest.mark.anyio\n"
        "async def test_expects_it_to_complete(runrow_run_agent):\n"
        "    result = await runrow_run_agent(broken_agent, 'Oslo')\n"
        "    assert result.traceback is not None and 'in look_up' in result.traceback\n"
        "    assert result.status == 'completed'\n",
        encoding="utf-8",
    )
    out = _pytest(sample, "tests/test_broken.py", env={URL_ENV: dsn})
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 failed" in out.stdout, out.stdout
    # The report shows where the agent failed, as a traceback, not just "KeyError: 'Oslo'".
    report = out.stdout
    assert "Traceback (most recent call last):" in report, report
    assert "in broken_agent" in report and "in look_up" in report, report
    assert "return {'Paris': 'sunny'}[city]" in report, report


@pytest.fixture
def server_tmp() -> Iterator[Path]:
    """A temporary folder (TMPDIR) for the subprocess alone, so that its servers can be
    told from others on the machine; world-traversable, as the server's account needs
    under root."""
    folder = Path(tempfile.mkdtemp(prefix="runrow-plugin-test-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _servers(folder: Path) -> list[int]:
    """Pids of live postgres processes whose command line names ``folder``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if b"postgres" in cmd and str(folder).encode() in cmd and state != "Z":
                found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_without_a_database_the_plugin_runs_a_private_server_for_the_session(
    sample: Path, server_tmp: Path
) -> None:
    (sample / "tests" / "test_server.py").write_text(
        "import os\n\n\n"
        "def test_the_server_lives_in_tmpdir(runrow_database_url):\n"
        "    assert os.environ['TMPDIR'] in runrow_database_url.replace('%2F', '/')\n",
        encoding="utf-8",
    )
    out = _pytest(sample, "-k", "streams or tool or server", env={"TMPDIR": str(server_tmp)})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 passed" in out.stdout, out.stdout
    assert _servers(server_tmp) == []  # stopped at the session's end
    assert list(server_tmp.iterdir()) == []  # and its folder removed


def test_loading_the_plugin_starts_nothing_and_its_fixtures_are_prefixed(
    tmp_path: Path, server_tmp: Path
) -> None:
    (tmp_path / "test_plain.py").write_text(
        "import sys\n\n\n"
        "def test_nothing_of_runrow_s_testing_was_loaded():\n"
        "    assert 'runrow.pytest_plugin' in sys.modules\n"
        "    assert 'runrow.embedded' not in sys.modules and 'runrow.testing' not in sys.modules\n",
        encoding="utf-8",
    )
    out = _pytest(tmp_path, env={"TMPDIR": str(server_tmp)})
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout + out.stderr
    assert list(server_tmp.iterdir()) == [] and _servers(server_tmp) == []

    listing = _pytest(tmp_path, "--fixtures").stdout
    section = listing.split("fixtures defined from runrow.pytest_plugin", 1)[1].split("\n---", 1)[0]
    names = set(re.findall(r"^(\w+)(?: \[\w+ scope\])? -- ", section, re.M))
    assert names == FIXTURES, section  # a name a host's conftest might use would clash
    assert "--runrow-database-url" in _pytest(tmp_path, "--help").stdout
