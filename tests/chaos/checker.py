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
    from datetime import datetime

    from psycopg import AsyncConnection

INVARIANTS = (
    "exactly_one_terminal_state",
    "terminal_states_never_changed",
    "no_side_effect_twice",
    "one_running_per_conversation",
    "turns_in_order",
    "journal_gap_free_one_complete",
    "tails_saw_exact_journal",
    "stops_honoured",
    "recovery_bounded",
)
"""One boolean per invariant in the report, in this order (a stable format)."""

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

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "from_seq": self.from_seq,
            "events": [list(e) for e in self.events],
            "resumes": self.resumes,
            "finished": self.finished,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Transcript:
        return cls(
            d["run_id"],
            d.get("from_seq", 0),
            [(int(s), str(t), p) for s, t, p in d["events"]],
            d.get("resumes", 0),
            d.get("finished", False),
        )


@dataclass
class RunRow:
    id: uuid.UUID
    conversation_id: str
    status: str
    queue_order: int
    cancel_requested: bool


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
        r[0]: RunRow(r[0], r[1], r[2], r[3], r[4])
        for r in await q(
            sql.SQL("SELECT id, conversation_id, status, queue_order, cancel_requested FROM {}").format(
                ident(schema, "agent_run")
            )
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
    return Snapshot(meta, runs, dict(events), transitions, side_effects, stops, faults)


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

    @property
    def run_seq(self) -> int | None:
        return self.running[0] if self.running else None

    @property
    def term_seq(self) -> float:
        return self.terminal[0].seq if self.terminal else INF


def _secs(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds()


def evaluate(snap: Snapshot, transcripts: list[Transcript]) -> CheckResult:
    v: dict[str, list[str]] = {name: [] for name in INVARIANTS}
    m = snap.meta
    lease, heartbeat = float(m.get("lease", 3.0)), float(m.get("heartbeat", 1.0))
    grace, tick, slack = float(m.get("grace", 2.0)), float(m.get("tick", 0.5)), float(m.get("slack", 1.5))

    outages = [(f.at, f.ended_at) for f in snap.faults if f.outage and f.ended_at is not None]

    def outage_within(a: datetime, b: datetime) -> float:
        return sum(max(0.0, _secs(max(a, s), min(b, e))) for s, e in outages)

    # -- the life of each run, from the transition log -----------------------------------
    lives: dict[uuid.UUID, _Life] = defaultdict(_Life)
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
    by_seq_terminal_at = {rid: life.terminal[0] for rid, life in lives.items() if life.terminal}

    # 1. exactly one terminal state per run, and 2. terminal states never change.
    for run in snap.runs.values():
        rl = lives.get(run.id)
        if run.status not in TERMINAL:
            v["exactly_one_terminal_state"].append(f"run {run.id} ({run.conversation_id}) ended {run.status}")
        if rl is None or rl.inserted is None:
            v["exactly_one_terminal_state"].append(f"run {run.id}: no insert in the transition log")
            continue
        if run.status in TERMINAL and len(rl.terminal) != 1:
            v["exactly_one_terminal_state"].append(
                f"run {run.id}: {len(rl.terminal)} transitions into a terminal state "
                f"(seqs {[t.seq for t in rl.terminal]})"
            )
        if rl.last_status != run.status:
            v["exactly_one_terminal_state"].append(
                f"run {run.id}: row says {run.status}, transition log ends {rl.last_status}"
            )
        for t in rl.changed_after_terminal:
            v["terminal_states_never_changed"].append(
                f"run {run.id}: {t.old_status} -> {t.new_status} at seq {t.seq} ({t.at.isoformat()})"
            )

    # 3. no side effect twice, and no run claimed twice.
    for run_id, step, executions in snap.side_effects:
        if executions != 1:
            v["no_side_effect_twice"].append(f"run {run_id} step {step}: executed {executions} times")
        if run_id in lives and lives[run_id].run_seq is None:
            v["no_side_effect_twice"].append(f"run {run_id} step {step}: side effect of a run never claimed")
    for run_id, life in lives.items():
        if len(life.running) > 1:
            v["no_side_effect_twice"].append(
                f"run {run_id}: claimed {len(life.running)} times {life.running}"
            )

    # 4. never two running per conversation, and 5. turns ran in enqueue order.
    by_conv: dict[str, list[RunRow]] = defaultdict(list)
    for run in snap.runs.values():
        by_conv[run.conversation_id].append(run)
    for conv, runs in by_conv.items():
        runs.sort(key=lambda r: r.queue_order)
        started = sorted(
            (r for r in runs if lives[r.id].run_seq is not None), key=lambda r: lives[r.id].run_seq or 0
        )
        holder: RunRow | None = None
        for r in started:
            life = lives[r.id]
            assert life.run_seq is not None
            if holder is not None and lives[holder.id].term_seq > life.run_seq:
                v["one_running_per_conversation"].append(
                    f"{conv}: run {r.id} started (seq {life.run_seq}) while run {holder.id} was running "
                    f"(seq {lives[holder.id].run_seq}..{lives[holder.id].term_seq})"
                )
            if holder is None or life.term_seq > lives[holder.id].term_seq:
                holder = r
        prior_max = -INF
        for i, r in enumerate(runs):
            life = lives[r.id]
            rs = life.run_seq
            if rs is not None and prior_max > rs:
                for q in runs[:i]:
                    ql = lives[q.id]
                    if ql.term_seq > rs and (ql.run_seq is None or ql.run_seq > rs):
                        v["turns_in_order"].append(
                            f"{conv}: run {r.id} (order {r.queue_order}) started at seq {rs} while the "
                            f"older turn {q.id} (order {q.queue_order}) was still queued"
                        )
            prior_max = max(prior_max, life.term_seq)

    # 6. each journal gap-free from 1, ending with exactly one complete that matches the row.
    for run in snap.runs.values():
        evs = snap.events.get(run.id, [])
        seqs = [e[0] for e in evs]
        if seqs != list(range(1, len(seqs) + 1)):
            missing = sorted(set(range(1, max(seqs, default=0) + 1)) - set(seqs))
            v["journal_gap_free_one_complete"].append(
                f"run {run.id}: seqs not gap-free from 1 (missing {missing[:10]})"
            )
        if [e[1] for e in evs[:2]] != ["user_message_created", "run_queued"]:
            v["journal_gap_free_one_complete"].append(
                f"run {run.id}: journal does not start with enqueue's events"
            )
        completes = [e for e in evs if e[1] == "complete"]
        if len(completes) != 1:
            v["journal_gap_free_one_complete"].append(f"run {run.id}: {len(completes)} complete events")
        elif evs[-1][1] != "complete":
            v["journal_gap_free_one_complete"].append(
                f"run {run.id}: {len(evs) - 1 - evs.index(completes[0])} event(s) after complete "
                f"(seq {completes[0][0]} of {evs[-1][0]})"
            )
        elif completes[0][2].get("status") != run.status:
            v["journal_gap_free_one_complete"].append(
                f"run {run.id}: complete says {completes[0][2].get('status')}, row says {run.status}"
            )

    # 7. every tail saw exactly the journal after its start: no gap, no duplicate, to the end.
    for tr in transcripts:
        rid = uuid.UUID(tr.run_id)
        expected = [(s, t, p) for s, t, p in snap.events.get(rid, []) if s > tr.from_seq]
        got = [(s, t, p) for s, t, p in tr.events]
        if not tr.finished:
            v["tails_saw_exact_journal"].append(f"tail of {rid}: never reached the terminal event")
        if got != expected:
            gs = [e[0] for e in got]
            dup = sorted(s for s, c in Counter(gs).items() if c > 1)
            gap = sorted({e[0] for e in expected} - set(gs))
            v["tails_saw_exact_journal"].append(
                f"tail of {rid} ({tr.resumes} resumes): saw seqs {gs[:40]}, journal has "
                f"{[e[0] for e in expected][:40]}; duplicates {dup[:10]}, missing {gap[:10]}"
                + _first_difference(got, expected)
            )

    # 8. stops: running turns end cancelled/completed within the bound; queued turns never start.
    stop_seconds: list[float] = []
    for st in snap.stops:
        cancelled, asked = set(st.cancelled), set(st.cancel_requested)
        for rid in cancelled:
            if lives[rid].run_seq is not None or (rid in snap.runs and snap.runs[rid].status != "cancelled"):
                v["stops_honoured"].append(
                    f"stop {st.id}: run {rid}, cancelled before it started, started or ended otherwise"
                )
        for r in by_conv.get(st.conversation_id, []):
            life = lives[r.id]
            if life.inserted is None or life.inserted > st.seq or life.term_seq < st.seq:
                continue  # enqueued after the stop, or already finished before it
            rs = life.run_seq
            if rs is not None and rs < st.seq:  # running when the stop committed
                if r.id not in asked:
                    v["stops_honoured"].append(f"stop {st.id}: running run {r.id} was not asked to stop")
                if r.status not in ("cancelled", "completed"):
                    v["stops_honoured"].append(f"stop {st.id}: running run {r.id} ended {r.status}")
                if life.terminal:
                    ended_at = life.terminal[0].at
                    took = _secs(st.at, ended_at)
                    stop_seconds.append(took)
                    reaped = _ending_reason(snap, r.id) == "worker_lost"
                    bound = (lease + grace + tick if reaped else 2 * heartbeat + tick) + slack
                    bound += outage_within(st.at, ended_at)
                    if took > bound:
                        v["stops_honoured"].append(
                            f"stop {st.id}: run {r.id} ended {r.status} {took:.2f}s after the stop "
                            f"(bound {bound:.2f}s{', reaped' if reaped else ''})"
                        )
            else:  # queued when the stop committed
                if rs is not None:
                    v["stops_honoured"].append(
                        f"stop {st.id} (seq {st.seq}): queued run {r.id} of {st.conversation_id} started "
                        f"after the stop (seq {rs})"
                    )
                if r.status != "cancelled" or r.id not in cancelled:
                    v["stops_honoured"].append(
                        f"stop {st.id}: queued run {r.id} ended {r.status}"
                        + ("" if r.id in cancelled else " and is missing from the stop's cancelled list")
                    )

    # 9. recovery: a dead worker's runs end within lease + grace + one tick (+ outages).
    recovery: list[float] = []
    recovery_by_kind: dict[str, list[float]] = defaultdict(list)
    reap_lateness: list[float] = []
    for f in snap.faults:
        for victim in f.victims:
            end = by_seq_terminal_at.get(victim)
            if end is None:
                v["recovery_bounded"].append(f"{f.kind} at {f.at.isoformat()}: victim {victim} never ended")
                continue
            took = max(0.0, _secs(f.at, end.at))
            recovery.append(took)
            recovery_by_kind[f.kind].append(took)
            bound = lease + grace + tick + slack + outage_within(f.at, end.at)
            if took > bound:
                v["recovery_bounded"].append(
                    f"{f.kind} at {f.at.isoformat()}: victim {victim} ended {end.new_status} after "
                    f"{took:.2f}s (bound {bound:.2f}s)"
                )
    for run in snap.runs.values():
        if _ending_reason(snap, run.id) != "worker_lost":
            continue
        end = by_seq_terminal_at.get(run.id)
        if end is None or end.old_claim_expires_at is None:
            continue
        late = _secs(end.old_claim_expires_at, end.at)
        reap_lateness.append(late)
        bound = grace + tick + slack + outage_within(end.old_claim_expires_at, end.at)
        if late > bound:
            v["recovery_bounded"].append(
                f"run {run.id} ({run.conversation_id}) reaped {late:.2f}s after its lease expired "
                f"(bound grace+tick+slack = {bound:.2f}s)"
            )

    by_status = Counter(r.status for r in snap.runs.values())
    counts = {
        "runs": len(snap.runs),
        "by_status": dict(sorted(by_status.items())),
        "conversations": len(by_conv),
        "events": sum(len(e) for e in snap.events.values()),
        "side_effects": len(snap.side_effects),
        "transitions": len(snap.transitions),
        "reaped": sum(1 for r in snap.runs if _ending_reason(snap, r) == "worker_lost"),
        "stops": len(snap.stops),
        "stopped_running": sum(len(s.cancel_requested) for s in snap.stops),
        "stopped_queued": sum(len(s.cancelled) for s in snap.stops),
        "tails": len(transcripts),
        "tails_resumed": sum(1 for t in transcripts if t.resumes),
        "tail_resumes": sum(t.resumes for t in transcripts),
    }
    return CheckResult(
        invariants={name: not v[name] for name in INVARIANTS},
        violations={name: lst[:MAX_LISTED] for name, lst in v.items() if lst},
        violation_counts={name: len(lst) for name, lst in v.items() if lst},
        counts=counts,
        faults=dict(sorted(Counter(f.kind for f in snap.faults).items())),
        recovery_seconds=recovery,
        recovery_by_kind=dict(recovery_by_kind),
        stop_seconds=stop_seconds,
        reap_lateness_seconds=reap_lateness,
    )


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
