"""runrow.admin over HTTP (through ASGI, on a real database): the runs list's filters,
keyset pages stable under inserts, tenant scoping on every page, read-only mode, CSRF
refusals, the actions doing what they say, and each statement's plan using an index."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, get_args

import anyio
import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from psycopg import sql

import runrow
from runrow._engine.flight import DEADLINE_ERROR
from runrow._engine.reaper import reap_expired
from runrow._gateway import statement_text
from runrow._models import RunStatus
from runrow.admin import AdminAccess

from . import manual
from .admin_support import admin_client, csrf_of, listed
from .bulk import seed
from .helpers import plan_nodes, wait_for

pytestmark = pytest.mark.anyio

_STATUSES: tuple[str, ...] = get_args(RunStatus)


async def _enqueue(dsn: str, schema: str, n: int, **kw: Any) -> list[uuid.UUID]:
    ids = []
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        for i in range(n):
            args: dict[str, Any] = {
                "conversation_id": f"c-{uuid.uuid4().hex[:8]}",
                "user_id": "u",
                "content": f"m{i}",
            }
            args.update(kw)
            ids.append((await runrow.enqueue(c, schema=schema, **args)).id)
    return ids


async def _quick(run: runrow.RunContext) -> None:
    await run.write_message("ok")


async def test_filters_by_status_tenant_conversation_user_worker_and_time(dsn: str, schema: str) -> None:
    done = await _enqueue(dsn, schema, 2, tenant_id="acme", user_id="ann", conversation_id="conv-done")
    async with runrow.Dispatcher(dsn, _quick, schema=schema, worker_id="w-one", concurrency=2):
        with anyio.fail_after(20):
            while [(await runrow.get_run(dsn, r, schema=schema)).status for r in done] != ["completed"] * 2:
                await anyio.sleep(0.05)
    acme = await _enqueue(dsn, schema, 3, tenant_id="acme", user_id="bob")
    other = await _enqueue(dsn, schema, 2, tenant_id="zeta", user_id="cy")
    await runrow.cancel_run(dsn, other[0], schema=schema)
    async with admin_client(dsn, schema) as client:
        everything = listed((await client.get("/admin/")).text)
        assert set(everything) == {str(r) for r in done + acme + other}
        assert everything[:1] == [str(other[-1])]  # newest first

        async def ids(**params: str) -> set[str]:
            resp = await client.get("/admin/", params=params)
            assert resp.status_code == 200, resp.text
            return set(listed(resp.text))

        assert await ids(status="completed") == {str(r) for r in done}
        assert await ids(status="cancelled") == {str(other[0])}
        assert await ids(status="queued") == {str(r) for r in acme + other[1:]}
        assert await ids(tenant="zeta") == {str(r) for r in other}
        assert await ids(tenant="acme", user="bob") == {str(r) for r in acme}
        assert await ids(conversation="conv-done") == {str(r) for r in done}
        assert await ids(worker="w-one") == {str(r) for r in done}
        assert await ids(worker="nobody") == set()
        future = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
        assert await ids(to=future) == set(everything)
        assert await ids(**{"from": future}) == set()
        bad = await client.get("/admin/", params={"status": "nonsense"})
        assert bad.status_code == 400
        # Counts per status: links that filter, with the figures.
        page = (await client.get("/admin/")).text
        assert ">completed: 2<" in page and ">queued: 4<" in page and ">cancelled: 1<" in page


async def test_pages_are_stable_while_runs_are_inserted(dsn: str, schema: str) -> None:
    first = await _enqueue(dsn, schema, 7)
    seen: list[str] = []
    async with admin_client(dsn, schema, page_size=3) as client:
        url: str | None = "/admin/"
        inserted = False
        while url is not None:
            resp = await client.get(url)
            seen += listed(resp.text)
            if not inserted:
                await _enqueue(dsn, schema, 5)  # newer runs land before the cursor, not in the pages
                inserted = True
            nxt = [m for m in resp.text.split('<a href="')[1:] if 'rel="next"' in m.split(">")[0]]
            url = nxt[0].split('"')[0].replace("&amp;", "&") if nxt else None
    assert seen == [str(r) for r in reversed(first)]


async def test_a_tenant_scope_hides_other_tenants_everywhere(dsn: str, schema: str) -> None:
    mine = await _enqueue(dsn, schema, 2, tenant_id="t-mine", conversation_id="conv-mine")
    theirs = await _enqueue(dsn, schema, 3, tenant_id="t-theirs", conversation_id="conv-theirs")
    async with admin_client(dsn, schema, who="act:t-mine") as client:
        page = (await client.get("/admin/")).text
        assert set(listed(page)) == {str(r) for r in mine}
        assert ">queued: 2<" in page and "t-theirs" not in page
        # Asking for the other tenant by filter changes nothing.
        assert set(listed((await client.get("/admin/", params={"tenant": "t-theirs"})).text)) == {
            str(r) for r in mine
        }
        for path in (
            f"/admin/runs/{theirs[0]}",
            f"/admin/runs/{theirs[0]}/events",
            f"/admin/runs/{theirs[0]}/cancel",
            "/admin/conversation?id=conv-theirs",
            "/admin/conversation/stop?id=conv-theirs",
        ):
            assert (await client.get(path)).status_code == 404, path
        token = csrf_of((await client.get(f"/admin/runs/{mine[0]}/cancel")).text)
        refused = await client.post(f"/admin/runs/{theirs[0]}/cancel", data={"csrf": token})
        assert refused.status_code == 404
        assert (await runrow.get_run(dsn, theirs[0], schema=schema)).status == "queued"
        health = (await client.get("/admin/health")).text
        assert "t-mine" in health and "t-theirs" not in health
        assert "<dd id='depth-queued'>2</dd>" in health
        assert (await client.get(f"/admin/runs/{mine[0]}")).status_code == 200
        assert (await client.get("/admin/conversation?id=conv-mine")).status_code == 200
    async with admin_client(dsn, schema, who="view") as client:  # unscoped: sees both
        assert len(listed((await client.get("/admin/")).text)) == 5


async def test_read_only_renders_no_action_and_refuses_every_post(dsn: str, schema: str) -> None:
    (rid,) = await _enqueue(dsn, schema, 1, conversation_id="conv-ro")
    for options, who in (({"read_only": True}, "act"), ({}, "view")):
        async with admin_client(dsn, schema, who=who, **options) as client:
            page = await client.get(f"/admin/runs/{rid}")
            assert page.status_code == 200
            assert "Cancel this run" not in page.text and "Stop the conversation" not in page.text
            assert 'method="post"' not in page.text
            assert "Stop the conversation" not in (await client.get("/admin/conversation?id=conv-ro")).text
            for path in (
                f"/admin/runs/{rid}/cancel",
                f"/admin/runs/{rid}/retry",
                "/admin/conversation/stop?id=conv-ro",
            ):
                assert (await client.get(path)).status_code == 403, path
                assert (await client.post(path, data={"csrf": "x"})).status_code == 403, path
    assert (await runrow.get_run(dsn, rid, schema=schema)).status == "queued"
    async with admin_client(dsn, schema, who=None) as client:
        assert (await client.get("/admin/")).status_code == 401
        assert (await client.get(f"/admin/runs/{rid}")).status_code == 401


async def test_csrf_refusals(dsn: str, schema: str) -> None:
    (rid,) = await _enqueue(dsn, schema, 1)
    async with admin_client(dsn, schema) as client:
        confirm = await client.get(f"/admin/runs/{rid}/cancel")
        assert confirm.status_code == 200 and "Cancel run" in confirm.text
        token = csrf_of(confirm.text)
        cookie = client.cookies.get("runrow_admin_csrf")
        assert cookie == token
        # No field; a field that is not the cookie; a cookie and field agreeing on an unsigned token.
        assert (await client.post(f"/admin/runs/{rid}/cancel")).status_code == 403
        assert (await client.post(f"/admin/runs/{rid}/cancel", data={"csrf": token + "0"})).status_code == 403
        client.cookies.set("runrow_admin_csrf", "abc.def", path="/admin")
        forged = await client.post(f"/admin/runs/{rid}/cancel", data={"csrf": "abc.def"})
        assert forged.status_code == 403
        assert (await runrow.get_run(dsn, rid, schema=schema)).status == "queued"
        client.cookies.clear()
        assert (await client.post(f"/admin/runs/{rid}/cancel", data={"csrf": token})).status_code == 403
        # A token of another admin (another secret) is refused too.
    async with admin_client(dsn, schema) as other:
        other.cookies.set("runrow_admin_csrf", token, path="/admin")
        assert (await other.post(f"/admin/runs/{rid}/cancel", data={"csrf": token})).status_code == 403
    assert (await runrow.get_run(dsn, rid, schema=schema)).status == "queued"


async def test_actions_do_what_they_say(dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The admin's forms need no python-multipart (the extras do not bring it): as if absent.
    monkeypatch.setattr("starlette.requests.parse_options_header", None)
    (rid,) = await _enqueue(dsn, schema, 1, content="<script>alert(1)</script>", conversation_id="conv-x")
    stopped = await _enqueue(dsn, schema, 2, conversation_id="conv-stop")
    async with admin_client(dsn, schema) as client:
        shown = (await client.get("/admin/conversation?id=conv-x")).text
        assert "<script>alert(1)</script>" not in shown and "&lt;script&gt;alert(1)&lt;/script&gt;" in shown
        token = csrf_of((await client.get(f"/admin/runs/{rid}/cancel")).text)
        done = await client.post(f"/admin/runs/{rid}/cancel", data={"csrf": token})
        assert done.status_code == 303 and done.headers["location"] == f"/admin/runs/{rid}"
        assert (await runrow.get_run(dsn, rid, schema=schema)).status == "cancelled"
        again = await client.post(f"/admin/runs/{rid}/retry", data={"csrf": token})
        assert again.status_code == 303
        new_id = again.headers["location"].rsplit("/", 1)[1]
        new = await runrow.get_run(dsn, new_id, schema=schema)
        assert new.retry_of == rid and new.status == "queued" and new.attempt == 2
        lineage = (await client.get(f"/admin/runs/{new_id}")).text
        assert str(rid) in lineage and "(this run)" in lineage
        # Retrying a queued run is refused, and says why.
        assert (await client.post(f"/admin/runs/{new_id}/retry", data={"csrf": token})).status_code == 409
        stop = await client.post("/admin/conversation/stop?id=conv-stop", data={"csrf": token})
        assert stop.status_code == 303
        assert [(await runrow.get_run(dsn, r, schema=schema)).status for r in stopped] == ["cancelled"] * 2
        conv = (await client.get("/admin/conversation?id=conv-stop")).text
        assert conv.count("status-cancelled") == 2 and "Transcript" in conv


async def test_the_detail_page_shows_the_reapers_hand_and_uncertain_calls(dsn: str, schema: str) -> None:
    (rid,) = await _enqueue(dsn, schema, 1)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        # A worker that claimed the run, announced a tool call and died; the lease lapsed.
        await c.execute(
            sql.SQL(
                "UPDATE {} SET status = 'running', claim_token = gen_random_uuid(), worker_id = 'w-dead',"
                " started_at = now() - interval '5 min', last_heartbeat_at = now() - interval '4 min',"
                " claim_expires_at = now() - interval '3 min' WHERE id = %s"
            ).format(sql.Identifier(schema, "agent_run")),
            (rid,),
        )
        await c.execute(
            sql.SQL(
                "INSERT INTO {} (run_id, seq, type, payload) VALUES (%s, 3, 'tool_call_started', %s)"
            ).format(sql.Identifier(schema, "run_event")),
            (rid, json.dumps({"tool_call_id": "call-9", "name": "charge_card"})),
        )
    assert await reap_expired(dsn, schema=schema, grace=1.0) == [rid]
    async with admin_client(dsn, schema) as client:
        page = (await client.get(f"/admin/runs/{rid}")).text
        assert "the reaper ended it" in page and "worker_lost" in page
        assert "charge_card" in page and "call-9" in page and "w-dead" in page
        health = (await client.get("/admin/health")).text
        assert "<dd id='reaped'>1</dd>" in health and "<svg" in health and "Queue depth" in health


async def test_the_admin_retry_keeps_the_deadline_and_refuses_a_passed_one(dsn: str, schema: str) -> None:
    (rid,) = await _enqueue(dsn, schema, 1, deadline=timedelta(seconds=-1))
    await runrow.cancel_run(dsn, rid, schema=schema)
    async with admin_client(dsn, schema) as client:
        confirm = (await client.get(f"/admin/runs/{rid}/retry")).text
        assert "keeping the turn&#x27;s deadline" in confirm or "keeping the turn's deadline" in confirm
        late = await client.post(f"/admin/runs/{rid}/retry", data={"csrf": csrf_of(confirm)})
        assert late.status_code == 409 and "deadline" in late.text
    assert (
        len(
            await runrow.list_runs(
                dsn,
                conversation_id=(await runrow.get_run(dsn, rid, schema=schema)).conversation_id,
                schema=schema,
            )
        )
        == 1
    )


async def test_a_run_its_worker_ended_at_its_deadline_is_not_shown_as_reaped(dsn: str, schema: str) -> None:
    """The worker's own deadline ending has the reaper's error type (deadline_exceeded):
    the page and the health counter must tell them apart by the terminal event."""
    (rid,) = await _enqueue(dsn, schema, 1, deadline=timedelta(seconds=1))
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        (claimed,) = await manual.claim(c, schema, worker_id="w-alive")
        assert await manual.finalize(
            c, schema, rid, claimed["claim_token"], "failed", claimed["last_seq"] + 1, error=DEADLINE_ERROR
        )
    async with admin_client(dsn, schema) as client:
        page = (await client.get(f"/admin/runs/{rid}")).text
        assert "deadline_exceeded" in page and "the reaper ended it" not in page
        health = (await client.get("/admin/health")).text
        assert "<dd id='reaped'>0</dd>" in health


# Each filter, with a rare value, and the index that must serve it (the plan's order
# comes from the index: no sort).
_PLAN_CASES: list[tuple[dict[str, Any], str]] = [
    ({}, "agent_run_created_idx"),
    ({"status": "completed"}, "agent_run_status_created_idx"),
    ({"tenant_id": "t2"}, "agent_run_tenant_created_idx"),
    ({"user_id": "u-rare"}, "agent_run_user_created_idx"),
    ({"worker_id": "w"}, "agent_run_worker_created_idx"),
    ({"conversation_id": "seed-t1-3"}, "agent_run_conversation_idx"),
    (
        {"created_from": datetime(2020, 1, 1, tzinfo=UTC), "created_to": datetime(2020, 1, 2, tzinfo=UTC)},
        "agent_run_created_idx",
    ),
]


async def test_every_admin_statement_reads_through_an_index(dsn: str, schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        await seed(c, schema, tenant="t1", n=3000, conversations=300)
        await c.execute(
            sql.SQL("UPDATE {} SET worker_id = 'w' WHERE queue_order % 7 = 0").format(
                sql.Identifier(schema, "agent_run")
            )
        )
        # The list's indexes are opt-in (schema 12): a large deployment builds them.
        await runrow.migrate(c, schema=schema, dashboard_indexes=True)
        await c.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(schema, "agent_run")))
        await c.execute(
            "SET enable_seqscan = off"
        )  # no escape hatch: without an index, the plan shows a Seq Scan
        base = {
            "status": None,
            "tenant_id": None,
            "conversation_id": None,
            "user_id": None,
            "worker_id": None,
            "created_from": None,
            "created_to": None,
            "before_created": None,
            "before_id": None,
            "limit": 51,
        }
        rid = uuid.uuid4()
        cases: list[tuple[str, dict[str, Any], str | None]] = [
            ("admin_list_runs", {**base, **params}, index) for params, index in _PLAN_CASES
        ]
        cases += [
            (name, params, None)
            for name, params in [
                ("admin_status_counts", {"tenant_id": None}),
                ("admin_status_counts", {"tenant_id": "t1"}),
                ("admin_lineage", {"root": rid}),
                ("admin_terminal_event", {"run_id": rid}),
                ("admin_steps", {"lineage_id": rid, "limit": 500}),
                ("admin_conversation_runs", {"conversation_id": "seed-t1-3", "limit": 500}),
                ("admin_tenant_health", {"tenant_id": None}),
                ("admin_workers", {"tenant_id": None}),
                (
                    "admin_finished_series",
                    {"tenant_id": None, "window_seconds": 3600.0, "bucket_seconds": 600.0},
                ),
                (
                    "admin_depth_series",
                    {"tenant_id": None, "window_seconds": 3600.0, "bucket_seconds": 600.0},
                ),
                (
                    "admin_depth_series",
                    {"tenant_id": "t2", "window_seconds": 3600.0, "bucket_seconds": 600.0},
                ),
            ]
        ]
        for name, params, index in cases:
            cur = await c.execute(b"EXPLAIN (FORMAT JSON) " + statement_text(name, schema), params)
            row = await cur.fetchone()
            assert row is not None
            nodes = plan_nodes(row[0][0]["Plan"])
            seq = [
                n for n in nodes if n["Node Type"] == "Seq Scan" and n.get("Relation Name") != "tenant_policy"
            ]
            assert not seq, f"{name} {params}: {json.dumps(row[0], indent=1)}"
            if index is not None:
                used = {n.get("Index Name") for n in nodes} - {None}
                assert used == {index}, f"{params}: {used}"
                # No sort of the whole match: the index delivers the order (a conversation's few runs aside).
                assert params["conversation_id"] or not any(n["Node Type"] == "Sort" for n in nodes), params


async def test_runrow_web_wants_its_token_or_a_local_caller(
    dsn: str, schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import httpx

    from runrow.admin._web import is_loopback, serve, web_app

    (rid,) = await _enqueue(dsn, schema, 1)
    app = web_app(dsn, schema=schema, token="s3cret", read_only=True)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://web") as c,
    ):
        assert (await c.get("/")).status_code == 401
        assert (await c.get("/", headers={"Authorization": "Bearer wrong"})).status_code == 401
        ok = await c.get(f"/runs/{rid}", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and "Cancel this run" not in ok.text  # --read-only
        assert (await c.get("/login?token=nope")).status_code == 401
        login = await c.get("/login?token=s3cret")
        assert login.status_code == 303
        assert str(rid) in (await c.get("/")).text  # the cookie now lets the browser in
    local = web_app(dsn, schema=schema, token=None, read_only=False)
    async with local.router.lifespan_context(local):
        cases = (
            (("127.0.0.1", 5000), "http://127.0.0.1:8001", 200),
            (("127.0.0.1", 5000), "http://localhost:8001", 200),
            (("::1", 5000), "http://[::1]:8001", 200),
            (("10.1.2.3", 5000), "http://127.0.0.1:8001", 401),
            # DNS rebinding: a page whose own name now resolves to 127.0.0.1.
            (("127.0.0.1", 5000), "http://rebind.attacker.example:8001", 401),
        )
        for client, base_url, status in cases:
            transport = httpx.ASGITransport(app=local, client=client)
            async with httpx.AsyncClient(transport=transport, base_url=base_url) as c:
                assert (await c.get("/")).status_code == status, (client, base_url)
    assert is_loopback("::1") and is_loopback("localhost") and not is_loopback("0.0.0.0")
    with pytest.raises(SystemExit, match="needs a token"):
        serve(dsn, host="0.0.0.0", port=1, schema=schema, token=None, read_only=False)
    from runrow.cli import main

    # The command refuses before it serves: a usage error, one line naming what is missing.
    assert main(["web", "--host", "0.0.0.0", "--database-url", dsn, "--schema", schema]) == 2
    assert "needs a token" in capsys.readouterr().err


async def test_the_demo_mounts_the_admin(dsn: str, schema: str) -> None:
    import httpx

    from .demo_support import auth, serve_demo

    async with serve_demo(dsn, schema) as base, httpx.AsyncClient(base_url=base, timeout=30) as client:
        posted = await client.post(
            "/v1/conversations/c-demo/messages", json={"content": "hi"}, headers=auth("alice")
        )
        assert posted.status_code == 202
        page = await client.get("/admin/", headers=auth("alice"))
        assert page.status_code == 200 and posted.json()["run_id"] in listed(page.text)
        detail = await client.get(f"/admin/runs/{posted.json()['run_id']}")  # a browser on this machine
        assert detail.status_code == 200 and "Stop the conversation" in detail.text


async def test_queue_depth_over_time_counts_queued_runs_until_they_leave(dsn: str, schema: str) -> None:
    from runrow._gateway import _exec
    from runrow._gateway import admin as gw

    queued = await _enqueue(dsn, schema, 5, tenant_id="d1")
    await runrow.cancel_run(dsn, queued[0], schema=schema)  # left the queue unstarted
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        old = sql.SQL("UPDATE {} SET created_at = now() - interval '2 hours' WHERE id = %s")
        await c.execute(
            old.format(sql.Identifier(schema, "agent_run")), (queued[1],)
        )  # queued before the window
        depths = await _exec.run(
            c, gw.depth_series(schema, tenant_id=None, window_seconds=3600, bucket_seconds=600)
        )
        assert len(depths) == 6 and depths[0] == 1 and depths[-1] == 4, depths
        assert (
            await _exec.run(
                c, gw.depth_series(schema, tenant_id="other", window_seconds=3600, bucket_seconds=600)
            )
            == [0] * 6
        )


async def test_no_action_without_a_post_from_the_admins_own_pages(dsn: str, schema: str) -> None:
    """HEAD (which Starlette answers on every GET route, and which a browser sends cross-site
    without a preflight) only ever confirms; a POST a browser marks as cross-site, or whose
    Origin is another host, is refused even with a valid token."""
    (rid,) = await _enqueue(dsn, schema, 1, conversation_id="conv-head")
    async with admin_client(dsn, schema) as client:
        for url in (
            f"/admin/runs/{rid}/cancel",
            f"/admin/runs/{rid}/retry",
            "/admin/conversation/stop?id=conv-head",
        ):
            head = await client.head(url)
            assert head.status_code == 200, (url, head.status_code)
            assert (await client.put(url)).status_code == 405
        assert (await runrow.get_run(dsn, rid, schema=schema)).status == "queued"
        token = csrf_of((await client.get(f"/admin/runs/{rid}/cancel")).text)
        for headers in (
            {"Sec-Fetch-Site": "cross-site"},
            {"Sec-Fetch-Site": "same-site"},
            {"Origin": "https://evil.example"},
        ):
            refused = await client.post(f"/admin/runs/{rid}/cancel", data={"csrf": token}, headers=headers)
            assert refused.status_code == 403, headers
        assert (await runrow.get_run(dsn, rid, schema=schema)).status == "queued"
        ok = await client.post(
            f"/admin/runs/{rid}/cancel",
            data={"csrf": token},
            headers={"Origin": "http://admin.test", "Sec-Fetch-Site": "same-origin"},
        )
        assert ok.status_code == 303
        assert (await runrow.get_run(dsn, rid, schema=schema)).status == "cancelled"


async def test_a_scope_never_sees_a_whole_conversation_it_has_not_read_whole(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conversation longer than the page reads (MAX_TURNS) may hold another tenant's turns
    past it: a scoped caller gets neither its transcript nor its stop."""
    from runrow.admin import _actions

    monkeypatch.setattr(_actions, "MAX_TURNS", 3)
    await _enqueue(dsn, schema, 3, tenant_id="mine", conversation_id="conv-long")
    async with admin_client(dsn, schema, who="act:mine") as client:
        page = await client.get("/admin/conversation?id=conv-long")
        assert page.status_code == 200 and "Stop the conversation" in page.text
        await _enqueue(dsn, schema, 1, tenant_id="theirs", conversation_id="conv-long", content="SECRET")
        page = await client.get("/admin/conversation?id=conv-long")
        assert (
            page.status_code == 200 and "SECRET" not in page.text and "Stop the conversation" not in page.text
        )
        assert (await client.get("/admin/conversation/stop?id=conv-long")).status_code == 404
    with pytest.raises(ValueError, match="non-empty"):
        AdminAccess(tenant_id="")


