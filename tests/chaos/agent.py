"""The chaos runner's test agent, run by worker processes as ``tests.chaos.agent:agent``.

A run's ``request`` says what to do: ``steps`` (each streams two deltas, performs a
side effect keyed by (run_id, step) and journals a ``step_done`` event; with ``durable``,
the effect is a durable step keyed by the turn, which a retry replays), ``delay``
between steps, ``message`` (write the answer to the transcript), ``steer_reads`` (read
steering messages at each step boundary, #41 point 6), and optionally a
``hook`` with a ``fault`` id; with ``tree`` (a count), the run is a tree's root that spawns
that many children running ``child`` (see :func:`parent`). At a hook point the agent announces itself by writing
``<CHAOS_HOOK_DIR>/<fault>.json`` (its pid, worker id and run id), then waits up to
``hook_wait`` seconds so the runner can SIGKILL or SIGSTOP this very process there:

* ``after_claim``: first thing after the claim;
* ``mid_stream`` / ``stall``: half way through the steps, after a flush;
* ``before_terminal``: after everything, just before the agent returns (the terminal
  write follows the return).

Configuration comes from the environment: ``CHAOS_SIDE_DSN`` (a direct connection for
the side effects), ``CHAOS_SCHEMA`` (the chaos tables) and ``CHAOS_HOOK_DIR``.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from tests.chaos.schema import record_side_effect, record_step_effect

if TYPE_CHECKING:
    from runrow import RunContext

SIDE_EFFECT_BUDGET = 25.0  # seconds an effect may retry through a database restart

_pool: AsyncConnectionPool[AsyncConnection] | None = None
_pool_lock = anyio.Lock()


async def _side_pool() -> AsyncConnectionPool[AsyncConnection]:
    global _pool
    async with _pool_lock:
        if _pool is None:
            pool: AsyncConnectionPool[AsyncConnection] = AsyncConnectionPool(
                os.environ["CHAOS_SIDE_DSN"],
                min_size=1,
                max_size=8,
                open=False,
                kwargs={"autocommit": True},
                check=AsyncConnectionPool.check_connection,
                timeout=10,
            )
            await pool.open()
            _pool = pool
        return _pool


async def side_effect(run: RunContext, step: int, execution: uuid.UUID) -> None:
    """Performs step ``step``'s effect once for this execution, retrying transient errors."""
    pool = await _side_pool()
    schema = os.environ.get("CHAOS_SCHEMA", "chaos")
    with anyio.fail_after(SIDE_EFFECT_BUDGET):
        while True:
            try:
                async with pool.connection() as conn:
                    await record_side_effect(conn, schema, run.run_id, step, execution, run.worker_id)
                return
            except (psycopg.OperationalError, PoolTimeout):
                # Same execution id: a retry of a write that did land counts nothing twice.
                await anyio.sleep(0.2)


async def step_effect(run: RunContext, step: int) -> int:
    """A durable step's effect (``durable`` runs call it through ``run.step``): counted per
    turn, so a step that a retry ran again instead of replaying would show."""
    pool = await _side_pool()
    schema = os.environ.get("CHAOS_SCHEMA", "chaos")
    execution = uuid.uuid4()
    with anyio.fail_after(SIDE_EFFECT_BUDGET):
        while True:
            try:
                async with pool.connection() as conn:
                    await record_step_effect(conn, schema, run.user_message_id, step, execution, run.run_id)
                return step
            except (psycopg.OperationalError, PoolTimeout):
                await anyio.sleep(0.2)


async def _hook(run: RunContext, request: dict[str, Any], point: str) -> None:
    if request.get("hook") != point or not request.get("fault"):
        return
    await run.flush()
    hook_dir = Path(os.environ["CHAOS_HOOK_DIR"])
    body = json.dumps({"pid": os.getpid(), "worker_id": run.worker_id, "run_id": str(run.run_id)})
    tmp = hook_dir / f".{request['fault']}.tmp"
    tmp.write_text(body)
    tmp.rename(hook_dir / f"{request['fault']}.json")
    # Wait here to be killed or stopped; if the runner passes, carry on normally.
    await anyio.sleep(float(request.get("hook_wait", 8.0)))


async def parent(run: RunContext, request: dict[str, Any]) -> None:
    """A tree's root (#41): spawns ``tree`` children (each runs this agent on ``child``, with
    its ``index``), waits for them without a slot, and writes their outcomes."""
    child = dict(request.get("child") or {})
    kids = await run.spawn_many(
        [(None, f"part {i} of {run.content}", {**child, "index": i}) for i in range(int(request["tree"]))]
    )
    results = await run.wait_for_children(kids)
    if request.get("message"):
        with contextlib.suppress(psycopg.OperationalError):
            await run.write_message({"children": [r.status for r in results]})


async def agent(run: RunContext) -> None:
    request: dict[str, Any] = run.request if isinstance(run.request, dict) else {}
    if request.get("tree"):
        return await parent(run, request)
    steps = int(request.get("steps", 3))
    delay = float(request.get("delay", 0.1))
    execution = uuid.uuid4()  # one per execution of this run: a second one would show
    await _hook(run, request, "after_claim")
    for step in range(steps):
        await run.text(f"step {step}: ")
        await run.text(f"token-{step} ")
        if request.get("durable"):
            await run.step(f"effect-{step}", step_effect, run, step)
        else:
            await side_effect(run, step, execution)
        await run.emit({"type": "step_done", "step": step})
        if request.get("steer_reads"):
            await run.steering()  # a step boundary: steering messages sent meanwhile come in here
        if step == steps // 2:
            await _hook(run, request, "mid_stream")
            await _hook(run, request, "stall")
        await anyio.sleep(delay)
    if request.get("message"):
        # On an unknown outcome, never write the transcript message a second time.
        with contextlib.suppress(psycopg.OperationalError):
            await run.write_message({"text": f"answer to {run.content!r}"})
    await _hook(run, request, "before_terminal")
