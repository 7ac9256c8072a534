"""Every Python code block under docs/ runs, against a real database.

The blocks of one page run in order in one namespace (like a notebook), with top-level
``await`` allowed and ``DATABASE_URL`` set to the test database, whose default
``runrow`` schema is freshly migrated for each page (and the host schema ``app``, which
the pages use for the host's own tables, starts empty). A block preceded by an HTML
comment ``<!-- no-test: reason -->`` is not run; keep those few and say why. A block (in
any language) preceded by ``<!-- file: path/from/the/repo.py -->`` shows that file: it must match the
file exactly, and is not run here (the file is a program of its own, and a test runs it,
e.g. tests/test_quickstart.py runs examples/quickstart/).
"""

from __future__ import annotations

import ast
import inspect
import linecache
import re
from pathlib import Path

import anyio
import psycopg
import pytest

import runrow

pytestmark = pytest.mark.anyio

DOCS = Path(__file__).resolve().parents[1] / "docs"
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[^\n]*$")
NO_TEST = re.compile(r"^<!--\s*no-test:\s*(?P<reason>\S.*?)\s*-->\s*$")
FILE = re.compile(r"^<!--\s*file:\s*(?P<path>\S+)\s*-->\s*$")
MAX_NO_TEST = 6


class Block:
    def __init__(self, path: Path, line: int, code: str, skip: str | None, file: str | None = None) -> None:
        self.path, self.line, self.code, self.skip, self.file = path, line, code, skip, file

    def __repr__(self) -> str:
        return f"{self.path.relative_to(DOCS)}:{self.line}"


def python_blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group("lang")
        i += 1
        body = []
        while i < len(lines) and not lines[i].strip().startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1
        prev = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        file = FILE.match(prev.strip())
        if lang not in ("python", "py"):
            if file:  # another language's file (the JavaScript clients): shown, checked, not run
                blocks.append(Block(path, start + 1, "\n".join(body), None, file.group("path")))
            continue
        assert not m.group("indent"), f"{path}:{start + 1}: indented python blocks are not run; dedent it"
        skip = NO_TEST.match(prev.strip())
        blocks.append(
            Block(
                path,
                start + 1,
                "\n".join(body),
                skip.group("reason") if skip else None,
                file.group("path") if file else None,
            )
        )
    return blocks


def _pages() -> list[Path]:
    """The site's pages: every ``.md`` under docs/ but the diagrams' tooling (whose
    ``node_modules`` holds other projects' READMEs once Mermaid is installed)."""
    return sorted(p for p in DOCS.rglob("*.md") if "diagrams" not in p.relative_to(DOCS).parts)


PAGES = [p for p in _pages() if python_blocks(p)]


def test_the_docs_have_runnable_snippets_and_few_exceptions() -> None:
    blocks = [b for p in PAGES for b in python_blocks(p)]
    skipped = [b for b in blocks if b.skip]
    assert len(blocks) >= 15, "expected the docs to show code"
    assert len(skipped) <= MAX_NO_TEST, f"too many no-test blocks: {skipped}"


async def _schemas(dsn: str) -> set[str]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT nspname FROM pg_namespace")
        return {r[0] for r in await cur.fetchall()}


async def _drop(dsn: str, schemas: set[str]) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for name in sorted(schemas):
            await conn.execute(
                psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(psycopg.sql.Identifier(name))
            )


async def _reset_default_schema(dsn: str) -> None:
    await _drop(dsn, {"runrow", "app"})
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("CREATE SCHEMA app")
    await runrow.migrate(dsn)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
