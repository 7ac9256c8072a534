-- runrow schema, version 1.
-- Every identifier below is written as {schema}.name: runrow substitutes the
-- host's schema name with psycopg.sql.Identifier, never with string formatting.
-- Literal braces must be doubled ({{ and }}) because of that substitution.

-- The durable transcript: what was said, keyed by the host's conversation id.
CREATE TABLE {schema}.message (
    id              uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    conversation_id text        NOT NULL CHECK (conversation_id <> ''),
    run_id          uuid,
    role            text        NOT NULL CHECK (role IN ('user', 'assistant', 'tool', 'system')),
    content         jsonb       NOT NULL,
    -- sent: a user message that became a run; draft: handed back by a stop;
    -- complete: an answer the agent wrote; partial: an answer cut short.
    status          text        NOT NULL CHECK (status IN ('sent', 'draft', 'complete', 'partial')),
    user_id         text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    position        bigint      GENERATED ALWAYS AS IDENTITY
);
CREATE INDEX message_conversation_idx ON {schema}.message (conversation_id, position);

-- One row per agent turn. The claim, the lease, the fence and the terminal
-- state all live here.
CREATE TABLE {schema}.agent_run (
    id                uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    -- Strict enqueue order; created_at is a transaction timestamp and can tie.
    queue_order       bigint      GENERATED ALWAYS AS IDENTITY,
    conversation_id   text        NOT NULL CHECK (conversation_id <> ''),
    user_id           text        NOT NULL CHECK (user_id <> ''),
    tenant_id         text        CHECK (tenant_id <> ''),
    user_message_id   uuid        NOT NULL REFERENCES {schema}.message (id),
    status            text        NOT NULL DEFAULT 'queued'
                      CHECK (status IN ('queued', 'running', 'completed', 'failed', 'cancelled')),
    request           jsonb,
    idempotency_key   text        CHECK (idempotency_key <> ''),
    retry_of          uuid        REFERENCES {schema}.agent_run (id),
    claim_token       uuid,
    claim_expires_at  timestamptz,
    worker_id         text,
    cancel_requested  boolean     NOT NULL DEFAULT false,
    error             jsonb,
    created_at        timestamptz NOT NULL DEFAULT now(),
    started_at        timestamptz,
    last_heartbeat_at timestamptz,
    finished_at       timestamptz,
    journal_trimmed   boolean     NOT NULL DEFAULT false,
    -- The state machine's shape, held by the schema rather than by the code:
    CONSTRAINT agent_run_queued_unclaimed CHECK (
        status <> 'queued' OR (claim_token IS NULL AND started_at IS NULL AND finished_at IS NULL)),
    CONSTRAINT agent_run_running_claimed CHECK (
        status <> 'running' OR (claim_token IS NOT NULL AND claim_expires_at IS NOT NULL
                                AND started_at IS NOT NULL AND finished_at IS NULL)),
    CONSTRAINT agent_run_terminal_finished CHECK (
        status IN ('queued', 'running') OR finished_at IS NOT NULL)
);

-- The claim walks queued runs in enqueue order; partial, so finished rows cost nothing.
CREATE INDEX agent_run_queued_idx ON {schema}.agent_run (queue_order) WHERE status = 'queued';
-- "Is there an older or running turn in this conversation?" and stop's sweep.
CREATE INDEX agent_run_active_conversation_idx
    ON {schema}.agent_run (conversation_id, queue_order) WHERE status IN ('queued', 'running');
-- The guarantee: one running turn per conversation.
CREATE UNIQUE INDEX agent_run_one_running_per_conversation
    ON {schema}.agent_run (conversation_id) WHERE status = 'running';
-- The reaper's sweep.
CREATE INDEX agent_run_lease_idx ON {schema}.agent_run (claim_expires_at) WHERE status = 'running';
-- Idempotent enqueue: one run per (user, key).
CREATE UNIQUE INDEX agent_run_idempotency_idx
    ON {schema}.agent_run (user_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
-- Retention's sweep over finished runs whose journal is still there.
CREATE INDEX agent_run_untrimmed_idx
    ON {schema}.agent_run (finished_at) WHERE finished_at IS NOT NULL AND NOT journal_trimmed;
CREATE INDEX agent_run_conversation_idx ON {schema}.agent_run (conversation_id, queue_order);
-- A person's retry makes one new run, however often the button is pressed.
CREATE UNIQUE INDEX agent_run_retry_idx ON {schema}.agent_run (retry_of) WHERE retry_of IS NOT NULL;

-- The journal: a per-run, gap-free, append-only event log that tails read from a cursor.
CREATE TABLE {schema}.run_event (
    run_id     uuid        NOT NULL REFERENCES {schema}.agent_run (id) ON DELETE CASCADE,
    seq        integer     NOT NULL CHECK (seq > 0),
    type       text        NOT NULL CHECK (type <> ''),
    payload    jsonb       NOT NULL DEFAULT '{{}}'::jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, seq)
);
-- At most one terminal event per run, whoever writes it.
CREATE UNIQUE INDEX run_event_one_terminal ON {schema}.run_event (run_id) WHERE type = 'complete';
