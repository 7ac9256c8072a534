-- How a claimed run ends (runrow/_gateway/endings.py, reaper.py): its worker's ending
-- (finalize), or the reaper's when the worker is gone or late, each with the automatic
-- retry it may commit (the fragment retried, below).
-- Worker writes are fenced: run id AND claim_token AND status = 'running'.

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
                  retry boolean, input_timeout float8, awaiting uuid[], await_any boolean,
                  retry_after float8, gate_key text)
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
    -- A park on children (f.awaiting: RunContext.wait_for_children) whose children have
    -- all ended (or one, with f.await_any) since the agent looked, as their endings
    -- recorded on this row (children_ended, read here as the latest committed version:
    -- see the fragment woke_parents), is queued again at once instead (status queued,
    -- unclaimed, one more resume). Its park event is written as for any park.
    UPDATE {schema}.agent_run a SET
        status            = CASE WHEN f.status IN ('waiting', 'failed', 'queued') AND a.cancel_requested
                                 THEN 'cancelled'
                                 WHEN {children_done_at_park} THEN 'queued'
                                 ELSE f.status END,
        error             = CASE WHEN a.cancel_requested AND f.status = 'failed' THEN NULL
                                 ELSE f.error::jsonb END,
        finished_at       = CASE WHEN f.status IN ('waiting', 'queued') AND NOT a.cancel_requested THEN NULL
                                 ELSE now() END,
        -- (The wait ends at its input timeout or the turn's deadline, whichever is first:
        -- least() skips a NULL.)
        input_deadline_at = CASE WHEN f.status = 'waiting' AND NOT a.cancel_requested
                                 AND NOT {children_done_at_park}
                                 THEN least(now() + make_interval(secs => f.input_timeout),
                                            a.deadline_at) END,
        awaiting          = CASE WHEN f.status = 'waiting' AND NOT {children_done_at_park}
                                 THEN f.awaiting END,
        await_any         = CASE WHEN f.status = 'waiting' AND NOT {children_done_at_park}
                                 THEN f.await_any END,
        claim_token       = CASE WHEN {children_done_at_park} OR {queued_later} THEN NULL ELSE a.claim_token END,
        claim_expires_at  = CASE WHEN {children_done_at_park} OR {queued_later} THEN NULL
                                 ELSE a.claim_expires_at END,
        resumes           = CASE WHEN {children_done_at_park} OR {queued_later} THEN a.resumes + 1
                                 ELSE a.resumes END,
        -- (RetryLater: due again after its wait; the claim reads not_before.)
        not_before        = CASE WHEN {queued_later} THEN now() + make_interval(secs => f.retry_after)
                                 ELSE a.not_before END
    FROM f
    WHERE a.id = ANY (ARRAY(SELECT id FROM locked))
      AND a.id = f.id AND a.claim_token = f.token AND a.status = 'running'
    -- (cancel_requested from the row as updated: a stop that committed while this
    -- waited for the row's lock is seen, and no retry follows it.)
    RETURNING a.id, a.conversation_id, a.tenant_key, f.partial, f.partial_id, a.status, a.input_deadline_at,
              f.retry IS TRUE AND NOT a.cancel_requested AS retry, f.status AS asked
), {retried}
), {gate_shut}
), {answer_saved}
), ev AS (
    INSERT INTO {schema}.run_event (run_id, seq, type, payload)
    -- (A park's input_requested says when the wait ends, on the database's clock.)
    SELECT e.run_id, e.seq,
           CASE WHEN e.type IN ('input_requested', 'children_awaited', 'retry_later') AND fin.status = 'cancelled'
                THEN 'complete' ELSE e.type END,
           CASE WHEN e.type IN ('input_requested', 'children_awaited', 'retry_later', 'complete')
                     AND fin.status = 'cancelled' AND fin.asked <> 'cancelled'
                THEN jsonb_build_object('status', 'cancelled', 'reason', 'stopped')
                WHEN e.type = 'input_requested'
                THEN e.payload::jsonb || jsonb_build_object('expires_at', fin.input_deadline_at)
                ELSE e.payload::jsonb END
    FROM jsonb_to_recordset(%(events)s::jsonb) AS e(run_id uuid, seq integer, type text, payload text)
    JOIN fin ON fin.id = e.run_id
    RETURNING run_id, CASE WHEN type = 'usage' THEN payload END AS usage
), usage_rows AS (
    -- (usage recorded since the run's last flush rides its ending: see usage_rolled)
    SELECT run_id, usage FROM ev WHERE usage IS NOT NULL
), {usage_rolled}
), {webhook_outbox}
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
                           AND q.status IN {live_status} AND (q.status = 'queued') IS TRUE)
              OR EXISTS (SELECT 1 FROM {schema}.tenant_policy p
                         WHERE p.tenant_key = fin.tenant_key AND p.max_running IS NOT NULL)
              OR EXISTS (SELECT 1 FROM retried WHERE retried.retry_of = fin.id)
              OR fin.status = 'queued'  -- (a park on children already over: queued again)
            THEN pg_notify(%(wake_channel)s, '') END
