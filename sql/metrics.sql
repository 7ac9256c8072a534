-- Read-only statements behind the Prometheus collector (runrow.metrics).

-- name: metrics_statement_timeout
-- Bounds the scrape-time read on the server too, for this transaction only (a
-- transaction-local setting is safe behind a transaction-pooling pgbouncer).
SELECT set_config('statement_timeout', %(timeout_ms)s, true)

-- name: queue_depth_by_tenant
-- Live runs per tenant ('' when the run has none) and status, and the age of the
-- oldest queued one. Only queued and running rows are read (the partial indexes on
-- the live states keep this cheap however many finished runs pile up).
SELECT coalesce(tenant_id, '') AS tenant,
       status,
       count(*) AS runs,
       extract(epoch FROM now() - min(created_at)) AS oldest_seconds
FROM {schema}.agent_run
WHERE status IN ('queued', 'running')
GROUP BY 1, 2
ORDER BY 1, 2
