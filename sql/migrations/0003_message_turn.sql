-- runrow schema, version 3: the transcript in turn order (#17).
-- Forward-only. The backfill rewrites every message row once.

-- The turn a message belongs to. A user message's turn is its run's queue_order; any
-- other message's is the turn of the user message its run answers (a retry reuses that
-- message, so its answer sits in the turn it retries). The transcript is ordered by
-- (turn, position): an answer written after the next turn was enqueued (double-texting,
-- an interrupt's partial answer) still comes before that turn's question.
ALTER TABLE {schema}.message ADD COLUMN turn bigint;

-- Backfill. User messages: the queue_order of the run that sent them (the first; a
-- retry reuses the message with a later queue_order).
UPDATE {schema}.message m SET turn = r.first_order
FROM (SELECT user_message_id, min(queue_order) AS first_order
      FROM {schema}.agent_run GROUP BY user_message_id) r
WHERE m.id = r.user_message_id;
-- Answers: the turn of their run's user message.
UPDATE {schema}.message m SET turn = u.turn
FROM {schema}.agent_run r JOIN {schema}.message u ON u.id = r.user_message_id
WHERE m.turn IS NULL AND m.run_id = r.id;
-- Anything else (runrow writes none): the latest turn begun before it was written, so
-- it keeps its place after what preceded it.
UPDATE {schema}.message m SET turn = coalesce(
    (SELECT max(p.turn) FROM {schema}.message p
     WHERE p.conversation_id = m.conversation_id AND p.position < m.position), 0)
WHERE m.turn IS NULL;

ALTER TABLE {schema}.message ALTER COLUMN turn SET NOT NULL;

-- The transcript's order replaces insert order.
DROP INDEX {schema}.message_conversation_idx;
CREATE INDEX message_conversation_turn_idx ON {schema}.message (conversation_id, turn, position);