# Every query parameter the admin reads, where, and what an arbitrary value may get:
# "id" a host id (400 unless storable: non-empty after the list's strip, no NUL, at most
# 256 characters), "status" one of the statuses, "parsed" a time, cursor or seq (or 400).
# Nothing gets a 500.
_QUERY_PARAMS: list[tuple[str, str, str]] = [
    ("/admin/", "tenant", "filter"),
    ("/admin/", "conversation", "filter"),
    ("/admin/", "user", "filter"),
    ("/admin/", "worker", "filter"),
    ("/admin/", "status", "status"),
    ("/admin/", "from", "parsed"),
    ("/admin/", "to", "parsed"),
    ("/admin/", "before", "parsed"),
    ("/admin/conversation", "id", "conversation"),
    ("/admin/conversation/stop", "id", "conversation"),
    ("/admin/runs/{run}/events", "from", "parsed"),
]


def _storable_id(value: str) -> bool:
    return bool(value) and "\x00" not in value and len(value) <= 256


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.sampled_from(_QUERY_PARAMS), value=st.text(max_size=300) | st.text("a\x00 ", max_size=4))
@example(where=("/admin/", "conversation", "filter"), value="c\x00")
@example(where=("/admin/", "user", "filter"), value="\x00")
@example(where=("/admin/", "worker", "filter"), value="w\x00w")
@example(where=("/admin/", "tenant", "filter"), value="\x00t")
@example(where=("/admin/conversation", "id", "conversation"), value="c\x00")
@example(where=("/admin/conversation/stop", "id", "conversation"), value="c\x00")
@example(where=("/admin/", "conversation", "filter"), value="c" * 256)
async def test_every_malformed_query_parameter_gets_400_never_500(
    dsn: str, schema: str, where: tuple[str, str, str], value: str
) -> None:
    path, name, kind = where
    if "{run}" in path:
        (rid,) = await _enqueue(dsn, schema, 1)
        await runrow.cancel_run(dsn, rid, schema=schema)  # ended: its stream ends too
        path = path.format(run=rid)
    async with admin_client(dsn, schema) as client:
        got = (await client.get(path, params={name: value})).status_code
    if kind == "filter":
        stripped = value.strip()
        assert got == (200 if not stripped or _storable_id(stripped) else 400), (name, value, got)
    elif kind == "status":
        assert got == (200 if value.strip() in ("", *_STATUSES) else 400), (value, got)
    elif kind == "conversation":  # no conversation exists: a well-formed id names none
        assert got == (404 if _storable_id(value) else 400), (path, value, got)
    else:  # (204: a cursor at or past an ended run's last event, nothing left to send)
        assert got in (200, 204, 400), (path, name, value, got)


