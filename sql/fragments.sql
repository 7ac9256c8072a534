-- Fragments: SQL text that statements in any file take as {name}, written out when the
-- statements load (see src/runrow/_sql.py). Not statements: nothing runs them alone.

-- fragment: live_status
-- The live statuses (src/runrow/_status.py's LIVE): a turn still in its conversation's
-- way. Written `status IN {live_status}`, the predicate of the partial index on a
-- conversation's active turns (agent_run_active_conversation_idx, migration 0006), so a
-- query written with it can use that index; the schema's agent_run_terminal_finished
-- check spells the same set. tests/test_status_vocabulary.py holds them together.
('queued', 'running', 'waiting')
