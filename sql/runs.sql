-- The life of a run: enqueue, claim, heartbeat, finalise, reap, retry.
-- Worker writes are fenced: run id AND claim_token AND status = 'running'.

-- name: enqueue
-- Message, run, journal seq 1-2 and the queue wake in one statement (one round trip,
-- one transaction). With an idempotency key that already exists, nothing is written.
WITH run AS (
    INSERT INTO {schema}.agent_run
        (conversation_id, user_id, tenant_id, user_message_id, request, idempotency_key)
    VALUES
        (%(conversation_id)s, %(user_id)s, %(tenant_id)s, gen_random_uuid(),
         %(request)s, %(idempotency_key)s)
    ON CONFLICT (user_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, user_message_id, conversation_id, user_id, status, created_at
), msg AS (
    INSERT INTO {schema}.message (id, conversation_id, run_id, role, content, status, user_id)
    SELECT user_message_id, conversation_id, id, 'user', %(content)s, 'sent', user_id FROM run
), ev AS (
    INSERT INTO {schema}.run_event (run_id, seq, type, payload)
    SELECT id, 1, 'user_message_created', jsonb_build_object('message_id', user_message_id) FROM run
    UNION ALL
    SELECT id, 2, 'run_queued', jsonb_build_object('run_id', id) FROM run
)
SELECT id, status, conversation_id, user_message_id, created_at, pg_notify(%(wake_channel)s, '')
FROM run

-- name: find_idempotent
SELECT id, status, conversation_id, user_message_id, created_at
FROM {schema}.agent_run
WHERE user_id = %(user_id)s AND idempotency_key = %(idempotency_key)s

-- name: claim
-- Claims up to %(limit)s runs in one statement. A run is a candidate only when it is
-- the oldest queued turn of its conversation and no turn of it is running, so one
-- statement takes at most one run per conversation and turns start in enqueue order.
-- The filter reads a snapshot; the unique index one_running_per_conversation is the
-- guarantee (a violation means: claim nothing this round).
WITH candidate AS (
    SELECT r.id
    FROM {schema}.agent_run r
    WHERE r.status = 'queued'
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.agent_run o
          WHERE o.conversation_id = r.conversation_id
            AND o.status IN ('queued', 'running')
            AND (o.status = 'running' OR o.queue_order < r.queue_order))
    ORDER BY r.queue_order
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.agent_run a SET
    status            = 'running',
    claim_token       = gen_random_uuid(),
    claim_expires_at  = coalesce(%(now)s::timestamptz, now())
                        + make_interval(secs => %(lease_seconds)s),
    worker_id         = %(worker_id)s,
    started_at        = coalesce(%(now)s::timestamptz, now()),
    last_heartbeat_at = coalesce(%(now)s::timestamptz, now())
FROM candidate
WHERE a.id = candidate.id
RETURNING a.id, a.claim_token, a.conversation_id, a.user_id, a.tenant_id, a.request,
    a.user_message_id, a.cancel_requested, a.created_at, a.started_at,
    (SELECT m.content FROM {schema}.message m WHERE m.id = a.user_message_id) AS content,
    (SELECT coalesce(max(e.seq), 0) FROM {schema}.run_event e WHERE e.run_id = a.id) AS last_seq

-- name: heartbeat
-- Rolls the lease of every run this process holds, in one statement. A run missing
-- from the result has lost its claim. Returns the durable cancel flag too: the
-- heartbeat is the fallback for a lost cancel NOTIFY.
UPDATE {schema}.agent_run a SET
    last_heartbeat_at = coalesce(%(now)s::timestamptz, now()),
    claim_expires_at  = coalesce(%(now)s::timestamptz, now())
                        + make_interval(secs => %(lease_seconds)s)
FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) AS h(id, token)
WHERE a.id = h.id AND a.claim_token = h.token AND a.status = 'running'
RETURNING a.id, a.cancel_requested

-- name: cancel_flag
SELECT cancel_requested FROM {schema}.agent_run
WHERE id = %(run_id)s AND claim_token = %(claim_token)s AND status = 'running'

-- name: finalize
-- Terminal writes of one or more runs: pending journal rows, the terminal event, any
-- streamed text not yet in the transcript, the status, and the wakes, all or nothing.
-- A run missing from the result was already ended by someone else: stand down.
WITH f AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[], %(statuses)s::text[],
                         %(errors)s::jsonb[], %(partials)s::text[])
             AS f(id, token, status, error, partial)
), fin AS (
    UPDATE {schema}.agent_run a SET status = f.status, error = f.error, finished_at = now()
    FROM f
    WHERE a.id = f.id AND a.claim_token = f.token AND a.status = 'running'
    RETURNING a.id, a.conversation_id, f.partial, f.status
), answer AS (
    -- Streamed text the agent never wrote to the transcript: its answer if the run
    -- completed, a partial answer if it was cut short.
    INSERT INTO {schema}.message (conversation_id, run_id, role, content, status)
    SELECT fin.conversation_id, fin.id, 'assistant', to_jsonb(fin.partial),
           CASE WHEN fin.status = 'completed' THEN 'complete' ELSE 'partial' END
    FROM fin WHERE fin.partial IS NOT NULL
), ev AS (
    INSERT INTO {schema}.run_event (run_id, seq, type, payload)
    SELECT e.run_id, e.seq, e.type, e.payload
    FROM unnest(%(ev_runs)s::uuid[], %(ev_seqs)s::integer[], %(ev_types)s::text[],
                %(ev_payloads)s::jsonb[]) AS e(run_id, seq, type, payload)
    JOIN fin ON fin.id = e.run_id
)
SELECT fin.id,
       pg_notify(%(events_prefix)s || replace(fin.id::text, '-', ''), ''),
       pg_notify(%(wake_channel)s, '')