FROM fin

-- fragment: answer_saved
-- (In finalize, after its CTE fin.) Streamed text the agent never wrote to the
-- transcript: its answer if the run completed (or what it said before it paused for
-- input), a partial answer if it was cut short. It goes in the turn of the message the
-- run answers, however many turns were enqueued since (#17). A park's text has the id of
-- the turn's message for its wait (partial_id: one id across the turn's attempts): a
-- retry that parks at the same wait finds it written by an earlier attempt and writes
-- nothing.
answer_saved AS (
    INSERT INTO {schema}.message (id, conversation_id, run_id, role, content, status, turn)
    SELECT coalesce(fin.partial_id, gen_random_uuid()), fin.conversation_id, fin.id, 'assistant',
           to_jsonb(fin.partial),
           CASE WHEN fin.status IN ('completed', 'waiting') THEN 'complete' ELSE 'partial' END,
           (SELECT u.turn FROM {schema}.agent_run r JOIN {schema}.message u ON u.id = r.user_message_id
            WHERE r.id = fin.id)
    FROM fin WHERE fin.partial IS NOT NULL
    ON CONFLICT (id) DO NOTHING

-- fragment: answer_saved_off
-- answer_saved switched off: a batch in which no ending has unsaved text (endings.py).
answer_saved AS (SELECT

-- fragment: gate_shut
-- (In finalize, after its CTEs f and fin.) RetryLater with a key: the key's gate shuts
-- until the latest wait asked for (a row without a limit if the key has none; the claim
-- passes over its queued runs meanwhile).
gate_shut AS (
    INSERT INTO {schema}.rate_limit AS l (key, gate_until)
    SELECT f.gate_key, max(now() + make_interval(secs => f.retry_after))
    FROM f JOIN fin ON fin.id = f.id AND fin.status = 'queued'
    WHERE f.status = 'queued' AND f.gate_key IS NOT NULL
    GROUP BY f.gate_key
    ON CONFLICT (key) DO UPDATE
        SET gate_until = greatest(l.gate_until, EXCLUDED.gate_until)

-- fragment: gate_shut_off
-- gate_shut switched off: a batch in which no ending shuts a gate (endings.py).
gate_shut AS (SELECT

-- fragment: retried_off
-- retried switched off: a batch with no ending to retry (endings.py). Its one column,
-- retry_of, is what finalize reads of it.
retried (retry_of) AS (SELECT NULL::uuid WHERE false

-- name: wake_parents
-- A child's ending, pipelined after finalize in its transaction (#41): the fragment
-- woke_parents for the children among %(ids)s (the batch's runs that have a parent), as
-- finalize left them. (Its own statement, not a CTE of finalize: a batch may hold a
-- parent's park and its child's ending, and one statement cannot update the parent's
-- row twice; a run without a parent never sends it.)
WITH fin AS (
    SELECT a.id, a.status, a.parent_run_id, coalesce(a.lineage_id, a.id) AS lineage
    FROM {schema}.agent_run a
    WHERE a.id = ANY (%(ids)s::uuid[]) AND a.parent_run_id IS NOT NULL
), retried AS (
    SELECT r.retry_of FROM {schema}.agent_run r WHERE r.retry_of = ANY (%(ids)s::uuid[])
), {woke_parents}
)
SELECT woke.id, CASE WHEN woke.resumed THEN pg_notify(%(wake_channel)s, '') END FROM woke

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
JOIN {schema}.run_event e ON e.run_id = a.id AND e.seq = %(seq)s AND {schema}.run_ms(e.run_id) = {schema}.run_ms(%(run_id)s)
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
    -- (retry: a lost worker's run whose policy retries worker losses; see the fragment
    -- retried. Failed for worker_lost is exactly an error of that type.)
    RETURNING a.id, a.conversation_id, a.status, a.error, a.worker_id, l.cause AS reason,
              l.was = 'waiting' AS parked,
              a.status = 'failed' AND l.cause = 'worker_lost'
              AND (a.retry_policy ->> 'worker_lost')::boolean AS retry,
              a.parent_run_id, coalesce(a.lineage_id, a.id) AS lineage
), ev AS (
    INSERT INTO {schema}.run_event (run_id, seq, type, payload)
    SELECT fin.id,
           {schema}.journal_last_seq(fin.id) + 1,  -- (functions: see migration 0025)
           'complete',
           jsonb_build_object(
               'status', fin.status,
               'error', fin.error,
               'reason', fin.reason,
               -- (A waiting run parked on purpose: its worker was not lost in the middle
               -- of a call, so none is uncertain: a call announced before the wait,
               -- awaiting approval, never ran.)
               'uncertain_tool_calls', CASE WHEN fin.parked THEN '[]'::jsonb
                                            ELSE {schema}.journal_uncertain_tool_calls(fin.id) END)
    FROM fin
), {retried}
), {woke_parents}
), {webhook_outbox}
SELECT fin.id, fin.conversation_id, fin.status, fin.worker_id, fin.reason,
       pg_notify(%(events_prefix)s || replace(fin.id::text, '-', ''), ''),
       pg_notify(%(wake_channel)s, '')
FROM fin

-- fragment: retried
-- The automatic retry (Dispatcher(retry=...)) of an ending, committed with it: two CTEs,
-- retried and retried_ev, after a CTE fin of the ended runs (id, and retry: whether the
-- ending asked for one). Shared by finalize (the worker judged the failure retryable
-- and no stop was asked for) and reap (a lost worker, when the run's policy, stamped by
-- its claim, retries worker losses). It is retried when attempts remain and no step of
-- the lineage is uncertain (begun, never recorded); the retry takes the ended run's
-- place in the queue (its queue_order: ahead of the conversation's later turns) and is
-- due after the policy's backoff, with the turn's deadline (none is queued due past it).
retried AS (
    INSERT INTO {schema}.agent_run
        (queue_order, conversation_id, user_id, tenant_id, user_message_id, request, retry_of,
         priority, lineage_id, attempt, not_before, deadline_at, version, agent_key, parent_run_id,
         root_run_id)
    OVERRIDING SYSTEM VALUE
    SELECT a.queue_order, a.conversation_id, a.user_id, a.tenant_id, a.user_message_id, a.request,
           a.id, a.priority, coalesce(a.lineage_id, a.id), a.attempt + 1, due.at, a.deadline_at,
           a.version,  -- (the version its turn started with: its steps replay)
           a.agent_key, a.parent_run_id, a.root_run_id  -- (the same agent, in the same tree)
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


-- fragment: queued_later
-- (In finalize's UPDATE of a run: the agent raised RetryLater, and no stop was asked for.)
(f.status = 'queued' AND f.retry_after IS NOT NULL AND NOT a.cancel_requested)

-- fragment: children_done_at_park
-- (In finalize's UPDATE of a run: a park on children, f.awaiting, whose wait is already
-- over by the children_ended recorded on the row.)
(f.status = 'waiting' AND f.awaiting IS NOT NULL AND NOT a.cancel_requested
 AND (CASE WHEN f.await_any THEN a.children_ended && f.awaiting
           ELSE f.awaiting <@ a.children_ended END) IS TRUE)

-- fragment: woke_parents
-- A child's ending, committed with it (#41; in wake_parents after the worker's finalize,
-- in reap, in a stop's cancel): after a CTE fin of ended runs (id, status,
-- parent_run_id, lineage) and a CTE retried (retry_of: the runs retried), the CTEs
-- ended_children and woke. Each child (by its first run, its lineage) that ended for
-- good (not queued again by a retry, not parked) is appended to children_ended of its
-- parent's live run (the parent turn's first run or a retry of it: parent_run_id is the
-- turn's first run); a parent waiting on its children (awaiting, await_any: see
-- RunContext.wait_for_children) whose wait this ending completes is queued again
-- (unclaimed, one more resume), as provide_input queues a run whose input came. A run
-- without a parent gives ended_children no row, and woke then reads nothing. Both sides
-- write the parent's row, so a child's ending and its parent's park (finalize) see each
-- other's writes whichever commits first: an UPDATE that finds the row changed by a
-- transaction that committed after its snapshot re-reads it and re-evaluates.
ended_children AS (
    SELECT fin.parent_run_id AS parent, array_agg(fin.lineage) AS ids
    FROM fin
    WHERE fin.parent_run_id IS NOT NULL AND fin.status IN ('completed', 'failed', 'cancelled', 'expired')
      AND NOT EXISTS (SELECT 1 FROM retried WHERE retried.retry_of = fin.id)
    GROUP BY fin.parent_run_id
), woke AS (
    UPDATE {schema}.agent_run p SET
        children_ended    = coalesce(p.children_ended, ARRAY[]::uuid[]) || e.ids,
        status            = CASE WHEN {parent_woken} THEN 'queued' ELSE p.status END,
        claim_token       = CASE WHEN {parent_woken} THEN NULL ELSE p.claim_token END,
        claim_expires_at  = CASE WHEN {parent_woken} THEN NULL ELSE p.claim_expires_at END,
        worker_id         = CASE WHEN {parent_woken} THEN NULL ELSE p.worker_id END,
        input_deadline_at = CASE WHEN {parent_woken} THEN NULL ELSE p.input_deadline_at END,
        resumes           = CASE WHEN {parent_woken} THEN p.resumes + 1 ELSE p.resumes END,
        awaiting          = CASE WHEN {parent_woken} THEN NULL ELSE p.awaiting END,
        await_any         = CASE WHEN {parent_woken} THEN NULL ELSE p.await_any END
    FROM ended_children e
    WHERE (p.id = e.parent OR p.lineage_id = e.parent) AND p.status IN {live_status}
    RETURNING p.id, p.status = 'queued' AS resumed  -- (a parent already queued: a wake too many)

-- fragment: parent_woken
-- (In woke's UPDATE of a parent p with the children e.ids that just ended: p waits on
-- its children, and with e.ids its wait is over.)
(p.status = 'waiting' AND p.awaiting IS NOT NULL
 AND (CASE WHEN p.await_any THEN p.awaiting && (coalesce(p.children_ended, ARRAY[]::uuid[]) || e.ids)
           ELSE p.awaiting <@ (coalesce(p.children_ended, ARRAY[]::uuid[]) || e.ids) END) IS TRUE)
