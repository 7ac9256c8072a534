-- runrow schema, version 2: tenants, fairness, priorities, delayed runs, deadlines (#10).
-- Forward-only. Adding the stored generated column rewrites agent_run once.

-- The tenant a run is counted against: tenant_id, or '' for the default tenant
-- (tenant_id IS NULL; tenant_id itself may never be '').
ALTER TABLE {schema}.agent_run
    ADD COLUMN tenant_key  text        GENERATED ALWAYS AS (coalesce(tenant_id, '')) STORED,
    -- Higher runs first within its tenant's fair share.
    ADD COLUMN priority    integer     NOT NULL DEFAULT 0,
    -- Not claimable before this time (database clock).
    ADD COLUMN not_before  timestamptz,
    -- A running run past this time is cancelled and ends failed (deadline_exceeded).
    ADD COLUMN deadline_at timestamptz;

-- The fair claim: per tenant, its queued runs in claim order. The claim also walks the
-- leading column to list the tenants that have queued work (a skip scan), so a tenant's
-- 10,000 queued runs cost the claim one probe plus the few runs it takes.
CREATE INDEX agent_run_fair_idx
    ON {schema}.agent_run (tenant_key, priority DESC, queue_order) WHERE status = 'queued';
-- Running runs per tenant (the fair share's numerator and the concurrency caps).
CREATE INDEX agent_run_running_tenant_idx
    ON {schema}.agent_run (tenant_key) WHERE status = 'running';
-- Recent throughput (queue position's estimated wait, the Overloaded retry-after hint).
CREATE INDEX agent_run_finished_idx
    ON {schema}.agent_run (finished_at) WHERE finished_at IS NOT NULL;

-- Per-tenant weights and concurrency caps. A tenant without a row has weight 1 and no cap.
CREATE TABLE {schema}.tenant_policy (
    tenant_key  text        PRIMARY KEY,  -- '' is the default tenant (tenant_id IS NULL)
    weight      integer     NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 1000000),
    max_running integer     CHECK (max_running > 0),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
