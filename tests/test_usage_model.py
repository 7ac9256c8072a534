"""Usage sums against a Python model (#42 point 5): random runs of random tenants and
agent keys record random usage, on a Dispatcher whose flushes of many runs share one
statement; usage_totals must equal the model's sums per tenant and agent key, exactly."""

from __future__ import annotations

import uuid
from collections import defaultdict
from decimal import Decimal
from typing import Any

import anyio
import anyio.from_thread
import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

import runrow

FAST = {"poll": 0.5, "heartbeat": 0.2, "lease": 2.0, "grace": 1.0, "reap_interval": 0.2}
TENANTS = st.sampled_from([None, "t1", "t2"])
AGENTS = st.sampled_from([None, "a"])
USAGE = st.tuples(
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.floats(0, 1e6, allow_nan=False, allow_infinity=False, allow_subnormal=False),
)
RUN = st.tuples(TENANTS, AGENTS, st.lists(USAGE, max_size=6), st.booleans())


async def _agent(run: runrow.RunContext) -> None:
    for i, (inp, out, cost) in enumerate(run.request["usage"]):
        run.record_usage(input_tokens=inp, output_tokens=out, cost=cost)
        if run.request["flush"] and i % 2:
            await run.emit({"type": "step_done"})  # some ride a structural event, the rest the ending
        await anyio.sleep(0)


def test_usage_totals_match_a_model(dsn: str) -> None:
    schema = f"u_{uuid.uuid4().hex[:10]}"
    model: dict[tuple[str | None, str | None], list[Any]] = defaultdict(lambda: [0, 0, Decimal(0), 0])
    with anyio.from_thread.start_blocking_portal(backend="asyncio") as portal:
        portal.call(lambda: runrow.migrate(dsn, schema=schema))
        dispatcher = runrow.Dispatcher(
            dsn, _agent, agents={"a": _agent}, schema=schema, concurrency=8, **FAST
        )
        with portal.wrap_async_context_manager(dispatcher):

            @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
            @given(st.lists(RUN, min_size=1, max_size=8))
            def check(runs: list[tuple[Any, ...]]) -> None:
                async def go() -> list[runrow.UsageTotal]:
                    ids = []
                    for tenant, agent_key, usage, flush in runs:
                        r = await runrow.enqueue(
                            dsn,
                            schema=schema,
                            conversation_id=str(uuid.uuid4()),
                            user_id="u",
                            content="x",
                            tenant_id=tenant,
                            agent_key=agent_key,
                            request={"usage": usage, "flush": flush},
                        )
                        ids.append(r.id)
                    for rid in ids:
                        while (await runrow.get_run(dsn, rid, schema=schema)).status != "completed":
                            await anyio.sleep(0.02)
                    return await runrow.usage_totals(dsn, schema=schema)

                for tenant, agent_key, usage, _ in runs:
                    for inp, out, cost in usage:
                        m = model[(tenant, agent_key)]
                        m[0] += inp
                        m[1] += out
                        m[2] += Decimal(repr(cost))
                        m[3] += 1
                got = portal.call(go)
                want = {k: (v[0], v[1], float(v[2]), v[3]) for k, v in model.items() if v[3]}
                assert {
                    (t.tenant_id, t.agent_key): (t.input_tokens, t.output_tokens, t.cost, t.records)
                    for t in got
                } == want

            check()

        async def drop() -> None:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
                await c.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))

        portal.call(drop)
