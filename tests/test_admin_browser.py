"""runrow.admin in a real browser: Playwright driving the system's Chromium, headless,
against a host app (uvicorn) that mounts the admin three ways (acting, read-only, scoped
to one tenant) next to a real Dispatcher whose agent streams slowly.

Skips without Playwright or Chromium, except under CI (then it fails), as
tests/test_demo_browser.py does, whose console/offline watch it reuses. Screenshots go
to ``$RUNROW_ARTIFACTS/admin`` (default: the test's tmp_path).
"""

from __future__ import annotations

import os
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.routing import Mount

import runrow
from runrow.admin import AdminAccess, create_admin

from .demo_support import serve_asgi
from .test_demo_browser import Watch, watched_page

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from starlette.requests import Request

pytestmark = [pytest.mark.anyio, pytest.mark.browser]

WORDS = 80  # about 12 s of streaming at 0.15 s a word: long enough to watch, cancel and retry


async def streaming_agent(run: runrow.RunContext) -> None:
    """Streams WORDS words slowly (or fails at once on "fail"), then answers."""
    if run.content == "fail":
        raise RuntimeError("the tool broke")
    if run.content == "tree":  # two sub-agents (agent key "words"), waited for
        kids = await run.spawn_many([("words", "a"), ("words", "b")])
        await run.wait_for_children(kids)
        await run.write_message("tree done")
        return
    if run.content == "ask":  # a few words, then it waits for an answer
        await run.text("may I? ")
        await run.flush()
        await anyio.sleep(1.0)  # (time to open its page while it runs)
        answer = await run.wait_for_input("approve", {"question": "may I?"})
        await run.write_message(f"answered {answer!r}")
        return
    await run.emit({"type": "progress", "stage": "thinking"})  # a type of the agent's own
    for i in range(WORDS if run.content == "slow" else 3):
        await run.text(f"word{i} ")
        await run.flush()
        await anyio.sleep(0.15)
    await run.write_message("done")


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    root = os.environ.get("RUNROW_ARTIFACTS")
    out = (Path(root) if root else tmp_path) / "admin"
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture
async def page(watch: Watch) -> AsyncIterator[Any]:
    async with watched_page(watch, width=1280, height=900) as p:
        yield p


@pytest.fixture
def watch() -> Watch:
    w = Watch()
    w.allow.append("403")  # the read-only test opens a refused page on purpose
    w.allow.append("404")  # and the tenant test another tenant's run
    return w


def _everyone(request: Request) -> AdminAccess:
    return AdminAccess(can_act=True)


def _acme(request: Request) -> AdminAccess:
    return AdminAccess(can_act=True, tenant_id="acme")


@asynccontextmanager
async def serve_host(dsn: str, schema: str) -> AsyncIterator[str]:
    """The host: its pool and hub opened in its lifespan, a Dispatcher, and three admins."""
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        dsn, min_size=1, max_size=10, open=False, kwargs={"autocommit": True}
    )
    hub = runrow.NotifyHub(dsn)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            await pool.open(wait=True)
            stack.push_async_callback(pool.close)
            await stack.enter_async_context(hub)
            await stack.enter_async_context(
                runrow.Dispatcher(
                    dsn,
                    streaming_agent,
                    agents={"words": streaming_agent},
                    schema=schema,
                    hub=hub,
                    worker_id="w-browser",
                    concurrency=4,
                )
            )
            yield

    options: dict[str, Any] = {"schema": schema, "hub": hub}
    app = Starlette(
        routes=[
            Mount("/admin", create_admin(pool, authorize=_everyone, **options)),
            Mount("/ro", create_admin(pool, authorize=_everyone, read_only=True, **options)),
            Mount("/acme", create_admin(pool, authorize=_acme, **options)),
        ],
        lifespan=lifespan,
    )
    async with serve_asgi(app) as base:
        yield base


