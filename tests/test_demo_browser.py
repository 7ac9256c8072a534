"""The demo's web page in a real browser: Playwright driving the system's Chromium, headless.

Skips (saying why) when Playwright or Chromium is missing, except when the CI variable is
set: then a missing browser fails the test, so CI cannot skip it silently. Screenshots go
to tests/artifacts/ (ignored by git). ``RUNROW_CHROMIUM`` points at another binary.

Every test fails on a console error, an uncaught page error, or a request to any host but
this machine (the page must work offline; such a request is also blocked).
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest
from psycopg import sql

from runrow.demo import answer_for, approval_answer_for
from runrow.demo.server import _WORKER_TIMING

from .demo_support import DemoProcess, auth, free_port, serve_demo

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = [pytest.mark.anyio, pytest.mark.browser]

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


LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}


class Watch:
    """What the page did wrong: console errors, uncaught errors, requests off the machine.
    ``allow`` takes substrings of console errors a test expects."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.allow: list[str] = []

    def console(self, msg: Any) -> None:
        if msg.type == "error" and not any(a in msg.text for a in self.allow):
            self.problems.append(f"console error: {msg.text} ({msg.location})")

    def page_error(self, exc: Any) -> None:
        self.problems.append(f"uncaught page error: {exc}")

    async def route(self, route: Any) -> None:
        url = route.request.url
        if urlsplit(url).hostname not in LOCAL_HOSTS:
            self.problems.append(f"request to another host: {url}")
            await route.abort()
        else:
            await route.continue_()


@pytest.fixture
def watch() -> Watch:
    return Watch()


@asynccontextmanager
async def watched_page(watch: Watch, *, width: int, height: int) -> AsyncIterator[Any]:
    """A page of the system's Chromium whose requests, console and errors ``watch`` sees;
    the test fails afterwards if it saw a problem. (The admin's browser tests use it too.)"""
    executable = _chromium()
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            context = await browser.new_context(viewport={"width": width, "height": height})
            await context.route("**/*", watch.route)
            page = await context.new_page()
            page.on("console", watch.console)
            page.on("pageerror", watch.page_error)
            page.set_default_timeout(15_000)
            yield page
        finally:
            await browser.close()
    assert watch.problems == [], "\n".join(watch.problems)


@pytest.fixture
async def page(watch: Watch) -> AsyncIterator[Any]:
    ARTIFACTS.mkdir(exist_ok=True)
    async with watched_page(watch, width=1100, height=800) as p:
        yield p


def test_the_watch_catches_what_it_should() -> None:
    """The guard itself can fail: a console error and a foreign request are both caught."""

    class Msg:
        type, text, location = "error", "Failed to load resource: 404", {}

    class Req:
        url = "https://fonts.example.com/x.woff2"

    class Route:
        request = Req()
        aborted = False

        async def abort(self) -> None:
            self.aborted = True

    w = Watch()
    w.console(Msg())
    route = Route()
    import anyio

    anyio.run(w.route, route)
    assert route.aborted and len(w.problems) == 2, w.problems


async def _turns(page: Any) -> list[dict[str, str]]:
    return await page.evaluate(  # type: ignore[no-any-return]
        """() => [...document.querySelectorAll('.turn')].map(t => ({
            run_id: t.dataset.runId,
            user: t.querySelector('.user').textContent,
            status: t.querySelector('.status').textContent,
            answer: t.querySelector('.answer').textContent,
        }))"""
    )


async def _empty_boxes(page: Any) -> list[str]:
    """Parts of turn cards that take room on the screen but show nothing."""
    return await page.evaluate(  # type: ignore[no-any-return]
        """() => [...document.querySelectorAll('.turn')].flatMap(t =>
            [...t.querySelectorAll('.user, .tools, .approvals, .answer, .error')]
              .filter(e => e.offsetHeight > 0 && !e.textContent.trim())
              .map(e => `${t.dataset.runId} .${e.className.split(' ')[0]}`))"""
    )


