"""The dashboard's schedules page: the list with next ticks, pause and resume behind a
confirmation and the CSRF token, tenant scoping, and read-only mode."""

from __future__ import annotations

import pytest

import runrow

from .admin_support import admin_client, csrf_of

pytestmark = pytest.mark.anyio

TURN = {"conversation_id": "c-sched", "user_id": "cron", "content": "tick"}


async def test_the_schedules_page_lists_and_pauses_and_resumes(dsn: str, schema: str) -> None:
    await runrow.add_schedule(
        dsn, "digest", cron="0 7 * * *", timezone="Europe/Berlin", schema=schema, **TURN
    )
    await runrow.add_schedule(dsn, "t1-check", every=600, tenant_id="t1", schema=schema, **TURN)
    async with admin_client(dsn, schema) as client:
        page = (await client.get("/admin/schedules")).text
        assert "digest" in page and "cron 0 7 * * * (Europe/Berlin)" in page
        assert "t1-check" in page and "every 600 s" in page
        assert 'href="/admin/schedules/pause?name=digest"' in page
        confirm = await client.get("/admin/schedules/pause?name=digest")
        assert confirm.status_code == 200 and "Pause this schedule?" in confirm.text
        assert not (await runrow.list_schedules(dsn, schema=schema))[0].paused  # GET only confirms
        # Without the token the POST is refused and changes nothing.
        assert (await client.post("/admin/schedules/pause?name=digest", data={})).status_code == 403
        assert not (await runrow.list_schedules(dsn, schema=schema))[0].paused
        done = await client.post("/admin/schedules/pause?name=digest", data={"csrf": csrf_of(confirm.text)})
        assert done.status_code == 303 and done.headers["location"] == "/admin/schedules"
        assert (await runrow.list_schedules(dsn, schema=schema))[0].paused
        page = (await client.get("/admin/schedules")).text
        assert 'href="/admin/schedules/resume?name=digest"' in page
        confirm = await client.get("/admin/schedules/resume?name=digest")
        await client.post("/admin/schedules/resume?name=digest", data={"csrf": csrf_of(confirm.text)})
        assert not (await runrow.list_schedules(dsn, schema=schema))[0].paused
        assert (await client.get("/admin/schedules/pause?name=nope")).status_code == 404
        assert (await client.get("/admin/schedules/explode?name=digest")).status_code == 404
        # A tenant's operator sees and acts on its own tenant's schedules only.
        scoped = (await client.get("/admin/schedules", headers={"x-admin": "act:t1"})).text
        assert "t1-check" in scoped and "digest" not in scoped
        other = await client.get("/admin/schedules/pause?name=digest", headers={"x-admin": "act:t1"})
        assert other.status_code == 404
    async with admin_client(dsn, schema, read_only=True) as client:
        page = (await client.get("/admin/schedules")).text
        assert "digest" in page and "/schedules/pause" not in page
        assert (await client.get("/admin/schedules/pause?name=digest")).status_code == 403
