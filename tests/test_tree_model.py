"""A hypothesis state machine over trees of runs (#41): spawn, claim, a child's ending
(completed or failed), a parent's park on its children, a stop of a root, and the reap
of a lost worker's runs, in random interleavings, against the real database, through the
statements the engine sends (a hand-driven worker: ``tests/manual.py``). After every
step:

* a terminal state never changes, and every ended run has exactly one terminal event;
* no parent is left waiting on children whose wait is over (all ended, or one with
  ``first``): the ending that completed it queued it again;
* once a root's conversation was stopped (the trees of its live turns then), or a root
  was cancelled (whatever its status), none of the runs of those trees is queued,
  waiting or running unflagged (the stop reached every one in its transaction).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import timedelta
from typing import Any

import anyio
import anyio.from_thread
import psycopg
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from psycopg import sql

import runrow
from runrow._engine.tree import CHILDREN
from runrow._enqueue import enqueue_in
from runrow._enqueue_options import EnqueueOptions
from runrow._gateway import _exec, endings
from runrow._gateway import tree as _tree
from runrow._names import Channels

from . import manual

ROOTS = ["r0", "r1"]
TERMINAL = {"completed", "failed", "cancelled", "expired"}


class Trees(RuleBasedStateMachine):
    dsn: str = ""
    portal: anyio.from_thread.BlockingPortal | None = None

    def __init__(self) -> None:
        super().__init__()
        self.schema = f"m_{uuid.uuid4().hex[:10]}"
        self.call(runrow.migrate, self.dsn, schema=self.schema)
        self.conn: psycopg.AsyncConnection = self.call(
            psycopg.AsyncConnection.connect, self.dsn, autocommit=True
        )
        self.held: dict[uuid.UUID, tuple[uuid.UUID, int]] = {}  # run -> (claim token, next seq)
        self.first_terminal: dict[uuid.UUID, str] = {}
        self.stopped_trees: set[uuid.UUID] = set()
        self.spawns = 0

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        assert self.portal is not None
        return self.portal.call(lambda: fn(*args, **kwargs))

    def teardown(self) -> None:
        async def drop() -> None:
            await self.conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(self.schema)))
            await self.conn.close()

        self.call(drop)

    def rows(self) -> dict[uuid.UUID, dict[str, Any]]:
        async def read() -> list[dict[str, Any]]:
            cur = self.conn.cursor(row_factory=psycopg.rows.dict_row)
            await cur.execute(
                sql.SQL(
                    "SELECT id, queue_order, status, conversation_id, parent_run_id, root_run_id, awaiting, await_any,"
                    " cancel_requested, (SELECT count(*) FROM {e} e WHERE e.run_id = a.id AND e.type = 'complete')"
                    " AS terminals FROM {a} a"
                ).format(
                    a=sql.Identifier(self.schema, "agent_run"), e=sql.Identifier(self.schema, "run_event")
                )
            )
            return await cur.fetchall()

        return {r["id"]: r for r in self.call(read)}

    def pick(self, data: st.DataObject, ids: Any) -> uuid.UUID:
        """One of ``ids``, drawn by enqueue order (ids are random: a draw must not be)."""
        rows = self.rows()
        return data.draw(st.sampled_from(sorted(ids, key=lambda i: rows[i]["queue_order"])))

    # -- rules -----------------------------------------------------------------------

    @rule(root=st.sampled_from(ROOTS))
    def enqueue_root(self, root: str) -> None:
        self.call(
            runrow.enqueue, self.conn, schema=self.schema, conversation_id=root, user_id="u", content="go"
        )

    @rule()
    def claim(self) -> None:
        got = self.call(manual.claim, self.conn, self.schema, agent_keys=("child",))
        for row in got:
            self.held[row["id"]] = (row["claim_token"], row["last_seq"] + 1)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), n=st.integers(min_value=1, max_value=3))
    def spawn(self, data: st.DataObject, n: int) -> None:
        run_id = self.pick(data, self.held)
        token, _ = self.held[run_id]
        row = self.rows()[run_id]
        lineage = run_id  # (no retries here: a run is its own turn)
        root = row["root_run_id"] or lineage
        self.spawns += 1

        def plan() -> Any:
            parent = yield from _tree.spawn_parent(self.schema, run_id=run_id, claim_token=token, max_depth=8)
            if parent is None or parent.cancel_requested:
                return None  # (as the engine: a stopping run spawns nothing)
            for i in range(n):
                options = EnqueueOptions.checked(
                    conversation_id=f"child:{self.spawns}:{i}",
                    user_id="u",
                    content="x",
                    tenant_id=None,
                    idempotency_key=f"spawn:{self.spawns}:{i}",
                    request=None,
                    priority=0,
                    not_before=None,
                    deadline=None,
                    on_busy="enqueue",
                    max_queued_per_tenant=None,
                    max_queued_per_conversation=None,
                    schema=self.schema,
                    max_content_bytes=1 << 16,
                    agent_key="child",
                )
                yield from enqueue_in(dataclasses.replace(options, parent_run_id=lineage, root_run_id=root))
            return True

        async def go() -> Any:
            async with self.conn.transaction():
                return await _exec.run(self.conn, plan())

        self.call(go)

    def _finalize(
        self, run_id: uuid.UUID, status: str, awaiting: list[uuid.UUID] | None, first: bool
    ) -> None:
        token, seq = self.held.pop(run_id)
        row = self.rows()[run_id]
        if awaiting is not None:
            payload = {"key": f"{CHILDREN}0", "children": [str(c) for c in awaiting], "first": first}
            events = [(seq, "children_awaited", json.dumps(payload))]
        else:
            events = [(seq, "complete", json.dumps({"status": status}))]
        ending = endings.Ending(
            run_id=run_id,
            claim_token=token,
            status=status,
            error=None if status != "failed" else json.dumps({"type": "E", "message": "m"}),
            partial=None,
            events=events,
            awaiting=awaiting,
            await_any=first,
            child=row["parent_run_id"] is not None,
        )
        self.call(
            endings.finalize, self.conn, self.schema, [ending], channels=Channels.for_schema(self.schema)
        )

    @precondition(lambda self: self.held)
    @rule(data=st.data(), status=st.sampled_from(["completed", "failed"]))
    def end(self, data: st.DataObject, status: str) -> None:
        self._finalize(self.pick(data, self.held), status, None, False)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), first=st.booleans())
    def park_on_children(self, data: st.DataObject, first: bool) -> None:
        """As wait_for_children: the children still going at the read are what it awaits."""
        run_id = self.pick(data, self.held)
        kids = sorted(
            (r for r in self.rows().values() if r["parent_run_id"] == run_id), key=lambda r: r["queue_order"]
        )
        pending = [k["id"] for k in kids if k["status"] not in TERMINAL]
        if not kids or not pending or (first and len(pending) < len(kids)):
            return  # (the wait would be over at once: recorded, no park)
        self._finalize(run_id, "waiting", pending, first)

    @rule(root=st.sampled_from(ROOTS))
    def stop(self, root: str) -> None:
        live = [
            r["id"]
            for r in self.rows().values()
            if r["conversation_id"] == root and r["status"] not in TERMINAL
        ]
        self.call(runrow.stop_conversation, self.conn, root, schema=self.schema)
        self.stopped_trees.update(live)

    @rule(data=st.data())
    def cancel_a_root(self, data: st.DataObject) -> None:
        """cancel_run on a root, whatever its status (an ended parent's children too)."""
        roots = [r["id"] for r in self.rows().values() if r["parent_run_id"] is None]
        if roots:
            root = self.pick(data, roots)
            self.call(runrow.cancel_run, self.conn, root, schema=self.schema)
            self.stopped_trees.add(root)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def lose_and_reap(self, data: st.DataObject) -> None:
        run_id = self.pick(data, self.held)
        del self.held[run_id]  # its worker is gone
        later = self.call(manual.db_now, self.conn) + timedelta(hours=1)
        self.call(manual.reap, self.conn, self.schema, [run_id], grace=0, now=later)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def finish_a_stopped_run(self, data: st.DataObject) -> None:
        """A worker seeing its stop flag ends its run cancelled."""
        rows = self.rows()
        flagged = [r for r in self.held if rows[r]["cancel_requested"]]
        if flagged:
            self._finalize(self.pick(data, flagged), "cancelled", None, False)

    # -- invariants ------------------------------------------------------------------

    @invariant()
    def every_run_ends_once(self) -> None:
        for rid, r in self.rows().items():
            if r["status"] in TERMINAL:
                first = self.first_terminal.setdefault(rid, r["status"])
                assert r["status"] == first, (rid, first, r["status"])
                assert r["terminals"] == 1, r
            else:
                assert rid not in self.first_terminal, r
                assert r["terminals"] == 0, r

    @invariant()
    def no_parent_waits_on_ended_children(self) -> None:
        rows = self.rows()
        for r in rows.values():
            if r["status"] == "waiting" and r["awaiting"] is not None:
                ended = [rows[c]["status"] in TERMINAL for c in r["awaiting"]]
                over = any(ended) if r["await_any"] else all(ended)
                assert not over, ("a parent waits on children whose wait is over", r)

    @invariant()
    def a_stopped_tree_has_nothing_live_left_unflagged(self) -> None:
        for r in self.rows().values():
            if r["id"] in self.stopped_trees or r["root_run_id"] in self.stopped_trees:
                assert r["status"] in TERMINAL or (r["status"] == "running" and r["cancel_requested"]), r


def test_tree_state_machine(dsn: str) -> None:
    with anyio.from_thread.start_blocking_portal(backend="asyncio") as portal:
        Trees.dsn = dsn
        Trees.portal = portal
        run_state_machine_as_test(
            Trees, settings=settings(max_examples=50, stateful_step_count=30, deadline=None)
        )
