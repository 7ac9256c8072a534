-- A run's way in (runrow/_gateway/submit.py): enqueue, with its admission gate and
-- idempotency, and retry, a new run for an ended one.

-- name: enqueue
-- (Event names and payloads: the vocabulary in src/runrow/_events.py.)
-- Message, run, journal seq 1-2 and the queue wake in one statement (one round trip,
-- one transaction). With an idempotency key that already exists, nothing is written.
-- The gate: with %(max_queued_tenant)s / %(max_queued_conversation)s (NULL: no limit)
-- the tenant's / conversation's queued runs are counted (up to the limit only; -1 for
-- the tenant: below the limit without counting), and with
-- %(reject_if_busy)s an active turn of the conversation refuses the enqueue; a refused
-- enqueue writes nothing and returns the gate's counts with a NULL id. A tenant whose
-- usage budget for the current period is spent is refused the same way (every enqueue:
-- the check is cheap, see budget_spent_until). Race safety comes
-- from the caller: it takes the advisory locks (admission_lock) in an earlier statement
-- of the same transaction, so this statement's snapshot is taken after them.
-- Commit order (#17): queue_order is drawn at insert, not at commit, so a turn enqueued
-- in a host transaction that commits late could start after a later turn of the same
-- conversation. The conversation's advisory lock (the one admission_lock takes) is
-- taken here, before queue_order is drawn (run reads admitted reads gate reads serial),
-- and held to the end of the transaction: a later enqueue of the conversation waits for
-- the earlier one's commit or rollback and draws a larger queue_order. The cost: a host
-- transaction holding an enqueue open delays the next enqueue of the same conversation
-- (never another conversation's). Still one statement; it takes no tenant lock, so it
-- never takes a lock out of admission_lock's order (tenant, then conversation).
WITH serial AS (
    SELECT pg_advisory_xact_lock(hashtextextended(%(conversation_lock)s::text, 0))
), gate AS (
    SELECT
        -- (Below the limit only the answer "below" matters. The queue_order span of the
        -- whole queue bounds every tenant's count from above and costs two probes of
        -- agent_run_queued_idx's ends; only when it reaches the limit is the tenant's
        -- queue counted, up to the limit. With a limit above the queue's depth, the gate
        -- then costs the same at 100,000 queued as at 2,000 (#17).)
        CASE WHEN %(max_queued_tenant)s::integer IS NULL THEN NULL
             -- (Two ORDER BY ... LIMIT 1 probes, not max() - min(): on statistics that say
             -- nothing is queued, the planner computed those in one scan of the index.)
             WHEN coalesce((SELECT q.queue_order FROM {schema}.agent_run q
                            WHERE q.status = 'queued' AND q.queue_order > 0
                            ORDER BY q.queue_order DESC LIMIT 1)
                           - (SELECT q.queue_order FROM {schema}.agent_run q
                              WHERE q.status = 'queued' AND q.queue_order > 0
                              ORDER BY q.queue_order LIMIT 1) + 1, 0)
                  < %(max_queued_tenant)s::integer THEN -1
             ELSE (
            SELECT count(*) FROM (
                SELECT 1 FROM {schema}.agent_run q
                WHERE q.status = 'queued' AND q.tenant_key = coalesce(%(tenant_id)s::text, '')
                LIMIT %(max_queued_tenant)s::integer) x) END AS tenant_queued,
        -- (The conversation's active turns, its running one included, read from its own
        -- entries: at most one is running, so the first limit + 1 hold min(queued, limit)
        -- queued ones. Counted as status = 'queued' instead, it could be planned as a
        -- walk of the tenant's whole queue in agent_run_fair_idx on stale statistics.)
        CASE WHEN %(max_queued_conversation)s::integer IS NULL THEN NULL ELSE (
            SELECT least(count(*) FILTER (WHERE x.status = 'queued'), %(max_queued_conversation)s::integer)
            FROM (
                SELECT q.status FROM {schema}.agent_run q
                WHERE q.conversation_id = %(conversation_id)s AND q.status IN {live_status}
                ORDER BY q.queue_order
                LIMIT %(max_queued_conversation)s::integer + 1) x) END AS conversation_queued,
        CASE WHEN %(reject_if_busy)s::boolean THEN EXISTS (
            SELECT 1 FROM {schema}.agent_run b
            WHERE b.conversation_id = %(conversation_id)s AND b.status IN {live_status})
        ELSE false END AS busy,
        -- The tenant's usage budget (runrow.set_usage_budget), if it has one and the
        -- current period's usage, as rolled up so far, has reached it: the period's end
        -- (NULL: not spent, or no budget). Without a budget this is one probe of
        -- usage_budget's primary key, which finds nothing; with one, a range read of the
        -- period's rollup rows (one per agent key and hour), never of the journal.
        (SELECT to_timestamp(((floor(extract(epoch FROM now()) / b.period_seconds) + 1)
                              * b.period_seconds)::float8)
         FROM {schema}.usage_budget b
         CROSS JOIN LATERAL (
             SELECT coalesce(sum(u.input_tokens + u.output_tokens), 0) AS tokens,
                    coalesce(sum(u.cost), 0) AS cost
             FROM {schema}.usage_rollup u
             WHERE u.tenant_key = b.tenant_key
               AND u.bucket >= to_timestamp((floor(extract(epoch FROM now()) / b.period_seconds)
                                             * b.period_seconds)::float8)) s
         WHERE b.tenant_key = coalesce(%(tenant_id)s::text, '')
           AND (s.tokens >= b.tokens OR s.cost >= b.cost)) AS budget_spent_until
    FROM serial
), admitted AS (
    SELECT 1 FROM gate
    WHERE NOT gate.busy AND gate.budget_spent_until IS NULL
      AND (gate.tenant_queued IS NULL OR gate.tenant_queued < %(max_queued_tenant)s::integer)
      AND (gate.conversation_queued IS NULL
           OR gate.conversation_queued < %(max_queued_conversation)s::integer)
), run AS (
    INSERT INTO {schema}.agent_run
        (conversation_id, user_id, tenant_id, user_message_id, request, idempotency_key,
         priority, not_before, deadline_at, agent_key, parent_run_id, root_run_id, limit_key,
         steerable)
    SELECT %(conversation_id)s, %(user_id)s, %(tenant_id)s, gen_random_uuid(),
           %(request)s, %(idempotency_key)s, %(priority)s,
           coalesce(%(not_before_at)s::timestamptz,
                    now() + make_interval(secs => %(not_before_in)s::float8)),
           coalesce(%(deadline_at)s::timestamptz,
                    now() + make_interval(secs => %(deadline_in)s::float8)),
           %(agent_key)s, %(parent_run_id)s::uuid, %(root_run_id)s::uuid, %(limit_key)s::text,
           %(steerable)s::boolean  -- (on_busy="steer": an earlier turn may absorb it, steering.sql)
    FROM admitted
    ON CONFLICT (user_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, user_message_id, conversation_id, user_id, status, created_at, queue_order
), msg AS (
    -- The message opens the run's turn: its queue_order (the transcript's order).
    INSERT INTO {schema}.message (id, conversation_id, run_id, role, content, status, user_id, turn)
    SELECT user_message_id, conversation_id, id, 'user', %(content)s, 'sent', user_id, queue_order
    FROM run
), ev AS (
    INSERT INTO {schema}.run_event (run_id, seq, type, payload)
    SELECT id, 1, 'user_message_created', jsonb_build_object('message_id', user_message_id) FROM run
    UNION ALL
    SELECT id, 2, 'run_queued', jsonb_build_object('run_id', id) FROM run
)
SELECT run.id, run.status, run.conversation_id, run.user_message_id, run.created_at,
       CASE WHEN run.id IS NOT NULL THEN pg_notify(%(wake_channel)s, '') END AS woke,
       EXISTS (SELECT 1 FROM admitted) AS admitted, gate.busy,
       gate.tenant_queued, gate.conversation_queued, gate.budget_spent_until,
       extract(epoch FROM gate.budget_spent_until - now())::float8 AS budget_resets_in
FROM gate LEFT JOIN run ON true

-- name: admission_lock
-- Serialises gated enqueues of one tenant and/or one conversation until the
-- transaction ends (a NULL key takes no lock). Tenant first, then conversation: one
-- order everywhere, so two gated enqueues never deadlock. (Every enqueue and retry
-- statement takes the conversation lock again, re-entrantly, and never a tenant lock.)
SELECT CASE WHEN %(tenant_lock)s::text IS NULL THEN NULL
            ELSE pg_advisory_xact_lock(hashtextextended(%(tenant_lock)s::text, 0))::text END,
       CASE WHEN %(conversation_lock)s::text IS NULL THEN NULL
            ELSE pg_advisory_xact_lock(hashtextextended(%(conversation_lock)s::text, 0))::text END

-- name: find_idempotent
-- The run a user's idempotency key already names, and which parts of the turn it recorded
-- differ from this enqueue's (the turn's inputs the agent gets: conversation, tenant,
-- content and request; JSON compared as jsonb, by value). A trimmed run's request
-- snapshot is gone, so it is not compared.
SELECT a.id, a.status, a.conversation_id, a.user_message_id, a.created_at,
       a.conversation_id IS DISTINCT FROM %(conversation_id)s::text AS other_conversation,
       a.tenant_id IS DISTINCT FROM %(tenant_id)s::text AS other_tenant,
       m.content IS DISTINCT FROM %(content)s::jsonb AS other_content,
       NOT a.journal_trimmed AND a.request IS DISTINCT FROM %(request)s::jsonb AS other_request
FROM {schema}.agent_run a
JOIN {schema}.message m ON m.id = a.user_message_id
WHERE a.user_id = %(user_id)s AND a.idempotency_key = %(idempotency_key)s

-- name: retry
-- (Event names and payloads: the vocabulary in src/runrow/_events.py.)
-- A new run for the same user message, linked to the failed, cancelled or expired one
-- (a wait for input that timed out: the retry asks again). At most
-- one retry per run (unique index on retry_of): a second call returns nothing here.
-- Like enqueue, it takes the conversation's advisory lock before its queue_order is
-- drawn, so the conversation's runs queue in commit order (see enqueue). A trimmed run
-- is not retried: its step records may be gone (trim's per-run pass deletes them with
-- the last of the lineage's runs and sets the flag in the same write, so this snapshot
-- sees both or neither; a partition's retirement deletes a lineage's with the range its
-- first run was made in, and the trigger of migration 28 orders this insert against it:
-- in a race it refuses the insert, which retry_run reports as RunTrimmed).
WITH src AS (
    SELECT id, conversation_id, user_id, tenant_id, user_message_id, request, priority,
           lineage_id, attempt, deadline_at, version, agent_key, parent_run_id, root_run_id, limit_key,
           pg_advisory_xact_lock(hashtextextended(%(conversation_lock_prefix)s::text || conversation_id, 0))
    FROM {schema}.agent_run
    WHERE id = %(run_id)s AND status IN ('failed', 'cancelled', 'expired') AND NOT journal_trimmed
      AND NOT {schema}.run_retired(coalesce(lineage_id, id))
      -- A kept deadline that has passed would only end the retry at once: not retried
      -- (retry_source says why; the caller may set a new deadline or clear it).
      AND NOT (%(keep_deadline)s AND coalesce(deadline_at <= now(), false))
    -- (Shared, against trim's FOR UPDATE: a trim committing meanwhile cannot delete the
    -- lineage's steps from under this retry, and one that came first is seen.)
    FOR SHARE
), run AS (
    -- The retry keeps the priority; it is due at once. It is the next attempt of the same
    -- turn, in the same lineage (its steps replay), and keeps the turn's deadline unless
    -- the caller set another (an absolute time, or seconds from now) or none, and the
    -- version the turn started with (its steps replay).
    INSERT INTO {schema}.agent_run
        (conversation_id, user_id, tenant_id, user_message_id, request, retry_of, priority,
         lineage_id, attempt, deadline_at, version, agent_key, parent_run_id, root_run_id, limit_key)
    SELECT conversation_id, user_id, tenant_id, user_message_id, request, id, priority,
           coalesce(lineage_id, id), attempt + 1,
           CASE WHEN %(keep_deadline)s THEN deadline_at
                ELSE coalesce(%(deadline_at)s::timestamptz,
                              now() + make_interval(secs => %(deadline_in)s::float8)) END,
           version, agent_key, parent_run_id, root_run_id,  -- (the same agent, in the same tree)
           limit_key
    FROM src
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

-- name: retry_source
-- Why a run was not retried: its status, whether it is trimmed (marked, or its lineage
-- made in a retired range), and its deadline and whether that has passed (by the
-- database's clock, as retry's check).
SELECT status, journal_trimmed OR {schema}.run_retired(coalesce(lineage_id, id)),
       deadline_at, coalesce(deadline_at <= now(), false)
FROM {schema}.agent_run WHERE id = %(run_id)s