async def _parked(dsn: str, schema: str, conn: psycopg.AsyncConnection, timeout: float | None) -> uuid.UUID:
    """A run that waits for input ``approve`` (with that input timeout, or none)."""

    async def agent(run: runrow.RunContext) -> None:
        await run.wait_for_input("approve", {"q": "ok?"}, timeout=timeout)

    async with runrow.Dispatcher(dsn, agent, schema=schema, poll=0.2):
        run = await runrow.enqueue(
            dsn, schema=schema, conversation_id=f"p-{timeout}", user_id="u", content="x"
        )

        async def waiting() -> bool:
            return (await runrow.get_run(dsn, run.id, schema=schema)).status == "waiting"

        await wait_for(waiting, what="the run to park")
    return run.id


async def test_the_timeline_says_until_when_only_a_wait_has_a_deadline(
    dsn: str, schema: str, conn: psycopg.AsyncConnection
) -> None:
    """It said "Waiting for input - until" (a dash, then nothing) for a wait without one."""
    endless = await _parked(dsn, schema, conn, None)
    timed = await _parked(dsn, schema, conn, 3600)
    async with admin_client(dsn, schema) as client:
        endless_html = (await client.get(f"/admin/runs/{endless}")).text
        timed_html = (await client.get(f"/admin/runs/{timed}")).text

    def waiting_item(html: str) -> str:
        (item,) = [li for li in html.split("<li>") if "Waiting for input" in li and "timeline" not in li]
        return item.split("</li>")[0]

    endless_item = waiting_item(endless_html)
    assert "until" not in endless_item and "no deadline" in endless_item, endless_item
    timed_item = waiting_item(timed_html)
    assert "until" in timed_item and "<time " in timed_item, timed_item
    assert timed_item.index("until") < timed_item.index("<time "), timed_item  # "until <the time>"


