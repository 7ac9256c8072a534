"""The invariant checker: a pure function of the database and the tails' transcripts.

``load()`` reads everything it needs (runrow's tables, the chaos tables of
``tests/chaos/schema.py``) into a :class:`Snapshot`; ``evaluate()`` decides each
invariant from that snapshot and the transcripts alone. ``check()`` does both.

Times compared below are all PostgreSQL ``clock_timestamp()`` values except fault
times, which the runner takes from the same host clock. Orderings ("B started after
A ended") use the transition log's ``seq``, which is commit-consistent for the cases
checked here (see schema.py).
"""

from __future__ import annotations

import statistics
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from psycopg import sql

from tests.chaos.schema import TERMINAL, ident

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from datetime import datetime

    from psycopg import AsyncConnection

PARK_EVENTS = frozenset({"children_awaited", "input_requested"})  # a run parks with one of these
MAX_LISTED = 25  # violations listed per invariant in the report (all are counted)
INF = float("inf")


@dataclass
class Transcript:
    """What one tail saw, across all its disconnects and resumes."""

    run_id: str
    from_seq: int = 0
    events: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)
    resumes: int = 0
    finished: bool = False
    tree: list[tuple[str, int]] | None = None
    """A tree's tail (``tail(root, tree=True)``): each event's run and seq in that run,
    beside ``events`` (whose seqs are then the tree's positions); None for a run's tail."""

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "from_seq": self.from_seq,
            "events": [list(e) for e in self.events],
            "resumes": self.resumes,
            "finished": self.finished,
            "tree": None if self.tree is None else [list(r) for r in self.tree],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Transcript:
        return cls(
            d["run_id"],
            d.get("from_seq", 0),
            [(int(s), str(t), p) for s, t, p in d["events"]],
            d.get("resumes", 0),
            d.get("finished", False),
            None if d.get("tree") is None else [(str(r), int(s)) for r, s in d["tree"]],
        )


@dataclass
class RunRow:
    id: uuid.UUID
    conversation_id: str
    status: str
    queue_order: int
    cancel_requested: bool
    attempt: int = 1
    parent_run_id: uuid.UUID | None = None  # a child run (#41): its parent turn's first run
    root_run_id: uuid.UUID | None = None
    lineage_id: uuid.UUID | None = None  # its turn's first run (None: it is that run)
    child_index: int | None = None  # which of its parent's children (the request's "index")
    steerable: bool = False  # a steering message (#41 point 6: enqueue(on_busy="steer"))
    absorbed_into: uuid.UUID | None = None  # an absorbed one: the run whose turn read it
    started: bool = False  # whether it ever ran (as a turn of its own)


@dataclass
class Transition:
    seq: int
    run_id: uuid.UUID
    conversation_id: str
    queue_order: int
    old_status: str | None
    new_status: str
    at: datetime
    worker_id: str | None
    old_claim_expires_at: datetime | None


@dataclass
class StopRow:
    id: uuid.UUID
    conversation_id: str
    seq: int
    at: datetime
    cancelled: list[uuid.UUID]
    cancel_requested: list[uuid.UUID]


@dataclass
class FaultRow:
    kind: str
    at: datetime
    ended_at: datetime | None
    victims: list[uuid.UUID]
    outage: bool


@dataclass
class Snapshot:
    meta: dict[str, Any]
    runs: dict[uuid.UUID, RunRow]
    events: dict[uuid.UUID, list[tuple[int, str, dict[str, Any]]]]
    transitions: list[Transition]
    side_effects: list[tuple[uuid.UUID, int, int]]
    stops: list[StopRow]
    faults: list[FaultRow]
    step_effects: list[tuple[uuid.UUID, int, int]] = field(default_factory=list)
    """(turn, step, executions) of durable steps, counted across a turn's attempts."""
    deliveries: list[tuple[uuid.UUID, uuid.UUID, int, list[uuid.UUID]]] = field(default_factory=list)
    """Steering deliveries (run_step ``runrow.steering``): (lineage, the run that made it,
    occurrence, the absorbed runs it delivered, in order)."""


@dataclass
class CheckResult:
    invariants: dict[str, bool]
    violations: dict[str, list[str]]
    violation_counts: dict[str, int]
    counts: dict[str, Any]
    faults: dict[str, int]
    recovery_seconds: list[float]
    recovery_by_kind: dict[str, list[float]]
    stop_seconds: list[float]
    reap_lateness_seconds: list[float]

    @property
    def ok(self) -> bool:
        return all(self.invariants.values())


