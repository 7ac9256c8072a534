-- Reads of runs (runrow/_gateway/reads.py, metrics.py): one run, a list, the stats,
-- recent throughput, a conversation's owner, and the metrics' queue depth.

-- name: throughput
-- Recent outcomes, for the Overloaded retry-after hint and queue position's wait.
SELECT count(*) AS finished,
       count(*) FILTER (WHERE tenant_key = coalesce(%(tenant_id)s::text, '')) AS tenant_finished,
       extract(epoch FROM avg(finished_at - started_at)
                          FILTER (WHERE started_at IS NOT NULL))::float8 AS avg_run_seconds
FROM {schema}.agent_run
WHERE finished_at IS NOT NULL
  AND finished_at > coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(window_seconds)s)

-- name: get_run
SELECT {run_columns}
FROM {schema}.agent_run WHERE id = %(run_id)s

-- name: conversation_owner
-- The user who owns a conversation for the HTTP layer (runrow.http): the user of any of
-- its runs, since the layer lets only the owner post (NULL: nobody has posted yet). The
-- caller holds the conversation's advisory lock (admission_lock) from an earlier
-- statement of its transaction, so two first posts cannot both find NULL.
SELECT user_id FROM {schema}.agent_run WHERE conversation_id = %(conversation_id)s LIMIT 1

-- name: list_runs
SELECT {run_columns}
FROM {schema}.agent_run
WHERE (%(conversation_id)s::text IS NULL OR conversation_id = %(conversation_id)s)
  AND (%(status)s::text IS NULL OR status = %(status)s)
ORDER BY queue_order DESC, attempt DESC
LIMIT %(limit)s

-- name: list_children
-- A run's children (list_runs(parent_run_id=...)), newest first: the parent's index
-- (agent_run_parent_idx, migration 0011) finds them however many runs there are.
SELECT {run_columns}
FROM {schema}.agent_run
WHERE parent_run_id = %(parent_run_id)s
  AND (%(conversation_id)s::text IS NULL OR conversation_id = %(conversation_id)s)
  AND (%(status)s::text IS NULL OR status = %(status)s)
ORDER BY queue_order DESC, attempt DESC
LIMIT %(limit)s

-- name: stats
SELECT status, count(*) AS runs,
       extract(epoch FROM now() - min(created_at) FILTER (WHERE status = 'queued')) AS oldest_queued_seconds
FROM {schema}.agent_run
WHERE status IN {live_status} OR finished_at > now() - interval '1 hour'
GROUP BY status

-- name: queue_depth_by_tenant
-- Live runs per tenant ('' when the run has none) and status, and the age of the
-- oldest queued one. Only live rows (queued, running, waiting) are read (the partial
-- indexes on the live states keep this cheap however many finished runs pile up).
SELECT coalesce(tenant_id, '') AS tenant,
       status,
       count(*) AS runs,
       extract(epoch FROM now() - min(created_at)) AS oldest_seconds
FROM {schema}.agent_run
WHERE status IN {live_status}
GROUP BY 1, 2
ORDER BY 1, 2
