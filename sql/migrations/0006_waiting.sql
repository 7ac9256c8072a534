-- runrow schema, version 6 (#20): human in the loop. A run can park itself to wait for
-- a person's input (run.wait_for_input): its status is then `waiting`, it holds no
-- lease and no worker's slot, and its conversation stays busy. Input recorded by
-- provide_input queues it again (same run, same journal); a worker claims it and its
-- agent replays to where it paused. An input deadline that passes ends it `expired`.

ALTER TABLE {schema}.agent_run DROP CONSTRAINT agent_run_status_check;
ALTER TABLE {schema}.agent_run ADD CONSTRAINT agent_run_status_check CHECK (
    status IN ('queued', 'running', 'waiting', 'completed', 'failed', 'cancelled', 'expired'));

-- How many times input resumed the run (0: never parked, or not yet answered). A
-- resumed run is queued again after it started: its started_at stays.
ALTER TABLE {schema}.agent_run ADD COLUMN resumes integer NOT NULL DEFAULT 0
    CONSTRAINT agent_run_resumes_check CHECK (resumes >= 0);
-- When a waiting run's input is due (NULL: no deadline); past it, a reaper ends the run
-- `expired`.
ALTER TABLE {schema}.agent_run ADD COLUMN input_deadline_at timestamptz;

ALTER TABLE {schema}.agent_run DROP CONSTRAINT agent_run_queued_unclaimed;
ALTER TABLE {schema}.agent_run ADD CONSTRAINT agent_run_queued_unclaimed CHECK (
    status <> 'queued'
    OR (claim_token IS NULL AND finished_at IS NULL AND (started_at IS NULL OR resumes > 0)));
ALTER TABLE {schema}.agent_run DROP CONSTRAINT agent_run_terminal_finished;
ALTER TABLE {schema}.agent_run ADD CONSTRAINT agent_run_terminal_finished CHECK (
    status IN ('queued', 'running', 'waiting') OR finished_at IS NOT NULL);
ALTER TABLE {schema}.agent_run ADD CONSTRAINT agent_run_waiting_unfinished CHECK (
    status <> 'waiting' OR (finished_at IS NULL AND started_at IS NOT NULL));
ALTER TABLE {schema}.agent_run ADD CONSTRAINT agent_run_input_deadline_waiting CHECK (
    input_deadline_at IS NULL OR status <> 'queued');

-- One turn at a time per conversation: a waiting turn holds it as a running one does.
DROP INDEX {schema}.agent_run_one_running_per_conversation;
CREATE UNIQUE INDEX agent_run_one_turn_per_conversation
    ON {schema}.agent_run (conversation_id) WHERE status IN ('running', 'waiting');
-- A conversation's active turns now include a waiting one.
DROP INDEX {schema}.agent_run_active_conversation_idx;
CREATE INDEX agent_run_active_conversation_idx
    ON {schema}.agent_run (conversation_id, queue_order) WHERE status IN ('queued', 'running', 'waiting');
-- Waiting runs by input deadline: the reaper's expiry pass and listings.
CREATE INDEX agent_run_waiting_idx ON {schema}.agent_run (input_deadline_at) WHERE status = 'waiting';

-- An input is a step a person records: `waiting` until provide_input records its value
-- (status `recorded`, result = the value). `request` is what the agent asked with.
ALTER TABLE {schema}.run_step ADD COLUMN request jsonb;
ALTER TABLE {schema}.run_step DROP CONSTRAINT run_step_status_check;
ALTER TABLE {schema}.run_step ADD CONSTRAINT run_step_status_check
    CHECK (status IN ('started', 'recorded', 'failed', 'waiting'));
ALTER TABLE {schema}.run_step DROP CONSTRAINT run_step_outcome_check;
ALTER TABLE {schema}.run_step ADD CONSTRAINT run_step_outcome_check CHECK (
    CASE status
        WHEN 'started'  THEN result IS NULL AND error IS NULL AND recorded_at IS NULL
        WHEN 'waiting'  THEN result IS NULL AND error IS NULL AND recorded_at IS NULL
                             AND request IS NOT NULL
        WHEN 'recorded' THEN result IS NOT NULL AND error IS NULL AND recorded_at IS NOT NULL
        ELSE result IS NULL AND error IS NOT NULL AND recorded_at IS NOT NULL
    END);
-- provide_input finds the step a waiting run waits on.
CREATE INDEX run_step_waiting_idx ON {schema}.run_step (run_id, key) WHERE status = 'waiting';
