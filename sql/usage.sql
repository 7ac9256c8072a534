-- Usage accounting (runrow/_usage.py): the rollup's sums, a run's own usage, and budgets.
-- (Event names and payloads: the vocabulary in src/runrow/_events.py.)

-- name: usage_totals
-- Sums of usage_rollup per tenant and agent key over [since, until) in whole UTC hours
-- (the rollup's grain: a bound is taken down to its hour; NULL: unbounded), for one
-- tenant (%(tenant_key)s; NULL: every tenant). A range read of the rollup, never the journal.
SELECT nullif(tenant_key, '') AS tenant_id, nullif(agent_key, '') AS agent_key,
       sum(input_tokens)::bigint AS input_tokens, sum(output_tokens)::bigint AS output_tokens,
       sum(cost)::float8 AS cost, sum(records)::bigint AS records
FROM {schema}.usage_rollup
WHERE (%(tenant_key)s::text IS NULL OR tenant_key = %(tenant_key)s::text)
  AND (%(since)s::timestamptz IS NULL
       OR bucket >= date_trunc('hour', %(since)s::timestamptz AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')
  AND (%(until)s::timestamptz IS NULL
       OR bucket < date_trunc('hour', %(until)s::timestamptz AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')
GROUP BY tenant_key, agent_key
ORDER BY tenant_key, agent_key

-- name: run_usage
-- One run's usage: the sum of its journal's usage events (a read of its own journal by
-- primary key; NULL sums once trimmed or never recorded: see records).
SELECT coalesce(sum((payload->>'input_tokens')::bigint), 0)::bigint,
       coalesce(sum((payload->>'output_tokens')::bigint), 0)::bigint,
       coalesce(sum((payload->>'cost')::numeric), 0)::float8,
       count(*)
FROM {schema}.run_event
WHERE run_id = %(run_id)s AND type = 'usage' AND {schema}.run_ms(run_id) = {schema}.run_ms(%(run_id)s)

-- name: set_usage_budget
-- Upsert; tenant_key '' is the default tenant.
INSERT INTO {schema}.usage_budget (tenant_key, tokens, cost, period_seconds)
VALUES (coalesce(%(tenant_id)s::text, ''), %(tokens)s, %(cost)s, %(period_seconds)s)
ON CONFLICT (tenant_key) DO UPDATE
    SET tokens = EXCLUDED.tokens, cost = EXCLUDED.cost, period_seconds = EXCLUDED.period_seconds,
        updated_at = now()
RETURNING nullif(tenant_key, '') AS tenant_id, tokens, cost::float8, period_seconds

-- name: usage_budgets
-- The budgets set, with what the tenant has spent in its current period (the rollup's
-- rows of that period) and when the period ends; one tenant's (%(tenant_key)s) or all.
SELECT nullif(b.tenant_key, '') AS tenant_id, b.tokens, b.cost::float8, b.period_seconds,
       s.tokens::bigint AS spent_tokens, s.cost::float8 AS spent_cost,
       to_timestamp(((floor(extract(epoch FROM now()) / b.period_seconds) + 1) * b.period_seconds)::float8)
           AS period_ends_at
FROM {schema}.usage_budget b
CROSS JOIN LATERAL (
    SELECT coalesce(sum(u.input_tokens + u.output_tokens), 0) AS tokens, coalesce(sum(u.cost), 0) AS cost
    FROM {schema}.usage_rollup u
    WHERE u.tenant_key = b.tenant_key
      AND u.bucket >= to_timestamp((floor(extract(epoch FROM now()) / b.period_seconds)
                                    * b.period_seconds)::float8)) s
WHERE %(tenant_key)s::text IS NULL OR b.tenant_key = %(tenant_key)s::text
ORDER BY b.tenant_key

-- name: remove_usage_budget
DELETE FROM {schema}.usage_budget WHERE tenant_key = coalesce(%(tenant_id)s::text, '')
RETURNING 1