async def _wait_for(page: Any, js: str, arg: Any = None, timeout: float = 20.0) -> None:
    await page.wait_for_function(js, arg=arg, timeout=timeout * 1000)


async def _stop_disabled(page: Any) -> bool:
    return await page.evaluate("() => document.querySelector('#stop').disabled")  # type: ignore[no-any-return]


async def test_reload_mid_answer_resumes_without_gap_or_duplicate(page: Any, dsn: str, schema: str) -> None:
    question = "hello from the browser"
    expected = answer_for(question)
    async with serve_demo(dsn, schema, token_delay=0.04) as base:
        # A new conversation: loads without errors (the watch checks), nothing to stop.
        await page.goto(f"{base}/?user=alice&conversation=browser-1")
        await _wait_for(page, "() => !document.querySelector('#empty').hidden")
        assert await _stop_disabled(page)
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
        assert not await _stop_disabled(page)
        # The tool call has finished, and its note is listed while the answer still streams.
        await _wait_for(page, "() => document.querySelectorAll('#notes li').length === 1", timeout=3)
        assert [t["status"] for t in await _turns(page)] == ["running"]
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
        await _wait_for(page, "() => document.querySelectorAll('#notes li').length === 1")
        # The page reads the tool events' documented fields (tool_call_id, name).
        tools = await page.evaluate("() => document.querySelector('.turn .tools').textContent")
        assert tools.startswith("✓ save_note("), tools
        assert await _stop_disabled(page)  # nothing running or queued

        # A reload with nothing kept in the tab (as a new tab would): the finished turn
        # still shows its tool call, read from the server.
        await page.evaluate("() => sessionStorage.clear()")
        await page.reload()
        await _wait_for(page, "() => document.querySelector('.turn .status')?.textContent === 'completed'")
        tools_after = await page.evaluate("() => document.querySelector('.turn .tools').textContent")
        assert tools_after == tools
        assert await _stop_disabled(page)
        await page.screenshot(path=str(ARTIFACTS / "reload-4-new-tab.png"))


async def test_stop_cancels_the_run_and_returns_the_queued_draft(page: Any, dsn: str, schema: str) -> None:
    async with serve_demo(dsn, schema, token_delay=0.15) as base:
        await page.goto(f"{base}/?user=bob&conversation=browser-2")
        await _wait_for(page, "() => !document.querySelector('#empty').hidden")
        assert await _stop_disabled(page)
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
        await _wait_for(page, "() => document.querySelector('#stop').disabled")  # nothing left to stop
        await page.screenshot(path=str(ARTIFACTS / "stop-2-after.png"))
        # The returned message's card is one line saying so: no empty answer box under it,
        # neither now nor read from the server after a reload.
        assert await _empty_boxes(page) == []
        await page.evaluate("() => sessionStorage.clear()")
        await page.reload()
        await _wait_for(page, "() => document.querySelectorAll('.turn .status').length === 2")
        assert (await _turns(page))[1]["user"] == "(message returned to the composer)"
        assert await _empty_boxes(page) == []
        await page.fill("#composer", "and a follow-up question")
        # Sending the draft again starts a new turn that runs to the end.
        await page.click("#send")
        await _wait_for(page, "() => document.querySelectorAll('.turn').length === 3")
        assert (await _turns(page))[2]["user"] == "and a follow-up question"
        assert await page.input_value("#composer") == ""
        await _wait_for(
            page, "() => document.querySelectorAll('.turn .status')[2].textContent === 'completed'"
        )
        assert await _stop_disabled(page)


