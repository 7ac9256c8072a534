"""Renders each ``docs/diagrams/*.mmd`` into ``docs/assets/diagrams/<name>-{light,dark}.svg``.

The site shows diagrams as plain SVG images, so it loads no diagram script: it works
offline and without JavaScript. Run this after editing a ``.mmd`` file and commit the
SVGs; ``tests/test_docs.py`` fails when an SVG was rendered from another version of its
source (each SVG records its source's SHA-256).

Needs Node (``npm ci --prefix docs/diagrams`` installs Mermaid) and Chromium driven by
Playwright (the ``test`` extra; set ``RUNROW_CHROMIUM`` if Chromium is not on ``PATH``)::

    npm ci --prefix docs/diagrams && python docs/diagrams/render.py
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "assets" / "diagrams"
MERMAID = HERE / "node_modules" / "mermaid" / "dist" / "mermaid.min.js"
THEMES = {"light": "neutral", "dark": "dark"}


def source_stamp(text: str) -> str:
    """The comment an SVG carries to name the source it was rendered from."""
    return f"<!-- rendered from sha256:{hashlib.sha256(text.encode()).hexdigest()} -->"


async def _render(sources: dict[str, str]) -> dict[str, str]:
    from playwright.async_api import async_playwright

    chromium = os.environ.get("RUNROW_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    out: dict[str, str] = {}
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        page = await browser.new_page()
        await page.set_content("<!doctype html><html><body></body></html>")
        await page.add_script_tag(path=str(MERMAID))
        for name, text in sources.items():
            for variant, theme in THEMES.items():
                # htmlLabels off: labels are SVG text, which an <img> shows (HTML inside
                # foreignObject is not reliably drawn there).
                svg = await page.evaluate(
                    """async ([id, text, theme]) => {
                        mermaid.initialize({startOnLoad: false, theme, htmlLabels: false,
                                            flowchart: {htmlLabels: false}});
                        return (await mermaid.render(id, text)).svg;
                    }""",
                    [f"{name}-{variant}", text, theme],
                )
                out[f"{name}-{variant}.svg"] = f"{source_stamp(text)}\n{svg}\n"
        await browser.close()
    return out


def main() -> int:
    if not MERMAID.exists():
        print(f"no {MERMAID}: run `npm ci --prefix {HERE}` first", file=sys.stderr)
        return 2
    sources = {p.stem: p.read_text(encoding="utf-8") for p in sorted(HERE.glob("*.mmd"))}
    OUT.mkdir(parents=True, exist_ok=True)
    for file, svg in asyncio.run(_render(sources)).items():
        (OUT / file).write_text(svg, encoding="utf-8")
        print(f"wrote {OUT / file}")
    print(json.dumps({"diagrams": sorted(sources)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
