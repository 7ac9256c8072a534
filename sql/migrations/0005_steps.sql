-- runrow schema, version 5 (#20): durable steps and automatic retries. A step is one
-- memoised call an agent makes through run.step(); its result is recorded, fenced by
-- the claim, before the agent sees it, so a later attempt of the same turn (a retry)
-- gets it back instead of calling again.

-- The turn's lineage: the first run of a retry chain. NULL on that first run (a run is
-- its own lineage), set by retry on every later one. Steps are keyed by lineage.
ALTER TABLE {schema}.agent_run ADD COLUMN lineage_id uuid REFERENCES {schema}.agent_run (id);
-- Which attempt of its turn a run is: 1, then one more per retry.
ALTER TABLE {schema}.agent_run ADD COLUMN attempt integer NOT NULL DEFAULT 1
    CONSTRAINT agent_run_attempt_check CHECK (attempt >= 1);
ALTER TABLE {schema}.agent_run ADD CONSTRAINT agent_run_lineage_check
    CHECK ((lineage_id IS NULL) = (attempt = 1));
-- The claiming dispatcher's retry policy (Dispatcher(retry=...)), stamped by each claim,
-- so that whoever ends the run (its worker, or any process's reaper) applies the same:
-- an object with max_attempts, backoff, max_backoff and worker_lost. NULL: never retried.
ALTER TABLE {schema}.agent_run ADD COLUMN retry_policy jsonb;
-- Trim asks whether a lineage still has an unfinished run.
CREATE INDEX agent_run_lineage_idx ON {schema}.agent_run (lineage_id) WHERE lineage_id IS NOT NULL;

CREATE TABLE {schema}.run_step (
    lineage_id  uuid NOT NULL,
    key         text NOT NULL CONSTRAINT run_step_key_check CHECK (length(key) BETWEEN 1 AND 200),
    -- The n-th call with this key in one attempt (0-based): steps in a loop.
    occurrence  integer NOT NULL CONSTRAINT run_step_occurrence_check CHECK (occurrence >= 0),
    -- Its place among the attempt's step calls (0-based): replay checks the sequence.
    position    integer NOT NULL CONSTRAINT run_step_position_check CHECK (position >= 0),
    -- The attempt (run) that last started or recorded it.
    run_id      uuid NOT NULL REFERENCES {schema}.agent_run (id),
    -- started: begun, outcome unknown until recorded (uncertain, should its worker die);
    -- recorded: returned `result`; failed: raised `error` (replay raises it again).
    status      text NOT NULL CONSTRAINT run_step_status_check
                CHECK (status IN ('started', 'recorded', 'failed')),
    idempotent  boolean NOT NULL,
    result      jsonb,
    error       jsonb,
    started_at  timestamptz NOT NULL DEFAULT now(),
    recorded_at timestamptz,
    PRIMARY KEY (lineage_id, key, occurrence),
    CONSTRAINT run_step_outcome_check CHECK (
        CASE status
            WHEN 'started'  THEN result IS NULL AND error IS NULL AND recorded_at IS NULL
            WHEN 'recorded' THEN result IS NOT NULL AND error IS NULL AND recorded_at IS NOT NULL
            ELSE result IS NULL AND error IS NOT NULL AND recorded_at IS NOT NULL
        END)
);
-- (One position per step in a lineage: replay reads them in this order.)
CREATE UNIQUE INDEX run_step_position_idx ON {schema}.run_step (lineage_id, position);