async def test_another_users_conversation_says_so_at_once(
    page: Any, watch: Watch, dsn: str, schema: str
) -> None:
    async with serve_demo(dsn, schema, workers=0) as base:
        async with httpx.AsyncClient(base_url=base) as client:
            resp = await client.post(
                "/v1/conversations/alices/messages", json={"content": "mine"}, headers=auth("alice")
            )
            assert resp.status_code == 202
        # The API's 403 is the signal; Chromium logs any 4xx fetch as a console error.
        watch.allow.append("status of 403")
        await page.goto(f"{base}/?user=mallory&conversation=alices")
        # At once: before typing anything, the page says whose it is not, and Send is off.
        await _wait_for(
            page,
            "() => document.querySelector('#error').textContent.includes('belongs to another user')",
            timeout=3,
        )
        assert await page.evaluate("() => document.querySelector('#send').disabled")
        assert await page.evaluate("() => document.querySelectorAll('.turn').length") == 0
        await page.screenshot(path=str(ARTIFACTS / "taken-1-another-users.png"))
        # A new conversation of one's own clears it.
        await page.click("#new-conversation")
        await _wait_for(page, "() => document.querySelector('#error').textContent === ''")
        assert not await page.evaluate("() => document.querySelector('#send').disabled")


async def test_killed_worker_fails_its_turn_and_the_next_turn_runs_on_a_new_worker(
    page: Any, dsn: str, schema: str, tmp_path: Path
) -> None:
    """Plain `runrow demo` (one worker process, the default timing): kill -9 the worker
    mid-answer. The turn ends failed (worker_lost) within lease + grace + one reaper tick,
    the demo logs the death and starts a new worker, and the queued turn completes."""
    t = _WORKER_TIMING
    demo = DemoProcess(dsn, schema, tmp_path / "demo.log")
    try:
        await demo.wait_for(r"open http://", timeout=60)
        [started] = await demo.wait_for(r"worker pid (\d+) started")
        worker = int(started.group(1))
        await page.goto(f"{demo.url}/?user=carol&conversation=kill-1")
        await page.fill("#composer", "first question")
        await page.click("#send")
        await _wait_for(
            page,
            """() => (document.querySelector('.turn .answer')?.textContent || '').split(' ').length >= 5
                     && document.querySelector('.turn .status').textContent === 'running'""",
        )
        await page.fill("#composer", "second question")
        await page.click("#send")
        await _wait_for(page, "() => document.querySelectorAll('.turn').length === 2")
        assert [x["status"] for x in await _turns(page)] == ["running", "queued"]
        await page.screenshot(path=str(ARTIFACTS / "kill-1-before.png"))

        os.kill(worker, signal.SIGKILL)
        killed_at = time.monotonic()
        await demo.wait_for(rf"worker pid {worker} killed by SIGKILL", timeout=5)
        await demo.wait_for(r"worker pid (\d+) started", count=2, timeout=10)
        await _wait_for(
            page,
            "() => document.querySelector('.turn .status').textContent === 'failed'",
            timeout=t["lease"] + t["grace"] + t["poll"] + 15,
        )
        took = time.monotonic() - killed_at
        # The last heartbeat came at most one heartbeat before the kill.
        assert took <= t["lease"] + t["grace"] + t["poll"] + 3, f"failed {took:.1f} s after the kill"
        first = await page.evaluate(
            """() => { const t = document.querySelector('.turn');
                       return { error: t.querySelector('.error').textContent,
                                hidden: t.querySelector('.error').hidden,
                                partial: t.querySelector('.answer').classList.contains('partial') }; }"""
        )
        assert first["error"].startswith("worker_lost:") and not first["hidden"], first
        assert first["partial"], first
        await page.screenshot(path=str(ARTIFACTS / "kill-2-failed.png"))

        await _wait_for(
            page,
            "() => document.querySelectorAll('.turn .status')[1].textContent === 'completed'",
            timeout=40,
        )
        turns = await _turns(page)
        assert [x["status"] for x in turns] == ["failed", "completed"]
        assert turns[1]["answer"] == answer_for("second question")
        await page.screenshot(path=str(ARTIFACTS / "kill-3-next-completed.png"))
    finally:
        demo.stop()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(f"{schema}_demo"))
            )
    (ARTIFACTS / "kill-demo.log").write_text(demo.output())
    assert demo.proc.returncode == 0, demo.output()


# -- human in the loop: the approval card -------------------------------------------------

CARD = ".turn .approval"


