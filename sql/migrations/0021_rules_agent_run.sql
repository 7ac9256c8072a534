-- runrow schema, version 21 (#38, #39), step 1 of 4: agent_run's seventeen CHECK
-- constraints become one, which calls a function that holds the same rules (steps 22
-- and 23 do the same for run_step's five and message's three; 24 validates the three).
--
-- Why: PostgreSQL reads every CHECK constraint of a table from its stored text, plans
-- it and builds its evaluator again for each INSERT or UPDATE statement (the work is
-- kept only for that statement). agent_run's seventeen came to about 14 KB of text: ~30
-- us of server CPU on every claim, ending and enqueue, a tenth of a run's database cost;
-- run_step's (7 KB) cost each of a step's two writes ~15 us. A plpgsql function is
-- compiled once per connection and its expression planned once, so the one constraint
-- that calls it costs a fraction of that (a bulk write pays a function call per row
-- instead). The rules are the same, one by one; a row that breaks one is refused with
-- the same error as before (SQLSTATE 23514, check_violation) naming the same constraint.
--
-- Online, one table per step: each swaps its table's constraints in one transaction
-- under one short exclusive lock (a step that locked two tables could deadlock with a
-- statement that uses both). The new constraint is added NOT VALID, so the swap reads
-- no row: the rows there already pass these rules (the old constraints held them), and
-- every write from the swap on is checked; step 24 then proves it for the record.
-- Expand only: a previous release writes rows that pass the same rules.

-- Every rule a run row keeps (its status and what each status implies), in one place.
-- IMMUTABLE: it reads nothing but the row it is given. The fast path is one expression
-- over all the rules; only a row it refuses is looked at rule by rule, to name the one
-- it breaks. (A rule that is NULL passes, as a CHECK constraint's does.)
CREATE FUNCTION {schema}.agent_run_rules(r {schema}.agent_run) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    broken text;
BEGIN
    IF (r.status IN ('queued', 'running', 'waiting', 'completed', 'failed', 'cancelled',
                     'expired', 'absorbed')
        AND r.conversation_id <> '' AND r.user_id <> '' AND r.tenant_id <> ''
        AND r.idempotency_key <> '' AND r.attempt >= 1 AND r.resumes >= 0
        AND length(r.agent_key) BETWEEN 1 AND 200 AND length(r.limit_key) BETWEEN 1 AND 200
        AND (r.lineage_id IS NULL) = (r.attempt = 1)
        AND (r.parent_run_id IS NULL) = (r.root_run_id IS NULL)
        AND (r.status = 'absorbed') <> (r.absorbed_into IS NULL)
        AND (r.status <> 'queued' OR (r.claim_token IS NULL AND r.finished_at IS NULL
                                      AND (r.started_at IS NULL OR r.resumes > 0)))
        AND (r.status <> 'running' OR (r.claim_token IS NOT NULL AND r.claim_expires_at IS NOT NULL
                                       AND r.started_at IS NOT NULL AND r.finished_at IS NULL))
        AND (r.status <> 'waiting' OR (r.finished_at IS NULL AND r.started_at IS NOT NULL))
        AND (r.status IN ('queued', 'running', 'waiting') OR r.finished_at IS NOT NULL)
        AND (r.input_deadline_at IS NULL OR r.status <> 'queued')) IS NOT FALSE THEN
        RETURN true;
    END IF;
    broken := CASE
        WHEN NOT r.status IN ('queued', 'running', 'waiting', 'completed', 'failed', 'cancelled',
                              'expired', 'absorbed') THEN 'agent_run_status_check'
        WHEN NOT r.conversation_id <> '' THEN 'agent_run_conversation_id_check'
        WHEN NOT r.user_id <> '' THEN 'agent_run_user_id_check'
        WHEN NOT r.tenant_id <> '' THEN 'agent_run_tenant_id_check'
        WHEN NOT r.idempotency_key <> '' THEN 'agent_run_idempotency_key_check'
        WHEN NOT r.attempt >= 1 THEN 'agent_run_attempt_check'
        WHEN NOT r.resumes >= 0 THEN 'agent_run_resumes_check'
        WHEN NOT length(r.agent_key) BETWEEN 1 AND 200 THEN 'agent_run_agent_key_check'
        WHEN NOT length(r.limit_key) BETWEEN 1 AND 200 THEN 'agent_run_limit_key_check'
        WHEN NOT (r.lineage_id IS NULL) = (r.attempt = 1) THEN 'agent_run_lineage_check'
        WHEN NOT (r.parent_run_id IS NULL) = (r.root_run_id IS NULL) THEN 'agent_run_tree_check'
        WHEN NOT (r.status = 'absorbed') <> (r.absorbed_into IS NULL)
            THEN 'agent_run_absorbed_into_check'
        WHEN NOT (r.status <> 'queued' OR (r.claim_token IS NULL AND r.finished_at IS NULL
                                           AND (r.started_at IS NULL OR r.resumes > 0)))
            THEN 'agent_run_queued_unclaimed'
        WHEN NOT (r.status <> 'running' OR (r.claim_token IS NOT NULL
                                            AND r.claim_expires_at IS NOT NULL
                                            AND r.started_at IS NOT NULL AND r.finished_at IS NULL))
            THEN 'agent_run_running_claimed'
        WHEN NOT (r.status <> 'waiting' OR (r.finished_at IS NULL AND r.started_at IS NOT NULL))
            THEN 'agent_run_waiting_unfinished'
        WHEN NOT (r.status IN ('queued', 'running', 'waiting') OR r.finished_at IS NOT NULL)
            THEN 'agent_run_terminal_finished'
        WHEN NOT (r.input_deadline_at IS NULL OR r.status <> 'queued')
            THEN 'agent_run_input_deadline_waiting'
    END;
    RAISE EXCEPTION 'new row for relation "agent_run" violates check constraint "%"', broken
        USING ERRCODE = 'check_violation', CONSTRAINT = broken, TABLE = 'agent_run';
END
$$;

-- holds for old writers: agent_run_rules
ALTER TABLE {schema}.agent_run ADD CONSTRAINT agent_run_rules
    CHECK ({schema}.agent_run_rules(agent_run)) NOT VALID;

ALTER TABLE {schema}.agent_run
    DROP CONSTRAINT agent_run_status_check,
    DROP CONSTRAINT agent_run_conversation_id_check,
    DROP CONSTRAINT agent_run_user_id_check,
    DROP CONSTRAINT agent_run_tenant_id_check,
    DROP CONSTRAINT agent_run_idempotency_key_check,
    DROP CONSTRAINT agent_run_attempt_check,
    DROP CONSTRAINT agent_run_resumes_check,
    DROP CONSTRAINT agent_run_agent_key_check,
    DROP CONSTRAINT agent_run_limit_key_check,
    DROP CONSTRAINT agent_run_lineage_check,
    DROP CONSTRAINT agent_run_tree_check,
    DROP CONSTRAINT agent_run_absorbed_into_check,
    DROP CONSTRAINT agent_run_queued_unclaimed,
    DROP CONSTRAINT agent_run_running_claimed,
    DROP CONSTRAINT agent_run_waiting_unfinished,
    DROP CONSTRAINT agent_run_terminal_finished,
    DROP CONSTRAINT agent_run_input_deadline_waiting;
