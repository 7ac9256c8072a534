-- The life of a run (agent_run): enqueue, claim, heartbeat, finalise, reap, retry, stop,
-- and the reads of runs (get, list, stats, the metrics' queue depth).
-- Worker writes are fenced: run id AND claim_token AND status = 'running'.

-- name: enqueue
-- (Event names and payloads: the vocabulary in src/runrow/_events.py.)
-- Message, run, journal seq 1-2 and the queue wake in one statement (one round trip,
-- one transaction). With an idempotency key that already exists, nothing is written.
-- The gate: with %(max_queued_tenant)s / %(max_queued_conversation)s (NULL: no limit)
-- the tenant's / conversation's queued runs are counted (up to the limit only; -1 for
-- the tenant: below the limit without counting), and with
-- %(reject_if_busy)s an active turn of the conversation refuses the enqueue; a refused
-- enqueue writes nothing and returns the gate's counts with a NULL id. Race safety comes
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
                WHERE q.conversation_id = %(conversation_id)s AND q.status IN ('queued', 'running', 'waiting')
                ORDER BY q.queue_order
                LIMIT %(max_queued_conversation)s::integer + 1) x) END AS conversation_queued,
        CASE WHEN %(reject_if_busy)s::boolean THEN EXISTS (
            SELECT 1 FROM {schema}.agent_run b
            WHERE b.conversation_id = %(conversation_id)s AND b.status IN ('queued', 'running', 'waiting'))
        ELSE false END AS busy
    FROM serial
), admitted AS (
    SELECT 1 FROM gate
    WHERE NOT gate.busy
      AND (gate.tenant_queued IS NULL OR gate.tenant_queued < %(max_queued_tenant)s::integer)
      AND (gate.conversation_queued IS NULL
           OR gate.conversation_queued < %(max_queued_conversation)s::integer)
), run AS (
    INSERT INTO {schema}.agent_run
        (conversation_id, user_id, tenant_id, user_message_id, request, idempotency_key,
         priority, not_before, deadline_at)
    SELECT %(conversation_id)s, %(user_id)s, %(tenant_id)s, gen_random_uuid(),
           %(request)s, %(idempotency_key)s, %(priority)s,
           coalesce(%(not_before_at)s::timestamptz,
                    now() + make_interval(secs => %(not_before_in)s::float8)),
           coalesce(%(deadline_at)s::timestamptz,
                    now() + make_interval(secs => %(deadline_in)s::float8))
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
       gate.tenant_queued, gate.conversation_queued
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

-- name: throughput
-- Recent outcomes, for the Overloaded retry-after hint and queue position's wait.
SELECT count(*) AS finished,
       count(*) FILTER (WHERE tenant_key = coalesce(%(tenant_id)s::text, '')) AS tenant_finished,
       extract(epoch FROM avg(finished_at - started_at)
                          FILTER (WHERE started_at IS NOT NULL))::float8 AS avg_run_seconds
FROM {schema}.agent_run
WHERE finished_at IS NOT NULL
  AND finished_at > coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(window_seconds)s)

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

