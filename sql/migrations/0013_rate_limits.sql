-- runrow schema, version 13 (#42): rate limits at the claim and provider back-pressure.
-- Expand only: a new table, and a nullable column on agent_run that a previous release
-- leaves NULL (no host-given limit key) and never reads.

-- A host-given key a run is limited under (enqueue(limit_key=...), e.g. a model provider),
-- besides its tenant ('tenant:<tenant_id>') and agent ('agent:<agent_key>') keys.
ALTER TABLE {schema}.agent_run ADD COLUMN limit_key text
    CONSTRAINT agent_run_limit_key_check CHECK (length(limit_key) BETWEEN 1 AND 200);

-- One row per limited or gated key. A limit (runs, per_seconds) lets at most `runs` runs
-- under the key start in one window of `per_seconds`; a window opens at the first start
-- after the previous one closed (window_start), and `used` counts the starts in it.
-- gate_until (runrow.RetryLater with a key) holds every run under the key until then; a
-- gate-only row has no limit (runs and per_seconds NULL). last_grant is the claim's
-- scratch: how many starts the last claim that touched the row took under it.
CREATE TABLE {schema}.rate_limit (
    key           text        PRIMARY KEY CHECK (length(key) BETWEEN 1 AND 300),
    runs          integer     CHECK (runs BETWEEN 1 AND 1000000),
    per_seconds   float8      CHECK (per_seconds >= 0.001 AND per_seconds <= 31622400),
    window_start  timestamptz,
    used          integer     NOT NULL DEFAULT 0 CHECK (used >= 0),
    last_grant    integer     NOT NULL DEFAULT 0,
    gate_until    timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT rate_limit_pair_check CHECK ((runs IS NULL) = (per_seconds IS NULL))
);
