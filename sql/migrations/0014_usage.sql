-- runrow schema, version 14 (#42 point 5): usage accounting. A run's usage is journaled
-- as `usage` events (input_tokens, output_tokens, cost); the same statement that
-- writes them (append_events, finalize) adds them to usage_rollup, one row per tenant,
-- agent key and UTC hour, so sums over a period read a few rows, never the journal.
-- usage_budget holds an optional per-tenant budget per period; enqueue refuses a
-- tenant's runs once the period's rollup has reached it.
-- Expand only: new tables that a previous release never touches (an older worker's
-- flushes write `usage` events only if its agents emit them by hand, uncounted).
-- (Numbered 14: 12 and 13 are other changes'; the loader accepts a gap, see src/runrow/_sql.py.)
CREATE TABLE {schema}.usage_rollup (
    tenant_key    text        NOT NULL,  -- '' is the default tenant
    agent_key     text        NOT NULL,  -- '' is the default agent
    bucket        timestamptz NOT NULL CONSTRAINT usage_rollup_bucket_check
                                       CHECK (bucket = date_trunc('hour', bucket AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'),
    input_tokens  bigint      NOT NULL DEFAULT 0 CONSTRAINT usage_rollup_input_check CHECK (input_tokens >= 0),
    output_tokens bigint      NOT NULL DEFAULT 0 CONSTRAINT usage_rollup_output_check CHECK (output_tokens >= 0),
    cost          numeric     NOT NULL DEFAULT 0 CONSTRAINT usage_rollup_cost_check CHECK (cost >= 0),
    records       bigint      NOT NULL DEFAULT 0 CONSTRAINT usage_rollup_records_check CHECK (records >= 0),
    PRIMARY KEY (tenant_key, bucket, agent_key)
);
CREATE TABLE {schema}.usage_budget (
    tenant_key     text    PRIMARY KEY,  -- '' is the default tenant
    tokens         bigint  CONSTRAINT usage_budget_tokens_check CHECK (tokens >= 0),
    cost           numeric CONSTRAINT usage_budget_cost_check CHECK (cost >= 0),
    -- The period: aligned windows of this many seconds from the Unix epoch (86400: the
    -- UTC day), a whole number of hours (the rollup's grain).
    period_seconds integer NOT NULL CONSTRAINT usage_budget_period_check
                           CHECK (period_seconds > 0 AND period_seconds % 3600 = 0),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT usage_budget_some_check CHECK (tokens IS NOT NULL OR cost IS NOT NULL)
);
