-- The operator's dashboard (runrow.admin). Every statement reads through an index
-- (see sql/migrations/0007_admin_indexes.sql and docs/howto/dashboard.md's EXPLAINs).
-- A NULL parameter means "no such filter"; the admin runs each statement unprepared,
-- so the planner sees the values and drops the unused conditions before choosing
-- an index.

-- name: admin_list_runs
-- One page of runs, newest first, after the keyset cursor (before_created, before_id).
SELECT id, conversation_id, user_id, tenant_id, status, request, idempotency_key, retry_of,
       worker_id, cancel_requested, error, created_at, started_at, last_heartbeat_at,
       finished_at, claim_expires_at, user_message_id, priority, not_before, deadline_at,
       attempt, lineage_id, resumes, input_deadline_at
FROM {schema}.agent_run
WHERE (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s)
  AND (%(conversation_id)s::text IS NULL OR conversation_id = %(conversation_id)s)
  AND (%(user_id)s::text IS NULL OR user_id = %(user_id)s)
  AND (%(worker_id)s::text IS NULL OR worker_id = %(worker_id)s)
  AND (%(created_from)s::timestamptz IS NULL OR created_at >= %(created_from)s)
  AND (%(created_to)s::timestamptz IS NULL OR created_at < %(created_to)s)
  AND (%(before_created)s::timestamptz IS NULL
       OR (created_at, id) < (%(before_created)s::timestamptz, %(before_id)s::uuid))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s

-- name: admin_status_counts
-- Runs per status: the live ones (queued, running, waiting: their partial indexes) and
-- those that finished in the last hour (agent_run_finished_idx). Counting every finished
-- run would read the whole table; this costs what the queue and the last hour hold.
SELECT status, count(*) FROM (
    SELECT status FROM {schema}.agent_run
    WHERE status = 'queued' AND queue_order > 0
      AND (%(tenant_id)s::text IS NULL OR tenant_key = %(tenant_id)s)
    UNION ALL
    SELECT status FROM {schema}.agent_run
    WHERE status = 'running' AND (%(tenant_id)s::text IS NULL OR tenant_key = %(tenant_id)s)
    UNION ALL
    SELECT status FROM {schema}.agent_run
    WHERE status = 'waiting' AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s)
    UNION ALL
    SELECT status FROM {schema}.agent_run
    WHERE finished_at > now() - interval '1 hour'
      AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s)
) s
GROUP BY status

-- name: admin_lineage
-- A turn's attempts: its first run and every retry of it (primary key, agent_run_lineage_idx).
SELECT id, status, attempt, retry_of, tenant_id, created_at, finished_at, error
FROM {schema}.agent_run
WHERE id = %(root)s OR lineage_id = %(root)s
ORDER BY attempt, created_at

-- name: admin_terminal_event
-- The run's terminal event (run_event_one_terminal): its uncertain tool calls, if reaped.
SELECT payload FROM {schema}.run_event WHERE run_id = %(run_id)s AND type = 'complete'
  AND {schema}.run_ms(run_id) = {schema}.run_ms(%(run_id)s)

-- name: admin_steps
-- The turn's durable steps in call order (run_step_position_idx).
SELECT position, key, occurrence, run_id, status, idempotent, started_at, recorded_at, error
FROM {schema}.run_step
WHERE lineage_id = %(lineage_id)s
ORDER BY position
LIMIT %(limit)s

-- name: admin_conversation_runs
-- A conversation's turns in order (agent_run_conversation_idx).
SELECT id, status, attempt, user_id, tenant_id, worker_id, created_at, started_at, finished_at, error
FROM {schema}.agent_run
WHERE conversation_id = %(conversation_id)s
ORDER BY queue_order
LIMIT %(limit)s