FROM fin

-- name: reap_candidates
-- Runs whose lease lapsed more than the grace ago. Only a hint: reap re-checks.
SELECT id FROM {schema}.agent_run
WHERE status = 'running'
  AND claim_expires_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(grace_seconds)s)
ORDER BY claim_expires_at
LIMIT %(limit)s

-- name: reap
-- Fails (or, when a stop was asked for, cancels) runs whose worker is gone. The expiry
-- is re-checked inside the write, so a heartbeat that landed after the candidates were
-- read wins. The terminal event takes max(seq)+1: the status flip fences the worker out,
-- and the journal's primary key rejects any append that raced it.
WITH fin AS (
    UPDATE {schema}.agent_run a SET
        status      = CASE WHEN a.cancel_requested THEN 'cancelled' ELSE 'failed' END,
        error       = CASE WHEN a.cancel_requested THEN NULL ELSE jsonb_build_object(
                          'type', 'worker_lost',
                          'message', 'the worker stopped heartbeating; its lease expired') END,
        finished_at = now()
    WHERE a.id = ANY(%(ids)s::uuid[])
      AND a.status = 'running'
      AND a.claim_expires_at < coalesce(%(now)s::timestamptz, now())
                               - make_interval(secs => %(grace_seconds)s)
    RETURNING a.id, a.conversation_id, a.status, a.error, a.worker_id
), ev AS (
    INSERT INTO {schema}.run_event (run_id, seq, type, payload)
    SELECT fin.id,
           (SELECT coalesce(max(e.seq), 0) + 1 FROM {schema}.run_event e WHERE e.run_id = fin.id),
           'complete',
           jsonb_build_object('status', fin.status, 'error', fin.error, 'reason', 'worker_lost')
    FROM fin
)
SELECT fin.id, fin.conversation_id, fin.status, fin.worker_id,
       pg_notify(%(events_prefix)s || replace(fin.id::text, '-', ''), ''),
       pg_notify(%(wake_channel)s, '')
FROM fin

-- name: retry
-- A new run for the same user message, linked to the failed or cancelled one. At most
-- one retry per run (unique index on retry_of): a second call returns nothing here.
WITH src AS (
    SELECT id, conversation_id, user_id, tenant_id, user_message_id, request
    FROM {schema}.agent_run
    WHERE id = %(run_id)s AND status IN ('failed', 'cancelled')
), run AS (
    INSERT INTO {schema}.agent_run
        (conversation_id, user_id, tenant_id, user_message_id, request, retry_of)
    SELECT conversation_id, user_id, tenant_id, user_message_id, request, id FROM src
    ON CONFLICT (retry_of) WHERE retry_of IS NOT NULL DO NOTHING
    RETURNING id, status, conversation_id, user_message_id, created_at
), msg AS (
    UPDATE {schema}.message m SET status = 'sent'
    FROM run WHERE m.id = run.user_message_id AND m.status = 'draft'
), ev AS (
    INSERT INTO {schema}.run_event (run_id, seq, type, payload)
    SELECT id, 1, 'user_message_created', jsonb_build_object('message_id', user_message_id) FROM run
    UNION ALL
    SELECT id, 2, 'run_queued', jsonb_build_object('run_id', id, 'retry_of', %(run_id)s::text)
    FROM run
)
SELECT id, status, conversation_id, user_message_id, created_at, pg_notify(%(wake_channel)s, '')
FROM run

-- name: find_retry
SELECT id, status, conversation_id, user_message_id, created_at
FROM {schema}.agent_run WHERE retry_of = %(run_id)s

-- name: get_run
SELECT id, conversation_id, user_id, tenant_id, status, request, idempotency_key, retry_of,
       worker_id, cancel_requested, error, created_at, started_at, last_heartbeat_at,
       finished_at, claim_expires_at, user_message_id
FROM {schema}.agent_run WHERE id = %(run_id)s

-- name: list_runs
SELECT id, conversation_id, user_id, tenant_id, status, request, idempotency_key, retry_of,
       worker_id, cancel_requested, error, created_at, started_at, last_heartbeat_at,
       finished_at, claim_expires_at, user_message_id
FROM {schema}.agent_run
WHERE (%(conversation_id)s::text IS NULL OR conversation_id = %(conversation_id)s)
  AND (%(status)s::text IS NULL OR status = %(status)s)
ORDER BY queue_order DESC
LIMIT %(limit)s

-- name: stats
SELECT status, count(*) AS runs,
       extract(epoch FROM now() - min(created_at) FILTER (WHERE status = 'queued')) AS oldest_queued_seconds
FROM {schema}.agent_run
WHERE status IN ('queued', 'running') OR finished_at > now() - interval '1 hour'
GROUP BY status