async def load(conn: AsyncConnection, schema: str, chaos_schema: str) -> Snapshot:
    """Reads the whole state the checker judges (runrow's tables and the chaos tables)."""

    async def q(query: sql.Composed) -> list[tuple[Any, ...]]:
        cur = await conn.execute(query)
        return list(await cur.fetchall())

    meta = {
        k: v for k, v in await q(sql.SQL("SELECT key, value FROM {}").format(ident(chaos_schema, "meta")))
    }
    runs = {
        r[0]: RunRow(*r)
        for r in await q(
            sql.SQL(
                "SELECT id, conversation_id, status, queue_order, cancel_requested, attempt, parent_run_id,"
                " root_run_id, lineage_id, (request ->> 'index')::int, steerable, absorbed_into,"
                " started_at IS NOT NULL FROM {}"
            ).format(ident(schema, "agent_run"))
        )
    }
    events: dict[uuid.UUID, list[tuple[int, str, dict[str, Any]]]] = defaultdict(list)
    for run_id, seq, etype, payload in await q(
        sql.SQL("SELECT run_id, seq, type, payload FROM {} ORDER BY run_id, seq").format(
            ident(schema, "run_event")
        )
    ):
        events[run_id].append((seq, etype, payload))
    transitions = [
        Transition(*r)
        for r in await q(
            sql.SQL(
                "SELECT seq, run_id, conversation_id, queue_order, old_status, new_status, at, worker_id, "
                "old_claim_expires_at FROM {} ORDER BY seq"
            ).format(ident(chaos_schema, "transition"))
        )
    ]
    side_effects = [
        (r[0], r[1], r[2])
        for r in await q(
            sql.SQL("SELECT run_id, step, executions FROM {}").format(ident(chaos_schema, "side_effect"))
        )
    ]
    stops = [
        StopRow(*r)
        for r in await q(
            sql.SQL(
                "SELECT id, conversation_id, seq, at, cancelled, cancel_requested FROM {} ORDER BY seq"
            ).format(ident(chaos_schema, "stop_log"))
        )
    ]
    faults = [
        FaultRow(*r)
        for r in await q(
            sql.SQL("SELECT kind, at, ended_at, victims, outage FROM {} ORDER BY id").format(
                ident(chaos_schema, "fault")
            )
        )
    ]
    step_effects = [
        (r[0], r[1], r[2])
        for r in await q(
            sql.SQL("SELECT turn, step, executions FROM {}").format(ident(chaos_schema, "step_effect"))
        )
    ]
    deliveries = [
        (r[0], r[1], r[2], [uuid.UUID(m["run_id"]) for m in r[3]])
        for r in await q(
            sql.SQL(
                "SELECT lineage_id, run_id, occurrence, result FROM {} WHERE key = 'runrow.steering'"
                " ORDER BY lineage_id, occurrence"
            ).format(ident(schema, "run_step"))
        )
    ]
    return Snapshot(
        meta, runs, dict(events), transitions, side_effects, stops, faults, step_effects, deliveries
    )


async def check(
    conn: AsyncConnection, schema: str, chaos_schema: str, transcripts: list[Transcript]
) -> CheckResult:
    return evaluate(await load(conn, schema, chaos_schema), transcripts)


@dataclass
class _Life:
    """One run's life from the transition log."""

    inserted: int | None = None
    running: list[int] = field(default_factory=list)
    terminal: list[Transition] = field(default_factory=list)
    changed_after_terminal: list[Transition] = field(default_factory=list)
    last_status: str | None = None
    history: list[tuple[int, str]] = field(default_factory=list)  # (seq, new status), in order

    @property
    def run_seq(self) -> int | None:
        return self.running[0] if self.running else None

    def status_at(self, seq: int) -> str | None:
        """The status the run had once the transition ``seq`` had committed (None: not yet inserted)."""
        status = None
        for at, new in self.history:
            if at > seq:
                break
            status = new
        return status

    def started_after(self, seq: int) -> int | None:
        """The first claim of the run after ``seq`` (a run parked before it may resume), or None."""
        return next((s for s in self.running if s > seq), None)

    @property
    def term_seq(self) -> float:
        return self.terminal[0].seq if self.terminal else INF


_NO_LIFE = _Life()  # the life of a run absent from the transition log; never mutated


