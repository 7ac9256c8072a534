"""examples/django/: the Django project's own tests (pytest-django), run in a subprocess
with its settings, against this session's database and a freshly migrated schema.

They cover runrow.contrib.django: an enqueue inside transaction.atomic() rolls back with
it (even as the block's first statement) or commits as exactly one run; the
runrow_worker command completes runs and drains on SIGTERM; runrow_migrate migrates a
fresh schema; the read-only admin lists runs. A subprocess, so that runrow's own suite
is never configured as a Django project.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import anyio
import pytest

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "django"


def _needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        reason = f"{module} is not installed: pip install -e '.[test,django]'"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Django tests, but {reason}")
        pytest.skip(reason)


@pytest.mark.timeout(600)
async def test_the_django_example_project_passes_its_tests(dsn: str, schema: str) -> None:
    _needs("django")
    _needs("pytest_django")
    env = {
        **os.environ,
        "DATABASE_URL": dsn,
        "RUNROW_SCHEMA": schema,
        "DJANGO_SETTINGS_MODULE": "exampleproject.settings",
    }
    env.pop("PYTEST_ADDOPTS", None)
    done = await anyio.run_process(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=EXAMPLE,
        env=env,
        check=False,
    )
    out = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 0, out
    assert re.search(r"\b9 passed", out) and "skipped" not in out, out