async def _enqueue(dsn: str, schema: str, content: str, **kw: Any) -> runrow.Run:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        return await runrow.enqueue(c, schema=schema, user_id="ops", content=content, **kw)


UNLABELLED = """() => [...document.querySelectorAll('input:not([type=hidden]), select, textarea, button')]
    .filter(e => (e.labels ? e.labels.length === 0 : true) && !e.textContent.trim()).map(e => e.outerHTML)"""


async def _tab_to(page: Any, selector: str, limit: int = 40) -> None:
    """Tabs from the top of the page until ``selector`` has the focus (keyboard reachable),
    and checks that the focused element shows a visible focus ring."""
    await page.keyboard.press("Tab")
    for _ in range(limit):
        if await page.evaluate("s => document.activeElement.matches(s)", selector):
            outline = await page.evaluate("() => getComputedStyle(document.activeElement).outlineStyle")
            assert outline not in ("none", ""), f"{selector} has no visible focus"
            return
        await page.keyboard.press("Tab")
    raise AssertionError(f"{selector} is not reachable with Tab")


async def _journal_text(page: Any) -> str:
    return await page.evaluate("() => document.querySelector('#journal').textContent")  # type: ignore[no-any-return]


async def _status(page: Any) -> str:
    return await page.evaluate("() => document.querySelector('.summary .status').textContent")  # type: ignore[no-any-return]


async def test_list_filter_detail_live_tail_cancel_retry(
    page: Any, dsn: str, schema: str, artifacts: Path
) -> None:
    async with serve_host(dsn, schema) as base:
        quick = await _enqueue(dsn, schema, "hi", conversation_id="conv-quick", tenant_id="zeta")
        failed = await _enqueue(dsn, schema, "fail", conversation_id="conv-fail", tenant_id="zeta")
        slow = await _enqueue(dsn, schema, "slow", conversation_id="conv-slow", tenant_id="acme")
        await page.goto(f"{base}/admin/")
        await page.wait_for_selector(".run-link")
        await page.screenshot(path=str(artifacts / "1-list.png"), full_page=True)
        assert len(await page.query_selector_all(".run-link")) == 3
        assert await page.evaluate(UNLABELLED) == []  # every form control has a label
        await _tab_to(page, "button[type=submit]")  # the filter form is keyboard-reachable

        # Filter with the keyboard: the labelled field, typed into, Enter submits.
        await page.get_by_label("Tenant").focus()
        await page.keyboard.type("zeta")
        await page.keyboard.press("Enter")
        await page.wait_for_url("**/admin/?*tenant=zeta*")
        shown = await page.eval_on_selector_all(".run-link", "els => els.map(e => e.textContent)")
        assert str(slow.id) not in shown and str(quick.id) in shown and len(shown) == 2
        await page.screenshot(path=str(artifacts / "2-filtered.png"), full_page=True)

        # The streaming run's page: its journal grows while we watch.
        await page.goto(f"{base}/admin/runs/{slow.id}")
        await page.wait_for_function("() => document.querySelector('#journal').textContent.includes('word2')")
        first = await _journal_text(page)
        await page.wait_for_function(
            "n => document.querySelector('#journal').textContent.length > n + 20", arg=len(first)
        )
        assert (await _journal_text(page)).startswith(first[: len(first) - 10])
        assert await _status(page) == "running"
        assert "thinking" in (await page.text_content("#journal li[data-type=progress]") or "")
        await page.screenshot(path=str(artifacts / "3-detail-live.png"), full_page=True)

        # Cancel: the action's confirmation, then the run ends cancelled and the tail says so.
        await _tab_to(page, ".actions a")  # the action is reachable by keyboard, and Enter follows it
        await page.keyboard.press("Enter")
        await page.wait_for_selector("form.confirm")
        await page.screenshot(path=str(artifacts / "4-cancel-confirm.png"), full_page=True)
        await page.get_by_role("button", name="Cancel run").click()
        await page.wait_for_url(f"**/admin/runs/{slow.id}")
        await page.wait_for_function(
            "() => document.querySelector('#live-status').textContent.includes('cancelled')"
        )
        assert (await runrow.get_run(dsn, slow.id, schema=schema)).status == "cancelled"
        await page.reload()
        assert await _status(page) == "cancelled"
        await page.screenshot(path=str(artifacts / "5-cancelled.png"), full_page=True)

        # Retry: a new attempt, whose page shows the lineage and streams again.
        await page.get_by_role("link", name="Retry this run…").click()
        await page.get_by_role("button", name="Retry run").click()
        await page.wait_for_url(lambda url: "/admin/runs/" in url and str(slow.id) not in url)
        new_id = page.url.rsplit("/", 1)[1]
        retried = await runrow.get_run(dsn, new_id, schema=schema)
        assert retried.retry_of == slow.id and retried.attempt == 2
        lineage = await page.text_content("#lineage-h + table")
        assert lineage is not None and str(slow.id) in lineage and "(this run)" in lineage
        await page.wait_for_function("() => document.querySelector('#journal').textContent.includes('word3')")
        await page.screenshot(path=str(artifacts / "6-retried-live.png"), full_page=True)

        # Queue health and the conversation view render (a worker, the chart).
        await page.goto(f"{base}/admin/health")
        await page.wait_for_selector("svg.chart")
        assert "w-browser" in (await page.text_content("main") or "")
        await page.screenshot(path=str(artifacts / "7-health.png"), full_page=True)
        await page.goto(f"{base}/admin/conversation?id=conv-slow")
        assert (await page.text_content("main") or "").count("cancelled") >= 1
        await page.screenshot(path=str(artifacts / "8-conversation.png"), full_page=True)

        # The failed run's page shows its error and the traceback, as Python printed it (#40).
        await page.goto(f"{base}/admin/runs/{failed.id}")
        await page.wait_for_selector("pre.traceback")
        assert await page.is_visible("pre.traceback")
        shown = await page.text_content("pre.traceback") or ""
        assert shown.startswith("Traceback (most recent call last)") and "streaming_agent" in shown
        await page.screenshot(path=str(artifacts / "9-failed-traceback.png"), full_page=True)


