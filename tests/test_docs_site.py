"""The built documentation site, read as a reader gets it: the HTML mkdocs writes.

A page can build strictly and still render wrong: a list that stays raw ``*`` text, a
paragraph replaced by a code snippet, a diagram whose folder was excluded from the site.
These tests build the site once per session and read every page's rendered text (outside
code blocks) and every link and image in it. Each check is also fed a known-bad snippet,
so it is shown able to fail. Skipped, saying why, where the ``docs`` extra is missing.
"""

from __future__ import annotations

import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

# The slow tier: the documentation site, built by mkdocs.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# Sources under docs/ that are tooling, not the site: the diagrams' renderer and its
# sources (the site shows the SVGs it writes to docs/assets/diagrams/), and mkdocs' hooks.
NOT_SITE = ("diagrams/", "hooks.py")

# Where rendered text is prose (code blocks and inline code are left out below).
_PROSE = {"p", "li", "td", "th", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote"}
_NOT_TEXT = {"code", "pre", "script", "style", "svg", "kbd", "samp"}
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

_MARKDOWN = {
    "bold marker **": re.compile(r"\*\*\S"),
    "backtick pair": re.compile(r"`[^`\n]+`"),
    "Markdown link [text](url)": re.compile(r"\[[^\]\n]+\]\([^)\s]+\)"),
}
_LIST_MARKER = re.compile(r"(?:^|\n)\s*[*-] \S")
_CODE_LIKE = {
    "an import": re.compile(r"(?:^|\n)\s*(?:from [\w.]+ )?import [\w.{]"),
    "a JavaScript const": re.compile(r"\bconst \w+\s*="),
    "an arrow function": re.compile(r"=>\s*\{"),
    "an async def": re.compile(r"\basync def \w"),
}


class _Page(HTMLParser):
    """Collects a page's prose blocks (text outside code), links, images and ids."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.blocks: list[tuple[str, str]] = []  # (tag, text outside code)
        self._open: list[tuple[str, list[str]]] = []
        self.links: list[str] = []
        self.images: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(str(a["id"]))
        if tag == "a" and a.get("name"):
            self.ids.add(str(a["name"]))
        if tag == "a" and a.get("href") is not None:
            self.links.append(str(a["href"]))
        if tag == "img" and a.get("src") is not None:
            self.images.append(str(a["src"]))
        if tag in _VOID:
            return
        self.stack.append(tag)
        if tag in _PROSE:
            self._open.append((tag, []))

    def handle_endtag(self, tag: str) -> None:
        if tag not in self.stack:
            return
        while self.stack:
            top = self.stack.pop()
            if top in _PROSE and self._open:
                name, parts = self._open.pop()
                self.blocks.append((name, "".join(parts)))
            if top == tag:
                break

    def handle_data(self, data: str) -> None:
        if self._open and not _NOT_TEXT.intersection(self.stack):
            for _, parts in self._open:
                parts.append(data)


def parse(html: str) -> _Page:
    page = _Page()
    page.feed(html)
    page.close()
    return page


def markdown_left_raw(html: str) -> list[str]:
    """Markdown markers in rendered prose: what the Markdown converter did not convert."""
    problems = []
    for tag, text in parse(html).blocks:
        for what, pattern in _MARKDOWN.items():
            if m := pattern.search(text):
                problems.append(f"{what} in <{tag}>: {m.group(0)!r} in {text.strip()[:120]!r}")
        if tag == "p" and (m := _LIST_MARKER.search(text)):
            problems.append(f"a list marker in <p>: {m.group(0)!r} in {text.strip()[:120]!r}")
    return problems


def code_outside_code(html: str) -> list[str]:
    """Text in a paragraph that reads like source code: a snippet that lost its fence."""
    problems = []
    for tag, text in parse(html).blocks:
        if tag != "p":
            continue
        for what, pattern in _CODE_LIKE.items():
            if m := pattern.search(text):
                problems.append(f"{what} in <p>: {m.group(0).strip()!r} in {text.strip()[:120]!r}")
    return problems


def _target(site: Path, page: Path, url: str) -> tuple[Path, str] | None:
    """The built file (and anchor) a relative URL on ``page`` names; None for another host."""
    parts = urlsplit(url)
    if parts.scheme or parts.netloc or url.startswith(("mailto:", "data:", "javascript:")):
        return None
    if not parts.path:
        return page, unquote(parts.fragment)
    target = (page.parent / unquote(parts.path)).resolve()
    if parts.path.endswith("/") or target.is_dir():
        target = target / "index.html"
    if not target.is_relative_to(site.resolve()):
        return target, ""  # outside the site: reported as missing below
    return target, unquote(parts.fragment)


def _ids(page: Path, cache: dict[Path, set[str]]) -> set[str]:
    if page not in cache:
        cache[page] = parse(page.read_text(encoding="utf-8")).ids
    return cache[page]


def unresolved(site: Path, page: Path, cache: dict[Path, set[str]] | None = None) -> list[str]:
    """Images and internal links on ``page`` that name no built file, or no anchor in it
    (``cache`` keeps each target's ids across calls: the reference is large)."""
    cache = {} if cache is None else cache
    parsed = parse(page.read_text(encoding="utf-8"))
    problems = []
    for kind, urls in (("image", parsed.images), ("link", parsed.links)):
        for url in urls:
            found = _target(site, page, url)
            if found is None:
                continue
            target, anchor = found
            if not target.is_file() or not target.resolve().is_relative_to(site.resolve()):
                problems.append(f"{kind} {url!r}: no {target}")
            elif anchor and kind == "link" and target.suffix == ".html" and anchor not in _ids(target, cache):
                problems.append(f"link {url!r}: {target.name} has no id {anchor!r}")
    return problems


def left_out(docs: Path, site: Path) -> list[str]:
    """Files under ``docs`` (pages and assets, not tooling) that the build did not publish."""
    missing = []
    for src in sorted(p for p in docs.rglob("*") if p.is_file()):
        rel = src.relative_to(docs).as_posix()
        if rel.startswith(NOT_SITE) or "__pycache__" in rel:
            continue
        if src.suffix == ".md":
            stem = rel.removesuffix(".md")
            built = site / ("index.html" if stem == "index" else f"{stem.removesuffix('/index')}/index.html")
        else:
            built = site / rel
        if not built.is_file():
            missing.append(f"docs/{rel} is not in the site (no {built.relative_to(site)})")
    return missing


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once per session as CI builds it (.ci/docs)."""
    for module in ("mkdocs", "mkdocstrings", "material"):
        pytest.importorskip(module, reason=f"{module} is missing: pip install -e '.[docs]' to check the site")
    out = tmp_path_factory.mktemp("docs") / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _pages(site: Path) -> list[Path]:
    pages = sorted(p for p in site.rglob("*.html") if p.name != "404.html")
    assert len(pages) > 20, pages
    return pages


def test_no_page_shows_raw_markdown(site: Path) -> None:
    problems = [f"{p.relative_to(site)}: {x}" for p in _pages(site) for x in markdown_left_raw(p.read_text())]
    assert not problems, "\n".join(problems)


def test_no_paragraph_reads_like_code(site: Path) -> None:
    problems = [f"{p.relative_to(site)}: {x}" for p in _pages(site) for x in code_outside_code(p.read_text())]
    assert not problems, "\n".join(problems)


def test_every_image_and_internal_link_resolves(site: Path) -> None:
    ids: dict[Path, set[str]] = {}
    problems = [f"{p.relative_to(site)}: {x}" for p in _pages(site) for x in unresolved(site, p, ids)]
    assert not problems, "\n".join(problems)


def test_every_page_and_asset_under_docs_is_in_the_site(site: Path) -> None:
    problems = left_out(DOCS, site)
    assert not problems, "\n".join(problems)


# Each check, fed what it must catch (and what it must let through).


def test_the_markdown_check_catches_raw_markers() -> None:
    assert markdown_left_raw("<p>Promises:\n* one\n* two</p>")
    assert markdown_left_raw("<p>a <strong>b</strong> and **c**</p>")
    assert markdown_left_raw("<li>call `tail()` to read</li>")
    assert markdown_left_raw("<td>see [the guide](howto/x.md)</td>")
    assert markdown_left_raw("<p>- a dash list\n- that stayed text</p>")
    ok = "<p>a <code>**kwargs</code> and <code>`x`</code></p><pre><code>* item\n[a](b)</code></pre>"
    assert not markdown_left_raw(ok)
    assert not markdown_left_raw("<ul><li>one</li></ul><p>2 * 3 - 1 = 5</p>")


def test_the_code_check_catches_a_snippet_in_prose() -> None:
    assert code_outside_code("<p>import { useChat } from '@ai-sdk/react';</p>")
    assert code_outside_code("<p>const chat = useChat({ transport })</p>")
    assert code_outside_code("<p>onFinish: (m) => { save(m) }</p>")
    assert code_outside_code("<p>async def agent(run): ...</p>")
    assert not code_outside_code("<p>An agent is <code>async def agent(run)</code>; it imports nothing.</p>")
    assert not code_outside_code("<pre><code>import runrow\nconst x = 1</code></pre>")


def test_the_link_check_catches_missing_files_and_anchors(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "index.html").write_text('<h2 id="here">Here</h2>')
    (tmp_path / "img.svg").write_text("<svg/>")
    page = tmp_path / "index.html"
    page.write_text(
        '<a href="a/">ok</a><a href="a/#here">ok</a><img src="img.svg#only-light">'
        '<a href="https://example.com/">away</a><a href="#top" id="top">self</a>'
    )
    assert unresolved(tmp_path, page) == []
    page.write_text('<img src="assets/diagrams/x.svg"><a href="a/#gone">x</a><a href="b/">y</a>')
    problems = unresolved(tmp_path, page)
    assert len(problems) == 3, problems
    assert "image" in problems[0] and "gone" in problems[1] and "b/" in problems[2]


def test_the_exclusion_check_catches_an_unpublished_file(tmp_path: Path) -> None:
    docs, site = tmp_path / "docs", tmp_path / "site"
    for rel in ("index.md", "howto/x.md", "assets/d.svg", "diagrams/d.mmd", "hooks.py"):
        (docs / rel).parent.mkdir(parents=True, exist_ok=True)
        (docs / rel).write_text("x")
    for rel in ("index.html", "howto/x/index.html", "assets/d.svg"):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text("x")
    assert left_out(docs, site) == []
    (site / "assets" / "d.svg").unlink()
    (site / "howto" / "x" / "index.html").unlink()
    assert left_out(docs, site) == [
        "docs/assets/d.svg is not in the site (no assets/d.svg)",
        "docs/howto/x.md is not in the site (no howto/x/index.html)",
    ]


# Public modules whose every exported name the reference documents (read from their
# source, so the check needs none of their optional libraries).
REFERENCED = (
    "admin/__init__.py",
    "adapters/openai.py",
    "adapters/openai_agents.py",
    "adapters/pydantic_ai.py",
    "contrib/django/__init__.py",
    "embedded.py",
    "testing.py",
    "protocols/__init__.py",
)


def _exported(rel: str) -> tuple[str, list[str]]:
    import ast

    path = ROOT / "src" / "runrow" / rel
    module = "runrow." + rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            assert node.value is not None
            return module, list(ast.literal_eval(node.value))
    raise AssertionError(f"{rel} has no __all__")


def test_the_reference_has_an_entry_for_every_public_module(site: Path) -> None:
    ids = parse((site / "reference" / "index.html").read_text(encoding="utf-8")).ids
    missing = []
    for rel in REFERENCED:
        module, names = _exported(rel)
        missing += [f"{module}.{n}" for n in names if f"{module}.{n}" not in ids]
    assert not missing, f"the API reference has no entry for {missing}"
