-- The live worker registry (migration 0009): one row per running Dispatcher, written by
-- its `registry` service, removed by its clean stop or by any reaper once it is dead.

-- name: worker_beat
-- Registers the dispatcher, or rolls its row (one statement per heartbeat). An upsert, so
-- a worker whose row a reaper removed (it was paused past lease + grace) comes back; it
-- keeps its first start (%(started_at)s, None at registration).
INSERT INTO {schema}.worker
    (id, host, pid, version, agent, concurrency, in_flight, started_at, heartbeat_at, expires_at,
     agent_keys, serves_default)
VALUES (%(id)s, %(host)s, %(pid)s, %(version)s, %(agent)s, %(concurrency)s, %(in_flight)s,
        coalesce(%(started_at)s::timestamptz, now()), now(),
        now() + make_interval(secs => %(lease_seconds)s), %(agent_keys)s::text[], %(serves_default)s)
ON CONFLICT (id) DO UPDATE SET
    host = excluded.host, pid = excluded.pid, version = excluded.version, agent = excluded.agent,
    agent_keys = excluded.agent_keys, serves_default = excluded.serves_default,
    concurrency = excluded.concurrency, in_flight = excluded.in_flight,
    started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at,
    expires_at = excluded.expires_at
RETURNING started_at

-- name: worker_leave
-- A clean stop: the dispatcher's own row (only the registration it made: a worker id
-- reused since by another process keeps its row).
DELETE FROM {schema}.worker WHERE id = %(id)s AND pid = %(pid)s AND host = %(host)s

-- name: worker_reap
-- The dead: workers whose lease lapsed more than %(grace_seconds)s ago without a beat.
DELETE FROM {schema}.worker
WHERE expires_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(grace_seconds)s)
RETURNING id, host, pid, version

-- name: worker_list
-- The live workers, by version then start, with their lease's expiry for "stale" marks.
SELECT id, host, pid, version, agent, concurrency, in_flight, started_at, heartbeat_at, expires_at,
       agent_keys, serves_default
FROM {schema}.worker
ORDER BY version NULLS FIRST, started_at, id

-- name: worker_version_running
-- `runrow workers wait --version`: running runs whose claim a worker of that version made
-- (the running runs' lease index bounds the read to the runs in flight).
SELECT count(*) FROM {schema}.agent_run
WHERE status = 'running' AND claim_expires_at IS NOT NULL AND worker_version = %(version)s

-- name: worker_count_by_version
-- The metrics' gauge runrow_workers: registered workers per version ('' for none).
SELECT coalesce(version, '') AS version, count(*) AS workers
FROM {schema}.worker
GROUP BY 1
ORDER BY 1

-- name: worker_stranded
-- Runs stranded by a deploy: queued, with recorded steps (resumed after a wait, or a
-- retry whose lineage recorded some), whose version no live worker (lease not lapsed)
-- has, queued for more than %(older_than)s seconds: under resume_policy="same_version"
-- nobody will claim them. Queued since: the input that resumed it was recorded, else its
-- creation (or not_before). Reads the queued runs only (their partial index).
SELECT a.id, a.conversation_id, a.version, a.status, q.since AS queued_since
FROM {schema}.agent_run a
CROSS JOIN LATERAL (
    SELECT greatest(a.created_at, a.not_before,
                    (SELECT max(s.recorded_at) FROM {schema}.run_step s
                     WHERE s.run_id = a.id AND s.request IS NOT NULL)) AS since
) q
WHERE a.status = 'queued' AND a.version IS NOT NULL
  AND (a.resumes > 0
       OR (a.lineage_id IS NOT NULL
           AND EXISTS (SELECT 1 FROM {schema}.run_step s WHERE s.lineage_id = a.lineage_id)))
  AND NOT EXISTS (SELECT 1 FROM {schema}.worker w
                  WHERE w.version = a.version AND w.expires_at > now())
  AND q.since < now() - make_interval(secs => %(older_than)s::float8)
ORDER BY q.since, a.id
LIMIT %(limit)s

-- name: worker_unserved
-- Queued runs that no live worker (lease not lapsed) serves: their agent key is none of
-- any live worker's keys (a NULL key: no live worker serves the default agent). One row
-- per key ('' for the default agent): how many, and the oldest's creation. Reads the
-- queued runs (their partial index); an operator's read, not the engine's.
SELECT coalesce(a.agent_key, '') AS agent_key, count(*) AS runs, min(a.created_at) AS oldest
FROM {schema}.agent_run a
WHERE a.status = 'queued' AND a.queue_order > 0
  AND NOT EXISTS (
      SELECT 1 FROM {schema}.worker w
      WHERE w.expires_at > now()
        AND CASE WHEN a.agent_key IS NULL THEN coalesce(w.serves_default, true)
                 ELSE coalesce(a.agent_key = ANY (w.agent_keys), false) END)
GROUP BY 1
ORDER BY 1
