"""The dashboard's webhooks page: subscriptions (no secret shown) and the latest
deliveries, redeliver behind a confirmation and the CSRF token, and tenant scoping."""

from __future__ import annotations

import pytest

import runrow

from .admin_support import admin_client, csrf_of

pytestmark = pytest.mark.anyio


async def test_the_webhooks_page_lists_and_redelivers(dsn: str, schema: str) -> None:
    hook = await runrow.add_webhook(dsn, "billing", "https://example.com/hook", schema=schema)
    sent = await runrow.send_test_webhook(dsn, "billing", schema=schema)
    assert sent is not None
    async with admin_client(dsn, schema) as client:
        page = (await client.get("/admin/webhooks")).text
        assert "billing" in page and "https://example.com/hook" in page and str(sent.id) in page
        assert hook.secret not in page
        href = f"/admin/webhooks/redeliver?id={sent.id}"
        assert f'href="{href}"' in page
        confirm = await client.get(href)
        assert confirm.status_code == 200 and "Send this delivery again?" in confirm.text
        assert (await client.post(href, data={})).status_code == 403  # no CSRF token
        done = await client.post(href, data={"csrf": csrf_of(confirm.text)})
        assert done.status_code == 303 and done.headers["location"] == "/admin/webhooks"
        assert (await client.get("/admin/webhooks/redeliver?id=nope")).status_code == 404
        assert (await client.get("/admin/webhooks/forget?id=x")).status_code == 404
