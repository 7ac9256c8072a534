-- runrow schema, version 7 (#23): the operator's dashboard (runrow.admin) lists runs
-- newest first, by (created_at, id), filtered by status, tenant, user or worker, and
-- pages with a keyset (created_at, id) < (cursor). Each filter has an index that
-- leads with it and ends in the order, so one page reads one page's worth of index
-- entries however many runs there are (a conversation's runs are few: its existing
-- index (conversation_id, queue_order) serves that filter, plus a small sort).
-- The time range is a range on created_at in every one of these indexes.
CREATE INDEX agent_run_created_idx ON {schema}.agent_run (created_at, id);
CREATE INDEX agent_run_status_created_idx ON {schema}.agent_run (status, created_at, id);
CREATE INDEX agent_run_tenant_created_idx
    ON {schema}.agent_run (tenant_id, created_at, id) WHERE tenant_id IS NOT NULL;
CREATE INDEX agent_run_user_created_idx ON {schema}.agent_run (user_id, created_at, id);
CREATE INDEX agent_run_worker_created_idx
    ON {schema}.agent_run (worker_id, created_at, id) WHERE worker_id IS NOT NULL;