async def test_read_only_mode_shows_no_action(page: Any, dsn: str, schema: str, artifacts: Path) -> None:
    async with serve_host(dsn, schema) as base:
        run = await _enqueue(dsn, schema, "slow", conversation_id="conv-ro")
        await page.goto(f"{base}/ro/runs/{run.id}")
        await page.wait_for_function("() => document.querySelector('#journal').textContent.includes('word1')")
        assert await page.query_selector_all(".actions") == []
        assert await page.query_selector_all("form[method=post]") == []
        assert await page.get_by_role("link", name="Cancel this run…").count() == 0
        assert "read-only" in (await page.text_content(".scope") or "")
        await page.screenshot(path=str(artifacts / "ro-1-detail.png"), full_page=True)
        await page.goto(f"{base}/ro/conversation?id=conv-ro")
        assert await page.get_by_role("link", name="Stop the conversation…").count() == 0
        refused = await page.goto(f"{base}/ro/runs/{run.id}/cancel")
        assert refused is not None and refused.status == 403
        await page.screenshot(path=str(artifacts / "ro-2-refused.png"), full_page=True)
        assert (await runrow.get_run(dsn, run.id, schema=schema)).status == "running"


async def test_another_tenants_data_is_hidden(page: Any, dsn: str, schema: str, artifacts: Path) -> None:
    async with serve_host(dsn, schema) as base:
        mine = await _enqueue(dsn, schema, "hi", conversation_id="conv-acme", tenant_id="acme")
        theirs = await _enqueue(dsn, schema, "hi", conversation_id="conv-zeta", tenant_id="zeta")
        await page.goto(f"{base}/acme/")
        await page.wait_for_selector(".run-link")
        shown = await page.eval_on_selector_all(".run-link", "els => els.map(e => e.textContent)")
        assert shown == [str(mine.id)]
        text = await page.text_content("main") or ""
        assert "zeta" not in text and "conv-zeta" not in text
        assert await page.get_by_label("Tenant").count() == 0  # no tenant filter when scoped
        await page.screenshot(path=str(artifacts / "tenant-1-list.png"), full_page=True)
        for path in (f"/acme/runs/{theirs.id}", "/acme/conversation?id=conv-zeta"):
            resp = await page.goto(f"{base}{path}")
            assert resp is not None and resp.status == 404, path
        await page.screenshot(path=str(artifacts / "tenant-2-404.png"), full_page=True)
        await page.goto(f"{base}/acme/health")
        assert "zeta" not in (await page.text_content("main") or "")
        await page.screenshot(path=str(artifacts / "tenant-3-health.png"), full_page=True)


