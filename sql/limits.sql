-- Rate limits and gates (runrow/_gateway/limits.py; migration 0013). The claim reads and
-- counts them (sql/claims.sql, fragments limits_open and limits_grant).

-- name: set_rate_limit
-- Upsert a key's limit. A changed limit keeps the open window and its count (the next
-- claim measures them against the new limit); the gate is kept.
INSERT INTO {schema}.rate_limit (key, runs, per_seconds)
VALUES (%(key)s, %(runs)s, %(per_seconds)s)
ON CONFLICT (key) DO UPDATE SET runs = EXCLUDED.runs, per_seconds = EXCLUDED.per_seconds
RETURNING key, runs, per_seconds, window_start, used, gate_until

-- name: list_rate_limits
SELECT key, runs, per_seconds, window_start, used, gate_until
FROM {schema}.rate_limit ORDER BY key

-- name: remove_rate_limit
-- A key's limit goes; a gate still shut keeps the row (without a limit) until it opens.
WITH gone AS (
    DELETE FROM {schema}.rate_limit
    WHERE key = %(key)s AND runs IS NOT NULL AND NOT coalesce(gate_until > now(), false)
    RETURNING key
), kept AS (
    UPDATE {schema}.rate_limit SET runs = NULL, per_seconds = NULL, window_start = NULL, used = 0
    WHERE key = %(key)s AND runs IS NOT NULL AND gate_until > now()
    RETURNING key
)
SELECT key FROM gone UNION ALL SELECT key FROM kept
