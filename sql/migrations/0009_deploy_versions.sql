-- runrow schema, version 9 (#43): versions on runs and a live worker registry, so a deploy
-- is visible and can be drained. Expand only: new columns are nullable (a previous
-- release's writes leave them NULL) and the registry is a new table it never touches.

-- The version of the code a run started with: set by its first claim only, so a run keeps
-- it across waits and resumes; a retry copies it (it replays the same lineage's steps).
-- NULL: claimed by a worker that has no version, or never claimed.
ALTER TABLE {schema}.agent_run ADD COLUMN version text;
-- The version of the worker that claimed it last (every claim sets it): what
-- `runrow workers wait --version` drains by.
ALTER TABLE {schema}.agent_run ADD COLUMN worker_version text;
-- The version of the worker that started or recorded the step (NULL: an input a person
-- recorded, or a worker without a version).
ALTER TABLE {schema}.run_step ADD COLUMN version text;

-- One row per running Dispatcher: inserted at its start, rolled with its heartbeat,
-- deleted by its clean stop, or by any reaper once its lease lapsed more than grace ago.
CREATE TABLE {schema}.worker (
    id           text PRIMARY KEY CONSTRAINT worker_id_check CHECK (length(id) BETWEEN 1 AND 200),
    host         text NOT NULL,
    pid          integer NOT NULL,
    version      text,
    -- The agent's qualified name (module.qualname).
    agent        text NOT NULL,
    concurrency  integer NOT NULL CONSTRAINT worker_concurrency_check CHECK (concurrency >= 1),
    in_flight    integer NOT NULL DEFAULT 0 CONSTRAINT worker_in_flight_check CHECK (in_flight >= 0),
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    -- heartbeat_at + the worker's own lease: the reaper's clock, as a run's claim_expires_at.
    expires_at   timestamptz NOT NULL,
    CONSTRAINT worker_expiry_check CHECK (expires_at >= heartbeat_at)
);
CREATE INDEX worker_expires_idx ON {schema}.worker (expires_at);