async def _card(page: Any) -> dict[str, Any] | None:
    return await page.evaluate(  # type: ignore[no-any-return]
        """() => { const c = document.querySelector('.turn .approval');
                   return c && { key: c.dataset.key, decision: c.dataset.decision,
                                 prompt: c.querySelector('.prompt').textContent,
                                 call: c.querySelector('.call').textContent,
                                 text: c.querySelector('.decision').textContent,
                                 buttons: [...c.querySelectorAll('button')].map(b => b.textContent),
                                 status: document.querySelector('.turn .status').textContent,
                                 position: document.querySelector('.turn .position')?.textContent || '',
                                 tools: document.querySelector('.turn .tools').textContent }; }"""
    )


async def _wait_for_pending_card(page: Any) -> dict[str, Any]:
    await _wait_for(
        page, "() => document.querySelector('.turn .approval[data-decision=\"pending\"] .approve')"
    )
    card = await _card(page)
    assert card is not None
    return card


async def test_approval_card_survives_reloads_and_a_server_restart_then_approve(
    page: Any, dsn: str, schema: str
) -> None:
    question = "send hello to bob"
    port = free_port()
    async with serve_demo(dsn, schema, port=port, keep_demo_schema=True) as base:
        await page.goto(f"{base}/?user=dora&conversation=hitl-1")
        await _wait_for(page, "() => !document.querySelector('#empty').hidden")
        assert "send" in await page.evaluate("() => document.querySelector('#empty').textContent")
        await page.fill("#composer", question)
        await page.click("#send")
        card = await _wait_for_pending_card(page)
        assert card["prompt"] == "Send this message to bob?"
        assert card["call"] == 'send_message({"to":"bob","text":"send hello to bob"})'
        assert card["buttons"] == ["Approve", "Deny"]
        assert card["status"] == "waiting" and card["position"] == "waiting for your approval"
        assert card["tools"].startswith("… send_message(") and card["tools"].endswith(
            ": waiting for your approval"
        )
        assert not await _stop_disabled(page)  # a waiting run can be stopped
        await page.screenshot(path=str(ARTIFACTS / "approval-1-asked.png"))

        # A reload resumes the stream after its last seq: the card comes from the tab's state.
        await page.reload()
        assert await _wait_for_pending_card(page) == card
        # A new tab (nothing kept): the stream replays from the start and draws it again.
        await page.evaluate("() => sessionStorage.clear()")
        await page.reload()
        assert await _wait_for_pending_card(page) == card
        stats = await page.evaluate("() => window.__demo")
        assert stats["duplicates"] == 0 and stats["gaps"] == 0, stats

        # The page goes away, and then the server (the waiting run holds no worker)...
        await page.goto("about:blank")

    # ...which starts again on the same port: the page, back, draws the card from the
    # tab's state and the stream resumes after its last seq.
    async with serve_demo(dsn, schema, port=port) as base:
        await page.goto(f"{base}/")
        assert await _wait_for_pending_card(page) == card
        await page.screenshot(path=str(ARTIFACTS / "approval-2-after-restart.png"))
        await page.click(f"{CARD} .approve")
        await _wait_for(page, "() => document.querySelector('.turn .status').textContent === 'completed'")
        [turn] = await _turns(page)
        assert turn["answer"] == approval_answer_for(question, True)
        done = await _card(page)
        assert done is not None
        assert done["decision"] == "approved" and done["buttons"] == [] and done["text"] == "✓ approved"
        assert done["tools"].startswith("✓ send_message("), done["tools"]
        await _wait_for(page, "() => document.querySelectorAll('#notes li').length === 1")
        notes = await page.evaluate("() => document.querySelector('#notes li').textContent")
        assert notes == f"sent to bob: {question}"
        assert await _stop_disabled(page)
        stats = await page.evaluate("() => window.__demo")
        assert stats["duplicates"] == 0 and stats["gaps"] == 0, stats
        await page.screenshot(path=str(ARTIFACTS / "approval-3-approved.png"))
        # A finished turn read from the server (a new tab) shows the decision too.
        await page.evaluate("() => sessionStorage.clear()")
        await page.reload()
        await _wait_for(page, "() => document.querySelector('.turn .status')?.textContent === 'completed'")
        again = await _card(page)
        assert again is not None and again["decision"] == "approved" and again["buttons"] == []
        assert again["tools"] == done["tools"]