def _secs(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds()


@dataclass
class _Samples:
    """Timings two checks measure on the way (stops, recovery), reported beside the verdicts."""

    recovery: list[float] = field(default_factory=list)
    recovery_by_kind: defaultdict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    stop_seconds: list[float] = field(default_factory=list)
    reap_lateness: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class _Context:
    """What every check reads: the snapshot, the transcripts, the bounds, and indexes built once."""

    snap: Snapshot
    transcripts: list[Transcript]
    lease: float
    heartbeat: float
    grace: float
    tick: float
    slack: float
    outages: list[tuple[datetime, datetime]]  # (start, end) of each PostgreSQL outage
    lives: Mapping[uuid.UUID, _Life]  # only the runs the transition log mentions, in first-seen order
    first_terminal: Mapping[uuid.UUID, Transition]  # each run's first transition into a terminal state
    by_conv: Mapping[str, list[RunRow]]  # each conversation's runs, in queue order
    reaped: frozenset[uuid.UUID]  # runs whose complete event gives the reason worker_lost
    samples: _Samples = field(default_factory=_Samples)

    @classmethod
    def build(cls, snap: Snapshot, transcripts: list[Transcript]) -> _Context:
        m = snap.meta
        lives: defaultdict[uuid.UUID, _Life] = defaultdict(_Life)
        for t in snap.transitions:
            life = lives[t.run_id]
            if t.old_status is None:
                life.inserted = t.seq
            elif t.old_status in TERMINAL:
                life.changed_after_terminal.append(t)
            if t.new_status == "running" and t.old_status != "running":
                life.running.append(t.seq)
            if t.new_status in TERMINAL and t.old_status not in TERMINAL:
                life.terminal.append(t)
            life.last_status = t.new_status
            life.history.append((t.seq, t.new_status))
        by_conv: defaultdict[str, list[RunRow]] = defaultdict(list)
        for run in snap.runs.values():
            by_conv[run.conversation_id].append(run)
        for runs in by_conv.values():
            runs.sort(key=lambda r: (r.queue_order, r.attempt))  # (a retry keeps its turn's order)
        return cls(
            snap=snap,
            transcripts=transcripts,
            lease=float(m.get("lease", 3.0)),
            heartbeat=float(m.get("heartbeat", 1.0)),
            grace=float(m.get("grace", 2.0)),
            tick=float(m.get("tick", 0.5)),
            slack=float(m.get("slack", 1.5)),
            outages=[(f.at, f.ended_at) for f in snap.faults if f.outage and f.ended_at is not None],
            lives=dict(lives),
            first_terminal={rid: life.terminal[0] for rid, life in lives.items() if life.terminal},
            by_conv=dict(by_conv),
            reaped=frozenset(rid for rid in snap.runs if _ending_reason(snap, rid) == "worker_lost"),
        )

    def faults_near(self, a: datetime, b: datetime) -> str:
        """The faults active in [a - 5 s, b], for a violation's message: a bound that fails
        should say what else was going on (a delay, a restart) without the run's artifacts."""
        near = [
            f"{f.kind}@{_secs(a, f.at):+.2f}s" + (f"..{_secs(a, f.ended_at):+.2f}s" if f.ended_at else "")
            for f in self.snap.faults
            if _secs(f.at, b) >= 0 and _secs(a, f.ended_at or f.at) >= -5.0
        ]
        return f"; faults near: {', '.join(near)}" if near else ""

    def life(self, run_id: uuid.UUID) -> _Life:
        """The run's life, empty (never claimed, never ended) when the log does not mention it."""
        return self.lives.get(run_id, _NO_LIFE)

    def outage_within(self, a: datetime, b: datetime) -> float:
        """Seconds of PostgreSQL outage inside [a, b]."""
        return sum(max(0.0, _secs(max(a, s), min(b, e))) for s, e in self.outages)


def _exactly_one_terminal_state(ctx: _Context) -> list[str]:
    """Proves every run ended terminal, by exactly one transition, and that the log agrees with the row."""
    out: list[str] = []
    for run in ctx.snap.runs.values():
        life = ctx.lives.get(run.id)
        if run.status not in TERMINAL:
            out.append(f"run {run.id} ({run.conversation_id}) ended {run.status}")
        if life is None or life.inserted is None:
            out.append(f"run {run.id}: no insert in the transition log")
            continue
        if run.status in TERMINAL and len(life.terminal) != 1:
            out.append(
                f"run {run.id}: {len(life.terminal)} transitions into a terminal state "
                f"(seqs {[t.seq for t in life.terminal]})"
            )
        if life.last_status != run.status:
            out.append(f"run {run.id}: row says {run.status}, transition log ends {life.last_status}")
    return out


def _terminal_states_never_changed(ctx: _Context) -> list[str]:
    """Proves no run left a terminal state, nor had its ending (error, finish time, claim) changed."""
    out: list[str] = []
    for run in ctx.snap.runs.values():
        life = ctx.lives.get(run.id)
        if life is None or life.inserted is None:
            continue  # a run with no insert logged is exactly_one_terminal_state's violation
        out.extend(
            f"run {run.id}: {t.old_status} -> {t.new_status} at seq {t.seq} ({t.at.isoformat()})"
            for t in life.changed_after_terminal
        )
    return out


def _no_side_effect_twice(ctx: _Context) -> list[str]:
    """Proves each side effect ran once, only for a claimed run, and no run was claimed twice."""
    out: list[str] = []
    for run_id, step, executions in ctx.snap.side_effects:
        if executions != 1:
            out.append(f"run {run_id} step {step}: executed {executions} times")
        if run_id in ctx.lives and ctx.lives[run_id].run_seq is None:
            out.append(f"run {run_id} step {step}: side effect of a run never claimed")
    for run_id, life in ctx.lives.items():
        # A run claims again only to resume from a park, each journaled with its wait (a
        # parent's on its children; a park whose wait was already over queues it at once).
        parks = sum(1 for _, etype, _ in ctx.snap.events.get(run_id, ()) if etype in PARK_EVENTS)
        if len(life.running) > 1 + parks:
            out.append(f"run {run_id}: claimed {len(life.running)} times {life.running} with {parks} parks")
    return out


def _recorded_steps_never_repeat(ctx: _Context) -> list[str]:
    """Proves a durable step's effect ran at most once per turn, across every attempt of it
    (a recorded step is replayed, an uncertain one is never run again)."""
    return [
        f"turn {turn} step {step}: durable step executed {executions} times"
        for turn, step, executions in ctx.snap.step_effects
        if executions != 1
    ]


def _one_running_per_conversation(ctx: _Context) -> list[str]:
    """Proves no turn started while another turn of its conversation was running."""
    out: list[str] = []
    for conv, runs in ctx.by_conv.items():
        started = sorted(
            (r for r in runs if ctx.life(r.id).run_seq is not None), key=lambda r: ctx.life(r.id).run_seq or 0
        )
        holder: RunRow | None = None
        for r in started:
            life = ctx.life(r.id)
            assert life.run_seq is not None
            if holder is not None and ctx.life(holder.id).term_seq > life.run_seq:
                out.append(
                    f"{conv}: run {r.id} started (seq {life.run_seq}) while run {holder.id} was running "
                    f"(seq {ctx.life(holder.id).run_seq}..{ctx.life(holder.id).term_seq})"
                )
            if holder is None or life.term_seq > ctx.life(holder.id).term_seq:
                holder = r
    return out


def _turns_in_order(ctx: _Context) -> list[str]:
    """Proves no turn started while an older turn of its conversation was still queued."""
    out: list[str] = []
    for conv, runs in ctx.by_conv.items():
        prior_max = -INF
        for i, r in enumerate(runs):
            life = ctx.life(r.id)
            rs = life.run_seq
            if rs is not None and prior_max > rs:
                for q in runs[:i]:
                    ql = ctx.life(q.id)
                    if ql.term_seq > rs and (ql.run_seq is None or ql.run_seq > rs):
                        out.append(
                            f"{conv}: run {r.id} (order {r.queue_order}) started at seq {rs} while the "
                            f"older turn {q.id} (order {q.queue_order}) was still queued"
                        )
            prior_max = max(prior_max, life.term_seq)
    return out


def _journal_gap_free_one_complete(ctx: _Context) -> list[str]:
    """Proves each journal is seq 1..N from enqueue's events to one final complete matching the row."""
    out: list[str] = []
    for run in ctx.snap.runs.values():
        evs = ctx.snap.events.get(run.id, [])
        seqs = [e[0] for e in evs]
        if seqs != list(range(1, len(seqs) + 1)):
            missing = sorted(set(range(1, max(seqs, default=0) + 1)) - set(seqs))
            out.append(f"run {run.id}: seqs not gap-free from 1 (missing {missing[:10]})")
        if [e[1] for e in evs[:2]] != ["user_message_created", "run_queued"]:
            out.append(f"run {run.id}: journal does not start with enqueue's events")
        completes = [e for e in evs if e[1] == "complete"]
        if len(completes) != 1:
            out.append(f"run {run.id}: {len(completes)} complete events")
        elif evs[-1][1] != "complete":
            out.append(
                f"run {run.id}: {len(evs) - 1 - evs.index(completes[0])} event(s) after complete "
                f"(seq {completes[0][0]} of {evs[-1][0]})"
            )
        elif completes[0][2].get("status") != run.status:
            out.append(f"run {run.id}: complete says {completes[0][2].get('status')}, row says {run.status}")
    return out


def _tails_saw_exact_journal(ctx: _Context) -> list[str]:
    """Proves every tail, across its resumes, saw exactly the journal after its start, to the end."""
    out: list[str] = []
    for tr in ctx.transcripts:
        if tr.tree is not None:
            continue  # (tree_tails_saw_whole_tree)
        rid = uuid.UUID(tr.run_id)
        expected = [(s, t, p) for s, t, p in ctx.snap.events.get(rid, []) if s > tr.from_seq]
        got = [(s, t, p) for s, t, p in tr.events]
        if not tr.finished:
            out.append(f"tail of {rid}: never reached the terminal event")
        if got != expected:
            gs = [e[0] for e in got]
            dup = sorted(s for s, c in Counter(gs).items() if c > 1)
            gap = sorted({e[0] for e in expected} - set(gs))
            out.append(
                f"tail of {rid} ({tr.resumes} resumes): saw seqs {gs[:40]}, journal has "
                f"{[e[0] for e in expected][:40]}; duplicates {dup[:10]}, missing {gap[:10]}"
                + _first_difference(got, expected)
            )
    return out


def _tree_tails_saw_whole_tree(ctx: _Context) -> list[str]:
    """Proves every tail of a tree (#41), across its resumes, saw every event of every run
    of the tree once, at gap-free positions, each run's in its journal's order, each with
    its payload, and the root's ending last."""
    out: list[str] = []
    for tr in ctx.transcripts:
        if tr.tree is None:
            continue
        root = uuid.UUID(tr.run_id)
        members = [
            r.id
            for r in ctx.snap.runs.values()
            if r.id == root or r.lineage_id == root or r.root_run_id == root
        ]
        journal = {(str(m), s): (t, p) for m in members for s, t, p in ctx.snap.events.get(m, [])}
        got = list(zip(tr.tree, tr.events, strict=True))
        positions = [e[0] for _, e in got]
        if not tr.finished:
            out.append(f"tree tail of {root}: never reached the root's ending")
        if positions != list(range(1, len(positions) + 1)):
            out.append(f"tree tail of {root} ({tr.resumes} resumes): positions {positions[:40]} are not 1..n")
        seen = [ref for ref, _ in got]
        if len(set(seen)) != len(seen):
            dup = sorted({r for r in seen if seen.count(r) > 1})[:5]
            out.append(f"tree tail of {root}: events seen twice {dup}")
        if set(seen) != set(journal):
            missing = sorted(set(journal) - set(seen))[:5]
            extra = sorted(set(seen) - set(journal))[:5]
            out.append(
                f"tree tail of {root} ({tr.resumes} resumes): missing {missing}, not in a journal {extra}"
            )
        for ref, (_, t, p) in got:
            if ref in journal and journal[ref] != (t, p):
                out.append(f"tree tail of {root}: event {ref} differs from its journal")
                break
        last_seq: dict[str, int] = {}
        for (rid, s), _ in got:
            if s <= last_seq.get(rid, 0):
                out.append(
                    f"tree tail of {root}: run {rid}'s events out of order ({s} after {last_seq[rid]})"
                )
                break
            last_seq[rid] = s
        if got:
            (rid, _), (_, t, _) = got[-1]
            lineage = {str(m) for m in members if m == root or ctx.snap.runs[m].lineage_id == root}
            if t != "complete" or rid not in lineage:
                out.append(f"tree tail of {root}: its last event is {t} of {rid}, not the root's ending")
    return out


def _stops_honoured(ctx: _Context) -> list[str]:
    """Proves a stop ended its running turn in time (cancelled/completed) and cancelled its queued ones."""
    out: list[str] = []
    for st in ctx.snap.stops:
        cancelled, asked = set(st.cancelled), set(st.cancel_requested)
        for rid in cancelled:
            life = ctx.life(rid)
            if (
                life.status_at(st.seq) == "running"
                or life.started_after(st.seq) is not None
                or (rid in ctx.snap.runs and ctx.snap.runs[rid].status != "cancelled")
            ):
                out.append(
                    f"stop {st.id}: run {rid}, cancelled before it started, started or ended otherwise"
                )
        for r in ctx.by_conv.get(st.conversation_id, []):
            life = ctx.life(r.id)
            if life.inserted is None or life.inserted > st.seq or life.term_seq < st.seq:
                continue  # enqueued after the stop, or already finished before it
            if life.status_at(st.seq) == "running":  # running when the stop committed
                if r.id not in asked:
                    out.append(f"stop {st.id}: running run {r.id} was not asked to stop")
                if r.status not in ("cancelled", "completed"):
                    out.append(f"stop {st.id}: running run {r.id} ended {r.status}")
                if life.terminal:
                    ended_at = life.terminal[0].at
                    took = _secs(st.at, ended_at)
                    ctx.samples.stop_seconds.append(took)
                    reaped = r.id in ctx.reaped
                    bound = (
                        ctx.lease + ctx.grace + ctx.tick if reaped else 2 * ctx.heartbeat + ctx.tick
                    ) + ctx.slack
                    bound += ctx.outage_within(st.at, ended_at)
                    if took > bound:
                        out.append(
                            f"stop {st.id}: run {r.id} ended {r.status} {took:.2f}s after the stop "
                            f"(bound {bound:.2f}s{', reaped' if reaped else ''})"
                        )
            else:  # queued (or parked waiting, a parent on its children) when the stop committed
                if (started := life.started_after(st.seq)) is not None:
                    out.append(
                        f"stop {st.id} (seq {st.seq}): queued run {r.id} of {st.conversation_id} started "
                        f"after the stop (seq {started})"
                    )
                if r.status != "cancelled" or r.id not in cancelled:
                    out.append(
                        f"stop {st.id}: queued run {r.id} ended {r.status}"
                        + ("" if r.id in cancelled else " and is missing from the stop's cancelled list")
                    )
    return out


def _recovery_bounded(ctx: _Context) -> list[str]:
    """Proves a dead or stopped worker's runs ended within lease + grace + tick + slack (+ outages)."""
    out: list[str] = []
    samples = ctx.samples
    for f in ctx.snap.faults:
        for victim in f.victims:
            end = ctx.first_terminal.get(victim)
            if end is None:
                out.append(f"{f.kind} at {f.at.isoformat()}: victim {victim} never ended")
                continue
            took = max(0.0, _secs(f.at, end.at))
            samples.recovery.append(took)
            samples.recovery_by_kind[f.kind].append(took)
            bound = ctx.lease + ctx.grace + ctx.tick + ctx.slack + ctx.outage_within(f.at, end.at)
            if took > bound:
                out.append(
                    f"{f.kind} at {f.at.isoformat()}: victim {victim} ended {end.new_status} after "
                    f"{took:.2f}s (bound {bound:.2f}s){ctx.faults_near(f.at, end.at)}"
                )
    for run in ctx.snap.runs.values():
        if run.id not in ctx.reaped:
            continue
        end = ctx.first_terminal.get(run.id)
        if end is None or end.old_claim_expires_at is None:
            continue
        late = _secs(end.old_claim_expires_at, end.at)
        samples.reap_lateness.append(late)
        bound = ctx.grace + ctx.tick + ctx.slack + ctx.outage_within(end.old_claim_expires_at, end.at)
        if late > bound:
            out.append(
                f"run {run.id} ({run.conversation_id}) reaped {late:.2f}s after its lease expired "
                f"(bound grace+tick+slack = {bound:.2f}s)" + ctx.faults_near(end.old_claim_expires_at, end.at)
            )
    return out


def _children_spawned_once(ctx: _Context) -> list[str]:
    """Proves no parent turn spawned a child twice (a replay of its spawn step gets the same
    children back), and that each child names its parent's root as its own."""
    out: list[str] = []
    spawned: Counter[tuple[uuid.UUID, int | None]] = Counter()
    runs = ctx.snap.runs
    for run in runs.values():
        if run.parent_run_id is None or run.attempt != 1:
            continue
        spawned[(run.parent_run_id, run.child_index)] += 1
        parent = runs.get(run.parent_run_id)
        if parent is None:
            out.append(f"child {run.id}: its parent {run.parent_run_id} is not a run")
            continue
        root = parent.root_run_id or parent.lineage_id or parent.id
        if run.root_run_id != root:
            out.append(f"child {run.id}: root {run.root_run_id}, but its parent's tree is rooted at {root}")
    for (parent_id, index), n in spawned.items():
        if n > 1:
            out.append(f"parent {parent_id}: child {index} spawned {n} times")
    return out


def _parents_end_after_children(ctx: _Context) -> list[str]:
    """Proves a parent turn that completed did so after each of its children ended (it waited
    for them: no orphan child still running when its parent's answer was written)."""
    out: list[str] = []
    children: defaultdict[uuid.UUID, list[RunRow]] = defaultdict(list)
    for run in ctx.snap.runs.values():
        if run.parent_run_id is not None:
            children[run.parent_run_id].append(run)
    for run in ctx.snap.runs.values():
        turn = run.lineage_id or run.id
        end = ctx.first_terminal.get(run.id)
        if run.status != "completed" or end is None or turn not in children:
            continue
        for child in children[turn]:
            child_end = ctx.first_terminal.get(child.id)
            if child_end is None or child_end.seq > end.seq:
                out.append(
                    f"parent {run.id} completed (seq {end.seq}) before its child {child.id} ended "
                    f"({'never' if child_end is None else f'seq {child_end.seq}'})"
                )
    return out


def _stops_reach_descendants(ctx: _Context) -> list[str]:
    """Proves a stop reached the trees of the turns it stopped: no child spawned after it, none
    queued or parked then that started later or ended otherwise than cancelled, and each
    running one ended cancelled or completed (or failed, reaped with its worker)."""
    out: list[str] = []
    tree: defaultdict[uuid.UUID, list[RunRow]] = defaultdict(list)
    for run in ctx.snap.runs.values():
        if run.root_run_id is not None:
            tree[run.root_run_id].append(run)
    for st in ctx.snap.stops:
        for r in ctx.by_conv.get(st.conversation_id, []):
            life = ctx.life(r.id)
            if life.inserted is None or life.inserted > st.seq or life.term_seq < st.seq:
                continue  # not live when the stop committed
            for child in tree.get(r.lineage_id or r.id, []):
                cl = ctx.life(child.id)
                if cl.inserted is None or cl.term_seq < st.seq:
                    continue  # ended before the stop
                if cl.inserted > st.seq:
                    out.append(f"stop {st.id}: child {child.id} of {r.id} was spawned after the stop")
                    continue
                at = cl.status_at(st.seq)
                if at == "running":
                    allowed = {"cancelled", "completed"} | ({"failed"} if child.id in ctx.reaped else set())
                    if child.status not in allowed:
                        out.append(f"stop {st.id}: running child {child.id} of {r.id} ended {child.status}")
                elif (started := cl.started_after(st.seq)) is not None or child.status != "cancelled":
                    out.append(
                        f"stop {st.id}: child {child.id} of {r.id}, {at} at the stop, "
                        + (
                            f"started after it (seq {started})"
                            if started is not None
                            else f"ended {child.status}"
                        )
                    )
    return out


def _no_lost_steering_message(ctx: _Context) -> list[str]:
    """Proves every steering message was delivered exactly once: read by one delivery of the
    turn it was absorbed into (never by two, never by a turn it was not absorbed into), or
    run as a turn of its own (never absorbed, never read), or handed back by a stop; and
    that a delivery only took steering messages of its own conversation, queued after the
    turn that read them."""
    out: list[str] = []
    runs = ctx.snap.runs
    read: defaultdict[uuid.UUID, list[tuple[uuid.UUID, uuid.UUID, int]]] = defaultdict(list)
    for lineage, reader, occurrence, taken in ctx.snap.deliveries:
        for rid in taken:
            read[rid].append((lineage, reader, occurrence))
    for run in runs.values():
        got = read.get(run.id, [])
        if run.status == "absorbed":
            if len(got) != 1:
                out.append(
                    f"steering message {run.id}: absorbed, but read by {len(got)} deliveries {got[:3]}"
                )
                continue
            lineage, reader, _ = got[0]
            into = runs.get(run.absorbed_into) if run.absorbed_into else None
            if into is None or (into.lineage_id or into.id) != lineage:
                out.append(
                    f"steering message {run.id}: absorbed into {run.absorbed_into}, read by turn {lineage}"
                )
            elif into.conversation_id != run.conversation_id or into.queue_order >= run.queue_order:
                out.append(
                    f"steering message {run.id}: read by {into.id}, not an earlier turn of its conversation"
                )
            if not run.steerable or run.started:
                out.append(
                    f"steering message {run.id}: absorbed, but steerable={run.steerable} started={run.started}"
                )
        elif got:
            out.append(f"run {run.id} ({run.status}): read by a delivery {got[0]}, but not absorbed")
        elif run.steerable and not run.started and run.status != "cancelled":
            out.append(f"steering message {run.id}: {run.status}, never read and never run (lost)")
    return out


_CHECKS: dict[str, Callable[[_Context], list[str]]] = {
    "exactly_one_terminal_state": _exactly_one_terminal_state,
    "terminal_states_never_changed": _terminal_states_never_changed,
    "no_side_effect_twice": _no_side_effect_twice,
    "recorded_steps_never_repeat": _recorded_steps_never_repeat,
    "one_running_per_conversation": _one_running_per_conversation,
    "turns_in_order": _turns_in_order,
    "journal_gap_free_one_complete": _journal_gap_free_one_complete,
    "tails_saw_exact_journal": _tails_saw_exact_journal,
    "tree_tails_saw_whole_tree": _tree_tails_saw_whole_tree,
    "stops_honoured": _stops_honoured,
    "recovery_bounded": _recovery_bounded,
    "children_spawned_once": _children_spawned_once,
    "parents_end_after_children": _parents_end_after_children,
    "stops_reach_descendants": _stops_reach_descendants,
    "no_lost_steering_message": _no_lost_steering_message,
}
"""Each invariant's check, in report order: a new invariant is one function and one entry here."""

INVARIANTS = tuple(_CHECKS)
"""One boolean per invariant in the report, in this order (a stable format)."""


def evaluate(snap: Snapshot, transcripts: list[Transcript]) -> CheckResult:
    """Decides every invariant from the snapshot and the transcripts alone."""
    ctx = _Context.build(snap, transcripts)
    v = {name: check(ctx) for name, check in _CHECKS.items()}
    return CheckResult(
        invariants={name: not lst for name, lst in v.items()},
        violations={name: lst[:MAX_LISTED] for name, lst in v.items() if lst},
        violation_counts={name: len(lst) for name, lst in v.items() if lst},
        counts=_counts(ctx),
        faults=dict(sorted(Counter(f.kind for f in snap.faults).items())),
        recovery_seconds=ctx.samples.recovery,
        recovery_by_kind=dict(ctx.samples.recovery_by_kind),
        stop_seconds=ctx.samples.stop_seconds,
        reap_lateness_seconds=ctx.samples.reap_lateness,
    )


def _counts(ctx: _Context) -> dict[str, Any]:
    snap, transcripts = ctx.snap, ctx.transcripts
    by_status = Counter(r.status for r in snap.runs.values())
    return {
        "runs": len(snap.runs),
        "by_status": dict(sorted(by_status.items())),
        "conversations": len(ctx.by_conv),
        "events": sum(len(e) for e in snap.events.values()),
        "side_effects": len(snap.side_effects),
        "step_effects": len(snap.step_effects),
        "retries": sum(1 for r in snap.runs.values() if r.attempt > 1),
        "transitions": len(snap.transitions),
        "reaped": len(ctx.reaped),
        "stops": len(snap.stops),
        "stopped_running": sum(len(s.cancel_requested) for s in snap.stops),
        "stopped_queued": sum(len(s.cancelled) for s in snap.stops),
        "tails": len(transcripts),
        "tails_resumed": sum(1 for t in transcripts if t.resumes),
        "tail_resumes": sum(t.resumes for t in transcripts),
        "children": sum(1 for r in snap.runs.values() if r.parent_run_id is not None),
        "parents": len({r.parent_run_id for r in snap.runs.values() if r.parent_run_id is not None}),
        "parks": sum(1 for evs in snap.events.values() for _, etype, _ in evs if etype in PARK_EVENTS),
        "steering_messages": sum(1 for r in snap.runs.values() if r.steerable),
        "steering_absorbed": by_status.get("absorbed", 0),
        "steering_deliveries": sum(1 for d in snap.deliveries if d[3]),
    }


def _first_difference(got: list[Any], expected: list[Any]) -> str:
    for g, e in zip(got, expected, strict=False):
        if g != e:
            return f"; first difference at seq {e[0]}: saw {g!r:.200}, journal {e!r:.200}"
    return ""


def _ending_reason(snap: Snapshot, run_id: uuid.UUID) -> str | None:
    evs = snap.events.get(run_id)
    if not evs or evs[-1][1] != "complete":
        return None
    reason = evs[-1][2].get("reason")
    return reason if isinstance(reason, str) else None


def summary(samples: list[float]) -> dict[str, float | int | None]:
    """p50/max of a list of seconds (None when empty), for the report."""
    if not samples:
        return {"samples": 0, "p50": None, "max": None}
    return {
        "samples": len(samples),
        "p50": round(statistics.median(samples), 3),
        "max": round(max(samples), 3),
    }
