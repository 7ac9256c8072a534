-- Conversations: the transcript, and stopping turns.

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

-- name: lock_conversation_runs
-- Stop's sweep: lock every active run of the conversation, queued and running together.
SELECT id, status FROM {schema}.agent_run
WHERE conversation_id = %(conversation_id)s AND status IN ('queued', 'running')
ORDER BY queue_order
FOR UPDATE

-- name: lock_run
SELECT id, status, conversation_id FROM {schema}.agent_run WHERE id = %(run_id)s FOR UPDATE

-- name: cancel_queued
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

-- name: request_cancel
-- The running turn: the durable flag is the truth, the NOTIFY only the fast path.
UPDATE {schema}.agent_run SET cancel_requested = true
WHERE id = ANY(%(ids)s::uuid[]) AND status = 'running'
RETURNING id, pg_notify(%(cancel_channel)s, id::text)
