"""A/B of two versions of the claim statement, alternated call by call in one process.

    git show <commit>:sql/claims.sql > /tmp/runs_old.sql   # (sql/runs.sql before the split)
    OLDSQL=/tmp/runs_old.sql CASE=a LIMIT=16 N=300 PYTHONPATH=src python bench/claim_ab.py

Seeds a backlog case (bench/scenarios/backlog.py: a, b or c) at 2,000 and at DEPTH
(100,000) queued, stale and fresh statistics, on the system's server, holds 16 runs
running, then times OLDSQL's and NEWSQL's (default: this tree's sql/claims.sql) claim as
prepared generic plans with JIT off, N calls each, alternating which goes first, each in
a rolled-back transaction. Prints the medians and new/old. With OLDSQL = NEWSQL it
reads 1.01: the alternation itself favours neither side.
"""

import asyncio
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

import runrow
from runrow._gateway import statement_text
from runrow.embedded import EmbeddedPostgres

FRAGMENTS = Path(__file__).resolve().parent.parent / "sql" / "fragments.sql"


def load(path, schema):
    text = Path(path).read_text()
    m = re.search(r"-- name: claim\n(.*?)\n-- name: claim_fifo", text, re.S)
    q = m.group(1)
    # {live_status} and the like: this tree's fragments, written out as runrow/_sql.py does.
    for block in re.split(r"^-- fragment: ", FRAGMENTS.read_text(), flags=re.M)[1:]:
        name, _, rest = block.partition("\n")
        body = "\n".join(line for line in rest.splitlines() if not line.lstrip().startswith("--"))
        q = q.replace("{" + name.strip() + "}", body.strip())
    return q.replace("{schema}", f'"{schema}"')


N = int(os.environ.get("N", "200"))
LIMIT = int(os.environ.get("LIMIT", "16"))


async def main():
    pg = EmbeddedPostgres(tcp=True, settings={"max_connections": "100"})
    pg.start()
    try:
        ci = pg.conninfo(via_tcp=True)
        depth = int(os.environ.get("DEPTH", "100000"))
        CASE = os.environ.get("CASE", "b")
        for label, shape in (
            ("base", B.shapes(depth, 10000)[CASE][0]),
            ("deep", B.shapes(depth, 10000)[CASE][1]),
        ):
            for state in os.environ.get("STATES", "stale,fresh").split(","):
                schema = f"ab_{label}_{state}"
                await runrow.migrate(ci, schema=schema)
                await B.seed(ci, schema, shape, analyze=(state == "fresh"))
                if state == "fresh":
                    async with await psycopg.AsyncConnection.connect(ci, autocommit=True) as c:
                        for t in ("agent_run", "message", "run_event"):
                            await c.execute(
                                sql.SQL("VACUUM ANALYZE {}.{}").format(
                                    sql.Identifier(schema), sql.Identifier(t)
                                )
                            )
                conns = {}
                for v, path in (
                    ("old", os.environ["OLDSQL"]),
                    (
                        "new",
                        os.environ.get(
                            "NEWSQL", str(Path(__file__).resolve().parent.parent / "sql" / "claims.sql")
                        ),
                    ),
                ):
                    c = await psycopg.AsyncConnection.connect(
                        ci + " options='-c jit=off -c plan_cache_mode=force_generic_plan'",
                        autocommit=True,
                        prepare_threshold=0,
                    )
                    conns[v] = (c, load(path, schema).encode())
                # 16 running, as at concurrency 16
                async with await psycopg.AsyncConnection.connect(ci, autocommit=True) as c:
                    await c.execute(
                        statement_text("claim_fifo", schema),
                        {
                            "limit": 16,
                            "lease_seconds": 300.0,
                            "worker_id": "p",
                            "now": None,
                            "retry_policy": None,
                            "version": None,
                            "same_version": False,
                            "agent_keys": [],
                            "serves_default": True,
                            "tree_cap": None,
                        },
                    )
                times = {"old": [], "new": []}
                for i in range(N):
                    for v in ("old", "new") if i % 2 else ("new", "old"):
                        c, q = conns[v]
                        async with c.transaction(force_rollback=True):
                            t0 = time.perf_counter()
                            cur = await c.execute(
                                q,
                                {
                                    "limit": LIMIT,
                                    "lease_seconds": 30.0,
                                    "worker_id": "x",
                                    "now": None,
                                    "retry_policy": None,
                                    "version": None,
                                    "same_version": False,
                                    "agent_keys": [],
                                    "serves_default": True,
                                    "tree_cap": None,
                                },
                            )
                            got = await cur.fetchall()
                            times[v].append((time.perf_counter() - t0) * 1000)
                        assert len(got) == LIMIT, len(got)
                mo, mn = statistics.median(times["old"]), statistics.median(times["new"])
                print(f"{label} {state}: old {mo:.2f} ms  new {mn:.2f} ms  new/old {mn / mo:.2f}", flush=True)
                for c, _ in conns.values():
                    await c.close()
    finally:
        pg.stop()


asyncio.run(main())
