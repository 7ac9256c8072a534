-- runrow schema, version 8 (#36): expand, then contract. Version 3 made message.turn
-- NOT NULL with no default, so a process of a release from before it (still running in
-- a rolling upgrade, after `runrow migrate` and before the rollout reached it) had
-- every message insert refused: its enqueue raised NotNullViolation, and its worker ran
-- agents whose answers could never be written. The column takes NULL again, and a
-- trigger gives a message inserted without a turn the turn this release would have
-- written (the rules of version 3's backfill). This release always writes the turn,
-- so the trigger's WHEN never holds for its inserts; the trigger and the nullable
-- column go in a contracting migration once no supported release omits the turn
-- (docs/howto/upgrading.md keeps the list).
ALTER TABLE {schema}.message ALTER COLUMN turn DROP NOT NULL;

-- (AFTER the statement's rows are in, not BEFORE: an old enqueue inserts the message
-- and its run in one statement, and only at its end is the run visible to look up.)
CREATE FUNCTION {schema}.message_fill_turn() RETURNS trigger
LANGUAGE plpgsql
SET search_path = {schema}, pg_catalog
AS $fill_turn$
BEGIN
    UPDATE message m SET turn = coalesce(
        -- A user message: the queue_order of the run that sent it (a message is only
        -- ever inserted by its turn's first run; retries reuse it).
        (SELECT r.queue_order FROM agent_run r WHERE r.id = m.run_id AND r.user_message_id = m.id),
        -- An answer: the turn of the user message its run answers.
        (SELECT u.turn FROM agent_run r JOIN message u ON u.id = r.user_message_id
         WHERE r.id = m.run_id),
        -- (Both are primary-key probes: agent_run.user_message_id has no index.)
        -- Anything else: the latest turn begun before it, so it keeps its place.
        (SELECT max(p.turn) FROM message p
         WHERE p.conversation_id = m.conversation_id AND p.position < m.position),
        0)
    WHERE m.id = NEW.id AND m.turn IS NULL;
    RETURN NULL;
END
$fill_turn$;

CREATE TRIGGER message_fill_turn AFTER INSERT ON {schema}.message
    FOR EACH ROW WHEN (NEW.turn IS NULL) EXECUTE FUNCTION {schema}.message_fill_turn();
