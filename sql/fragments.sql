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

-- fragment: usage_rolled
-- (Event names and payloads: the vocabulary in src/runrow/_events.py.)
-- Adds the `usage` events a statement wrote (its CTE usage_rows: run_id, usage payload)
-- to usage_rollup, per tenant, agent key and UTC hour, in the statement that journals
-- them (append_events, finalize): the rollup holds exactly what landed, with no commit
-- of its own, and a fenced-out write adds nothing. Rows are taken in key order, so two
-- writers never wait on each other's rollup rows in a cycle. With no usage event the
-- insert reads nothing (usage_rows is empty) and agent_run is not probed.
usage_rolled AS (
    INSERT INTO {schema}.usage_rollup AS u
        (tenant_key, agent_key, bucket, input_tokens, output_tokens, cost, records)
    SELECT a.tenant_key, coalesce(a.agent_key, ''),
           date_trunc('hour', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',
           sum((r.usage->>'input_tokens')::bigint), sum((r.usage->>'output_tokens')::bigint),
           sum((r.usage->>'cost')::numeric), count(*)
    FROM usage_rows r JOIN {schema}.agent_run a ON a.id = r.run_id
    GROUP BY 1, 2
    ORDER BY 1, 2
    ON CONFLICT (tenant_key, bucket, agent_key) DO UPDATE SET
        input_tokens  = u.input_tokens + excluded.input_tokens,
        output_tokens = u.output_tokens + excluded.output_tokens,
        cost          = u.cost + excluded.cost,
        records       = u.records + excluded.records