async def test_approval_denied_and_a_stopped_wait(page: Any, dsn: str, schema: str) -> None:
    question = "send the report to carol"
    async with serve_demo(dsn, schema) as base:
        await page.goto(f"{base}/?user=erin&conversation=hitl-2")
        await _wait_for(page, "() => !document.querySelector('#empty').hidden")
        await page.fill("#composer", question)
        await page.click("#send")
        await _wait_for_pending_card(page)
        await page.click(f"{CARD} .deny")
        await _wait_for(page, "() => document.querySelector('.turn .status').textContent === 'completed'")
        [turn] = await _turns(page)
        assert turn["answer"] == approval_answer_for(question, False)
        card = await _card(page)
        assert card is not None and card["decision"] == "denied" and card["buttons"] == []
        assert card["tools"].startswith("✗ send_message("), card["tools"]
        assert await page.evaluate("() => document.querySelectorAll('#notes li').length") == 0
        await page.screenshot(path=str(ARTIFACTS / "approval-4-denied.png"))

        # Stop while a run waits: it is cancelled at once, and its card says it did not run.
        await page.fill("#composer", "send it anyway to carol")
        await page.click("#send")
        await _wait_for(
            page,
            "() => document.querySelectorAll('.turn')[1]?.querySelector('.approval[data-decision=\"pending\"]')",
        )
        await page.click("#stop")
        await _wait_for(
            page,
            """() => document.querySelectorAll('.turn')[1].querySelector('.status').textContent === 'cancelled'
                     && document.querySelectorAll('.turn')[1].querySelector('.approval').dataset.decision === 'none'""",
        )
        stopped = await page.evaluate(
            """() => { const t = document.querySelectorAll('.turn')[1];
                       return { buttons: t.querySelectorAll('.approval button').length,
                                tools: t.querySelector('.tools').textContent }; }"""
        )
        assert stopped["buttons"] == 0 and stopped["tools"].startswith("✗ send_message("), stopped
        assert await _stop_disabled(page)
        await page.screenshot(path=str(ARTIFACTS / "approval-5-stopped.png"))


async def test_an_unanswered_approval_expires(page: Any, dsn: str, schema: str) -> None:
    async with serve_demo(dsn, schema, approval_timeout=2.0) as base:
        await page.goto(f"{base}/?user=finn&conversation=hitl-3")
        await _wait_for(page, "() => !document.querySelector('#empty').hidden")
        await page.fill("#composer", "send the minutes to the team")
        await page.click("#send")
        await _wait_for_pending_card(page)
        await _wait_for(page, "() => document.querySelector('.turn .status').textContent === 'expired'")
        card = await _card(page)
        assert card is not None and card["decision"] == "none" and card["buttons"] == [], card
        assert card["text"].startswith("expired"), card
        # The call announced before the wait never ran, and the page says so.
        assert card["tools"].endswith(": not run (no approval)"), card
        assert await _stop_disabled(page)
        await page.screenshot(path=str(ARTIFACTS / "approval-6-expired.png"))


