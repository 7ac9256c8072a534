-- runrow schema, version 23, step 3 of 4: message's three CHECK constraints become one,
-- which calls a function that holds the same rules (see step 21 for why and how).

-- A message's rules: a conversation, a role and a status from their lists.
CREATE FUNCTION {schema}.message_rules(m {schema}.message) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    broken text;
BEGIN
    IF (m.conversation_id <> '' AND m.role IN ('user', 'assistant', 'tool', 'system')
        AND m.status IN ('sent', 'draft', 'complete', 'partial')) IS NOT FALSE THEN
        RETURN true;
    END IF;
    broken := CASE
        WHEN NOT m.conversation_id <> '' THEN 'message_conversation_id_check'
        WHEN NOT m.role IN ('user', 'assistant', 'tool', 'system') THEN 'message_role_check'
        WHEN NOT m.status IN ('sent', 'draft', 'complete', 'partial') THEN 'message_status_check'
    END;
    RAISE EXCEPTION 'new row for relation "message" violates check constraint "%"', broken
        USING ERRCODE = 'check_violation', CONSTRAINT = broken, TABLE = 'message';
END
$$;

-- holds for old writers: message_rules
ALTER TABLE {schema}.message ADD CONSTRAINT message_rules
    CHECK ({schema}.message_rules(message)) NOT VALID;

ALTER TABLE {schema}.message
    DROP CONSTRAINT message_conversation_id_check,
    DROP CONSTRAINT message_role_check,
    DROP CONSTRAINT message_status_check;
