-- Fragments: SQL text that statements in any file take as {name}, written out when the
-- statements load (see src/runrow/_sql.py). Not statements: nothing runs them alone.

-- fragment: live_status
-- The live statuses (src/runrow/_status.py's LIVE): a turn still in its conversation's
-- way. Written `status IN {live_status}`, the predicate of the partial index on a
-- conversation's active turns (agent_run_active_conversation_idx, migration 0006), so a
-- query written with it can use that index; the schema's agent_run_terminal_finished
-- check spells the same set. tests/test_status_vocabulary.py holds them together.
('queued', 'running', 'waiting')

-- fragment: webhook_outbox
-- Webhooks on endings (#42; migration 0012): after a CTE fin of the runs a statement
-- ended (id, status), the CTE webhook_outbox inserts one delivery per subscription that
-- wants the run's terminal status (and its tenant, if it names one), in the ending's own
-- transaction: every statement that makes a run terminal (finalize, reap, cancel_queued,
-- cancel_paused) takes it, so no ending commits without its deliveries and none is
-- delivered for an ending rolled back. The run's other columns are read as the
-- statement's snapshot has them (the ending changes none that are read here). With no
-- subscription the guard (one probe of an empty table, evaluated once) skips it all.
webhook_outbox AS (
    INSERT INTO {schema}.webhook_delivery (webhook, run_id, lineage, event_type, payload)
    SELECT w.name, a.id, coalesce(a.lineage_id, a.id), 'run.' || fin.status,
           jsonb_build_object(
               'type', 'run.' || fin.status,
               'timestamp', now(),
               'data', jsonb_build_object('run_id', a.id, 'status', fin.status,
                                          'conversation_id', a.conversation_id,
                                          'tenant_id', a.tenant_id, 'attempt', a.attempt,
                                          'parent_run_id', a.parent_run_id))
    FROM fin
    JOIN {schema}.agent_run a ON a.id = fin.id
    JOIN {schema}.webhook w ON fin.status = ANY (w.endings)
                            AND (w.tenant_id IS NULL OR w.tenant_id = a.tenant_id)
    WHERE EXISTS (SELECT 1 FROM {schema}.webhook)
      AND fin.status IN ('completed', 'failed', 'cancelled', 'expired')
    ORDER BY a.id, w.name
)
