"""The demo's web page in a real browser: Playwright driving the system's Chromium, headless.

Skips (saying why) when Playwright or Chromium is missing, except when the CI variable is
set: then a missing browser fails the test, so CI cannot skip it silently. Screenshots go
to tests/artifacts/ (ignored by git). ``RUNROW_CHROMIUM`` points at another binary.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from runrow.demo import answer_for

from .demo_support import serve_demo

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.anyio

ARTIFACTS = Path(__file__).parent / "artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",  # the tests may run as root, where Chromium's sandbox cannot start
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-sync",
    "--no-first-run",
    "--mute-audio",
]


def _chromium() -> str:
    reason = None
    path = os.environ.get("RUNROW_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        reason = "the playwright package is not installed (pip install -e '.[test]')"
    if reason is None and not os.access(path, os.X_OK):
        reason = f"no Chromium at {path} (Debian: apt-get install chromium; or set RUNROW_CHROMIUM)"
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"browser test cannot run in CI: {reason}")
        pytest.skip(reason)
    return path


@pytest.fixture
async def page() -> AsyncIterator[Any]:
    executable = _chromium()
    from playwright.async_api import async_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            context = await browser.new_context(viewport={"width": 1100, "height": 800})
            page = await context.new_page()
            page.set_default_timeout(15_000)
            yield page
        finally:
            await browser.close()


async def _turns(page: Any) -> list[dict[str, str]]:
    return await page.evaluate(  # type: ignore[no-any-return]
        """() => [...document.querySelectorAll('.turn')].map(t => ({
            run_id: t.dataset.runId,
            user: t.querySelector('.user').textContent,
            status: t.querySelector('.status').textContent,
            answer: t.querySelector('.answer').textContent,
        }))"""
    )


async def _wait_for(page: Any, js: str, arg: Any = None, timeout: float = 20.0) -> None:
    await page.wait_for_function(js, arg=arg, timeout=timeout * 1000)


async def test_reload_mid_answer_resumes_without_gap_or_duplicate(page: Any, dsn: str, schema: str) -> None:
    question = "hello from the browser"
    expected = answer_for(question)
    async with serve_demo(dsn, schema, token_delay=0.04) as base:
        await page.goto(f"{base}/?user=alice&conversation=browser-1")
        await page.fill("#composer", question)
        await page.click("#send")
        # Mid-answer: some words shown, the run still going.
        await _wait_for(
            page,
            """() => { const a = document.querySelector('.turn .answer');
                       return a && a.textContent.split(' ').length >= 8
                           && document.querySelector('.turn .status').textContent === 'running'; }""",
        )
        [before] = await _turns(page)
        assert before["status"] == "running" and 0 < len(before["answer"]) < len(expected)
        assert expected.startswith(before["answer"])
        await page.screenshot(path=str(ARTIFACTS / "reload-1-before.png"))

        await page.reload()
        # The page reads the conversation, then reattaches to the running turn.
        await _wait_for(page, "() => Object.keys(window.__demo.resumed).length > 0")
        resumed = await page.evaluate("() => window.__demo.resumed")
        assert resumed.get(before["run_id"], 0) > 2, f"the page did not resume from its last seq: {resumed}"
        await page.screenshot(path=str(ARTIFACTS / "reload-2-after.png"))
        await _wait_for(page, "() => document.querySelector('.turn .status').textContent === 'completed'")
        [after] = await _turns(page)
        stats = await page.evaluate("() => window.__demo")
        await page.screenshot(path=str(ARTIFACTS / "reload-3-completed.png"))
        assert after["run_id"] == before["run_id"]
        assert after["answer"] == expected  # the streamed text itself, not the transcript
        assert stats["duplicates"] == 0 and stats["gaps"] == 0, stats
        saved = await page.evaluate(
            f"() => JSON.parse(sessionStorage.getItem('runrow.demo.run.{after['run_id']}'))"
        )
        assert saved["text"] == expected
        # The tool's note is listed once the run is done.
        await _wait_for(page, "() => document.querySelectorAll('#notes li').length === 1")
        # The page reads the tool events' documented fields (tool_call_id, name).
        tools = await page.evaluate("() => document.querySelector('.turn .tools').textContent")
        assert tools.startswith("✓ save_note("), tools


async def test_stop_cancels_the_run_and_returns_the_queued_draft(page: Any, dsn: str, schema: str) -> None:
    async with serve_demo(dsn, schema, token_delay=0.15) as base:
        await page.goto(f"{base}/?user=bob&conversation=browser-2")
        await page.fill("#composer", "tell me a long story")
        await page.click("#send")
        await _wait_for(
            page, "() => (document.querySelector('.turn .answer')?.textContent || '').split(' ').length >= 4"
        )
        await page.fill("#composer", "and a follow-up question")
        await page.click("#send")
        await _wait_for(page, "() => document.querySelectorAll('.turn').length === 2")
        turns = await _turns(page)
        assert [t["status"] for t in turns] == ["running", "queued"]
        assert await page.input_value("#composer") == ""
        # The queued turn knows its place in line.
        await _wait_for(
            page,
            "() => (document.querySelectorAll('.turn')[1].querySelector('.position')?.textContent || '')"
            '.startsWith("you\'re #")',
        )
        await page.screenshot(path=str(ARTIFACTS / "stop-1-before.png"))

        await page.click("#stop")
        await _wait_for(
            page,
            """() => [...document.querySelectorAll('.turn .status')].every(s => s.textContent === 'cancelled')""",
        )
        assert await page.input_value("#composer") == "and a follow-up question"
        turns = await _turns(page)
        assert turns[1]["user"] == "(message returned to the composer)"
        assert 0 < len(turns[0]["answer"]) < len(answer_for("tell me a long story"))
        await page.screenshot(path=str(ARTIFACTS / "stop-2-after.png"))
        # Sending the draft again starts a new turn that runs to the end.
        await page.click("#send")
        await _wait_for(page, "() => document.querySelectorAll('.turn').length === 3")
        assert (await _turns(page))[2]["user"] == "and a follow-up question"
        assert await page.input_value("#composer") == ""
