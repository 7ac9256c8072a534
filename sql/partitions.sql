-- The journal's partitions (migrations 18-20): made ahead of the clock, listed, and
-- dropped whole by trim once nobody needs their events.

-- name: journal_ensure_partitions
-- Makes the partitions up to journal_settings.premake intervals past `at` (default now);
-- returns how many it made (see the function in migration 18).
SELECT {schema}.journal_ensure_partitions(coalesce(%(at)s::timestamptz, now()))

-- name: journal_partitions
-- Every partition, oldest first (lo NULL: the legacy one, events of runs made before
-- migration 20), with PostgreSQL's estimate of its rows (from the last ANALYZE).
SELECT name::text, lo, hi, detach_pending, rows_estimate
FROM {schema}.journal_partition_bounds()
ORDER BY lo NULLS FIRST

-- name: journal_partitions_expired
-- The partitions trim may drop: every run made in the partition's interval was made
-- before the cutoff and has had its journal trimmed (it finished before the cutoff:
-- see trim), so no tail, retry or worker needs any of its events. The runs of an
-- interval are a range of the primary key (ids are time-ordered), read from its start
-- until an untrimmed one is found. (A version-4 id from before migration 20 that falls
-- in the range holds the partition back until it is trimmed too: safe, never wrong.)
SELECT b.name::text, b.rows_estimate
FROM {schema}.journal_partition_bounds() b
WHERE b.lo >= 1 AND NOT b.detach_pending
  AND b.hi <= (extract(epoch FROM coalesce(%(now)s::timestamptz, now())
                                    - make_interval(secs => %(retention_seconds)s)) * 1000)::bigint
  AND NOT EXISTS (
      SELECT 1 FROM {schema}.agent_run r
      WHERE r.id >= (lpad(to_hex(b.lo), 12, '0') || repeat('0', 20))::uuid
        AND r.id < (lpad(to_hex(b.hi), 12, '0') || repeat('0', 20))::uuid
        AND NOT r.journal_trimmed)
ORDER BY b.lo

-- name: journal_partitions_detach_pending
-- Partitions a detach left half done (it was cancelled or its connection dropped).
SELECT name::text FROM {schema}.journal_partition_bounds() WHERE detach_pending

-- name: journal_detach_partition
-- Detaches without stopping the journal's reads and writes (SHARE UPDATE EXCLUSIVE; it
-- waits for transactions that may read the partition). Outside any transaction block.
ALTER TABLE {schema}.run_event DETACH PARTITION {schema}.{partition} CONCURRENTLY

-- name: journal_detach_partition_in_transaction
-- The same inside a caller's transaction, where CONCURRENTLY cannot run: an exclusive
-- lock on the journal, held until that transaction ends.
ALTER TABLE {schema}.run_event DETACH PARTITION {schema}.{partition}

-- name: journal_finish_detach
ALTER TABLE {schema}.run_event DETACH PARTITION {schema}.{partition} FINALIZE

-- name: journal_drop_partition
-- Drops a detached partition: its events go at the cost of unlinking its files, with no
-- dead tuple left anywhere and almost no WAL.
DROP TABLE IF EXISTS {schema}.{partition}
