"""The SQL under sql/: every file parses, every statement renders, every name used exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import runrow
from runrow import _sql

ROOT = Path(__file__).resolve().parents[1]


def test_every_statement_renders_for_an_awkward_schema() -> None:
    names = _sql.statements()
    assert len(names) > 20
    for name in names:
        if "{partition}" in _sql.statements()[name]:  # (a journal partition's DDL)
            rendered = _sql.partition_statement(name, 'We"ird', 'run_event_"x').decode()
            assert "{partition}" not in rendered and '"run_event_""x"' in rendered
        else:
            rendered = _sql.statement(name, 'We"ird').decode()
        assert "{schema}" not in rendered
        if "{schema}" in _sql.statements()[name]:
            assert '"We""ird"' in rendered


def test_every_statement_the_code_asks_for_exists() -> None:
    used: set[str] = set()
    for path in (ROOT / "src" / "runrow").rglob("*.py"):
        used |= set(re.findall(r"""(?:statement|positional)\(\s*["']([a-z_0-9]+)["']""", path.read_text()))
    assert used, "expected the code to name statements"
    missing = used - set(_sql.statements())
    assert not missing, f"statements used by the code but not in sql/: {missing}"
    unused = set(_sql.statements()) - used
    assert not unused, f"statements in sql/ that no code uses: {unused}"


def test_statements_convert_to_positional_placeholders() -> None:
    """The claim and finalize run as positional statements on raw cursors (psycopg would
    parse them again on every call: they are over its 4 KB cache limit). Every statement
    written with named placeholders only converts, each name to one $n, and a schema name
    holding a % is never read as a placeholder."""
    converted = 0
    for name, text in _sql.statements().items():
        if "{partition}" in text:  # (DDL for one journal partition: never positional)
            continue
        if re.search(r"%\([a-z_0-9]+\)[^s]", text):  # a binary placeholder: stays named
            with pytest.raises(ValueError, match=r"only %\(name\)s"):
                _sql.positional(name, "s")
            continue
        found = _sql.positional(name, "a%(b)s")
        assert set(found.names) == set(re.findall(r"%\(([a-z_0-9]+)\)s", text)), name
        assert len(found.names) == len(set(found.names)), name
        query = found.query.decode()
        assert '"a%(b)s"' in query or "{schema}" not in text, name
        assert "%(" not in query.replace('"a%(b)s"', ""), name
        for i in range(1, len(found.names) + 1):
            assert f"${i}" in query, name
        assert found.bind({n: n for n in reversed(found.names)}) == found.names
        converted += 1
    assert converted > 20
    hot = [len(_sql.statement(name, "runrow")) for name in ("claim", "finalize")]
    assert max(hot) > 4096, "the claim and finalize fit psycopg's cache now: positional is not needed"


def test_a_variant_switches_off_only_fragments_that_have_an_off_form() -> None:
    """``positional(..., off=...)`` writes each named fragment's ``_off`` form in its
    place; a name without one, or one the statement does not take, is refused."""
    assert _sql.fragments()["version_open_off"] == "true"
    full = _sql.positional("claim", "s")
    off = _sql.positional("claim", "s", frozenset({"version_open"}))
    assert "run_step" in full.query.decode() and "run_step" not in off.query.decode()
    with pytest.raises(ValueError, match="no fragment"):
        _sql.positional("claim", "s", frozenset({"live_status"}))
    with pytest.raises(ValueError, match="takes none"):
        _sql.positional("heartbeat", "s", frozenset({"limits_open"}))
    with pytest.raises(KeyError, match="nope"):
        _sql.positional("nope", "s", frozenset({"limits_open"}))


def test_duplicate_names_are_rejected() -> None:
    with pytest.raises(RuntimeError, match="defined twice"):
        _sql._parse("-- name: a\nSELECT 1\n-- name: a\nSELECT 2\n", "x.sql")


def test_every_fragment_is_used_and_every_placeholder_is_one() -> None:
    """Fragments (``-- fragment: name``, taken as ``{name}``) are written out at load:
    none is left unused, no statement keeps a ``{name}`` other than ``{schema}``, and an
    unknown one is refused when the statements load."""
    raw = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "sql").glob("*.sql"))
    fragments = _sql.fragments()
    assert "live_status" in fragments
    for name in fragments:
        used = name.removesuffix("_off")  # (a fragment's off form is used where it is)
        assert f"{{{used}}}" in raw, f"the fragment {name!r} is used by no statement"
    for name, text in _sql.statements().items():
        # (and {partition}: the one other identifier, for a journal partition's DDL)
        assert set(re.findall(r"\{([a-z_0-9]+)\}", text)) <= {"schema", "partition"}, name
    with pytest.raises(RuntimeError, match="no SQL fragment named 'nope'"):
        _sql._expand("s", "SELECT {nope} FROM {schema}.t", fragments)
    assert _sql._expand("s", "WHERE status IN {live_status}", fragments) == (
        f"WHERE status IN {fragments['live_status']}"
    )


