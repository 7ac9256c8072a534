-- Fragments: SQL text that statements in any file take as {name}, written out when the
-- statements load (see src/runrow/_sql.py). Not statements: nothing runs them alone.

-- fragment: live_status
-- The live statuses (src/runrow/_status.py's LIVE): a turn still in its conversation's
-- way. Written `status IN {live_status}`, the predicate of the partial index on a
-- conversation's active turns (agent_run_active_conversation_idx, migration 0006), so a
-- query written with it can use that index; the schema's agent_run_terminal_finished
-- check spells the same set. tests/test_status_vocabulary.py holds them together.
('queued', 'running', 'waiting')

-- fragment: run_columns
-- A run's row as runrow.RunInfo reads it (its fields, in order): the reads of one run or
-- of a list take it, so a new column is added here once.
id, conversation_id, user_id, tenant_id, status, request, idempotency_key, retry_of,
       worker_id, cancel_requested, error, created_at, started_at, last_heartbeat_at,
       finished_at, claim_expires_at, user_message_id, priority, not_before, deadline_at,
       attempt, lineage_id, resumes, input_deadline_at, version, worker_version, agent_key,
       parent_run_id, root_run_id
