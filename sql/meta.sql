-- Schema bookkeeping: migrations and the version check.

-- name: migrate_lock
-- Serialises migrators of one schema, across processes, until the transaction ends.
SELECT pg_advisory_xact_lock(hashtextextended(%(lock_key)s, 0))

-- name: create_schema
CREATE SCHEMA IF NOT EXISTS {schema}

-- name: create_version_table
CREATE TABLE IF NOT EXISTS {schema}.schema_version (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)

-- name: applied_versions
SELECT version FROM {schema}.schema_version ORDER BY version

-- name: record_version
INSERT INTO {schema}.schema_version (version, name) VALUES (%(version)s, %(name)s)

-- name: version_table_exists
SELECT to_regclass(%(version_table)s) IS NOT NULL AS present

-- name: max_version
SELECT coalesce(max(version), 0) AS version FROM {schema}.schema_version

-- name: drop_schema
-- Only for the throwaway schemas of runrow/testing.py (its name guard runs first);
-- runrow never drops a schema of its own accord.
DROP SCHEMA IF EXISTS {schema} CASCADE

-- The dashboard's runs-list indexes (opt-in since migration 12; see its comment): one for
-- each filter, ending in the list's order (created_at, id). Built CONCURRENTLY, so writes
-- go on meanwhile (each in a statement of its own, never in a transaction block); IF NOT
-- EXISTS makes a second call a no-op.

-- name: dashboard_index_created
CREATE INDEX CONCURRENTLY IF NOT EXISTS agent_run_created_idx ON {schema}.agent_run (created_at, id)

-- name: dashboard_index_status
CREATE INDEX CONCURRENTLY IF NOT EXISTS agent_run_status_created_idx ON {schema}.agent_run (status, created_at, id)

-- name: dashboard_index_tenant
CREATE INDEX CONCURRENTLY IF NOT EXISTS agent_run_tenant_created_idx
    ON {schema}.agent_run (tenant_id, created_at, id) WHERE tenant_id IS NOT NULL

-- name: dashboard_index_user
CREATE INDEX CONCURRENTLY IF NOT EXISTS agent_run_user_created_idx ON {schema}.agent_run (user_id, created_at, id)

-- name: dashboard_index_worker
CREATE INDEX CONCURRENTLY IF NOT EXISTS agent_run_worker_created_idx
    ON {schema}.agent_run (worker_id, created_at, id) WHERE worker_id IS NOT NULL

-- name: dashboard_indexes_invalid
-- Which of them a build that did not finish (cancelled, or the connection lost) left
-- INVALID: IF NOT EXISTS would keep such an index as it is, unusable.
SELECT c.relname AS name
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE i.indrelid = to_regclass(format('%%I.agent_run', %(schema)s::text)) AND NOT i.indisvalid
  AND c.relname = ANY (ARRAY['agent_run_created_idx', 'agent_run_status_created_idx',
                             'agent_run_tenant_created_idx', 'agent_run_user_created_idx',
                             'agent_run_worker_created_idx'])
ORDER BY 1
