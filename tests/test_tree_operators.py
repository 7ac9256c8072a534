"""A run's tree for operators and hosts (#41 point 7): ``list_runs(parent_run_id=...)``
lists the children a run spawned, ``runrow runs show`` names them and ``runs list
--parent`` lists them, and the dashboard's run page links a child to its parent and root
and a parent to its children (another tenant's children stay hidden)."""

from __future__ import annotations

import uuid

import anyio
import pytest

import runrow

from .admin_support import admin_client

pytestmark = pytest.mark.anyio

FAST = {"poll": 0.2, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.1}


async def leaf(run: runrow.RunContext) -> None:
    await run.write_message(f"leaf {run.content}")


async def middle(run: runrow.RunContext) -> None:
    (grandchild,) = await run.spawn_many([("leaf", "deep")])
    await run.wait_for_children([grandchild])
    await run.write_message("middle done")


async def root(run: runrow.RunContext) -> None:
    kids = await run.spawn_many([("leaf", "a"), ("middle", "b"), ("leaf", "c")])
    await run.wait_for_children(kids)
    await run.write_message("root done")


async def _tree(dsn: str, schema: str) -> runrow.RunInfo:
    """A finished tree: root -> (leaf a, middle b -> leaf deep, leaf c)."""
    agents = {"leaf": leaf, "middle": middle}
    async with runrow.Dispatcher(dsn, root, agents=agents, schema=schema, concurrency=4, **FAST):
        turn = await runrow.enqueue(
            dsn, schema=schema, conversation_id="tree", user_id="u", content="go", tenant_id="t1"
        )
        with anyio.fail_after(30):
            async for _ in runrow.tail(dsn, turn.id, schema=schema):  # until its terminal event
                pass
    info = await runrow.get_run(dsn, turn.id, schema=schema)
    assert info.status == "completed", info.error
    return info


async def test_list_runs_by_parent_lists_only_that_runs_children(dsn: str, schema: str) -> None:
    top = await _tree(dsn, schema)
    children = await runrow.list_runs(dsn, parent_run_id=top.id, schema=schema)
    # Newest first, like every list; the three the root spawned, not the grandchild.
    assert [c.agent_key for c in reversed(children)] == ["leaf", "middle", "leaf"]
    assert {c.parent_run_id for c in children} == {top.id} and {c.root_run_id for c in children} == {top.id}
    (mid,) = [c for c in children if c.agent_key == "middle"]
    (deep,) = await runrow.list_runs(dsn, parent_run_id=str(mid.id), schema=schema)
    assert deep.parent_run_id == mid.id and deep.root_run_id == top.id and deep.agent_key == "leaf"
    assert await runrow.list_runs(dsn, parent_run_id=deep.id, schema=schema) == []
    # The other filters still apply, and a run with no children has an empty list.
    assert await runrow.list_runs(dsn, parent_run_id=top.id, status="failed", schema=schema) == []
    assert len(await runrow.list_runs(dsn, parent_run_id=top.id, limit=2, schema=schema)) == 2
    assert await runrow.list_runs(dsn, parent_run_id=uuid.uuid4(), schema=schema) == []
    with pytest.raises(runrow.InvalidInput) as bad:
        await runrow.list_runs(dsn, parent_run_id="not-a-run", schema=schema)
    assert bad.value.field == "parent_run_id"


async def test_runs_show_names_the_children_and_runs_list_parent_lists_them(dsn: str, schema: str) -> None:
    from .test_cli import cli

    top = await _tree(dsn, schema)
    children = await runrow.list_runs(dsn, parent_run_id=top.id, schema=schema)
    common = ("--database-url", dsn, "--schema", schema)
    shown = await anyio.to_thread.run_sync(lambda: cli("runs", "show", str(top.id), *common))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    at = lines.index("children:")
    named = [line.split() for line in lines[at + 1 : at + 4]]
    assert [(n[0], n[1], n[2]) for n in named] == [
        (str(c.id), c.agent_key, "completed") for c in reversed(children)
    ], shown.stdout
    listed = await anyio.to_thread.run_sync(lambda: cli("runs", "list", "--parent", str(top.id), *common))
    assert listed.returncode == 0, listed.stderr
    assert all(str(c.id) in listed.stdout for c in children) and str(top.id) not in listed.stdout
    bad = await anyio.to_thread.run_sync(lambda: cli("runs", "list", "--parent", "nope", *common))
    assert bad.returncode != 0 and "Traceback" not in bad.stderr


async def test_the_run_page_links_parent_root_and_children_within_the_tenant(dsn: str, schema: str) -> None:
    top = await _tree(dsn, schema)
    children = await runrow.list_runs(dsn, parent_run_id=top.id, schema=schema)
    (mid,) = [c for c in children if c.agent_key == "middle"]
    (deep,) = await runrow.list_runs(dsn, parent_run_id=mid.id, schema=schema)
    async with admin_client(dsn, schema) as client:
        page = (await client.get(f"/admin/runs/{top.id}")).text
        assert '<h2 id="children-h">Children</h2>' in page
        for c in children:
            assert f'href="/admin/runs/{c.id}"' in page
        assert str(deep.id) not in page  # a grandchild is its parent's child, not the root's
        deep_page = (await client.get(f"/admin/runs/{deep.id}")).text
        assert f'<dt>Parent run</dt><dd><a href="/admin/runs/{mid.id}"' in deep_page
        assert f'<dt>Root run</dt><dd><a href="/admin/runs/{top.id}"' in deep_page
        assert "No child runs." in deep_page
    async with admin_client(dsn, schema, who="act:t2") as other:
        assert (await other.get(f"/admin/runs/{top.id}")).status_code == 404
