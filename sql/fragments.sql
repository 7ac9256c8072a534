-- Fragments: SQL text that statements in any file take as {name}, written out when the
-- statements load (see src/runrow/_sql.py). Not statements: nothing runs them alone.

-- fragment: live_status
-- The live statuses (src/runrow/_status.py's LIVE): a turn still in its conversation's
-- way. Written `status IN {live_status}`, the predicate of the partial index on a
-- conversation's active turns (agent_run_active_conversation_idx, migration 0006), so a
-- query written with it can use that index; the schema's agent_run_terminal_finished
-- check spells the same set. tests/test_status_vocabulary.py holds them together.
('queued', 'running', 'waiting')

-- fragment: run_columns
-- A run's row as runrow.RunInfo reads it (its fields, in order): the reads of one run or
-- of a list take it, so a new column is added here once.
id, conversation_id, user_id, tenant_id, status, request, idempotency_key, retry_of,
       worker_id, cancel_requested, error, created_at, started_at, last_heartbeat_at,
       finished_at, claim_expires_at, user_message_id, priority, not_before, deadline_at,
       attempt, lineage_id, resumes, input_deadline_at, version, worker_version, agent_key,
       parent_run_id, root_run_id, steerable, absorbed_into

-- fragment: usage_rolled
-- (Event names and payloads: the vocabulary in src/runrow/_events.py.)
-- Adds the `usage` events a statement wrote (its CTE usage_rows: run_id, usage payload)
-- to usage_rollup, per tenant, agent key and UTC hour, in the statement that journals
-- them (append_events, finalize): the rollup holds exactly what landed, with no commit
-- of its own, and a fenced-out write adds nothing. Rows are taken in key order, so two
-- writers never wait on each other's rollup rows in a cycle. With no usage event the
-- insert reads nothing (usage_rows is empty) and agent_run is not probed.
usage_rolled AS (
    INSERT INTO {schema}.usage_rollup AS u
        (tenant_key, agent_key, bucket, input_tokens, output_tokens, cost, records)
    SELECT a.tenant_key, coalesce(a.agent_key, ''),
           date_trunc('hour', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',
           sum((r.usage->>'input_tokens')::bigint), sum((r.usage->>'output_tokens')::bigint),
           sum((r.usage->>'cost')::numeric), count(*)
    FROM usage_rows r JOIN {schema}.agent_run a ON a.id = r.run_id
    GROUP BY 1, 2
    ORDER BY 1, 2
    ON CONFLICT (tenant_key, bucket, agent_key) DO UPDATE SET
        input_tokens  = u.input_tokens + excluded.input_tokens,
        output_tokens = u.output_tokens + excluded.output_tokens,
        cost          = u.cost + excluded.cost,
        records       = u.records + excluded.records
-- fragment: usage_rolled_off
-- usage_rolled switched off: a batch whose events hold no `usage` event (the journal
-- writer's append_events and the ending's finalize: journal.py, endings.py).
usage_rolled AS (SELECT

-- fragment: limits_open
-- A claim's test that queued run r is under no closed rate limit or gate (migration 0013):
-- none of its keys (tenant:<tenant_key>, agent:<agent_key>, its limit_key) has a row
-- whose gate is shut or whose window is spent. Its first arm is the claim's one-row
-- limits_on CTE (is any row in rate_limit?), read once per statement: with no limits
-- defined each row pays one boolean test and the table is never probed. (OFFSET 0: a
-- per-row probe of the primary key, never planned as a join.)
(NOT (SELECT o.any_limit FROM limits_on o) OR NOT EXISTS (
    SELECT 1 FROM {schema}.rate_limit l
    WHERE l.key IN ('tenant:' || r.tenant_key, 'agent:' || r.agent_key, r.limit_key)
      AND (l.gate_until > coalesce(%(now)s::timestamptz, clock_timestamp())
           OR (l.used >= l.runs
               AND l.window_start + make_interval(secs => l.per_seconds)
                   > coalesce(%(now)s::timestamptz, clock_timestamp())))
    OFFSET 0))

-- fragment: limits_open_off
-- limits_open switched off (claims.py: a claim made while no rate limit was defined at
-- the last claim): no probe at all. Safe only with limits_grant_off, which claims
-- nothing if a limit is defined after all.
true

-- fragment: version_open
-- A claim's test that queued run r may start on this worker under
-- Dispatcher(resume_policy="same_version"), %(same_version)s: a run that has recorded
-- steps (resumed after a wait, or a retry whose lineage recorded some) only if its
-- version is the worker's, %(version)s; fresh turns go to any worker. (OFFSET 0: a
-- per-row probe of the lineage's steps.)
(NOT %(same_version)s::bool OR r.version IS NOT DISTINCT FROM %(version)s::text
 OR (r.resumes = 0 AND (r.lineage_id IS NULL OR NOT EXISTS (
     SELECT 1 FROM {schema}.run_step s WHERE s.lineage_id = r.lineage_id OFFSET 0))))

-- fragment: version_open_off
-- version_open switched off: the claim of a worker with resume_policy="replay".
true

-- fragment: tree_open
-- A claim's test that queued run r may start under Dispatcher(max_running_per_tree=N),
-- %(tree_cap)s: a run no tree spawned (root_run_id NULL: one test), or a claim with no
-- cap, always may; a spawned run only while fewer than N runs of its tree are running
-- (counted up to N, by the partial index agent_run_tree_running_idx: migration 0016).
(r.root_run_id IS NULL OR %(tree_cap)s::integer IS NULL OR (
    SELECT count(*) FROM (SELECT 1 FROM {schema}.agent_run x
                          WHERE x.root_run_id = r.root_run_id AND x.status = 'running'
                          LIMIT %(tree_cap)s::integer) x) < %(tree_cap)s::integer)

-- fragment: tree_capped
-- The claim's cap per tree within one statement (after its locked rows, `locked (id,
-- queue_order, tenant_key, agent_key, limit_key, root_run_id)`), giving `candidate`
-- (the same columns but the root): tree_open let each spawned run through on the count
-- before this claim; of one tree's, only the first (by queue order) N - running start,
-- and the rest stay queued. (Claims of several workers at the same moment each count
-- the others' as not yet running: a tree may then run up to one batch over its cap.)
candidate AS (
    SELECT l.id, l.queue_order, l.tenant_key, l.agent_key, l.limit_key FROM locked l
    WHERE l.root_run_id IS NULL OR %(tree_cap)s::integer IS NULL
       OR l.id IN (
           SELECT k.id FROM (
               SELECT c.id, row_number() OVER (PARTITION BY c.root_run_id ORDER BY c.queue_order) AS k,
                      (SELECT count(*) FROM {schema}.agent_run x
                       WHERE x.root_run_id = c.root_run_id AND x.status = 'running') AS running
               FROM locked c WHERE c.root_run_id IS NOT NULL) k
           WHERE k.k + k.running <= %(tree_cap)s::integer)
)

-- fragment: tree_open_off
-- tree_open switched off: a claim with no cap per tree.
true

-- fragment: tree_capped_off
-- tree_capped switched off: a claim with no cap per tree (every locked row a candidate).
candidate AS (
    SELECT l.id, l.queue_order, l.tenant_key, l.agent_key, l.limit_key FROM locked l
)

-- fragment: limits_grant
-- The claim's rate-limit step (CTEs after its locked candidate rows, `candidate (id,
-- queue_order, tenant_key, agent_key, limit_key)`), giving `allowed (id)`: with no limits
-- defined, every candidate. Otherwise the candidates' limited keys' rows are locked in key
-- order (so overlapping claims never deadlock, and each sees the previous claim's count),
-- each key grants what is left of its window (a spent window opens anew; a shut gate grants
-- nothing), and a candidate starts only if each of its keys' grants covers its rank under
-- that key (by queue order). A run refused here stays queued. A grant a run could not use
-- because another of its keys refused it is still counted: a limit errs on the side of
-- fewer starts, never more.
limit_keys AS (
    SELECT c.id, c.queue_order, k.key
    FROM candidate c
    CROSS JOIN LATERAL unnest(ARRAY['tenant:' || c.tenant_key, 'agent:' || c.agent_key, c.limit_key]) k (key)
    WHERE (SELECT o.any_limit FROM limits_on o) AND k.key IS NOT NULL
), limit_wanted AS (
    SELECT lk.key, count(*)::integer AS n FROM limit_keys lk GROUP BY lk.key
), limit_locked AS (
    -- (Keys as an array: probes of the primary key, never a scan of every limit.)
    SELECT l.key FROM {schema}.rate_limit l
    WHERE l.key = ANY (ARRAY(SELECT w.key FROM limit_wanted w))
    ORDER BY l.key
    FOR UPDATE OF l
), limit_granted AS (
    UPDATE {schema}.rate_limit l SET
        window_start = CASE WHEN l.runs IS NULL THEN NULL
                            WHEN l.window_start IS NULL
                                 OR l.window_start + make_interval(secs => l.per_seconds)
                                    <= coalesce(%(now)s::timestamptz, clock_timestamp())
                            THEN coalesce(%(now)s::timestamptz, clock_timestamp())
                            ELSE l.window_start END,
        used = CASE WHEN l.runs IS NULL THEN 0
                    WHEN l.window_start IS NULL
                         OR l.window_start + make_interval(secs => l.per_seconds)
                            <= coalesce(%(now)s::timestamptz, clock_timestamp())
                    THEN 0 ELSE l.used END
               + CASE WHEN l.runs IS NULL
                           OR l.gate_until > coalesce(%(now)s::timestamptz, clock_timestamp()) THEN 0
                      WHEN l.window_start IS NULL
                           OR l.window_start + make_interval(secs => l.per_seconds)
                              <= coalesce(%(now)s::timestamptz, clock_timestamp())
                      THEN least(w.n, l.runs)
                      ELSE least(w.n, greatest(0, l.runs - l.used)) END,
        last_grant = CASE WHEN l.gate_until > coalesce(%(now)s::timestamptz, clock_timestamp()) THEN 0
                          WHEN l.runs IS NULL THEN w.n
                          WHEN l.window_start IS NULL
                               OR l.window_start + make_interval(secs => l.per_seconds)
                                  <= coalesce(%(now)s::timestamptz, clock_timestamp())
                          THEN least(w.n, l.runs)
                          ELSE least(w.n, greatest(0, l.runs - l.used)) END
    FROM limit_wanted w
    WHERE l.key = ANY (ARRAY(SELECT lo.key FROM limit_locked lo)) AND l.key = w.key
    RETURNING l.key, l.last_grant
), allowed AS (
    SELECT c.id FROM candidate c WHERE NOT (SELECT o.any_limit FROM limits_on o)
    UNION ALL
    SELECT ranked_keys.id FROM (
        SELECT lk.id, lk.key, row_number() OVER (PARTITION BY lk.key ORDER BY lk.queue_order) AS rank
        FROM limit_keys lk
    ) ranked_keys
    LEFT JOIN limit_granted g ON g.key = ranked_keys.key
    GROUP BY ranked_keys.id
    HAVING bool_and(g.key IS NULL OR ranked_keys.rank <= g.last_grant)
)

-- fragment: limits_grant_off
-- limits_grant switched off (with limits_open_off): every candidate is allowed if no rate
-- limit is defined, and none is if one is (read in the statement's snapshot, as the full
-- claim reads it): the claim then takes nothing, and the claimer sends the full one
-- (claims.py). Its candidates were locked and are released at commit, still queued.
allowed AS (
    SELECT c.id FROM candidate c WHERE NOT (SELECT o.any_limit FROM limits_on o)
)

-- fragment: webhook_outbox
-- Webhooks on endings (#42; migration 0015): after a CTE fin of the runs a statement
-- ended (id, status), the CTE webhook_outbox inserts one delivery per subscription that
-- wants the run's terminal status (and its tenant, if it names one), in the ending's own
-- transaction: every statement that makes a run terminal (finalize, reap, cancel_queued,
-- cancel_paused) takes it, so no ending commits without its deliveries and none is
-- delivered for an ending rolled back. The run's other columns are read as the
-- statement's snapshot has them (the ending changes none that are read here). With no
-- subscription the guard (one probe of an empty table, evaluated once) skips it all.
webhook_outbox AS (
    INSERT INTO {schema}.webhook_delivery (webhook, run_id, lineage, event_type, payload)
    SELECT w.name, a.id, coalesce(a.lineage_id, a.id), 'run.' || fin.status,
           jsonb_build_object(
               'type', 'run.' || fin.status,
               'timestamp', now(),
               'data', jsonb_build_object('run_id', a.id, 'status', fin.status,
                                          'conversation_id', a.conversation_id,
                                          'tenant_id', a.tenant_id, 'attempt', a.attempt,
                                          'parent_run_id', a.parent_run_id))
    FROM fin
    JOIN {schema}.agent_run a ON a.id = fin.id
    JOIN {schema}.webhook w ON fin.status = ANY (w.endings)
                            AND (w.tenant_id IS NULL OR w.tenant_id = a.tenant_id)
    WHERE EXISTS (SELECT 1 FROM {schema}.webhook)
      AND fin.status IN ('completed', 'failed', 'cancelled', 'expired')
    ORDER BY a.id, w.name
)

-- fragment: stamp_many
-- The claim's rows to stamp: by primary key from an array, not joined (joined, a long
-- queue's estimates could turn the join into a hash of the whole table).
a.id = ANY (ARRAY(SELECT id FROM allowed))

-- fragment: stamp_many_off
-- stamp_many switched off: a claim of one run (limit 1, so `allowed` has at most one row).
-- A generic plan takes an array of unknown length for ten ids, and on a table of a few
-- thousand runs it then reads the whole table rather than probe the primary key ten
-- times; one id, compared as a scalar, is estimated as one row and probed.
a.id = (SELECT id FROM allowed)

-- fragment: claim_stamp
-- The claim's last step, the same for the fair and the FIFO claim: the runs in `allowed`
-- (the candidates the rate limits let through, see limits_grant) become running under a
-- new claim token and lease, stamped with this worker, its retry policy and version (a
-- run keeps its first version); the RETURNING list is runrow/_gateway/claims.py's
-- ClaimedRun, column for column (checked there by name). Its last column, limited, says
-- whether a rate limit was defined (the claimer's choice of statement: claims.py).
UPDATE {schema}.agent_run a SET
    status            = 'running',
    claim_token       = gen_random_uuid(),
    claim_expires_at  = coalesce(%(now)s::timestamptz, clock_timestamp())
                        + make_interval(secs => %(lease_seconds)s),
    worker_id         = %(worker_id)s,
    retry_policy      = %(retry_policy)s::jsonb,
    version           = coalesce(a.version, %(version)s),  -- (the first claim's: kept)
    worker_version    = %(version)s,
    started_at        = coalesce(%(now)s::timestamptz, clock_timestamp()),
    last_heartbeat_at = coalesce(%(now)s::timestamptz, clock_timestamp())
WHERE {stamp_many}
RETURNING a.id, a.claim_token, a.conversation_id, a.user_id, a.tenant_id, a.request,
    a.user_message_id, a.cancel_requested, a.created_at, a.started_at, a.deadline_at, a.priority,
    a.lineage_id, a.attempt, a.resumes,
    (SELECT m.content FROM {schema}.message m WHERE m.id = a.user_message_id) AS content,
    {schema}.journal_last_seq(a.id) AS last_seq,  -- (a function: see migration 0025)
    a.agent_key, a.parent_run_id, a.root_run_id, (SELECT o.any_limit FROM limits_on o) AS limited
