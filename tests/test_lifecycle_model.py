"""A hypothesis state machine drives random lifecycles against the real database and
checks the invariants after every step:

* at most one running or waiting run per conversation;
* a terminal state never changes;
* every terminal run has exactly one terminal event, and it is the last; a waiting
  run's last event is its input_requested;
* every run's journal is gap-free from 1;
* a turn that was queued when its conversation was stopped never starts;
* a worker whose claim is gone can write nothing;
* every steering message (``on_busy="steer"``) is delivered exactly once: read into a
  running turn by one delivery (its run ``absorbed`` into that turn, its message moved
  there), or as a turn of its own (it started), or it is still queued, or a stop handed
  it back as a draft; never two of these, never lost; a delivery sent again (a lost
  answer) returns what it delivered and absorbs nothing more.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import anyio
import anyio.from_thread
import psycopg
import pytest
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
from runrow._engine.reaper import reap_expired

from . import manual

CONVERSATIONS = ["a", "b", "c"]
TERMINAL = {"completed", "failed", "cancelled", "expired", "absorbed"}


class Lifecycle(RuleBasedStateMachine):
    dsn: str = ""
    portal: anyio.from_thread.BlockingPortal | None = None

    def __init__(self) -> None:
        super().__init__()
        self.schema = f"m_{uuid.uuid4().hex[:10]}"
        self.call(runrow.migrate, self.dsn, schema=self.schema)
        self.conn: psycopg.AsyncConnection = self.call(
            psycopg.AsyncConnection.connect, self.dsn, autocommit=True
        )
        self.tokens: dict[uuid.UUID, uuid.UUID] = {}  # runs our worker holds
        self.next_seq: dict[uuid.UUID, int] = {}
        self.zombies: dict[uuid.UUID, tuple[uuid.UUID, int]] = {}  # claims taken from us
        self.first_terminal: dict[uuid.UUID, str] = {}
        self.stopped_queued: set[uuid.UUID] = set()
        self.order: dict[uuid.UUID, int] = {}  # enqueue order: run ids are random, choices must not be
        self.parks: dict[uuid.UUID, int] = {}  # how many times each run parked (its next input's key)
        self.deadlines: dict[uuid.UUID, bool] = {}  # waiting runs: whether their wait has a timeout
        self.steers: set[uuid.UUID] = set()  # runs enqueued with on_busy="steer"
        self.positions = 0  # step positions and delivery occurrences, never reused (one counter)
        self.delivered: dict[tuple[uuid.UUID, int], list[dict[str, Any]]] = {}  # (run, occurrence) -> what

    def ordered(self, ids: Any) -> list[uuid.UUID]:
        return sorted(ids, key=lambda r: self.order.get(r, len(self.order)))

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        assert self.portal is not None
        return self.portal.call(lambda: fn(*args, **kwargs))

    def teardown(self) -> None:
        async def drop() -> None:
            await self.conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(self.schema)))
            await self.conn.close()

        self.call(drop)

    # -- reading the truth ---------------------------------------------------------

    def runs(self) -> dict[uuid.UUID, tuple[str, str, Any]]:
        async def read() -> list[tuple[Any, ...]]:
            cur = await self.conn.execute(
                sql.SQL("SELECT id, conversation_id, status, started_at FROM {}").format(
                    sql.Identifier(self.schema, "agent_run")
                )
            )
            return await cur.fetchall()

        return {r[0]: (r[1], r[2], r[3]) for r in self.call(read)}

    def journals(self) -> dict[uuid.UUID, list[tuple[int, str]]]:
        async def read() -> list[tuple[Any, ...]]:
            cur = await self.conn.execute(
                sql.SQL("SELECT run_id, seq, type FROM {} ORDER BY run_id, seq").format(
                    sql.Identifier(self.schema, "run_event")
                )
            )
            return await cur.fetchall()

        out: dict[uuid.UUID, list[tuple[int, str]]] = {}
        for run_id, seq, etype in self.call(read):
            out.setdefault(run_id, []).append((seq, etype))
        return out

    def with_status(self, status: str) -> list[uuid.UUID]:
        return sorted(r for r, (_, s, _) in self.runs().items() if s == status)

    # -- rules -----------------------------------------------------------------------

    @rule(conv=st.sampled_from(CONVERSATIONS))
    def enqueue(self, conv: str) -> None:
        run = self.call(
            runrow.enqueue, self.conn, schema=self.schema, conversation_id=conv, user_id="u", content=conv
        )
        self.order[run.id] = len(self.order)

    @rule(conv=st.sampled_from(CONVERSATIONS))
    def steer(self, conv: str) -> None:
        run = self.call(
            runrow.enqueue,
            self.conn,
            schema=self.schema,
            conversation_id=conv,
            user_id="u",
            content=f"steer {conv}",
            on_busy="steer",
        )
        self.order[run.id] = len(self.order)
        self.steers.add(run.id)

    def queue(self) -> dict[uuid.UUID, tuple[str, str, int, bool]]:
        """Every run's conversation, status, queue order and steerable flag."""

        async def read() -> list[tuple[Any, ...]]:
            cur = await self.conn.execute(
                sql.SQL("SELECT id, conversation_id, status, queue_order, steerable FROM {}").format(
                    sql.Identifier(self.schema, "agent_run")
                )
            )
            return await cur.fetchall()

        return {r[0]: (r[1], r[2], r[3], r[4]) for r in self.call(read)}

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def absorb(self, data: st.DataObject) -> None:
        """The agent reads its steering messages: the steerable queued turns right after
        it (up to the first live turn that is not one) are delivered, in queue order."""
        run_id = data.draw(st.sampled_from(self.ordered(self.tokens)))
        before = self.queue()
        conv, status, order, _ = before[run_id]
        flagged = self.call(self._cancel_flag, run_id)
        expected: list[uuid.UUID] = []
        for other, (c, s, o, steerable) in sorted(before.items(), key=lambda kv: kv[1][2]):
            if c != conv or o <= order or s not in ("queued", "running", "waiting"):
                continue
            if s != "queued" or not steerable:
                break
            expected.append(other)
        occurrence = self.positions
        self.positions += 1
        got = self.call(
            manual.steer,
            self.conn,
            self.schema,
            run_id,
            self.tokens[run_id],
            occurrence=occurrence,
            position=occurrence,
        )
        if got is None:  # the claim is gone: nothing absorbed
            assert status != "running" or self.queue()[run_id][1] != "running"
            assert {r: v[1] for r, v in self.queue().items() if r in expected} == {
                r: "queued" for r in expected
            }
            self._lose(run_id)
            return
        assert [uuid.UUID(m["run_id"]) for m in got] == ([] if flagged else expected)
        self.delivered[(run_id, occurrence)] = got
        after = self.queue()
        assert all(after[uuid.UUID(m["run_id"])][1] == "absorbed" for m in got)

    @precondition(lambda self: any(r in self.tokens for r, _ in self.delivered))
    @rule(data=st.data())
    def redeliver(self, data: st.DataObject) -> None:
        """A delivery sent again (its answer was lost): the same messages, nothing more."""
        held = sorted(
            (k for k in self.delivered if k[0] in self.tokens), key=lambda k: (self.order.get(k[0], 0), k[1])
        )
        run_id, occurrence = data.draw(st.sampled_from(held))
        before = self.queue()
        got = self.call(
            manual.steer,
            self.conn,
            self.schema,
            run_id,
            self.tokens[run_id],
            occurrence=occurrence,
            position=occurrence,
        )
        if got is None:
            self._lose(run_id)
            return
        assert got == self.delivered[(run_id, occurrence)]
        assert self.queue() == before

    @rule(limit=st.integers(min_value=1, max_value=3))
    def claim(self, limit: int) -> None:
        for row in self.call(manual.claim, self.conn, self.schema, limit=limit):
            self.tokens[row["id"]] = row["claim_token"]
            self.next_seq[row["id"]] = row["last_seq"] + 1

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), n=st.integers(min_value=1, max_value=3))
    def emit(self, data: st.DataObject, n: int) -> None:
        run_id = data.draw(st.sampled_from(self.ordered(self.tokens)))
        seq = self.next_seq[run_id]
        evs = [(seq + i, "content_delta", {"delta": "x"}) for i in range(n)]
        landed = self.call(manual.append, self.conn, self.schema, run_id, self.tokens[run_id], evs)
        still_ours = self.runs()[run_id][1] == "running"
        assert landed == still_ours
        if landed:
            self.next_seq[run_id] = seq + n
        else:
            self._lose(run_id)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), status=st.sampled_from(["completed", "failed", "cancelled"]))
    def finish(self, data: st.DataObject, status: str) -> None:
        run_id = data.draw(st.sampled_from(self.ordered(self.tokens)))
        landed = self.call(
            manual.finalize,
            self.conn,
            self.schema,
            run_id,
            self.tokens[run_id],
            status,
            self.next_seq[run_id],
        )
        if not landed:
            assert self.runs()[run_id][1] in TERMINAL
        self._lose(run_id)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), timeout=st.sampled_from([None, 60.0]))
    def park(self, data: st.DataObject, timeout: float | None) -> None:
        """The agent waits for input: the run parks (waiting, or cancelled if a stop came first)."""
        run_id = data.draw(st.sampled_from(self.ordered(self.tokens)))
        n = self.parks.get(run_id, 0)
        flagged = self.call(self._cancel_flag, run_id)
        landed = self.call(
            manual.park,
            self.conn,
            self.schema,
            run_id,
            self.tokens[run_id],
            self.next_seq[run_id],
            key=f"k{n}",
            position=self.positions,
            timeout=timeout,
        )
        self.positions += 1
        status = self.runs()[run_id][1]
        if landed:
            assert status == ("cancelled" if flagged else "waiting")
            self.parks[run_id] = n + 1
            self.deadlines[run_id] = timeout is not None
        else:
            assert status in TERMINAL
        self._lose(run_id)

    async def _cancel_flag(self, run_id: uuid.UUID) -> bool:
        cur = await self.conn.execute(
            sql.SQL("SELECT cancel_requested FROM {} WHERE id = %s").format(
                sql.Identifier(self.schema, "agent_run")
            ),
            (run_id,),
        )
        row = await cur.fetchone()
        return bool(row and row[0])

    @precondition(lambda self: self.parks)
    @rule(data=st.data(), right_key=st.booleans())
    def provide(self, data: st.DataObject, right_key: bool) -> None:
        run_id = data.draw(st.sampled_from(self.ordered(self.parks)))
        status = self.runs()[run_id][1]
        key = f"k{self.parks[run_id] - 1}" if right_key else "nope"
        if status == "waiting" and right_key:
            assert self.call(runrow.provide_input, self.conn, run_id, key, 1, schema=self.schema) is True
            assert self.runs()[run_id][1] == "queued"
            assert self.call(runrow.provide_input, self.conn, run_id, key, 1, schema=self.schema) is False
        else:
            try:
                got = self.call(runrow.provide_input, self.conn, run_id, key, 1, schema=self.schema)
            except runrow.NotWaitingForInput as exc:
                assert exc.status == status
            else:  # the same value again, for an input answered before
                assert got is False and right_key and status != "waiting"
            assert self.runs()[run_id][1] == status

    @rule(conv=st.sampled_from(CONVERSATIONS))
    def stop(self, conv: str) -> None:
        before = {r: s for r, (c, s, _) in self.runs().items() if c == conv}
        queued_before = {r for r, s in before.items() if s == "queued"}
        waiting_before = {r for r, s in before.items() if s == "waiting"}
        result = self.call(runrow.stop_conversation, self.conn, conv, schema=self.schema)
        assert set(result.cancelled) == queued_before | waiting_before
        self.stopped_queued |= {r for r in queued_before if self.runs()[r][2] is None}

    @precondition(lambda self: self.runs())
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        run_id = data.draw(st.sampled_from(self.ordered(self.runs())))
        before = self.runs()[run_id][1]
        result = self.call(runrow.cancel_run, self.conn, run_id, schema=self.schema)
        assert result.noop == (before in TERMINAL)
        if before in ("queued", "waiting"):
            assert result.cancelled == [run_id] and self.runs()[run_id][1] == "cancelled"
        if before == "queued" and self.runs()[run_id][2] is None:
            self.stopped_queued.add(run_id)

    @rule()
    def reap(self) -> None:
        """Every lease and every wait's timeout is long over in this rule's clock: the
        reaper ends all running runs, and the waiting runs whose wait has a timeout."""
        now = self.call(manual.db_now, self.conn) + timedelta(hours=1)
        running = set(self.with_status("running"))
        timed = {r for r in self.with_status("waiting") if self.deadlines.get(r)}
        reaped = set(self.call(reap_expired, self.conn, schema=self.schema, grace=30, now=now))
        assert reaped == running | timed
        for run_id in timed:
            assert self.runs()[run_id][1] == "expired"
        for run_id in reaped:
            self._lose(run_id)

    @precondition(lambda self: self.zombies)
    @rule(data=st.data())
    def zombie_writes(self, data: st.DataObject) -> None:
        run_id = data.draw(st.sampled_from(self.ordered(self.zombies)))
        token, seq = self.zombies[run_id]
        assert not self.call(manual.append, self.conn, self.schema, run_id, token, [(seq, "late", {})])
        assert not self.call(manual.finalize, self.conn, self.schema, run_id, token, "completed", seq)

    @precondition(
        lambda self: any(s in ("failed", "cancelled", "expired") for _, s, _ in self.runs().values())
    )
    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        candidates = self.ordered(
            r for r, (_, s, _) in self.runs().items() if s in ("failed", "cancelled", "expired")
        )
        run_id = data.draw(st.sampled_from(candidates))
        again = self.call(runrow.retry_run, self.conn, run_id, schema=self.schema)
        self.order.setdefault(again.id, len(self.order))
        assert again.status in ("queued", "running", "waiting", *TERMINAL)

    def _lose(self, run_id: uuid.UUID) -> None:
        if run_id in self.tokens:
            self.zombies[run_id] = (self.tokens.pop(run_id), self.next_seq.pop(run_id))

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def one_running_turn_per_conversation(self) -> None:
        active = [c for c, s, _ in self.runs().values() if s in ("running", "waiting")]
        assert len(active) == len(set(active))

    @invariant()
    def terminal_states_never_change(self) -> None:
        for run_id, (_, status, _) in self.runs().items():
            if run_id in self.first_terminal:
                assert status == self.first_terminal[run_id]
            elif status in TERMINAL:
                self.first_terminal[run_id] = status

    @invariant()
    def journals_are_gap_free_with_one_last_terminal(self) -> None:
        runs = self.runs()
        for run_id, evs in self.journals().items():
            assert [s for s, _ in evs] == list(range(1, len(evs) + 1))
            terminals = [t for _, t in evs if t == "complete"]
            if runs[run_id][1] in TERMINAL:
                assert terminals == ["complete"] and evs[-1][1] == "complete"
            else:
                assert terminals == []
            if runs[run_id][1] == "waiting":
                assert evs[-1][1] == "input_requested"

    @invariant()
    def every_steering_message_is_delivered_exactly_once(self) -> None:
        async def read() -> list[tuple[Any, ...]]:
            cur = await self.conn.execute(
                sql.SQL(
                    "SELECT a.id, a.status, a.started_at, a.absorbed_into, m.status, m.run_id,"
                    " EXISTS (SELECT 1 FROM {runs} r WHERE r.retry_of = a.id),"
                    " (SELECT count(*) FROM {steps} s, jsonb_array_elements(s.result) e"
                    "  WHERE s.key = 'runrow.steering' AND e ->> 'run_id' = a.id::text)"
                    " FROM {runs} a JOIN {msgs} m ON m.id = a.user_message_id"
                ).format(
                    steps=sql.Identifier(self.schema, "run_step"),
                    runs=sql.Identifier(self.schema, "agent_run"),
                    msgs=sql.Identifier(self.schema, "message"),
                )
            )
            return await cur.fetchall()

        for run_id, status, started, into, message_status, message_run, retried, deliveries in self.call(
            read
        ):
            if status == "absorbed":  # read by one delivery, into the run that made it
                assert run_id in self.steers and started is None and deliveries == 1
                assert into is not None and message_run == into
            else:
                assert deliveries == 0 and into is None
                if run_id in self.steers and started is None and status != "queued":
                    # never started and not queued: a stop handed it back (or it was then
                    # retried: a turn of its own)
                    assert status == "cancelled" and (message_status == "draft" or retried)

    @invariant()
    def stopped_queued_turns_never_start(self) -> None:
        runs = self.runs()
        for run_id in self.stopped_queued:
            assert runs[run_id][1] == "cancelled" and runs[run_id][2] is None


