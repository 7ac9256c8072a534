"""The agent-shaped turn on each system, one system per child process (bench/agent_turn.py).

A turn: 3 durable steps (each returns a small dict), 20 streamed chunks of 5 characters
where the system can stream, and a recorded answer. Each ``run_<system>`` drains ``n``
turns with at most ``c`` in flight in this process and returns what it saw: the drain's
seconds (first turn started to last turn ended), the turns ended, how many times a step
body ran (``step_calls``: 3 per turn unless a system ran a step twice), the chunks
streamed and the system's version. Each system is set up as its own docs show, in its
own database; see bench/README.md ("The agent-shaped turn") for the choices.

    python bench/turn_systems.py SYSTEM '{"conninfo": ..., "n": 100, "c": 16, ...}'

prints ``RESULT <json>`` as its last line. The parent enqueues nothing: a system with a
queue enqueues its ``n`` turns here first (counted in the parent's per-turn figures,
not in the clock), then drains them.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from importlib import metadata
from typing import Any

STEPS = 3
CHUNKS = 20
CHUNK = "abcde"
ANSWER = CHUNK * CHUNKS


class Tally:
    """What one drain saw."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last = 0.0
        self.done = 0
        self.step_calls = 0
        self.chunks = 0

    def started(self) -> None:
        if self.first is None:
            self.first = time.monotonic()

    def ended(self) -> None:
        self.done += 1
        self.last = time.monotonic()

    async def tool(self, k: int) -> dict[str, Any]:
        """The step body: counts its calls (a system that runs a step twice shows it here)."""
        self.step_calls += 1
        return {"tool": k, "ok": True}

    def result(self, system: str, version: str, **extra: Any) -> dict[str, Any]:
        seconds = (self.last - self.first) if self.first is not None else None
        return {
            "system": system,
            "version": version,
            "turns": self.done,
            "seconds": seconds,
            "step_calls": self.step_calls,
            "chunks": self.chunks,
            **extra,
        }


async def _until(cond: Any, timeout: float, step: float = 0.002) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("the drain did not finish in time")
        await asyncio.sleep(step)


# -- runrow -----------------------------------------------------------------------------


async def run_runrow(a: dict[str, Any]) -> dict[str, Any]:
    """One Dispatcher(concurrency=c); steps via run.step, chunks via run.text, the answer
    via run.write_message. The turns are enqueued first through runrow.enqueue."""
    import psycopg

    import runrow

    conninfo, schema, n, c = a["conninfo"], a["schema"], int(a["n"]), int(a["c"])
    t = Tally()
    conns = [await psycopg.AsyncConnection.connect(conninfo, autocommit=True) for _ in range(4)]

    async def enqueue(k: int) -> None:
        for i in range(k, n, len(conns)):
            await runrow.enqueue(conns[k], conversation_id=f"t{i}", user_id="u", content="go", schema=schema)

    await asyncio.gather(*(enqueue(k) for k in range(len(conns))))
    for conn in conns:
        await conn.close()

    async def agent(run: runrow.RunContext) -> None:
        t.started()
        for k in range(STEPS):
            await run.step("tool", t.tool, k)
        for _ in range(CHUNKS):
            await run.text(CHUNK)
            t.chunks += 1
        await run.write_message({"text": ANSWER})

    d = runrow.Dispatcher(conninfo, agent, schema=schema, concurrency=c)
    async with d:

        def ended() -> bool:
            s = d.get_stats()
            return s["completed"] + s["failed"] >= n

        await _until(ended, a.get("timeout", 600))
        t.last = time.monotonic()  # the last terminal write has returned
        stats = d.get_stats()
    t.done = stats["completed"]
    return t.result("runrow", _version("runrow", runrow), failed=stats["failed"])


# -- Absurd -----------------------------------------------------------------------------


async def run_absurd(a: dict[str, Any]) -> dict[str, Any]:
    """absurd-sdk's AsyncAbsurd: a task of 3 ``ctx.step`` calls whose return value is the
    answer, its worker at ``concurrency=c`` (claims c at a time). No client stream."""
    from absurd_sdk import AsyncAbsurd

    conninfo, n, c = a["conninfo"], int(a["n"]), int(a["c"])
    t = Tally()
    app = AsyncAbsurd(conninfo, queue_name=a.get("queue", "turns"))

    @app.register_task(name="turn")
    async def turn(params: Any, ctx: Any) -> Any:
        t.started()
        for k in range(STEPS):
            await ctx.step("tool", lambda k=k: t.tool(k))
        t.ended()
        return {"answer": ANSWER}

    for i in range(n):
        await app.spawn("turn", {"i": i})
    worker = asyncio.create_task(app.start_worker(concurrency=c))
    try:
        await _until(lambda: t.done >= n, a.get("timeout", 600))
        # The last task's completion is written after its body returns: let the worker's
        # batch finish (start_worker gathers its batch before claiming again).
        # (The clock stops at the last body's end; the completion write is one call.)
        app.stop_worker()
        await asyncio.wait_for(worker, 60)
    finally:
        worker.cancel()
        await app.close()
    return t.result("absurd", metadata.version("absurd-sdk"))


