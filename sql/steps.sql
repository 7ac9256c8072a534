-- Durable steps (run.step(); migration 0005): the lineage's recorded steps, and a
-- step's fenced start and record. Both writes are idempotent for the attempt that makes
-- them, so a write whose answer was lost is simply sent again.

-- name: step_load
-- Every step of the run's lineage (the turn's earlier attempts, and this run's own
-- before it paused for input), in call order: what a retry or a resumed run replays.
SELECT s.key, s.occurrence, s.position, s.status, s.idempotent, s.result, s.error, s.run_id,
       s.request IS NOT NULL AS input
FROM {schema}.run_step s
WHERE s.lineage_id = (SELECT coalesce(a.lineage_id, a.id) FROM {schema}.agent_run a
                      WHERE a.id = %(run_id)s)
ORDER BY s.position

-- name: step_start
-- Marks a step begun before it runs, fenced by the claim: should the worker die before
-- the step is recorded, the next attempt knows the step may have happened (uncertain).
-- Sent again after a lost answer, it finds its own row and returns it once more.
-- (Its version is the claiming worker's, read from the fenced row: no parameter.)
INSERT INTO {schema}.run_step (lineage_id, key, occurrence, position, run_id, status, idempotent, version)
SELECT coalesce(a.lineage_id, a.id), %(key)s, %(occurrence)s, %(position)s, a.id, 'started', false,
       a.worker_version
FROM {schema}.agent_run a
WHERE a.id = %(run_id)s AND a.claim_token = %(claim_token)s AND a.status = 'running'
ON CONFLICT (lineage_id, key, occurrence) DO UPDATE SET run_id = excluded.run_id
    WHERE run_step.run_id = excluded.run_id AND run_step.status = 'started'
RETURNING 1

-- name: step_record
-- Records a step's outcome (its result, or the error a step that is not idempotent
-- raised), fenced by the claim.
-- The common case, a step this attempt marked begun (not idempotent, not an input), is a
-- plain update of its own row (`own`): no row lock of its own before it (a WAL record
-- that INSERT ... ON CONFLICT writes), and heap-only, as no index of run_step names a
-- column it changes (schema 26). Otherwise (`other`): over an earlier attempt's started
-- row only for a step declared idempotent (it was run again); an idempotent step is
-- never marked started, so this also inserts. Sent again after a lost answer, either
-- rewrites its own row. A wait for children answered before it parked is inserted here
-- with its request: the request marks the row an input, which a replay must find it to be.
WITH own AS (
    UPDATE {schema}.run_step s
    SET status = %(status)s, result = %(result)s::jsonb, error = %(error)s::jsonb, recorded_at = now(),
        version = a.worker_version
    FROM {schema}.agent_run a
    WHERE NOT %(idempotent)s AND %(request)s::jsonb IS NULL
      AND a.id = %(run_id)s AND a.claim_token = %(claim_token)s AND a.status = 'running'
      AND s.lineage_id = coalesce(a.lineage_id, a.id) AND s.key = %(key)s
      AND s.occurrence = %(occurrence)s AND s.run_id = a.id AND NOT s.idempotent
    RETURNING s.result
), other AS (
    INSERT INTO {schema}.run_step
        (lineage_id, key, occurrence, position, run_id, status, idempotent, result, error, recorded_at,
         version, request)
    SELECT coalesce(a.lineage_id, a.id), %(key)s, %(occurrence)s, %(position)s, a.id, %(status)s,
           %(idempotent)s, %(result)s::jsonb, %(error)s::jsonb, now(), a.worker_version,
           %(request)s::jsonb
    FROM {schema}.agent_run a
    WHERE a.id = %(run_id)s AND a.claim_token = %(claim_token)s AND a.status = 'running'
      AND NOT EXISTS (SELECT 1 FROM own)
    ON CONFLICT (lineage_id, key, occurrence) DO UPDATE SET
        run_id = excluded.run_id, status = excluded.status, idempotent = excluded.idempotent,
        result = excluded.result, error = excluded.error, recorded_at = excluded.recorded_at,
        version = excluded.version
        WHERE run_step.run_id = excluded.run_id
           OR (run_step.status = 'started' AND excluded.idempotent)
    RETURNING result
)
-- (The result as jsonb gives it back: the value a replay returns, so the first attempt
-- returns the very same one, key order and number types included.)
SELECT result FROM own UNION ALL SELECT result FROM other

-- name: step_wait
-- An input the run waits for (run.wait_for_input): a step a person records, marked
-- `waiting` with the agent's request, fenced by the claim, just before the run parks.
-- Sent again after a lost answer, or by a later attempt of the turn that asks again
-- (the earlier one was stopped or failed while waiting), it takes the row over.
INSERT INTO {schema}.run_step (lineage_id, key, occurrence, position, run_id, status, idempotent, request)
SELECT coalesce(a.lineage_id, a.id), %(key)s, %(occurrence)s, %(position)s, a.id, 'waiting', false,
       %(request)s::jsonb
