-- runrow schema, version 25: a run's journal looked up by functions, in statements that
-- may recheck a row (EvalPlanQual).
--
-- On PostgreSQL 18 a statement that rechecks a row updated concurrently (an UPDATE or
-- a FOR UPDATE whose row changed since its snapshot) initialises every subplan of the
-- statement again for the recheck, and a lookup of one run's events by a per-row run id
-- is such a subplan: a scan of the journal's partitions pruned as it runs. Initialising
-- its pruning a second time corrupts the backend's memory; under concurrent claims
-- the server crashed (SIGSEGV in AllocSetFree under ExecInitPartitionExecPruning, from
-- EvalPlanQualBegin; seen in tests/test_processes.py, test_rate_limits.py and
-- test_steering.py on PostgreSQL 18.6), restarting every session of the cluster.
-- These functions run the lookup in an executor of their own, where the run id is a
-- parameter: its partition is chosen as the lookup starts, and no recheck of the
-- calling statement ever reaches it. STABLE: they read the calling statement's
-- snapshot, as the subqueries they replace did.

-- The run's last journal position (0 for none).
CREATE FUNCTION {schema}.journal_last_seq(run uuid) RETURNS bigint
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
DECLARE
    last bigint;
BEGIN
    SELECT max(e.seq) INTO last FROM {schema}.run_event e
    WHERE e.run_id = run AND {schema}.run_ms(e.run_id) = {schema}.run_ms(run);
    RETURN coalesce(last, 0);
END
$$;

-- The tool calls the run's journal shows started (tool_call_started with a tool_call_id)
-- and never finished (no tool_call_finished with that id), in journal order: the
-- reaper's uncertain_tool_calls (the event names: src/runrow/_events.py).
CREATE FUNCTION {schema}.journal_uncertain_tool_calls(run uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
DECLARE
    calls jsonb;
BEGIN
    SELECT coalesce(jsonb_agg(jsonb_build_object('tool_call_id', s.payload -> 'tool_call_id',
                                                 'name', s.payload -> 'name') ORDER BY s.seq), '[]'::jsonb)
    INTO calls
    FROM {schema}.run_event s
    WHERE s.run_id = run AND {schema}.run_ms(s.run_id) = {schema}.run_ms(run)
      AND s.type = 'tool_call_started' AND s.payload ? 'tool_call_id'
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.run_event f
          WHERE f.run_id = run AND {schema}.run_ms(f.run_id) = {schema}.run_ms(run)
            AND f.type = 'tool_call_finished'
            AND f.payload -> 'tool_call_id' = s.payload -> 'tool_call_id');
    RETURN calls;
END
$$;