async def _badge(page: Any) -> tuple[str, str]:
    return tuple(  # type: ignore[return-value]
        await page.evaluate(
            "() => { const b = document.querySelector('.summary .status'); return [b.textContent, b.className]; }"
        )
    )


async def test_the_status_badge_follows_the_journal_without_a_reload(
    page: Any, dsn: str, schema: str, artifacts: Path
) -> None:
    """After a cancel, the badge said `running` while the journal said cancelled, until a reload."""
    async with serve_host(dsn, schema) as base:
        slow = await _enqueue(dsn, schema, "slow", conversation_id="conv-badge")
        await page.goto(f"{base}/admin/runs/{slow.id}")
        await page.wait_for_function("() => document.querySelector('#journal').textContent.includes('word1')")
        assert await _badge(page) == ("running", "status status-running")
        await runrow.cancel_run(dsn, slow.id, schema=schema)  # from elsewhere: the page is not reloaded
        await page.wait_for_function(
            "() => document.querySelector('#live-status').textContent.includes('cancelled')"
        )
        assert await _badge(page) == ("cancelled", "status status-cancelled")
        await page.screenshot(path=str(artifacts / "badge-1-cancelled.png"), full_page=True)

        # A run that parks: the badge says waiting once its journal asks for input.
        asking = await _enqueue(dsn, schema, "ask", conversation_id="conv-ask")
        await page.goto(f"{base}/admin/runs/{asking.id}")
        await page.wait_for_function("() => document.querySelector('#journal').textContent.includes('may I')")
        await page.wait_for_function(
            "() => document.querySelector('#journal li[data-type=input_requested]') !== null"
        )
        assert (await _badge(page))[0] == "waiting"
        await page.screenshot(path=str(artifacts / "badge-2-waiting.png"), full_page=True)
        await page.goto("about:blank")  # (a waiting run's stream stays open: leave before the server)


async def test_a_waiting_run_is_answered_from_its_page_without_a_reload(
    page: Any, watch: Watch, dsn: str, schema: str, artifacts: Path
) -> None:
    """The run page had no way to answer a waiting input."""
    watch.allow.append("status of 400")  # the malformed value below is refused on purpose
    async with serve_host(dsn, schema) as base:
        asking = await _enqueue(dsn, schema, "ask", conversation_id="conv-answer")
        await page.goto(f"{base}/admin/runs/{asking.id}")
        await page.evaluate("() => { window.__notReloaded = true; }")
        # The form appears once the run parks (the page may have been drawn while it ran).
        await page.wait_for_selector("form.answer")
        assert (await _badge(page))[0] == "waiting"
        assert await page.get_by_role("link", name="Cancel this run…").count() == 1
        assert await page.evaluate(UNLABELLED) == []
        assert "may I?" in (await page.text_content("#waiting") or "")

        # A value that is not JSON: refused next to the form, what was typed kept.
        await page.get_by_label("Or answer with a value").fill("{oops")
        await page.get_by_role("button", name="Send the value").click()
        await page.wait_for_selector("#waiting [role=alert]")
        assert "not JSON" in (await page.text_content("#waiting [role=alert]") or "")
        assert await page.get_by_label("Or answer with a value").input_value() == "{oops"
        assert (await runrow.get_run(dsn, asking.id, schema=schema)).status == "waiting"
        await page.screenshot(path=str(artifacts / "answer-1-refused.png"), full_page=True)

        # Approve: the run resumes and completes while the page watches.
        await page.get_by_role("button", name="Approve").click()
        await page.wait_for_function(
            "() => document.querySelector('#live-status').textContent.includes('completed')"
        )
        assert await _badge(page) == ("completed", "status status-completed")
        assert await page.evaluate("() => window.__notReloaded === true")
        journal = await _journal_text(page)
        assert "input_provided" in journal and '"approved":true' in journal
        await page.wait_for_function("() => document.querySelector('form.answer') === null")
        await page.wait_for_function(
            "() => !document.querySelector('#actions').textContent.includes('Cancel')"
        )
        transcript = await runrow.transcript(dsn, "conv-answer", schema=schema)
        assert transcript[-1].content == "answered {'approved': True}"
        await page.screenshot(path=str(artifacts / "answer-2-completed.png"), full_page=True)