# -- DBOS -------------------------------------------------------------------------------


async def run_dbos(a: dict[str, Any]) -> dict[str, Any]:
    """DBOS Transact: an async workflow of 3 async steps, 20 ``DBOS.write_stream_async``
    chunks, the answer as its return value; enqueued on a queue with
    ``worker_concurrency=c``. The queue is registered after the turns are enqueued, so
    the clock covers a drain."""
    import psycopg
    from dbos import DBOS

    n, c = int(a["n"]), int(a["c"])
    t = Tally()
    DBOS(config={"name": "bench-turn", "system_database_url": a["url"], "log_level": "WARNING"})

    @DBOS.step()
    async def tool(k: int) -> dict[str, Any]:
        return await t.tool(k)

    @DBOS.workflow()
    async def turn(i: int) -> dict[str, Any]:
        t.started()
        for k in range(STEPS):
            await tool(k)
        for _ in range(CHUNKS):
            await DBOS.write_stream_async("answer", CHUNK)
            t.chunks += 1
        t.ended()
        return {"answer": ANSWER}

    DBOS.launch()
    try:
        for i in range(n):
            await DBOS.enqueue_workflow_async("turns", turn, i)
        await DBOS.register_queue_async(
            "turns", worker_concurrency=c, polling_interval_sec=float(a.get("poll", 0.01))
        )
        await _until(lambda: t.done >= n, a.get("timeout", 600))
        # A workflow's output is recorded after its body returns: wait (a read every
        # 20 ms, a few in all) until every turn is recorded as a success.
        async with await psycopg.AsyncConnection.connect(a["conninfo"], autocommit=True) as conn:
            while True:
                cur = await conn.execute("SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS'")
                row = await cur.fetchone()
                if row and row[0] >= n:
                    break
                await asyncio.sleep(0.02)
        t.last = time.monotonic()
    finally:
        DBOS.destroy()
    return t.result("dbos", metadata.version("dbos"), poll_interval=a.get("poll", 0.01))


# -- LangGraph --------------------------------------------------------------------------


async def run_langgraph(a: dict[str, Any]) -> dict[str, Any]:
    """LangGraph with AsyncPostgresSaver on a psycopg pool (autocommit, prepare_threshold=0,
    dict rows, as its docs set it up): a graph of 3 nodes, each a step returning a small
    dict; the last also streams 20 chunks through ``get_stream_writer`` (not stored) and
    sets the answer in the state. No queue: c driver tasks invoke the graph for n turns."""
    from typing import TypedDict

    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from langgraph.config import get_stream_writer
    from langgraph.graph import END, START, StateGraph
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    n, c = int(a["n"]), int(a["c"])
    t = Tally()

    class State(TypedDict, total=False):
        i: int
        s0: dict[str, Any]
        s1: dict[str, Any]
        s2: dict[str, Any]
        answer: str

    def node(k: int) -> Any:
        async def fn(state: State) -> dict[str, Any]:
            out: dict[str, Any] = {f"s{k}": await t.tool(k)}
            if k == STEPS - 1:
                write = get_stream_writer()
                for _ in range(CHUNKS):
                    write(CHUNK)
                out["answer"] = ANSWER
            return out

        return fn

    builder = StateGraph(State)
    prev = START
    for k in range(STEPS):
        builder.add_node(f"s{k}", node(k))
        builder.add_edge(prev, f"s{k}")
        prev = f"s{k}"
    builder.add_edge(prev, END)
    pool_size = int(a.get("pool", min(c, 32)))
    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    async with AsyncConnectionPool(
        a["conninfo"], min_size=1, max_size=pool_size, kwargs=kwargs, open=False
    ) as pool:
        await pool.open(wait=True)
        saver = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
        if a.get("setup"):
            await saver.setup()  # once, by the parent's first (n=0) child
        graph = builder.compile(checkpointer=saver)
        nxt = 0

        async def driver() -> None:
            nonlocal nxt
            while nxt < n:
                i = nxt
                nxt += 1
                t.started()
                config = {"configurable": {"thread_id": f"t{i}"}}
                async for _ in graph.astream({"i": i}, config, stream_mode="custom"):  # type: ignore[arg-type]
                    t.chunks += 1
                t.ended()

        await asyncio.wait_for(asyncio.gather(*(driver() for _ in range(c))), a.get("timeout", 600))
    return t.result("langgraph", metadata.version("langgraph"), pool=pool_size)


def _version(dist: str, module: Any) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return str(getattr(module, "__version__", "?"))


SYSTEMS = {"runrow": run_runrow, "absurd": run_absurd, "dbos": run_dbos, "langgraph": run_langgraph}


def main() -> None:
    system, raw = sys.argv[1], sys.argv[2]
    result = asyncio.run(SYSTEMS[system](json.loads(raw)))
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
