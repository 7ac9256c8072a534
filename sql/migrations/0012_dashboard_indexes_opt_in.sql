-- runrow schema, version 12 (#39): the dashboard's list indexes become opt-in.
-- Migration 7 gave each filter of the dashboard's runs list its own index ending in
-- (created_at, id). A run's status changes three times per turn and each change is a
-- non-HOT update, which adds an entry to every index of agent_run: these five cost
-- every turn about 1.1 KB of WAL (of 7.8 KB) and 7-20% of the no-op throughput at 1, 16
-- and 160 in flight (bench/ab.py, session 21), to serve a page an operator opens now
-- and then. Without them a list page sorts the runs it filters: fine on small tables.
-- A deployment with a large table creates them again, without blocking writes:
-- `runrow migrate --dashboard-indexes` (or migrate(..., dashboard_indexes=True)).
-- (Dropping an index changes no statement's result: releases before this one keep
-- working on this schema; their list pages lose the indexes too.)
DROP INDEX IF EXISTS {schema}.agent_run_created_idx;
DROP INDEX IF EXISTS {schema}.agent_run_status_created_idx;
DROP INDEX IF EXISTS {schema}.agent_run_tenant_created_idx;
DROP INDEX IF EXISTS {schema}.agent_run_user_created_idx;
DROP INDEX IF EXISTS {schema}.agent_run_worker_created_idx;
