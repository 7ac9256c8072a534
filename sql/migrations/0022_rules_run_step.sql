-- runrow schema, version 22 (#39), step 2 of 4: run_step's five CHECK constraints become
-- one, which calls a function that holds the same rules (see step 21 for why and how).

-- A step record's rules: its status, its key and numbers, and what each status implies
-- for its outcome (see migrations 5 and 6).
CREATE FUNCTION {schema}.run_step_rules(s {schema}.run_step) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    broken text;
    -- What the status implies for the outcome (NULL for a NULL status: passes, as before).
    outcome boolean := CASE s.status
        WHEN 'started' THEN s.result IS NULL AND s.error IS NULL AND s.recorded_at IS NULL
        WHEN 'waiting' THEN s.result IS NULL AND s.error IS NULL AND s.recorded_at IS NULL
                            AND s.request IS NOT NULL
        WHEN 'recorded' THEN s.result IS NOT NULL AND s.error IS NULL AND s.recorded_at IS NOT NULL
        ELSE s.result IS NULL AND s.error IS NOT NULL AND s.recorded_at IS NOT NULL
    END;
BEGIN
    IF (s.status IN ('started', 'recorded', 'failed', 'waiting')
        AND length(s.key) BETWEEN 1 AND 200 AND s.occurrence >= 0 AND s.position >= 0
        AND outcome) IS NOT FALSE THEN
        RETURN true;
    END IF;
    broken := CASE
        WHEN NOT s.status IN ('started', 'recorded', 'failed', 'waiting') THEN 'run_step_status_check'
        WHEN NOT length(s.key) BETWEEN 1 AND 200 THEN 'run_step_key_check'
        WHEN NOT s.occurrence >= 0 THEN 'run_step_occurrence_check'
        WHEN NOT s.position >= 0 THEN 'run_step_position_check'
        WHEN NOT outcome THEN 'run_step_outcome_check'
    END;
    RAISE EXCEPTION 'new row for relation "run_step" violates check constraint "%"', broken
        USING ERRCODE = 'check_violation', CONSTRAINT = broken, TABLE = 'run_step';
END
$$;

-- holds for old writers: run_step_rules
ALTER TABLE {schema}.run_step ADD CONSTRAINT run_step_rules
    CHECK ({schema}.run_step_rules(run_step)) NOT VALID;

ALTER TABLE {schema}.run_step
    DROP CONSTRAINT run_step_status_check,
    DROP CONSTRAINT run_step_key_check,
    DROP CONSTRAINT run_step_occurrence_check,
    DROP CONSTRAINT run_step_position_check,
    DROP CONSTRAINT run_step_outcome_check;
