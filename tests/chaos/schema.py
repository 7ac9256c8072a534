"""The chaos runner's own tables, installed next to a runrow schema in the test database.

* ``transition``: one row per agent_run insert and per status change (and any change to
  a finished run's ending), written by a trigger in the same transaction as the change.
  ``seq`` comes from a sequence that is read inside that transaction, so for two
  transactions A and B where B's statement started after A committed, A's rows have the
  smaller seq: the log orders commits well enough to prove "B started after A ended".
* ``side_effect``: the test agent's external effect, keyed by (run_id, step). A second
  execution of a step (a different ``execution`` id) bumps ``executions``, so a repeat
  is visible instead of being swallowed by the key.
* ``step_effect``: the effect of a durable step (``run.step``), keyed by the turn (its
  user message, which every attempt of the turn shares) and the step, counted like
  ``side_effect``: a step run again by a retry would show as a second execution.
* ``stop_log``: every stop the load generator made, written in the stop's own
  transaction with its result and a seq from the same sequence as the transitions.
* ``fault``: every fault the runner injected (kind, time, victims, outage windows).
* ``meta``: the bounds the run was configured with, so the checker needs nothing else.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

from psycopg import sql

if TYPE_CHECKING:
    from psycopg import AsyncConnection

TERMINAL = ("completed", "failed", "cancelled", "absorbed")

_DDL = """
CREATE SCHEMA {c};
CREATE SEQUENCE {c}.tick;
CREATE TABLE {c}.meta (key text PRIMARY KEY, value jsonb NOT NULL);
CREATE TABLE {c}.transition (
    seq                  bigint      PRIMARY KEY DEFAULT nextval({tick}),
    run_id               uuid        NOT NULL,
    conversation_id      text        NOT NULL,
    queue_order          bigint      NOT NULL,
    old_status           text,
    new_status           text        NOT NULL,
    at                   timestamptz NOT NULL DEFAULT clock_timestamp(),
    worker_id            text,
    claim_token          uuid,
    old_claim_expires_at timestamptz,
    cancel_requested     boolean
);
CREATE INDEX transition_run_idx ON {c}.transition (run_id, seq);
CREATE TABLE {c}.side_effect (
    run_id         uuid        NOT NULL,
    step           integer     NOT NULL,
    execution      uuid        NOT NULL,
    executions     integer     NOT NULL DEFAULT 1,
    last_execution uuid,
    worker_id      text,
    at             timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (run_id, step)
);
CREATE TABLE {c}.step_effect (
    turn           uuid        NOT NULL,
    step           integer     NOT NULL,
    execution      uuid        NOT NULL,
    executions     integer     NOT NULL DEFAULT 1,
    last_execution uuid,
    run_id         uuid        NOT NULL,
    at             timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (turn, step)
);
CREATE TABLE {c}.stop_log (
    id               uuid        PRIMARY KEY,
    conversation_id  text        NOT NULL,
    seq              bigint      NOT NULL DEFAULT nextval({tick}),
    at               timestamptz NOT NULL DEFAULT clock_timestamp(),
    cancelled        uuid[]      NOT NULL,
    cancel_requested uuid[]      NOT NULL
);
CREATE TABLE {c}.fault (
    id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind      text        NOT NULL,
    at        timestamptz NOT NULL,
    ended_at  timestamptz,
    worker_id text,
    victims   uuid[]      NOT NULL DEFAULT '{{}}',
    outage    boolean     NOT NULL DEFAULT false,
    detail    jsonb       NOT NULL DEFAULT '{{}}'
);
CREATE FUNCTION {c}.log_transition() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {c}.transition
            (run_id, conversation_id, queue_order, old_status, new_status, worker_id, claim_token,
             cancel_requested)
        VALUES (NEW.id, NEW.conversation_id, NEW.queue_order, NULL, NEW.status, NEW.worker_id,
                NEW.claim_token, NEW.cancel_requested);
    ELSIF NEW.status IS DISTINCT FROM OLD.status
       OR (OLD.status IN ('completed', 'failed', 'cancelled')
           AND (NEW.error IS DISTINCT FROM OLD.error
                OR NEW.finished_at IS DISTINCT FROM OLD.finished_at
                OR NEW.claim_token IS DISTINCT FROM OLD.claim_token)) THEN
        INSERT INTO {c}.transition
            (run_id, conversation_id, queue_order, old_status, new_status, worker_id, claim_token,
             old_claim_expires_at, cancel_requested)
        VALUES (NEW.id, NEW.conversation_id, NEW.queue_order, OLD.status, NEW.status, NEW.worker_id,
                NEW.claim_token, OLD.claim_expires_at, NEW.cancel_requested);
    END IF;
    RETURN NULL;
END
$fn$;
CREATE TRIGGER chaos_log_transition AFTER INSERT OR UPDATE ON {run} FOR EACH ROW
    EXECUTE FUNCTION {c}.log_transition();
"""


def ident(schema: str, name: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(name))


async def install(conn: AsyncConnection, schema: str, chaos_schema: str, meta: dict[str, Any]) -> None:
    """Creates the chaos tables and the transition trigger on ``schema``.agent_run."""
    ddl = sql.SQL(_DDL).format(
        c=sql.Identifier(chaos_schema),
        tick=sql.Literal(f"{sql.Identifier(chaos_schema).as_string(conn)}.tick"),
        run=ident(schema, "agent_run"),
    )
    async with conn.transaction():
        await conn.execute(ddl)
        for key, value in meta.items():
            await conn.execute(
                sql.SQL("INSERT INTO {} (key, value) VALUES (%s, %s)").format(ident(chaos_schema, "meta")),
                (key, json.dumps(value)),
            )


async def record_side_effect(
    conn: AsyncConnection, chaos_schema: str, run_id: Any, step: int, execution: Any, worker_id: str
) -> None:
    """The agent's side effect. Re-sending the same execution is harmless; another execution counts."""
    await conn.execute(
        sql.SQL(
            "INSERT INTO {t} AS s (run_id, step, execution, worker_id) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (run_id, step) DO UPDATE SET executions = s.executions + 1, "
            "last_execution = excluded.execution WHERE s.execution <> excluded.execution"
        ).format(t=ident(chaos_schema, "side_effect")),
        (run_id, step, execution, worker_id),
    )


async def record_step_effect(
    conn: AsyncConnection, chaos_schema: str, turn: Any, step: int, execution: Any, run_id: Any
) -> None:
    """A durable step's effect, counted per turn across its attempts (see ``side_effect``)."""
    await conn.execute(
        sql.SQL(
            "INSERT INTO {t} AS s (turn, step, execution, run_id) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (turn, step) DO UPDATE SET executions = s.executions + 1, "
            "last_execution = excluded.execution WHERE s.execution <> excluded.execution"
        ).format(t=ident(chaos_schema, "step_effect")),
        (turn, step, execution, run_id),
    )


async def stop_and_log(conn: AsyncConnection, schema: str, chaos_schema: str, conversation_id: str) -> Any:
    """``runrow.stop_conversation`` with its result logged in the same transaction."""
    import runrow

    async with conn.transaction():
        result = await runrow.stop_conversation(conn, conversation_id, schema=schema)
        await conn.execute(
            sql.SQL(
                "INSERT INTO {} (id, conversation_id, cancelled, cancel_requested) VALUES (%s, %s, %s, %s)"
            ).format(ident(chaos_schema, "stop_log")),
            (uuid.uuid4(), conversation_id, list(result.cancelled), list(result.cancel_requested)),
        )
    return result
