-- The transcript (message): fenced writes by the claim holder, their read-back, and
-- a conversation's transcript.

-- name: write_message
-- A fenced transcript write by the claim holder, in the turn of the message it answers.
-- The id comes from the worker, so a write whose answer was lost can be read back
-- (message_landed); a retry of a write that had landed after all conflicts on it and
-- writes nothing.
INSERT INTO {schema}.message (id, conversation_id, run_id, role, content, status, turn)
SELECT %(message_id)s, a.conversation_id, a.id, %(role)s, %(content)s, 'complete',
       (SELECT u.turn FROM {schema}.message u WHERE u.id = a.user_message_id)
FROM {schema}.agent_run a
WHERE a.id = %(run_id)s AND a.claim_token = %(claim_token)s AND a.status = 'running'
ON CONFLICT (id) DO NOTHING
RETURNING id

-- name: write_message_after_events
-- write_message with the text streamed before it (RunContext.write_message): the run's
-- pending journal rows (as append_events takes them, without `usage` rows) and the
-- message in one statement, both fenced by the claim, so the text lands with its message
-- or not at all (after a lost answer, a read-back of its rows tells for both: flush_landed;
-- the message's id may be an earlier attempt's of the turn). Returns whether the fence
-- held (then the rows landed, and the message did unless an earlier write of its id had),
-- with the NOTIFY of the run's tails when rows landed.
WITH run AS (
    SELECT a.id, a.conversation_id, a.user_message_id FROM {schema}.agent_run a
    WHERE a.id = %(run_id)s AND a.claim_token = %(claim_token)s AND a.status = 'running'
), ins AS (
    INSERT INTO {schema}.run_event (run_id, seq, type, payload)
    SELECT run.id, e.seq, e.type, e.payload
    FROM run CROSS JOIN jsonb_to_recordset(%(events)s::jsonb)
         AS e(run_id uuid, token uuid, seq integer, type text, payload jsonb)
    WHERE e.run_id = run.id
    RETURNING run_id
), msg AS (
    INSERT INTO {schema}.message (id, conversation_id, run_id, role, content, status, turn)
    SELECT %(message_id)s, run.conversation_id, run.id, %(role)s, %(content)s, 'complete',
           (SELECT u.turn FROM {schema}.message u WHERE u.id = run.user_message_id)
    FROM run
    ON CONFLICT (id) DO NOTHING
    RETURNING id
)
SELECT EXISTS (SELECT 1 FROM run) AS owned,
       CASE WHEN %(notify)s AND EXISTS (SELECT 1 FROM ins)
            THEN pg_notify(%(events_prefix)s || replace(%(run_id)s::text, '-', ''), '') END

-- name: message_landed
-- After a transcript write failed without an answer (connection lost): did the message
-- land, and does this worker still hold the claim? "Done", "retry" or "stand down".
SELECT EXISTS (SELECT 1 FROM {schema}.message WHERE id = %(message_id)s) AS landed,
       EXISTS (SELECT 1 FROM {schema}.agent_run
               WHERE id = %(run_id)s AND claim_token = %(claim_token)s AND status = 'running') AS owned

-- name: transcript
-- In turn order (#17): a turn's messages come before the next turn's question, whenever
-- they were written (an answer streamed while the next turn was enqueued, an
-- interrupt's partial answer); insert order (position) orders within a turn. With
-- %(run_id)s (a run reading its own context), only the turns up to that run's: a turn
-- queued after it is not its to answer, and a retry reads the conversation as it was
-- at the turn it retries.
SELECT id, role, content, status, run_id, user_id, created_at
FROM {schema}.message
WHERE conversation_id = %(conversation_id)s AND status <> 'draft'
  AND (%(run_id)s::uuid IS NULL
       OR turn <= (SELECT u.turn FROM {schema}.agent_run a
                   JOIN {schema}.message u ON u.id = a.user_message_id
                   WHERE a.id = %(run_id)s::uuid))
ORDER BY turn, position
