-- runrow schema, version 15 (#42): webhooks on endings, through an outbox. A subscription
-- is a row (webhook); a run's ending inserts one delivery row per matching subscription
-- (webhook_delivery) in the ending's own transaction (the fragment webhook_outbox), so no
-- ending commits without its deliveries and none is delivered for an ending rolled back.
-- A worker's delivery service claims due rows under FOR UPDATE SKIP LOCKED with a lease
-- (claimed_until): a worker killed mid-delivery leaves a row that is claimed again.
-- Expand only: new tables that a previous release never touches.
CREATE TABLE {schema}.webhook (
    name        text PRIMARY KEY CONSTRAINT webhook_name_check CHECK (length(name) BETWEEN 1 AND 100),
    url         text NOT NULL CONSTRAINT webhook_url_check CHECK (length(url) BETWEEN 8 AND 2000),
    -- The endings it is sent for (a run's terminal status).
    endings     text[] NOT NULL
        CONSTRAINT webhook_endings_check
        CHECK (cardinality(endings) >= 1 AND endings <@ ARRAY['completed', 'failed', 'cancelled', 'expired']),
    -- Standard Webhooks signing secret: whsec_ and the key in base64.
    secret      text NOT NULL CONSTRAINT webhook_secret_check CHECK (secret LIKE 'whsec\_%' AND length(secret) <= 200),
    -- Only runs of this tenant (NULL: every run).
    tenant_id   text CONSTRAINT webhook_tenant_check CHECK (tenant_id <> ''),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE {schema}.webhook_delivery (
    -- Sent as the webhook-id header: the same across retries and redeliveries, so a
    -- receiver deduplicates by it.
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    seq             bigint GENERATED ALWAYS AS IDENTITY,
    webhook         text NOT NULL REFERENCES {schema}.webhook (name) ON DELETE CASCADE,
    run_id          uuid,             -- NULL: a test delivery
    -- The run's first attempt: a lineage's later delivery waits for its earlier one.
    lineage         uuid,
    event_type      text NOT NULL,
    payload         jsonb NOT NULL,
    -- pending (due at next_attempt_at), delivered, or dead (attempts exhausted).
    state           text NOT NULL DEFAULT 'pending'
        CONSTRAINT webhook_delivery_state_check CHECK (state IN ('pending', 'delivered', 'dead')),
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    claimed_until   timestamptz,
    last_status     integer,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz
);
-- The delivery service's one question: which pending delivery is due first.
CREATE INDEX webhook_delivery_due_idx ON {schema}.webhook_delivery (next_attempt_at) WHERE state = 'pending';
-- Ordering per run and the dashboard's recent deliveries.
CREATE INDEX webhook_delivery_lineage_idx ON {schema}.webhook_delivery (webhook, lineage, seq) WHERE state = 'pending';
CREATE INDEX webhook_delivery_recent_idx ON {schema}.webhook_delivery (seq DESC);
