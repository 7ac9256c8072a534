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