@pytest.mark.slow
def test_lifecycle_state_machine(dsn: str) -> None:
    with anyio.from_thread.start_blocking_portal(backend="asyncio") as portal:
        Lifecycle.dsn = dsn
        Lifecycle.portal = portal
        run_state_machine_as_test(
            Lifecycle, settings=settings(max_examples=40, stateful_step_count=30, deadline=None)
        )


class SteeringLifecycle(Lifecycle):
    """The same machine with the rules steering meets most (turns and steering messages
    enqueued, claims, deliveries and their resends, parks and inputs, endings, stops,
    reaps): every invariant above, with deliveries common enough to matter."""

    # (Not rules here: overridden without @rule.)
    def emit(self, data: st.DataObject, n: int) -> None:  # type: ignore[override]
        raise AssertionError("not a rule of this machine")

    def zombie_writes(self, data: st.DataObject) -> None:  # type: ignore[override]
        raise AssertionError("not a rule of this machine")

    def cancel(self, data: st.DataObject) -> None:  # type: ignore[override]
        raise AssertionError("not a rule of this machine")

    @rule(conv=st.sampled_from(CONVERSATIONS[:2]))
    def steer_more(self, conv: str) -> None:
        self.steer(conv)

    @rule(conv=st.sampled_from(CONVERSATIONS[:1]))
    def enqueue_behind(self, conv: str) -> None:
        self.enqueue(conv)

    # (Rules are drawn uniformly: more ways to read makes deliveries with messages common.)
    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def absorb_more(self, data: st.DataObject) -> None:
        self.absorb(data)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def absorb_again(self, data: st.DataObject) -> None:
        self.absorb(data)


@pytest.mark.slow
def test_steering_lifecycle_state_machine(dsn: str) -> None:
    with anyio.from_thread.start_blocking_portal(backend="asyncio") as portal:
        SteeringLifecycle.dsn = dsn
        SteeringLifecycle.portal = portal
        run_state_machine_as_test(
            SteeringLifecycle, settings=settings(max_examples=80, stateful_step_count=30, deadline=None)
        )