async def test_a_waiting_run_shows_no_worker(dsn: str, schema: str) -> None:
    """The worker that parked a run let go of it (it may be long dead): a waiting run, and
    the queued run it becomes when input comes, show no worker anywhere a run is shown
    (get_run, list_runs and so the CLI and the HTTP API, the dashboard's pages); a running
    or ended run shows the worker that held it last."""
    from runrow.http._turns import run_json

    (rid,) = await _enqueue(dsn, schema, 1, conversation_id="parked")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        (claimed,) = await manual.claim(c, schema, worker_id="w-parker")
        assert (await runrow.get_run(dsn, rid, schema=schema)).worker_id == "w-parker"  # running: its worker
        assert await manual.park(c, schema, rid, claimed["claim_token"], claimed["last_seq"] + 1, key="ok")
    info = await runrow.get_run(dsn, rid, schema=schema)
    assert info.status == "waiting"
    assert info.worker_id is None
    listed_runs = await runrow.list_runs(dsn, conversation_id="parked", schema=schema)
    assert [r.worker_id for r in listed_runs] == [None]
    assert run_json(info, "/chat")["worker_id"] is None
    async with admin_client(dsn, schema) as client:
        for page in ("/admin/", "/admin/conversation?id=parked", f"/admin/runs/{rid}"):
            assert "w-parker" not in (await client.get(page)).text, page
    assert await runrow.provide_input(dsn, rid, "ok", True, schema=schema)
    resumed = await runrow.get_run(dsn, rid, schema=schema)
    assert (resumed.status, resumed.worker_id) == ("queued", None)


async def test_the_workers_page_lists_the_registry_and_the_run_page_its_version(
    dsn: str, schema: str
) -> None:
    (rid,) = await _enqueue(dsn, schema, 1)
    async with (
        runrow.Dispatcher(dsn, _quick, schema=schema, version="v-42", poll=0.2) as d,
        admin_client(dsn, schema) as client,
    ):
        await wait_for(lambda: _ended(dsn, schema, rid), what="the run to end")
        page = (await client.get("/admin/workers")).text
        assert d.worker_id in page and "v-42" in page and "tests.test_admin._quick" in page
        assert "<dt>Version v-42</dt><dd>1 worker(s)</dd>" in page
        run_page = (await client.get(f"/admin/runs/{rid}")).text
        assert "<dt>Version</dt><dd>v-42</dd>" in run_page
        scoped = await client.get("/admin/workers", headers={"x-admin": "view:t1"})
        assert scoped.status_code == 403
    async with admin_client(dsn, schema) as client:
        assert "No worker is registered." in (await client.get("/admin/workers")).text


async def _ended(dsn: str, schema: str, rid: uuid.UUID) -> bool:
    return (await runrow.get_run(dsn, rid, schema=schema)).terminal