async def test_the_page_fits_a_phone_screen(watch: Watch, dsn: str, schema: str) -> None:
    """390 px wide (a phone, upright): nothing scrolls sideways, with an answer, a tool
    call and an approval card on the page."""
    _chromium()  # (skips, or fails under CI, before the demo's server starts, not inside it)
    ARTIFACTS.mkdir(exist_ok=True)
    width = 390
    scroll_width = "() => document.scrollingElement.scrollWidth"
    async with serve_demo(dsn, schema) as base, watched_page(watch, width=width, height=844) as page:
        await page.goto(f"{base}/?user=phone&conversation=a-phone-sized-conversation")
        await _wait_for(page, "() => !document.querySelector('#empty').hidden")
        assert await page.evaluate(scroll_width) <= width
        # A long word (a link) in the question, its tool call's JSON and the answer's echo of it.
        await page.fill("#composer", "read https://example.com/docs/runrow/howto/a-long-path-to-a-page")
        await page.click("#send")
        await _wait_for(page, "() => document.querySelector('.turn .status')?.textContent === 'completed'")
        assert await page.evaluate(scroll_width) <= width
        await page.fill("#composer", "send https://example.com/docs/runrow/howto/a-rather-long-path to bob")
        await page.click("#send")
        await _wait_for_pending_card(page)
        await page.screenshot(path=str(ARTIFACTS / "phone-390.png"), full_page=True)
        assert await page.evaluate(scroll_width) <= width


# -- a research turn: sub-agents in one stream ------------------------------------------


async def _children(page: Any) -> list[dict[str, str]]:
    return await page.evaluate(  # type: ignore[no-any-return]
        """() => [...document.querySelectorAll('.turn .child')].map(c => ({
            run_id: c.dataset.runId, status: c.dataset.status,
            text: c.querySelector('.child-text').textContent }))"""
    )


async def test_a_research_turn_streams_its_sub_agents_through_a_reload_and_a_killed_worker(
    page: Any, dsn: str, schema: str, tmp_path: Path
) -> None:
    """Plain `runrow demo`: "research tides" fans out to three researchers, each streaming
    into a panel of its own from the turn's one tree stream. A reload mid-research resumes
    the tree where the page left it; then kill -9 the worker while they stream: the turn,
    parked on its researchers (holding no worker), is woken by the reaper's endings of the
    lost ones and answers on the new worker, saying which were lost. No event is missed or
    shown twice."""
    t = _WORKER_TIMING
    demo = DemoProcess(dsn, schema, tmp_path / "demo.log")
    try:
        await demo.wait_for(r"open http://", timeout=60)
        [started] = await demo.wait_for(r"worker pid (\d+) started")
        worker = int(started.group(1))
        await page.goto(f"{demo.url}/?user=dana&conversation=research-1")
        await page.fill("#composer", "research tides")
        await page.click("#send")
        await _wait_for(
            page,
            """() => { const c = [...document.querySelectorAll('.turn .child .child-text')];
                       return c.length === 3 && c.every(x => x.textContent.split(' ').length >= 3); }""",
        )
        before = await _children(page)
        assert all(c["status"] == "running" for c in before), before
        await page.screenshot(path=str(ARTIFACTS / "research-1-streaming.png"))

        await page.reload()
        await _wait_for(page, "() => Object.keys(window.__demo.resumed).length > 0")
        [turn] = await _turns(page)
        resumed = await page.evaluate("() => window.__demo.resumed")
        assert resumed.get(turn["run_id"], 0) > 6, f"the page did not resume the tree: {resumed}"
        assert len(await _children(page)) == 3  # the panels came back from the tab's storage

        os.kill(worker, signal.SIGKILL)
        await demo.wait_for(rf"worker pid {worker} killed by SIGKILL", timeout=5)
        await _wait_for(
            page,
            "() => document.querySelector('.turn .status').textContent === 'completed'",
            timeout=t["lease"] + t["grace"] + t["poll"] + 30,
        )
        await page.screenshot(path=str(ARTIFACTS / "research-2-answered.png"))
        [after] = await _turns(page)
        children = await _children(page)
        stats = await page.evaluate("() => window.__demo")
        assert stats["duplicates"] == 0 and stats["gaps"] == 0, stats
        lost = [c for c in children if c["status"] == "failed"]
        assert lost, children  # the kill landed while they streamed
        assert after["answer"].count("was lost") == len(lost), after["answer"]
        assert all(c["status"] in ("completed", "failed") for c in children), children
    finally:
        demo.stop()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(f"{schema}_demo"))
            )
    (ARTIFACTS / "research-demo.log").write_text(demo.output())
