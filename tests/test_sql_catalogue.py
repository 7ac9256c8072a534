"""The SQL under sql/: every file parses, every statement renders, every name used exists."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import runrow
from runrow import _sql

ROOT = Path(__file__).resolve().parents[1]


def test_every_statement_renders_for_an_awkward_schema() -> None:
    names = _sql.statements()
    assert len(names) > 20
    for name in names:
        rendered = _sql.statement(name, 'We"ird').decode()
        assert "{schema}" not in rendered
        if "{schema}" in _sql.statements()[name]:
            assert '"We""ird"' in rendered


def test_every_statement_the_code_asks_for_exists() -> None:
    used: set[str] = set()
    for path in (ROOT / "src" / "runrow").rglob("*.py"):
        used |= set(re.findall(r"""statement\(\s*["']([a-z_0-9]+)["']""", path.read_text()))
    assert used, "expected the code to name statements"
    missing = used - set(_sql.statements())
    assert not missing, f"statements used by the code but not in sql/: {missing}"
    unused = set(_sql.statements()) - used
    assert not unused, f"statements in sql/ that no code uses: {unused}"


def test_duplicate_names_are_rejected() -> None:
    with pytest.raises(RuntimeError, match="defined twice"):
        _sql._parse("-- name: a\nSELECT 1\n-- name: a\nSELECT 2\n", "x.sql")


def test_migrations_are_numbered_without_gaps() -> None:
    versions = [v for v, _, _ in _sql.migrations()]
    assert versions == list(range(1, len(versions) + 1))
    assert runrow.latest_version() == len(versions)


@pytest.mark.slow
def test_wheel_carries_every_sql_file(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = tmp_path.glob("runrow-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"runrow/sql/{p.relative_to(ROOT / 'sql').as_posix()}" for p in (ROOT / "sql").rglob("*.sql")}
    assert expected, "no sql files found in the checkout"
    assert expected <= names, f"missing from the wheel: {sorted(expected - names)}"
    assert "runrow/py.typed" in names