async def test_cancel_and_retry_follow_the_status_without_a_reload(
    page: Any, dsn: str, schema: str, artifacts: Path
) -> None:
    """After the badge said cancelled, the page still offered Cancel and no Retry until a reload."""
    async with serve_host(dsn, schema) as base:
        slow = await _enqueue(dsn, schema, "slow", conversation_id="conv-follow")
        await page.goto(f"{base}/admin/runs/{slow.id}")
        await page.wait_for_function("() => document.querySelector('#journal').textContent.includes('word1')")
        assert await page.get_by_role("link", name="Retry this run…").count() == 0
        await page.evaluate("() => { window.__notReloaded = true; }")
        await runrow.cancel_run(dsn, slow.id, schema=schema)
        await page.get_by_role("link", name="Retry this run…").wait_for()
        assert await page.get_by_role("link", name="Cancel this run…").count() == 0
        assert await page.evaluate("() => window.__notReloaded === true")
        await page.screenshot(path=str(artifacts / "follow-1-retry.png"), full_page=True)


async def test_a_roots_page_shows_its_trees_merged_journal(
    page: Any, dsn: str, schema: str, artifacts: Path
) -> None:
    """#41 point 7: a root's page has its Children and the tree's merged journal (every
    run's events, each with its run, gap-free positions, the root's ending last), live."""
    async with serve_host(dsn, schema) as base:
        root = await _enqueue(dsn, schema, "tree", conversation_id="conv-tree")
        await page.goto(f"{base}/admin/runs/{root.id}")
        if not await page.evaluate("() => !!document.querySelector('#tree-journal')"):
            await page.wait_for_function("() => window.__runrowAdmin.done")  # (the children came later)
            await page.reload()
        await page.wait_for_function("() => window.__runrowAdminTree && window.__runrowAdminTree.done")
        rows = await page.evaluate(
            """() => [...document.querySelectorAll('#tree-journal li')].map(li => ({
                   pos: li.value, run: li.dataset.run, type: li.dataset.type,
                   label: li.querySelector('.run').textContent }))"""
        )
        await page.screenshot(path=str(artifacts / "tree-journal.png"), full_page=True)
        runs = {r["run"] for r in rows}
        assert len(runs) == 3 and str(root.id) in runs, rows
        assert rows[-1]["run"] == str(root.id) and rows[-1]["type"] == "complete", rows[-1]
        assert [r["label"] == "root" for r in rows] == [r["run"] == str(root.id) for r in rows]
        positions = [r["pos"] for r in rows]
        assert positions == sorted(positions) and len(set(positions)) == len(positions), positions
        assert await page.evaluate("() => document.querySelectorAll('#children tbody tr').length") == 2
        await page.goto("about:blank")  # (before the server goes: the page may still redraw)
