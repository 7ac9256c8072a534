-- Steering (#41 point 6; runrow/_gateway/steering.py, migration 0017): a running turn
-- reads the steering messages sent to its conversation (enqueue(on_busy="steer")) at a
-- point of its choosing (RunContext.steering), as a recorded step.

-- name: steer_deliver
-- (Event names and payloads: the vocabulary in src/runrow/_events.py.)
-- One delivery, fenced by the reading run's claim (no row: the claim is no longer this
-- worker's), in one statement: the steerable queued turns that directly follow the
-- running one in its conversation (in queue order, up to the first later live turn that
-- is not one, at most %(limit)s, of its agent, due) end `absorbed` into it, each with its
-- terminal event and its tail's wake; their user messages move into the reading run's
-- turn at this point (run_id, turn, and a new position, drawn in the order they were
-- sent: the transcript shows them after what the turn wrote before and before what it
-- writes after); and the step (%(key)s, %(occurrence)s, %(position)s) records which
-- messages were delivered, in order. A run asked to stop absorbs nothing (its
-- conversation's stop hands queued messages back as drafts; a stop of this run alone
-- leaves them to run as turns). Sent again after a lost answer, it finds the step it
-- recorded and returns that delivery, absorbing nothing more. The reading run's row is
-- locked first, then the turns it absorbs, in queue order: the order of a stop's sweep
-- (lock_conversation_runs), so the two never deadlock; a stop, the reaper or an ending
-- that comes first is seen (the fence or the status test fails), one that comes later
-- waits for this commit. Answers the delivered messages (message_id, run_id: the
-- absorbed run, content, user_id), in order.
WITH me AS (
    SELECT a.id, a.conversation_id, a.queue_order, a.agent_key, a.cancel_requested, a.worker_version,
           coalesce(a.lineage_id, a.id) AS lineage,
           (SELECT u.turn FROM {schema}.message u WHERE u.id = a.user_message_id) AS turn
    FROM {schema}.agent_run a
    WHERE a.id = %(run_id)s AND a.claim_token = %(claim_token)s AND a.status = 'running'
    FOR NO KEY UPDATE
), prior AS (
    SELECT s.result FROM {schema}.run_step s JOIN me ON s.lineage_id = me.lineage
    WHERE s.key = %(key)s AND s.occurrence = %(occurrence)s
), barrier AS (
    -- The first later live turn that cannot be absorbed: nothing at or after it is (the
    -- messages keep the order they were sent in, and that turn runs before them).
    SELECT min(b.queue_order) AS at
    FROM {schema}.agent_run b JOIN me ON b.conversation_id = me.conversation_id
    WHERE b.status IN {live_status} AND b.queue_order > me.queue_order
      AND NOT (b.status = 'queued' AND b.steerable AND b.agent_key IS NOT DISTINCT FROM me.agent_key
               AND (b.not_before IS NULL OR b.not_before <= now()))
), picked AS (
    SELECT q.id FROM {schema}.agent_run q JOIN me ON q.conversation_id = me.conversation_id
    WHERE NOT EXISTS (SELECT 1 FROM prior) AND NOT me.cancel_requested
      AND q.status = 'queued' AND q.steerable AND q.queue_order > me.queue_order
      AND q.queue_order < coalesce((SELECT barrier.at FROM barrier), 9223372036854775807)
    ORDER BY q.queue_order
    LIMIT %(limit)s
    FOR UPDATE OF q
), absorbed AS (
    UPDATE {schema}.agent_run a SET status = 'absorbed', finished_at = now(), absorbed_into = me.id
    FROM me
    WHERE a.id IN (SELECT picked.id FROM picked) AND a.status = 'queued'
    RETURNING a.id, a.user_message_id, a.queue_order
), numbered AS (
    -- (nextval over the sorted rows: positions in the order the messages were sent.)
    SELECT x.run_id, x.message_id, x.queue_order,
           nextval(pg_get_serial_sequence(format('%%I.message', %(schema)s::text), 'position')) AS position
    FROM (SELECT ab.id AS run_id, ab.user_message_id AS message_id, ab.queue_order
          FROM absorbed ab ORDER BY ab.queue_order) x
), moved AS (
    UPDATE {schema}.message m SET turn = me.turn, run_id = me.id, position = n.position
    FROM numbered n, me
    WHERE m.id = n.message_id
    RETURNING m.id
), delivered AS (
    SELECT coalesce(jsonb_agg(jsonb_build_object('message_id', n.message_id, 'run_id', n.run_id)
                              ORDER BY n.queue_order), '[]'::jsonb) AS ids
    FROM numbered n
), step AS (
    INSERT INTO {schema}.run_step
        (lineage_id, key, occurrence, position, run_id, status, idempotent, result, recorded_at, version)
    SELECT me.lineage, %(key)s, %(occurrence)s, %(position)s, me.id, 'recorded', true, d.ids, now(),
           me.worker_version
    FROM me, delivered d
    WHERE NOT EXISTS (SELECT 1 FROM prior)
    RETURNING 1
), ev AS (
    INSERT INTO {schema}.run_event (run_id, seq, type, payload)
    SELECT ab.id,
           {schema}.journal_last_seq(ab.id) + 1,  -- (a function: see migration 0025)
           'complete',
           jsonb_build_object('status', 'absorbed', 'reason', 'steered', 'into', me.id)
    FROM absorbed ab, me
    RETURNING run_event.run_id
)
SELECT (SELECT coalesce(jsonb_agg(jsonb_build_object('message_id', m.id, 'run_id', e.x ->> 'run_id',
                                                     'content', m.content, 'user_id', m.user_id)
                                  ORDER BY e.o), '[]'::jsonb)
        FROM jsonb_array_elements(coalesce((SELECT p.result FROM prior p), (SELECT d.ids FROM delivered d)))
             WITH ORDINALITY e (x, o)
        JOIN {schema}.message m ON m.id = (e.x ->> 'message_id')::uuid) AS messages,
       (SELECT count(pg_notify(%(events_prefix)s || replace(ev.run_id::text, '-', ''), '')) FROM ev)
           AS woke,
       (SELECT count(*) FROM moved) + (SELECT count(*) FROM step) AS written
FROM me

-- name: steer_read
-- A delivery a replay returns (what step %(ids)s recorded: message and run ids, in
-- order), with each message's content and user, as steer_deliver answers it.
SELECT coalesce(jsonb_agg(jsonb_build_object('message_id', m.id, 'run_id', e.x ->> 'run_id',
                                             'content', m.content, 'user_id', m.user_id)
                          ORDER BY e.o), '[]'::jsonb)
FROM jsonb_array_elements(%(ids)s::jsonb) WITH ORDINALITY e (x, o)
JOIN {schema}.message m ON m.id = (e.x ->> 'message_id')::uuid