-- name: admin_tenant_health
-- Per tenant: queued runs (agent_run_fair_idx), running ones (agent_run_running_tenant_idx),
-- the oldest queued run's wait, and the tenant's policy (weight, cap).
WITH q AS (
    SELECT tenant_key, count(*) AS queued, min(created_at) AS oldest
    FROM {schema}.agent_run
    WHERE status = 'queued' AND (%(tenant_id)s::text IS NULL OR tenant_key = %(tenant_id)s)
    GROUP BY tenant_key
), r AS (
    SELECT tenant_key, count(*) AS running
    FROM {schema}.agent_run
    WHERE status = 'running' AND (%(tenant_id)s::text IS NULL OR tenant_key = %(tenant_id)s)
    GROUP BY tenant_key
)
SELECT coalesce(q.tenant_key, r.tenant_key) AS tenant, coalesce(q.queued, 0), coalesce(r.running, 0),
       extract(epoch FROM now() - q.oldest)::float8 AS oldest_wait_seconds,
       p.weight, p.max_running
FROM q FULL JOIN r ON r.tenant_key = q.tenant_key
LEFT JOIN {schema}.tenant_policy p ON p.tenant_key = coalesce(q.tenant_key, r.tenant_key)
ORDER BY 2 DESC, 3 DESC, 1
LIMIT 500

-- name: admin_workers
-- Workers seen in running runs' claims (an index of running runs): runs in flight, last heartbeat.
SELECT worker_id, count(*) AS runs, max(last_heartbeat_at) AS last_heartbeat_at,
       min(claim_expires_at) AS next_lease_expiry
FROM {schema}.agent_run
WHERE status = 'running' AND claim_expires_at IS NOT NULL
  AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s)
GROUP BY worker_id
ORDER BY worker_id
LIMIT 500

-- name: admin_finished_series
-- Runs finished per bucket over the last window (agent_run_finished_idx), by outcome,
-- and those the reaper ended (error type worker_lost or deadline_exceeded, and the
-- reaper's terminal event: only it lists uncertain_tool_calls, and a worker ending its
-- own run at the deadline records the same error type). (run_event_one_terminal serves
-- the look-up, made only for runs with one of those error types.)
SELECT to_timestamp(floor(extract(epoch FROM finished_at) / %(bucket_seconds)s) * %(bucket_seconds)s) AS bucket,
       count(*) FILTER (WHERE status = 'completed') AS completed,
       count(*) FILTER (WHERE status <> 'completed') AS ended_otherwise,
       count(*) FILTER (WHERE r.error ->> 'type' IN ('worker_lost', 'deadline_exceeded')
                          AND EXISTS (SELECT 1 FROM {schema}.run_event e
                                      WHERE e.run_id = r.id AND {schema}.run_ms(e.run_id) = {schema}.run_ms(r.id)
                                        AND e.type = 'complete'
                                        AND e.payload ? 'uncertain_tool_calls')) AS reaped
FROM {schema}.agent_run r
WHERE finished_at > now() - make_interval(secs => %(window_seconds)s)
  AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s)
GROUP BY 1
ORDER BY 1

-- name: admin_depth_series
-- Queue depth over the window, as changes per bucket: +1 when a run was queued, -1 when
-- it left the queue (started, or ended unstarted). Reads the runs created in the window
-- (agent_run_created_idx) and the older ones still queued (agent_run_queued_idx); the
-- caller sums the changes. (A run queued before the window that started within it is
-- not seen: it waited longer than the whole window.)
WITH w AS (
    SELECT now() - make_interval(secs => %(window_seconds)s) AS start
), r AS (
    SELECT a.created_at, CASE WHEN a.status = 'queued' THEN NULL ELSE coalesce(a.started_at, a.finished_at) END AS left_at
    FROM {schema}.agent_run a, w
    WHERE a.created_at > w.start AND (%(tenant_id)s::text IS NULL OR a.tenant_id = %(tenant_id)s)
    UNION ALL
    SELECT w.start, NULL
    FROM {schema}.agent_run a, w
    WHERE a.status = 'queued' AND a.queue_order > 0 AND a.created_at <= w.start
      AND (%(tenant_id)s::text IS NULL OR a.tenant_key = %(tenant_id)s)
), ev AS (
    SELECT created_at AS at, 1 AS d FROM r
    UNION ALL
    SELECT left_at, -1 FROM r WHERE left_at IS NOT NULL
)
SELECT floor(extract(epoch FROM ev.at - w.start) / %(bucket_seconds)s)::int AS slot, sum(ev.d)::bigint
FROM ev, w
GROUP BY 1
ORDER BY 1
