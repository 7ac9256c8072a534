-- runrow schema, version 4 (#17): the FIFO queue index serves only the statements that ask for it.
-- agent_run_queued_idx (queue_order) and agent_run_fair_idx (tenant_key, priority DESC,
-- queue_order) index the same rows (status = 'queued'). On statistics taken before a
-- burst, which say no run is queued, the planner costs both at one row, and took the
-- smaller agent_run_queued_idx plus a sort for the fair claim's walks of a tenant's
-- queue (and for queue_position's counts): every claim then read the whole queue, three
-- times (1.2-1.9 s per claim at 100,000 queued). With queue_order > 0 in its predicate
-- (always true: the identity starts at 1), only a statement that states that condition
-- can use it (the FIFO claim); the fair walks are left with agent_run_fair_idx, which
-- reads a tenant's runs in their claim order.
DROP INDEX {schema}.agent_run_queued_idx;
CREATE INDEX agent_run_queued_idx ON {schema}.agent_run (queue_order)
    WHERE status = 'queued' AND queue_order > 0;