FROM {schema}.agent_run a
WHERE a.id = %(run_id)s AND a.claim_token = %(claim_token)s AND a.status = 'running'
ON CONFLICT (lineage_id, key, occurrence) DO UPDATE SET
    run_id = excluded.run_id, request = excluded.request, started_at = now()
    WHERE run_step.status = 'waiting'
RETURNING 1

-- name: provide_input
-- (Event names and payloads: the vocabulary in src/runrow/_events.py.)
-- A person's answer to the input a waiting run waits for under %(key)s: recorded as the
-- step's result, and the run queued again (same run, same place in its conversation's
-- queue: its queue_order), with an input_provided event and the wakes, all in one
-- statement. Fenced on the waiting state: a run not waiting for this key changes
-- nothing, and the answer then says what it found: the run's status, and whether the
-- same value was already recorded for the key (a repeated call: not an error).
WITH run AS (
    SELECT a.id, a.status, coalesce(a.lineage_id, a.id) AS lineage_id FROM {schema}.agent_run a
    WHERE a.id = %(run_id)s
    FOR NO KEY UPDATE
), step AS (
    -- (Found through the primary key, by lineage and key: schema 26 has no index on a
    -- step's status, so that recording a step stays a heap-only update.)
    UPDATE {schema}.run_step s SET status = 'recorded', result = %(value)s::jsonb, recorded_at = now()
    FROM run
    WHERE run.status = 'waiting' AND s.lineage_id = run.lineage_id AND s.key = %(key)s
      AND s.run_id = run.id AND s.status = 'waiting'
      AND NOT starts_with(s.key, 'runrow.children:')  -- (a wait for children: their endings answer it)
    RETURNING s.key
), resumed AS (
    UPDATE {schema}.agent_run a SET status = 'queued', claim_token = NULL, claim_expires_at = NULL,
                                    worker_id = NULL, input_deadline_at = NULL,
                                    resumes = a.resumes + 1
    WHERE a.id = (SELECT id FROM run) AND EXISTS (SELECT 1 FROM step)
    RETURNING a.id
), ev AS (
    INSERT INTO {schema}.run_event (run_id, seq, type, payload)
    SELECT r.id,
           {schema}.journal_last_seq(r.id) + 1,  -- (a function: see migration 0025)
           'input_provided',
           jsonb_build_object('key', %(key)s::text, 'value', %(value)s::jsonb)
    FROM resumed r
)
SELECT run.status,
       EXISTS (SELECT 1 FROM resumed) AS recorded,
       -- (A wait's key is its own in the turn (wait_for_input refuses a key used
       -- before): the lineage's row for the key is this input, found by primary key.)
       EXISTS (SELECT 1 FROM {schema}.run_step s
               WHERE s.lineage_id = run.lineage_id
                 AND s.key = %(key)s AND s.occurrence = 0 AND s.request IS NOT NULL
                 AND s.status = 'recorded' AND s.result = %(value)s::jsonb) AS same,
       CASE WHEN EXISTS (SELECT 1 FROM resumed) THEN pg_notify(%(wake_channel)s, '') END,
       CASE WHEN EXISTS (SELECT 1 FROM resumed)
            THEN pg_notify(%(events_prefix)s || replace(run.id::text, '-', ''), '') END
FROM run

-- name: waiting_inputs
-- The inputs waiting runs wait for (not their waits for children, #41): one row per input (a run whose parallel waits were
-- marked together has several), newest first, optionally of one run or one conversation.
SELECT a.id, a.conversation_id, a.user_id, a.tenant_id, s.key, s.request, s.started_at,
       a.input_deadline_at
FROM {schema}.agent_run a
JOIN {schema}.run_step s ON s.lineage_id = coalesce(a.lineage_id, a.id)  -- (the primary key's prefix)
    AND s.run_id = a.id AND s.status = 'waiting'
    AND NOT starts_with(s.key, 'runrow.children:')  -- (a wait for children: no person's input)
WHERE a.status = 'waiting'
  AND (%(run_id)s::uuid IS NULL OR a.id = %(run_id)s::uuid)
  AND (%(conversation_id)s::text IS NULL OR a.conversation_id = %(conversation_id)s::text)
ORDER BY s.started_at DESC
LIMIT %(limit)s

-- name: check_runs
-- What `runrow check` replays against new code: every waiting run, and (with
-- %(failed_since)s, seconds) the runs that failed since then, which a retry would
-- replay; oldest first. Read only.
SELECT a.id, a.conversation_id, a.user_id, a.tenant_id, a.status, a.request,
       (SELECT m.content FROM {schema}.message m WHERE m.id = a.user_message_id) AS content,
       a.user_message_id, a.created_at, a.started_at, a.attempt, a.lineage_id, a.resumes, a.version
FROM {schema}.agent_run a
WHERE a.status = 'waiting'
   OR (a.status = 'failed' AND %(failed_since)s::float8 IS NOT NULL
       AND a.finished_at > now() - make_interval(secs => %(failed_since)s::float8))
ORDER BY a.created_at, a.id