async def test_page_snippets_run(page: Path, dsn: str) -> None:
    existing = await _schemas(dsn) - {"runrow", "app"}
    await _reset_default_schema(dsn)
    namespace: dict[str, object] = {"__name__": "__docs__", "DATABASE_URL": dsn}
    try:
        for block in python_blocks(page):
            if block.skip or block.file:
                continue
            # Tracebacks name the page and its line numbers, and show its lines.
            name = f"docs/{page.relative_to(DOCS)}"
            text = page.read_text(encoding="utf-8")
            linecache.cache[name] = (len(text), None, text.splitlines(keepends=True), name)
            source = "\n" * block.line + block.code
            code = compile(source, name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
            with anyio.fail_after(60):
                result = eval(code, namespace)  # the docs own code
                if inspect.isawaitable(result):
                    await result
    finally:
        # Whatever the page created (the default schema, app, and any other) goes.
        await _drop(dsn, await _schemas(dsn) - existing)


FILE_BLOCKS = [b for p in PAGES for b in python_blocks(p) if b.file]


@pytest.mark.parametrize("block", FILE_BLOCKS, ids=[f"{b!r}:{b.file}" for b in FILE_BLOCKS])
def test_a_block_that_shows_a_file_matches_it(block: Block) -> None:
    assert block.file is not None
    path = DOCS.parent / block.file
    assert path.is_file(), f"{block!r} shows {block.file}, which does not exist"
    assert block.code == path.read_text(encoding="utf-8").rstrip("\n"), (
        f"{block!r} differs from {block.file}: paste the file into the page again"
    )


@pytest.mark.slow  # (mkdocs builds the whole site)
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """What CI runs (.ci/docs); skipped where the docs extra is not installed."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=DOCS.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    site = tmp_path / "site"
    pages = {p: p.read_text(encoding="utf-8") for p in site.rglob("*.html")}
    assert len(pages) > 10
    role = re.compile(r":(?:class|func|meth|attr|exc|data|mod|obj):(?:<code>|`)")
    for path, html in pages.items():
        # A docstring's Sphinx role shows as raw text unless the build turns it into a link.
        assert not role.search(html), f"{path.relative_to(site)} shows a raw Sphinx role: {role.search(html)}"
        # Offline: nothing is fetched from another host (no web fonts, no CDN scripts).
        external = re.findall(r"""<(?:link|script)[^>]+(?:href|src)=["'](https?://[^"']+)""", html)
        assert not external, f"{path.relative_to(site)} fetches {external}"
        # The issue tracker's numbers mean nothing to a reader.
        assert not re.search(r"\(#\d+\)|issue #\d+", html), (
            f"{path.relative_to(site)} cites an internal issue"
        )
    reference = pages[site / "reference" / "index.html"]
    # A role in a docstring became a link to what it names.
    assert re.search(r'<a[^>]+href="#runrow\.InvalidInput"', reference), (
        "no cross-reference links to InvalidInput"
    )


def test_every_diagram_is_an_svg_rendered_from_its_current_source() -> None:
    """Diagrams are pre-rendered SVG images (docs/diagrams/render.py), so the site loads no
    diagram script from a CDN. An edited ``.mmd`` whose SVGs were not rendered again, a
    page that still holds a ``mermaid`` block, or a page that shows a diagram with no
    source fails here."""
    import hashlib

    sources = sorted((DOCS / "diagrams").glob("*.mmd"))
    assert sources
    shown = "\n".join(p.read_text(encoding="utf-8") for p in _pages())
    assert "```mermaid" not in shown, "a page holds a mermaid block: move it to docs/diagrams/"
    for src in sources:
        digest = hashlib.sha256(src.read_bytes()).hexdigest()
        for variant in ("light", "dark"):
            svg = DOCS / "assets" / "diagrams" / f"{src.stem}-{variant}.svg"
            assert svg.exists(), f"{svg} is missing: run docs/diagrams/render.py"
            head = svg.read_text(encoding="utf-8").splitlines()[0]
            assert head == f"<!-- rendered from sha256:{digest} -->", (
                f"{svg.name} was rendered from another version of {src.name}: run docs/diagrams/render.py"
            )
            assert f"assets/diagrams/{svg.name}#only-{variant}" in shown, f"no page shows {svg.name}"
    for svg in (DOCS / "assets" / "diagrams").glob("*.svg"):
        assert (DOCS / "diagrams" / f"{svg.stem.rsplit('-', 1)[0]}.mmd").exists(), f"{svg.name} has no source"


def test_every_test_the_docs_cite_exists() -> None:
    """The guarantees page (and any page) cites tests as ``test_file.py::test_name``, and
    names after it in the same cell as bare ``test_name``: each must still exist there,
    so a test that moves or is renamed takes its citation along."""
    tests = DOCS.parent / "tests"
    defined: dict[str, set[str]] = {}
    for path in tests.rglob("test_*.py"):
        names = {
            n.name
            for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        defined.setdefault(path.name, set()).update(names)
    cited = 0
    for page in _pages():
        for line in page.read_text(encoding="utf-8").splitlines():
            for cell in line.split("|"):
                current = None
                for m in re.finditer(r"`(?:(test_\w+\.py)::)?(test_\w+)(?:\[[^\]]*\])?`", cell):
                    current = m.group(1) or current
                    if current is None:
                        continue
                    cited += 1
                    assert m.group(2) in defined.get(current, set()), (
                        f"{page.name}: {current}::{m.group(2)} does not exist"
                    )
    assert cited > 50