def test_no_statement_spells_a_fragment_by_hand() -> None:
    """A fragment's text appears in the statements only where they take it: a copy
    written out by hand (which could drift from the fragment) fails here."""
    files = sorted((ROOT / "sql").glob("*.sql"))
    for name, body in _sql.fragments().items():
        if name.endswith("_off"):
            continue  # (a fragment switched off is trivial text, `true` say)
        squeezed = "".join(body.split())  # (blanks apart, as the server reads it)
        for path in files:
            parsed = _sql._parse(path.read_text(encoding="utf-8"), path.name)
            for statement, text in parsed.statements.items():
                assert squeezed not in "".join(text.split()), (
                    f"{path.name}: {statement} spells {name!r} by hand"
                )


def test_migrations_are_numbered_in_order() -> None:
    """From 1, strictly increasing; a number another branch took may be missing until it
    lands (see _sql.migrations), never more than a few."""
    versions = [v for v, _, _ in _sql.migrations()]
    assert versions[0] == 1 and versions == sorted(set(versions))
    assert len(versions) >= versions[-1] - 2
    assert runrow.latest_version() == versions[-1]


# -- one SQL gateway: only runrow/_gateway loads statements ----------------------------

# Allowed to name _sql: the loader itself, the gateway, and this file (it tests the loader).
_SQL_ALLOWED = ("src/runrow/_sql.py", "src/runrow/_gateway/", "tests/test_sql_catalogue.py")


def _references_sql(source: str, module: str) -> list[int]:
    """Lines of ``source`` (the module ``module``) that import or name ``runrow._sql``,
    however deep in a function: ``import runrow._sql``, ``from runrow import _sql``,
    ``from .. import _sql``, ``from runrow._sql import x``, ``runrow._sql.statement``."""
    package = module.rpartition(".")[0]
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            if any(a.name == "runrow._sql" or a.name.startswith("runrow._sql.") for a in node.names):
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            if base == "runrow._sql" or (base == "runrow" and any(a.name == "_sql" for a in node.names)):
                lines.append(node.lineno)
        elif isinstance(node, ast.Attribute) and node.attr == "_sql":
            lines.append(node.lineno)
    return lines


def _sql_offenders() -> list[str]:
    found = []
    for top in ("src/runrow", "tests", "bench"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(_SQL_ALLOWED):
                continue
            parts = path.relative_to(ROOT / "src" if top == "src/runrow" else ROOT).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            if path.name == "__init__.py":
                module += ".__init__"  # (its relative imports resolve against itself)
            found += [f"{rel}:{line}" for line in _references_sql(path.read_text(encoding="utf-8"), module)]
    return found


def test_the_gateway_check_sees_every_way_to_reach_sql() -> None:
    forms = {
        "import runrow._sql\n": "tests.x",
        "import runrow._sql as s\n": "tests.x",
        "from runrow import _json, _sql\n": "tests.x",
        "from runrow._sql import statement\n": "bench.x",
        "import runrow\nrunrow._sql.statement('a', 's')\n": "tests.x",
        "def f():\n    from .. import _sql\n": "runrow._engine.x",
        "from . import _sql\n": "runrow.x",
        "from ._sql import render\n": "runrow.x",
    }
    for source, module in forms.items():
        assert _references_sql(source, module), source
    for source, module in {
        "from runrow._gateway import statement_text\n": "tests.x",
        "from . import _json\n": "runrow.x",
        "from ._gateway import _exec\n": "runrow.x",
    }.items():
        assert not _references_sql(source, module), source


def test_only_the_gateway_reaches_sql() -> None:
    offenders = _sql_offenders()
    assert not offenders, f"only runrow/_gateway may use runrow._sql: {offenders}"


def test_no_statement_that_may_recheck_a_row_looks_up_a_journal_by_a_per_row_run_id() -> None:
    """A statement that updates, deletes or locks rows may recheck one a concurrent
    transaction changed (EvalPlanQual), and PostgreSQL 18 initialises every subplan of
    the statement again for that: a journal lookup by a run id known only row by row is
    a scan whose pruning runs as it goes, and initialising it twice corrupted the
    server's memory (it crashed under concurrent claims). Such statements read a run's
    journal through journal_last_seq and journal_uncertain_tool_calls (migration 0025),
    whose lookups run in an executor of their own."""
    per_row = re.compile(r"run_ms\(\w+\.run_id\)\s*=\s*\S*run_ms\(\w+\.\w+\)")
    rechecks = re.compile(r"\b(UPDATE|DELETE|FOR (NO KEY )?UPDATE|FOR (KEY )?SHARE)\b")
    found = [n for n, text in _sql.statements().items() if per_row.search(text) and rechecks.search(text)]
    assert found == []
    # (The pattern itself is live: the read-only statements still use it.)
    assert any(per_row.search(text) for text in _sql.statements().values())
