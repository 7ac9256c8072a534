"""Per-statement time and plan shape at depth (issue #17): custom vs generic plan, stale vs
fresh statistics, in the backlog scenario's shapes (bench/scenarios/backlog.py).

    PYTHONPATH=src python bench/backlog_plans.py                 # every case and statement
    CASES=b STATES=stale STMTS=claim SHOW=1 python bench/backlog_plans.py   # with plan trees

Starts a private server on the system's binaries (RUNROW_PG_BIN overrides), seeds each
shape at DEPTH (100,000) queued with 16 runs running, and times each runrow statement
K times (15) as a prepared statement with plan_cache_mode = force_custom_plan, then
force_generic_plan (the plan a prepared statement settles on), each call in a rolled
back transaction. JIT=off (default) or JIT=on sets jit on these connections. Prints
the median and max ms per call, the server's execution and planning time and the
buffers read by one EXPLAIN (ANALYZE, BUFFERS) of the same prepared statement.
"""

import asyncio
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "scenarios"))
if not os.environ.get("RUNROW_PG_BIN"):
    os.environ["RUNROW_PG_BIN"] = str(sorted(Path("/usr/lib/postgresql").glob("*/bin"))[-1])
import backlog as B
import psycopg
from psycopg import sql
from throughput import ENQUEUE_DEFAULTS

import runrow
from runrow._gateway import statement_text
from runrow._names import Channels
from runrow.embedded import EmbeddedPostgres

K = int(os.environ.get("K", "15"))
CASES = os.environ.get("CASES", "a,b,c").split(",")
STATES = os.environ.get("STATES", "stale,fresh").split(",")
STMTS = os.environ.get(
    "STMTS",
    "claim,claim_fifo,enqueue,enqueue_gated,queue_position,heartbeat,finalize,reap_candidates,read_events,stats",
).split(",")
DEPTH = int(os.environ.get("DEPTH", "100000"))
JIT = os.environ.get("JIT", "off")


def order(q: bytes):
    seen = []
    for m in re.finditer(rb"%\((\w+)\)[sbt]", q):
        n = m.group(1).decode()
        if n not in seen:
            seen.append(n)
    return seen


def nodes(plan, depth=0, out=None):
    out = [] if out is None else out
    d = plan["Node Type"]
    if "Index Name" in plan:
        d += f" {plan['Index Name']}"
    elif "Relation Name" in plan:
        d += f" {plan['Relation Name']}"
    if plan.get("Join Type"):
        d += f" ({plan['Join Type']})"
    d += f" rows={plan.get('Actual Rows')}x{plan.get('Actual Loops')} est={plan.get('Plan Rows')} bufs={bufs(plan)}"
    if plan.get("Heap Fetches"):
        d += f" heap={plan['Heap Fetches']}"
    out.append("  " * depth + d)
    for p in plan.get("Plans", []):
        nodes(p, depth + 1, out)
    return out


def bufs(plan):
    return int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))


async def main():
    pg = EmbeddedPostgres(tcp=True, settings={"max_connections": "500"})
    pg.start()
    try:
        ci = pg.conninfo(via_tcp=True)
        async with await psycopg.AsyncConnection.connect(ci, autocommit=True) as c:
            for k in ("server_version", "jit", "jit_above_cost"):
                print(k, (await (await c.execute(f"SHOW {k}")).fetchone())[0])
        sizes = B.shapes(DEPTH, 10_000)
        for case in CASES:
            for state in STATES:
                shape = sizes[case][1]
                schema = f"p{case}_{state}"
                await runrow.migrate(ci, schema=schema)
                secs = await B.seed(ci, schema, shape, analyze=(state == "fresh"))
                print(f"\n===== case {case} ({shape.label}) stats={state} seeded {secs:.1f}s", flush=True)
                await probe(ci, schema, case)
    finally:
        pg.stop()