-- name: claim
-- (Claim times use clock_timestamp(), read after the statement's snapshot, not now(), the
-- transaction's start: a claim that saw the previous turn's ending must also be stamped
-- after it.)
-- The fair claim: up to %(limit)s runs in one statement, fairly across tenants.
-- Eligible: queued, due (not_before <= now), the oldest queued turn of its conversation,
-- no turn of that conversation running, and its tenant below its max_running cap.
-- Order: each tenant's eligible runs are ranked k = 1, 2, ... by (priority DESC,
-- queue_order); across tenants runs go by (running + k - 1) / weight ascending (the
-- tenant's share after taking this run), then priority DESC, then queue_order.
-- Cost: the tenants with queued work are found by a skip scan of the fair index (one
-- probe each, which also brings the tenant's first run); each tenant offers its first
-- eligible run and, if its share is low enough to matter, a few more (see threshold).
-- Only a tenant that offers more than one run, or whose first run cannot start, reads
-- its queue again (in claim order, from the index), so a hot tenant's long queue is
-- never scanned (on statistics that say nothing is queued, the planner may still read
-- it once per claim: linear, never once per queued run; see tests/test_claim_plan.py).
-- Only the best candidates are locked
-- (SKIP LOCKED, in claim order, stopping at %(limit)s); those a concurrent claim holds
-- are skipped. A single claim's pick is exact; a batch is exact unless tenants' runs are
-- blocked (conversation order, not_before), when it may come back smaller. With one
-- tenant queued (solo, below) none of that ranking runs: its queue is walked in order.
-- The unique index one_turn_per_conversation is still the guarantee.
-- The batch size is read through a one-row CTE, not used inline: the planner then cannot
-- specialise a plan on it, so a prepared claim settles on its generic plan instead of
-- planning the whole statement again on every call (about half of the claim's cost).
WITH RECURSIVE lim (n) AS (
    SELECT %(limit)s::bigint
), tenants (tenant_key, id, priority, queue_order, conversation_id, not_before) AS (
    -- The skip scan: each tenant's first queued run in claim order, one index probe per
    -- tenant. The row itself comes along (its heap tuple), so a tenant that offers just
    -- its first run (most of them, with many tenants) needs no second probe below.
    (SELECT r.tenant_key, r.id, r.priority, r.queue_order, r.conversation_id, r.not_before
     FROM {schema}.agent_run r
     WHERE r.status = 'queued' ORDER BY r.tenant_key, r.priority DESC, r.queue_order LIMIT 1)
    UNION ALL
    SELECT n.* FROM tenants t CROSS JOIN LATERAL (
        SELECT r.tenant_key, r.id, r.priority, r.queue_order, r.conversation_id, r.not_before
        FROM {schema}.agent_run r
        WHERE r.status = 'queued' AND r.tenant_key > t.tenant_key
        ORDER BY r.tenant_key, r.priority DESC, r.queue_order LIMIT 1) n
), running AS (
    SELECT r.tenant_key, count(*) AS n FROM {schema}.agent_run r
    WHERE r.status = 'running' GROUP BY r.tenant_key
), depth AS (
    -- At most how many candidates a tenant offers: %(limit)s, more with few tenants, so
    -- that concurrent claimers that lose a lock race (SKIP LOCKED) still find others.
    SELECT greatest((SELECT n FROM lim),
                    ceil(4.0 * (SELECT n FROM lim) / greatest(1, count(*)))::bigint) AS per_tenant
    FROM tenants
), share AS (
    SELECT t.tenant_key, coalesce(ru.n, 0) AS running, coalesce(p.weight, 1) AS weight,
           CASE WHEN p.max_running IS NULL THEN depth.per_tenant
                ELSE greatest(0, least(depth.per_tenant, p.max_running - coalesce(ru.n, 0))) END AS room
    FROM depth, tenants t
    LEFT JOIN running ru ON ru.tenant_key = t.tenant_key
    LEFT JOIN {schema}.tenant_policy p ON p.tenant_key = t.tenant_key
), threshold AS (
    -- The 4 x %(limit)s-th smallest load if every tenant had room runs eligible. A
    -- tenant's runs past it cannot be among the best 4 x %(limit)s, so it offers only
    -- those at or under it, and always its first: with 100 idle tenants, 100 candidates
    -- instead of 800.
    SELECT (s.running + k - 1)::float8 / s.weight AS load
    FROM share s, generate_series(1, s.room) k
    ORDER BY 1 OFFSET 4 * (SELECT n FROM lim) - 1 LIMIT 1
), sized AS (
    SELECT s.tenant_key, s.running, s.weight,
           CASE WHEN s.room = 0 THEN 0
                WHEN th.load IS NULL THEN s.room
                ELSE greatest(1, least(s.room, floor(th.load * s.weight - s.running + 1e-9)::bigint + 1))
           END AS offer
    FROM share s LEFT JOIN threshold th ON true
), head AS (
    -- Can each tenant's first run start now? (The same checks as the walk below.)
    SELECT t.tenant_key, t.id, t.priority, t.queue_order,
           (t.not_before IS NULL OR t.not_before <= coalesce(%(now)s::timestamptz, now()))
           AND NOT EXISTS (
               SELECT 1 FROM {schema}.agent_run o
               WHERE o.conversation_id = t.conversation_id AND o.status IN ('running', 'waiting')
               OFFSET 0)
           AND NOT EXISTS (
               SELECT 1 FROM {schema}.agent_run o
               WHERE o.conversation_id = t.conversation_id
                 AND o.status IN ('queued', 'running', 'waiting') AND o.queue_order < t.queue_order
               OFFSET 0) AS ready
    FROM tenants t
), ranked AS (
    -- A tenant that offers one run and whose first run is ready offers exactly that run
    -- (k = 1); any other tenant walks its queue from the start, as follows.
    SELECT h.id, h.priority, h.queue_order, s.running::float8 / s.weight AS load
    FROM sized s JOIN head h ON h.tenant_key = s.tenant_key
    WHERE s.offer = 1 AND h.ready
    UNION ALL
    SELECT h.id, h.priority, h.queue_order,
           (s.running + row_number() OVER (PARTITION BY s.tenant_key
                                           ORDER BY h.priority DESC, h.queue_order) - 1)::float8
               / s.weight AS load
    FROM sized s
    JOIN head hd ON hd.tenant_key = s.tenant_key AND (s.offer > 1 OR (s.offer = 1 AND NOT hd.ready))
    CROSS JOIN LATERAL (
        SELECT r.id, r.priority, r.queue_order
        FROM {schema}.agent_run r
        WHERE r.status = 'queued' AND r.tenant_key = s.tenant_key
          AND (r.not_before IS NULL OR r.not_before <= coalesce(%(now)s::timestamptz, now()))
          -- (OFFSET 0 keeps these per-row probes of the conversation's index entries;
          -- planned as an anti-join on stale statistics, one scanned the whole queue for
          -- every queued run. Two probes, not one with "running OR older": that OR was
          -- planned as a BitmapOr that read every older turn of the conversation, for
          -- each of them: 5 s per claim with 10,000 turns queued in one conversation.
          -- The running turn is one unique-index probe; the older turn the first entry
          -- of the conversation's active-turn index: status IN (queued, running) matches
          -- no index on the queue alone, so stale statistics cannot make it a queue walk.)
          AND NOT EXISTS (
              SELECT 1 FROM {schema}.agent_run o
              WHERE o.conversation_id = r.conversation_id AND o.status IN ('running', 'waiting')
              OFFSET 0)
          AND NOT EXISTS (
              SELECT 1 FROM {schema}.agent_run o
              WHERE o.conversation_id = r.conversation_id
                AND o.status IN ('queued', 'running', 'waiting') AND o.queue_order < r.queue_order
              OFFSET 0)
        ORDER BY r.priority DESC, r.queue_order
        LIMIT s.offer
    ) h
), picked AS (
    -- The best 4 x %(limit)s candidates in claim order, as one array of ids: the lock
    -- below then probes the primary key for exactly these rows.
    SELECT (array_agg(ranked.id ORDER BY ranked.load, ranked.priority DESC, ranked.queue_order))
               [1:4 * (SELECT n FROM lim)] AS ids
    FROM ranked
), fair_candidate AS (
    -- (Still queued, re-checked on the locked row version. Written "IS TRUE" so that it
    -- implies no partial index's predicate: with status = 'queued', statistics from before
    -- a burst had the planner scan a whole queue index believed empty, with the ids as a
    -- filter, rather than probe the primary key: 100,000 rows read per claim. By
    -- queue_order, as before, it did the same with agent_run_fair_idx.)
    SELECT a.id
    FROM {schema}.agent_run a
    WHERE a.id = ANY ((SELECT ids FROM picked)::uuid[]) AND (a.status = 'queued') IS TRUE
    ORDER BY array_position((SELECT ids FROM picked)::uuid[], a.id)
    LIMIT (SELECT n FROM lim)
    FOR UPDATE OF a SKIP LOCKED
), solo AS (
    -- One tenant with queued work (the usual case): the fair order is just its own order
    -- (priority DESC, queue_order), so its runs are read, checked and locked lazily from
    -- the index, stopping at %(limit)s (or its cap): no ranking, no oversampling, and a
    -- lock race only moves the scan on.
    SELECT s.tenant_key, least((SELECT n FROM lim), s.room) AS room
    FROM share s
    WHERE (SELECT count(*) FROM share) = 1
), solo_candidate AS (
    SELECT r.id
    FROM {schema}.agent_run r
    WHERE r.status = 'queued' AND r.tenant_key = (SELECT tenant_key FROM solo)
      AND (r.not_before IS NULL OR r.not_before <= coalesce(%(now)s::timestamptz, now()))
      AND NOT EXISTS (  -- per-row probes (OFFSET 0), as above
          SELECT 1 FROM {schema}.agent_run o
          WHERE o.conversation_id = r.conversation_id AND o.status IN ('running', 'waiting')
          OFFSET 0)
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.agent_run o
          WHERE o.conversation_id = r.conversation_id
            AND o.status IN ('queued', 'running', 'waiting') AND o.queue_order < r.queue_order
          OFFSET 0)
    ORDER BY r.priority DESC, r.queue_order
    LIMIT (SELECT room FROM solo)
    FOR UPDATE OF r SKIP LOCKED
), candidate AS (
    SELECT id FROM solo_candidate
    UNION ALL
    SELECT id FROM fair_candidate WHERE NOT EXISTS (SELECT 1 FROM solo)
)
UPDATE {schema}.agent_run a SET
    status            = 'running',
    claim_token       = gen_random_uuid(),
    claim_expires_at  = coalesce(%(now)s::timestamptz, clock_timestamp())
                        + make_interval(secs => %(lease_seconds)s),
    worker_id         = %(worker_id)s,
    retry_policy      = %(retry_policy)s::jsonb,
    started_at        = coalesce(%(now)s::timestamptz, clock_timestamp()),
    last_heartbeat_at = coalesce(%(now)s::timestamptz, clock_timestamp())
-- (By primary key from an array, not joined: joined, a long queue's estimates could
-- turn the join into a hash of the whole table.)
WHERE a.id = ANY (ARRAY(SELECT id FROM candidate))
RETURNING a.id, a.claim_token, a.conversation_id, a.user_id, a.tenant_id, a.request,
    a.user_message_id, a.cancel_requested, a.created_at, a.started_at, a.deadline_at, a.priority,
    a.lineage_id, a.attempt, a.resumes,
    (SELECT m.content FROM {schema}.message m WHERE m.id = a.user_message_id) AS content,
    (SELECT coalesce(max(e.seq), 0) FROM {schema}.run_event e WHERE e.run_id = a.id) AS last_seq

-- name: claim_fifo
-- The plain FIFO claim (Dispatcher(claim_order="fifo")): global enqueue order, ignoring
-- tenants, weights, caps and priorities; not_before is still honoured. Cheapest; unfair.
-- (The batch size goes through a CTE for the reason given at the fair claim.)
WITH lim (n) AS (
    SELECT %(limit)s::bigint
), candidate AS (
    SELECT r.id
    FROM {schema}.agent_run r
    WHERE r.status = 'queued' AND r.queue_order > 0  -- (agent_run_queued_idx: migration 0003)
      AND (r.not_before IS NULL OR r.not_before <= coalesce(%(now)s::timestamptz, now()))
      AND NOT EXISTS (  -- per-row probes (OFFSET 0), as in the fair claim
          SELECT 1 FROM {schema}.agent_run o
          WHERE o.conversation_id = r.conversation_id AND o.status IN ('running', 'waiting')
          OFFSET 0)
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.agent_run o
          WHERE o.conversation_id = r.conversation_id
            AND o.status IN ('queued', 'running', 'waiting') AND o.queue_order < r.queue_order
          OFFSET 0)
    ORDER BY r.queue_order
    LIMIT (SELECT n FROM lim)
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.agent_run a SET
    status            = 'running',
    claim_token       = gen_random_uuid(),
    claim_expires_at  = coalesce(%(now)s::timestamptz, clock_timestamp())
                        + make_interval(secs => %(lease_seconds)s),
    worker_id         = %(worker_id)s,
    retry_policy      = %(retry_policy)s::jsonb,
    started_at        = coalesce(%(now)s::timestamptz, clock_timestamp()),
    last_heartbeat_at = coalesce(%(now)s::timestamptz, clock_timestamp())
WHERE a.id = ANY (ARRAY(SELECT id FROM candidate))  -- (by primary key, as in the fair claim)
RETURNING a.id, a.claim_token, a.conversation_id, a.user_id, a.tenant_id, a.request,
    a.user_message_id, a.cancel_requested, a.created_at, a.started_at, a.deadline_at, a.priority,
    a.lineage_id, a.attempt, a.resumes,
    (SELECT m.content FROM {schema}.message m WHERE m.id = a.user_message_id) AS content,
    (SELECT coalesce(max(e.seq), 0) FROM {schema}.run_event e WHERE e.run_id = a.id) AS last_seq

-- name: heartbeat
-- Rolls the lease of every run this process holds, in one statement. A run missing
-- from the result has lost its claim. Returns the durable cancel flag too: the
-- heartbeat is the fallback for a lost cancel NOTIFY.
-- Every batched writer of agent_run (heartbeat, finalize, reap) locks its rows first, in
-- id order, so that overlapping batches never deadlock whatever order they come in.
WITH locked AS (
    SELECT a.id FROM {schema}.agent_run a
    JOIN unnest(%(ids)b::uuid[], %(tokens)b::uuid[]) AS h(id, token)
      ON a.id = h.id AND a.claim_token = h.token
    WHERE a.status = 'running'
    ORDER BY a.id
    FOR NO KEY UPDATE OF a
)
UPDATE {schema}.agent_run a SET
    last_heartbeat_at = coalesce(%(now)s::timestamptz, now()),
    claim_expires_at  = coalesce(%(now)s::timestamptz, now())
                        + make_interval(secs => %(lease_seconds)s)
WHERE a.id = ANY (ARRAY(SELECT id FROM locked)) AND a.status = 'running'
RETURNING a.id, a.cancel_requested

-- name: cancel_flag
SELECT cancel_requested FROM {schema}.agent_run
WHERE id = %(run_id)s AND claim_token = %(claim_token)s AND status = 'running'

-- name: finalize
-- (Event names and payloads: the vocabulary in src/runrow/_events.py.)
-- Terminal writes of one or more runs: pending journal rows, the terminal event, any
-- streamed text not yet in the transcript, the status, and the wakes, all or nothing.
-- A run missing from the result was already ended by someone else: stand down.
-- The batch comes as two JSON arrays of objects (one parameter each: much cheaper to
-- send than nine parallel arrays): %(runs)s of {id, token, status, error (JSON text or
-- null), partial, partial_id, retry, input_timeout} and %(events)s of {run_id, seq,
-- type, payload (JSON text)}.
-- A run that parks to wait for input ends here too, but not terminally: status
-- `waiting`, unfinished, its lease left to lapse unheeded (only running runs are
-- heartbeaten or reaped for it), its input due within input_timeout seconds if given,
-- its last event `input_requested` instead of `complete`.
WITH f AS (
    SELECT * FROM jsonb_to_recordset(%(runs)s::jsonb)
             AS f(id uuid, token uuid, status text, error text, partial text, partial_id uuid,
                  retry boolean, input_timeout float8)
), locked AS (
    -- (in id order, as every batched writer: see heartbeat)
    SELECT a.id FROM {schema}.agent_run a JOIN f ON a.id = f.id AND a.claim_token = f.token
    WHERE a.status = 'running'
    ORDER BY a.id
    FOR NO KEY UPDATE OF a
), fin AS (
    -- A stop asked for while the run was running is what ends it, unless it completed:
    -- a park or a failure that finds the stop already asked for (one that reached the
    -- worker after the agent had raised, or never reached it) ends the run cancelled,
    -- as the reaper does, and its terminal event becomes the stop's.
    UPDATE {schema}.agent_run a SET
        status            = CASE WHEN f.status IN ('waiting', 'failed') AND a.cancel_requested
                                 THEN 'cancelled' ELSE f.status END,
        error             = CASE WHEN a.cancel_requested AND f.status = 'failed' THEN NULL
                                 ELSE f.error::jsonb END,
        finished_at       = CASE WHEN f.status = 'waiting' AND NOT a.cancel_requested THEN NULL
                                 ELSE now() END,
        -- (The wait ends at its input timeout or the turn's deadline, whichever is first:
        -- least() skips a NULL.)
        input_deadline_at = CASE WHEN f.status = 'waiting' AND NOT a.cancel_requested
                                 THEN least(now() + make_interval(secs => f.input_timeout),
                                            a.deadline_at) END
    FROM f
    WHERE a.id = ANY (ARRAY(SELECT id FROM locked))
      AND a.id = f.id AND a.claim_token = f.token AND a.status = 'running'
    -- (cancel_requested from the row as updated: a stop that committed while this
    -- waited for the row's lock is seen, and no retry follows it.)
    RETURNING a.id, a.conversation_id, a.tenant_key, f.partial, f.partial_id, a.status, a.input_deadline_at,
              f.retry IS TRUE AND NOT a.cancel_requested AS retry, f.status AS asked
), retried AS (
    -- An automatic retry (Dispatcher(retry=...)) commits with the ending: when the worker
    -- judged the failure retryable, no stop was asked for, attempts remain and no step
    -- of the lineage is uncertain (begun, never recorded). It takes the failed run's
    -- place in the queue (its queue_order: ahead of the conversation's later turns) and
    -- is due after the policy's backoff, with the turn's deadline (none is queued due past
    -- it). (The reap statement has the same insert.)
    INSERT INTO {schema}.agent_run
        (queue_order, conversation_id, user_id, tenant_id, user_message_id, request, retry_of,
         priority, lineage_id, attempt, not_before, deadline_at)
    OVERRIDING SYSTEM VALUE
    SELECT a.queue_order, a.conversation_id, a.user_id, a.tenant_id, a.user_message_id, a.request,
           a.id, a.priority, coalesce(a.lineage_id, a.id), a.attempt + 1, due.at, a.deadline_at
    FROM fin JOIN {schema}.agent_run a ON a.id = fin.id
    CROSS JOIN LATERAL (
        SELECT now() + make_interval(secs => least((a.retry_policy ->> 'max_backoff')::float8,
                                                   (a.retry_policy ->> 'backoff')::float8
                                                   * 2.0 ^ least(a.attempt - 1, 30))) AS at) due
    WHERE fin.retry AND a.attempt < (a.retry_policy ->> 'max_attempts')::integer
      AND (a.deadline_at IS NULL OR due.at < a.deadline_at)  -- the turn's deadline holds for its retries
      AND NOT EXISTS (SELECT 1 FROM {schema}.run_step s
                      WHERE s.lineage_id = coalesce(a.lineage_id, a.id) AND s.status = 'started')
    ON CONFLICT (retry_of) WHERE retry_of IS NOT NULL DO NOTHING
    RETURNING id, retry_of, user_message_id, attempt
), retried_ev AS (
    INSERT INTO {schema}.run_event (run_id, seq, type, payload)
    SELECT id, 1, 'user_message_created', jsonb_build_object('message_id', user_message_id) FROM retried
    UNION ALL
    SELECT id, 2, 'run_queued', jsonb_build_object('run_id', id, 'retry_of', retry_of, 'attempt', attempt)
    FROM retried
), answer AS (
    -- Streamed text the agent never wrote to the transcript: its answer if the run
    -- completed (or what it said before it paused for input), a partial answer if it
    -- was cut short. It goes in the turn of the message the run answers, however many
    -- turns were enqueued since (#17). A park's text has the id of the turn's message
    -- for its wait (partial_id: one id across the turn's attempts): a retry that parks
    -- at the same wait finds it written by an earlier attempt and writes nothing.
    INSERT INTO {schema}.message (id, conversation_id, run_id, role, content, status, turn)
    SELECT coalesce(fin.partial_id, gen_random_uuid()), fin.conversation_id, fin.id, 'assistant',
           to_jsonb(fin.partial),
           CASE WHEN fin.status IN ('completed', 'waiting') THEN 'complete' ELSE 'partial' END,
           (SELECT u.turn FROM {schema}.agent_run r JOIN {schema}.message u ON u.id = r.user_message_id
            WHERE r.id = fin.id)
    FROM fin WHERE fin.partial IS NOT NULL
    ON CONFLICT (id) DO NOTHING
), ev AS (
    INSERT INTO {schema}.run_event (run_id, seq, type, payload)
    -- (A park's input_requested says when the wait ends, on the database's clock.)
    SELECT e.run_id, e.seq,
           CASE WHEN e.type = 'input_requested' AND fin.status = 'cancelled' THEN 'complete'
                ELSE e.type END,
           CASE WHEN e.type IN ('input_requested', 'complete') AND fin.status = 'cancelled'
                     AND fin.asked <> 'cancelled'
                THEN jsonb_build_object('status', 'cancelled', 'reason', 'stopped')
                WHEN e.type = 'input_requested'
                THEN e.payload::jsonb || jsonb_build_object('expires_at', fin.input_deadline_at)
                ELSE e.payload::jsonb END
    FROM jsonb_to_recordset(%(events)s::jsonb) AS e(run_id uuid, seq integer, type text, payload text)
    JOIN fin ON fin.id = e.run_id
)
-- The queue wake only when the ending can let an idle worker claim: the conversation
-- has a next turn waiting, or the tenant has a running cap (a freed place under it).
-- Otherwise every listening worker would wake for nothing on every run's end.
-- (The queued turn is looked up among the conversation's active turns: written as
-- status = 'queued', statistics from before a burst had it walk a whole queue index,
-- believed empty, for every run ended; "IS TRUE" implies no partial index's predicate.)
SELECT fin.id, fin.status,
       pg_notify(%(events_prefix)s || replace(fin.id::text, '-', ''), ''),
       CASE WHEN EXISTS (SELECT 1 FROM {schema}.agent_run q
                         WHERE q.conversation_id = fin.conversation_id
                           AND q.status IN ('queued', 'running', 'waiting') AND (q.status = 'queued') IS TRUE)
              OR EXISTS (SELECT 1 FROM {schema}.tenant_policy p
                         WHERE p.tenant_key = fin.tenant_key AND p.max_running IS NOT NULL)
              OR EXISTS (SELECT 1 FROM retried WHERE retried.retry_of = fin.id)
            THEN pg_notify(%(wake_channel)s, '') END
FROM fin

-- name: ending_landed
-- (Event names and payloads: the vocabulary in src/runrow/_events.py.)
-- After an ending's answer was lost (connection cut) and its retry's fence matched
-- nothing: had the lost attempt committed, and as what? Only this claim's own ending
-- leaves the run with this claim token and exactly this last event at this seq (the
-- reaper's terminal event always lists the tool calls it found uncertain; a worker's
-- never does; a park's last event is its input_requested): as written, or, for a
-- failure or a park that found a stop asked for, cancelled with the stop's terminal
-- event (see finalize). The status recorded; no row if it had not landed.
SELECT a.status
FROM {schema}.agent_run a
JOIN {schema}.run_event e ON e.run_id = a.id AND e.seq = %(seq)s
WHERE a.id = %(run_id)s AND a.claim_token = %(claim_token)s
  AND ((a.status = %(status)s AND e.type = %(type)s
        AND e.payload - 'expires_at' = %(payload)s::jsonb - 'expires_at')
       OR (a.status = 'cancelled' AND %(status)s IN ('failed', 'waiting') AND e.type = 'complete'
           AND e.payload = jsonb_build_object('status', 'cancelled', 'reason', 'stopped')))

-- name: reap_candidates
-- Runs whose lease lapsed more than the grace ago, or whose deadline passed more than the
-- grace ago (their worker, alive or not, should have ended them); and waiting runs whose
-- wait is over (input timeout or deadline: no worker to race, no grace). Only a hint:
-- reap re-checks.
SELECT id FROM (
    (SELECT id, claim_expires_at AS due FROM {schema}.agent_run
     WHERE status = 'running'
       AND (claim_expires_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(grace_seconds)s)
            OR deadline_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(grace_seconds)s))
     ORDER BY claim_expires_at
     LIMIT %(limit)s)
    UNION ALL
    (SELECT id, input_deadline_at FROM {schema}.agent_run
     WHERE status = 'waiting' AND input_deadline_at <= coalesce(%(now)s::timestamptz, now())
     ORDER BY input_deadline_at
     LIMIT %(limit)s)
) c
ORDER BY due
LIMIT %(limit)s

-- name: reap
-- (Event names and payloads: the vocabulary in src/runrow/_events.py.)
-- Fails (or, when a stop was asked for, cancels) runs whose worker is gone, or that ran
-- past their deadline without their worker ending them. The conditions are re-checked
-- inside the write, so a heartbeat that landed after the candidates were read wins. The
-- terminal event takes max(seq)+1: the status flip fences the worker out, and the
-- journal's primary key rejects any append that raced it. It says why (reason
-- worker_lost, deadline_exceeded, or input_expired for a waiting run whose wait is
-- over) and lists the tool calls the journal shows started
-- (tool_call_started with a tool_call_id) and never finished (no tool_call_finished
-- with that id): their side effects are uncertain. (The terminal event always carries
-- uncertain_tool_calls, which a worker's never does: ending_landed relies on it to tell
-- a reaped ending from the worker's own.)
WITH locked AS (
    -- (in id order, as every batched writer: see heartbeat.) SKIP LOCKED: a row another
    -- transaction holds is left to the next pass. Its holder is alive (a heartbeat, an
    -- ending, a stop) or frozen mid-transaction (a worker stopped between a pipelined
    -- fold's statements and its sync): waiting would hold every other run of the batch,
    -- on every reaper, for as long as that process stays frozen.
    -- The row's one cause (its error type and its terminal event's reason). A running
    -- run both lost and past its deadline (reaped late: every worker was down, say) is
    -- ended for whichever passed first, as a prompt reaper would have: its lease lapsing
    -- (worker_lost) or its deadline (deadline_exceeded). (Locking reads the row's latest
    -- version, the one the update below re-checks.)
    SELECT a.id, a.status AS was,
           CASE WHEN a.status = 'waiting'
                THEN CASE WHEN a.deadline_at <= coalesce(%(now)s::timestamptz, now())
                          THEN 'deadline_exceeded' ELSE 'input_expired' END
                WHEN a.deadline_at <= a.claim_expires_at THEN 'deadline_exceeded'
                ELSE 'worker_lost' END AS cause
    FROM {schema}.agent_run a
    WHERE a.id = ANY(%(ids)s::uuid[]) AND a.status IN ('running', 'waiting')
    ORDER BY a.id
    FOR NO KEY UPDATE OF a SKIP LOCKED
), fin AS (
    -- A waiting run whose wait is over ends `expired`, or `failed` if that was the
    -- turn's deadline.
    UPDATE {schema}.agent_run a SET
        status      = CASE WHEN l.was = 'waiting'
                           THEN CASE WHEN l.cause = 'deadline_exceeded' THEN 'failed' ELSE 'expired' END
                           WHEN a.cancel_requested THEN 'cancelled' ELSE 'failed' END,
        error       = CASE
                          WHEN l.was = 'running' AND a.cancel_requested THEN NULL
                          ELSE jsonb_build_object('type', l.cause, 'message', CASE
                              WHEN l.was = 'waiting' AND l.cause = 'deadline_exceeded'
                              THEN 'the run was still waiting for input at its deadline'
                              WHEN l.was = 'waiting' THEN 'no input arrived before the wait''s timeout'
                              WHEN l.cause = 'deadline_exceeded'
                              THEN 'the run was still running past its deadline'
                              ELSE 'the worker stopped heartbeating; its lease expired' END) END,
        finished_at = now()
    FROM locked l
    WHERE a.id = ANY (ARRAY(SELECT id FROM locked)) AND l.id = a.id
      AND ((a.status = 'running'
            AND (a.claim_expires_at < coalesce(%(now)s::timestamptz, now())
                                      - make_interval(secs => %(grace_seconds)s)
                 OR a.deadline_at < coalesce(%(now)s::timestamptz, now())
                                    - make_interval(secs => %(grace_seconds)s)))
           OR (a.status = 'waiting' AND a.input_deadline_at <= coalesce(%(now)s::timestamptz, now())))
    RETURNING a.id, a.conversation_id, a.status, a.error, a.worker_id, l.cause AS reason,
              l.was = 'waiting' AS parked
), ev AS (
    INSERT INTO {schema}.run_event (run_id, seq, type, payload)
    SELECT fin.id,
           (SELECT coalesce(max(e.seq), 0) + 1 FROM {schema}.run_event e WHERE e.run_id = fin.id),
           'complete',
           jsonb_build_object(
               'status', fin.status,
               'error', fin.error,
               'reason', fin.reason,
               'uncertain_tool_calls', (
                   SELECT coalesce(jsonb_agg(jsonb_build_object(
                              'tool_call_id', s.payload -> 'tool_call_id',
                              'name', s.payload -> 'name') ORDER BY s.seq), '[]'::jsonb)
                   FROM {schema}.run_event s
                   -- (A waiting run parked on purpose: its worker was not lost in the
                   -- middle of a call, so none is uncertain: a call announced before the
                   -- wait, awaiting approval, never ran.)
                   WHERE s.run_id = fin.id AND s.type = 'tool_call_started' AND NOT fin.parked
                     AND s.payload ? 'tool_call_id'
                     AND NOT EXISTS (
                         SELECT 1 FROM {schema}.run_event f
                         WHERE f.run_id = fin.id AND f.type = 'tool_call_finished'
                           AND f.payload -> 'tool_call_id' = s.payload -> 'tool_call_id')))
    FROM fin
), retried AS (
    -- A lost worker's run is retried in the same commit when its policy (stamped by its
    -- claim) retries worker losses: as in finalize's retried, which see.
    INSERT INTO {schema}.agent_run
        (queue_order, conversation_id, user_id, tenant_id, user_message_id, request, retry_of,
         priority, lineage_id, attempt, not_before, deadline_at)
    OVERRIDING SYSTEM VALUE
    SELECT a.queue_order, a.conversation_id, a.user_id, a.tenant_id, a.user_message_id, a.request,
           a.id, a.priority, coalesce(a.lineage_id, a.id), a.attempt + 1, due.at, a.deadline_at
    FROM fin JOIN {schema}.agent_run a ON a.id = fin.id
    CROSS JOIN LATERAL (
        SELECT now() + make_interval(secs => least((a.retry_policy ->> 'max_backoff')::float8,
                                                   (a.retry_policy ->> 'backoff')::float8
                                                   * 2.0 ^ least(a.attempt - 1, 30))) AS at) due
    WHERE fin.status = 'failed' AND fin.error ->> 'type' = 'worker_lost'
      AND (a.retry_policy ->> 'worker_lost')::boolean
      AND a.attempt < (a.retry_policy ->> 'max_attempts')::integer
      AND (a.deadline_at IS NULL OR due.at < a.deadline_at)
      AND NOT EXISTS (SELECT 1 FROM {schema}.run_step s
                      WHERE s.lineage_id = coalesce(a.lineage_id, a.id) AND s.status = 'started')
    ON CONFLICT (retry_of) WHERE retry_of IS NOT NULL DO NOTHING
    RETURNING id, retry_of, user_message_id, attempt
), retried_ev AS (
    INSERT INTO {schema}.run_event (run_id, seq, type, payload)
    SELECT id, 1, 'user_message_created', jsonb_build_object('message_id', user_message_id) FROM retried
    UNION ALL
    SELECT id, 2, 'run_queued', jsonb_build_object('run_id', id, 'retry_of', retry_of, 'attempt', attempt)
    FROM retried
)
SELECT fin.id, fin.conversation_id, fin.status, fin.worker_id, fin.reason,
       pg_notify(%(events_prefix)s || replace(fin.id::text, '-', ''), ''),
       pg_notify(%(wake_channel)s, '')
FROM fin

-- name: retry
-- (Event names and payloads: the vocabulary in src/runrow/_events.py.)
-- A new run for the same user message, linked to the failed, cancelled or expired one
-- (a wait for input that timed out: the retry asks again). At most
-- one retry per run (unique index on retry_of): a second call returns nothing here.
-- Like enqueue, it takes the conversation's advisory lock before its queue_order is
-- drawn, so the conversation's runs queue in commit order (see enqueue). A trimmed run
-- is not retried: trim deleted its request snapshot (and sets the flag in the same
-- write, so this snapshot sees both or neither).
WITH src AS (
    SELECT id, conversation_id, user_id, tenant_id, user_message_id, request, priority,
           lineage_id, attempt, deadline_at,
           pg_advisory_xact_lock(hashtextextended(%(conversation_lock_prefix)s::text || conversation_id, 0))
    FROM {schema}.agent_run
    WHERE id = %(run_id)s AND status IN ('failed', 'cancelled', 'expired') AND NOT journal_trimmed
      -- A kept deadline that has passed would only end the retry at once: not retried
      -- (retry_source says why; the caller may set a new deadline or clear it).
      AND NOT (%(keep_deadline)s AND coalesce(deadline_at <= now(), false))
    -- (Shared, against trim's FOR UPDATE: a trim committing meanwhile cannot delete the
    -- lineage's steps from under this retry, and one that came first is seen.)
    FOR SHARE
), run AS (
    -- The retry keeps the priority; it is due at once. It is the next attempt of the same
    -- turn, in the same lineage (its steps replay), and keeps the turn's deadline unless
    -- the caller set another (an absolute time, or seconds from now) or none.
    INSERT INTO {schema}.agent_run
        (conversation_id, user_id, tenant_id, user_message_id, request, retry_of, priority,
         lineage_id, attempt, deadline_at)
    SELECT conversation_id, user_id, tenant_id, user_message_id, request, id, priority,
           coalesce(lineage_id, id), attempt + 1,
           CASE WHEN %(keep_deadline)s THEN deadline_at
                ELSE coalesce(%(deadline_at)s::timestamptz,
                              now() + make_interval(secs => %(deadline_in)s::float8)) END
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
-- Why a run was not retried: its status, whether trim deleted its request, and its
-- deadline and whether that has passed (by the database's clock, as retry's check).
SELECT status, journal_trimmed, deadline_at, coalesce(deadline_at <= now(), false)
FROM {schema}.agent_run WHERE id = %(run_id)s

-- name: get_run
SELECT id, conversation_id, user_id, tenant_id, status, request, idempotency_key, retry_of,
       worker_id, cancel_requested, error, created_at, started_at, last_heartbeat_at,
       finished_at, claim_expires_at, user_message_id, priority, not_before, deadline_at,
       attempt, lineage_id, resumes, input_deadline_at
FROM {schema}.agent_run WHERE id = %(run_id)s

-- name: conversation_owner
-- The user who owns a conversation for the HTTP layer (runrow.http): the user of any of
-- its runs, since the layer lets only the owner post (NULL: nobody has posted yet). The
-- caller holds the conversation's advisory lock (admission_lock) from an earlier
-- statement of its transaction, so two first posts cannot both find NULL.
SELECT user_id FROM {schema}.agent_run WHERE conversation_id = %(conversation_id)s LIMIT 1

-- name: list_runs
SELECT id, conversation_id, user_id, tenant_id, status, request, idempotency_key, retry_of,
       worker_id, cancel_requested, error, created_at, started_at, last_heartbeat_at,
       finished_at, claim_expires_at, user_message_id, priority, not_before, deadline_at,
       attempt, lineage_id, resumes, input_deadline_at
FROM {schema}.agent_run
WHERE (%(conversation_id)s::text IS NULL OR conversation_id = %(conversation_id)s)
  AND (%(status)s::text IS NULL OR status = %(status)s)
ORDER BY queue_order DESC, attempt DESC
LIMIT %(limit)s

-- name: stats
SELECT status, count(*) AS runs,
       extract(epoch FROM now() - min(created_at) FILTER (WHERE status = 'queued')) AS oldest_queued_seconds
FROM {schema}.agent_run
WHERE status IN ('queued', 'running', 'waiting') OR finished_at > now() - interval '1 hour'
GROUP BY status

-- name: lock_conversation_runs
-- Stop's sweep: lock every active run of the conversation (queued, running, waiting) together.
-- (resumed: a queued run that input resumed has started: it is stopped as a waiting one.)
SELECT id, status, resumes > 0 AS resumed FROM {schema}.agent_run
WHERE conversation_id = %(conversation_id)s AND status IN ('queued', 'running', 'waiting')
ORDER BY queue_order
FOR UPDATE

-- name: lock_run
SELECT id, status, resumes > 0 AS resumed FROM {schema}.agent_run WHERE id = %(run_id)s FOR UPDATE

-- name: cancel_queued
-- (Event names and payloads: the vocabulary in src/runrow/_events.py.)
-- Queued turns never started: cancel them outright, turn their user message back into
-- a draft for the composer, and journal their one terminal event.
WITH c AS (
    UPDATE {schema}.agent_run SET status = 'cancelled', finished_at = now()
    WHERE id = ANY(%(ids)s::uuid[]) AND status = 'queued'
    RETURNING id, user_message_id
), d AS (
    UPDATE {schema}.message m SET status = 'draft'
    FROM c WHERE m.id = c.user_message_id
    RETURNING m.id, m.content, c.id AS run_id
), ev AS (
    INSERT INTO {schema}.run_event (run_id, seq, type, payload)
    SELECT c.id,
           (SELECT coalesce(max(e.seq), 0) + 1 FROM {schema}.run_event e WHERE e.run_id = c.id),
           'complete',
           jsonb_build_object('status', 'cancelled', 'reason', 'stopped_before_start')
    FROM c
)
SELECT d.run_id, d.id AS message_id, d.content,
       pg_notify(%(events_prefix)s || replace(d.run_id::text, '-', ''), '')
FROM d

-- name: cancel_paused
-- (Event names and payloads: the vocabulary in src/runrow/_events.py.)
-- Turns paused for input: waiting, or queued again by provide_input and not yet
-- claimed. No worker holds them, so a stop ends them at once, cancelled (they had
-- started: no draft), with their one terminal event, and wakes the queue (the
-- conversation's next turn, if any, may start).
WITH c AS (
    UPDATE {schema}.agent_run SET status = 'cancelled', finished_at = now(), input_deadline_at = NULL
    WHERE id = ANY(%(ids)s::uuid[]) AND (status = 'waiting' OR (status = 'queued' AND resumes > 0))
    RETURNING id
), ev AS (
    INSERT INTO {schema}.run_event (run_id, seq, type, payload)
    SELECT c.id,
           (SELECT coalesce(max(e.seq), 0) + 1 FROM {schema}.run_event e WHERE e.run_id = c.id),
           'complete',
           jsonb_build_object('status', 'cancelled', 'reason', 'stopped')
    FROM c
)
SELECT c.id,
       pg_notify(%(events_prefix)s || replace(c.id::text, '-', ''), ''),
       pg_notify(%(wake_channel)s, '')
FROM c

-- name: request_cancel
-- The running turn: the durable flag is the truth, the NOTIFY only the fast path.
UPDATE {schema}.agent_run SET cancel_requested = true
WHERE id = ANY(%(ids)s::uuid[]) AND status = 'running'
RETURNING id, pg_notify(%(cancel_channel)s, id::text)

-- name: queue_depth_by_tenant
-- Live runs per tenant ('' when the run has none) and status, and the age of the
-- oldest queued one. Only live rows (queued, running, waiting) are read (the partial
-- indexes on the live states keep this cheap however many finished runs pile up).
SELECT coalesce(tenant_id, '') AS tenant,
       status,
       count(*) AS runs,
       extract(epoch FROM now() - min(created_at)) AS oldest_seconds
FROM {schema}.agent_run
WHERE status IN ('queued', 'running', 'waiting')
GROUP BY 1, 2
ORDER BY 1, 2
