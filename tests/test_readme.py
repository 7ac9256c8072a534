"""What the README says of the test suite stays true: how many tests skip without
Chromium, the Node packages and pgbouncer (it says the numbers next to its command)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _collected(*args: str) -> int:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    m = re.search(r"^(\d+)(?:/\d+)? tests? collected", out.stdout, re.M)
    assert m, out.stdout[-2000:]
    return int(m.group(1))


@pytest.mark.slow
def test_the_readme_counts_what_the_suite_skips() -> None:
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    counts = {
        "browser": _collected("-m", "browser"),
        "node": _collected("-m", "node"),
        "pgbouncer": _collected("tests/test_pgbouncer.py"),
    }
    said = {
        "browser": r"the (\d+) tests of the demo and the dashboard in a browser",
        "node": r"the (\d+) tests of the AI SDK's and AG-UI's own JavaScript clients",
        "pgbouncer": r"the (\d+) pgbouncer tests",
    }
    for what, pattern in said.items():
        m = re.search(pattern, readme)
        assert m, f"the README no longer says how many {what} tests skip: update this test"
        assert int(m.group(1)) == counts[what], (
            f"the README says {m.group(1)} {what} tests; there are {counts[what]}"
        )