async def probe(ci, schema, case):
    ch = Channels.for_schema(schema)
    dsn = psycopg.conninfo.make_conninfo(ci, options=f"-c jit={JIT}")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        # 16 running runs, as a Dispatcher at concurrency 16 holds
        async with conn.transaction():
            await conn.execute("SET LOCAL jit = off")
            cur = await conn.execute(
                statement_text("claim_fifo", schema),
                {
                    "limit": 16,
                    "lease_seconds": 300.0,
                    "worker_id": "probe",
                    "now": None,
                    "retry_policy": None,
                    "version": None,
                    "same_version": False,
                    "agent_keys": [],
                    "serves_default": True,
                    "tree_cap": None,
                },
            )
            running = await cur.fetchall()
        ids = [r[0] for r in running]
        toks = [r[1] for r in running]
        s = sql.Identifier(schema)
        last = await (
            await conn.execute(
                sql.SQL(
                    "SELECT id, conversation_id, tenant_id FROM {}.agent_run WHERE status='queued' ORDER BY queue_order DESC LIMIT 1"
                ).format(s)
            )
        ).fetchone()
        conv = last[1]
        tenant = last[2]
        enq = {
            "conversation_id": conv,
            "user_id": "u",
            "tenant_id": tenant,
            "idempotency_key": None,
            "content": '"hi"',
            "request": None,
            "wake_channel": ch.wake,
            # the conversation's advisory lock key, as runrow.enqueue makes it
            "conversation_lock": f"runrow.enqueue:{schema}:conversation:{conv}",
            **ENQUEUE_DEFAULTS,
        }
        params = {
            "claim": {
                "limit": int(os.environ.get("LIMIT", "4")),
                "lease_seconds": 30.0,
                "worker_id": "probe",
                "now": None,
                "retry_policy": None,
                "version": None,
                "same_version": False,
                "agent_keys": [],
                "serves_default": True,
                "tree_cap": None,
            },
            "claim_fifo": {
                "limit": int(os.environ.get("LIMIT", "4")),
                "lease_seconds": 30.0,
                "worker_id": "probe",
                "now": None,
                "retry_policy": None,
                "version": None,
                "same_version": False,
                "agent_keys": [],
                "serves_default": True,
                "tree_cap": None,
            },
            "enqueue": enq,
            "enqueue_gated": {**enq, "max_queued_tenant": 1_000_000, "max_queued_conversation": 1_000},
            "queue_position": {"run_id": last[0], "now": None, "cap": 1000, "min_walk": 16},
            "heartbeat": {"ids": ids, "tokens": toks, "lease_seconds": 300.0, "now": None},
            "finalize": {
                "runs": json.dumps(
                    [
                        {"id": str(i), "token": str(t), "status": "completed", "error": None, "partial": None}
                        for i, t in zip(ids, toks, strict=False)
                    ]
                ),
                "events": json.dumps(
                    [{"run_id": str(i), "seq": 3, "type": "complete", "payload": "{}"} for i in ids]
                ),
                "events_prefix": ch.events_prefix,
                "wake_channel": ch.wake,
            },
            "reap_candidates": {"now": None, "grace_seconds": 30.0, "limit": 100},
            "read_events": {"run_id": last[0], "after": 0, "limit": 500},
            "stats": {},
        }
        for name in STMTS:
            qname = "enqueue" if name.startswith("enqueue") else name
            q = statement_text(qname, schema)
            p = params[name]
            res = {}
            names = order(q)
            pq = re.sub(
                rb"%\((\w+)\)[sbt]", lambda m, names=names: b"$%d" % (names.index(m.group(1).decode()) + 1), q
            ).replace(b"%%", b"%")
            args = [p[n] for n in names]
            ph = sql.SQL(", ").join(sql.Literal(a) for a in args)
            for mode in ("force_custom_plan", "force_generic_plan"):
                async with await psycopg.AsyncConnection.connect(
                    dsn, autocommit=True, prepare_threshold=None
                ) as c2:
                    await c2.execute(f"SET plan_cache_mode = {mode}")
                    await c2.execute(b"PREPARE p AS " + pq)
                    times = []
                    for _i in range(K):
                        async with c2.transaction(force_rollback=True):
                            t0 = time.perf_counter()
                            cur = await c2.execute(
                                sql.SQL("EXECUTE p({})").format(ph) if args else sql.SQL("EXECUTE p")
                            )
                            await cur.fetchall()
                            times.append((time.perf_counter() - t0) * 1000)
                    async with c2.transaction(force_rollback=True):
                        cur = await c2.execute(
                            sql.SQL(
                                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE p" + ("({})" if args else "")
                            ).format(ph)
                        )
                        doc = (await cur.fetchone())[0]
                    plan = doc[0]
                    res[mode] = (statistics.median(times), max(times), plan)
            cm, cmax, cp = res["force_custom_plan"]
            gm, gmax, gp = res["force_generic_plan"]
            print(
                f"-- {name}: custom median {cm:.2f} ms (max {cmax:.2f}) exec {cp['Execution Time']:.2f} plan {cp['Planning Time']:.2f} bufs {bufs(cp['Plan'])} | "
                f"generic median {gm:.2f} ms (max {gmax:.2f}) exec {gp['Execution Time']:.2f} bufs {bufs(gp['Plan'])}",
                flush=True,
            )
            if os.environ.get("SHOW"):
                for m, (_, _, pl) in res.items():
                    print(f"   [{m}]")
                    print("\n".join("     " + line for line in nodes(pl["Plan"])))


asyncio.run(main())
