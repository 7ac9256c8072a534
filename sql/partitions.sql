-- The journal's partitions (migrations 18-20): made ahead of the clock, listed, and
-- dropped whole by trim once nobody needs their events (retired first: migration 28).

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

-- name: journal_retired
-- The retired ranges (ms of run creation, migration 28): runs made in them are trimmed.
SELECT lo_ms, hi_ms FROM {schema}.journal_retired ORDER BY lo_ms

-- name: journal_retire_lock
-- Trim's side of the lock with retry (migration 28): held until the retiring
-- transaction ends, taken before it reads which runs are unfinished.
SELECT 1 FROM {schema}.journal_retire_lock FOR UPDATE

-- name: journal_retire_partition
-- Retires the partition of runs made in [lo, hi) ms if nobody needs it: it ends before
-- the cutoff, and every run made in it, every run of a lineage begun in it (a retry
-- made later replays those step records) and every run of a tree rooted in it finished
-- before the cutoff. Then, in this statement: the range is written (merged into one
-- that ends at lo), which trims those runs, and the step records and tree streams keyed
-- by them go (ranges of their keys; a version-4 key that falls in the range is not
-- one of them). Its caller holds the lock row (journal_retire_lock), so no retry of
-- those lineages is being written meanwhile. Returns nothing if the partition is still
-- needed; else the runs made in it and how many of them were not marked trimmed before.
-- (A partition that ends after the cutoff gets no bound row, so no run of it is read:
-- the live ones hold the most runs.)
WITH bound AS (
    SELECT {schema}.run_id_floor(%(lo)s) AS lo, {schema}.run_id_floor(%(hi)s) AS hi, c.cutoff
    FROM (SELECT coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(retention_seconds)s)
                 AS cutoff) c
    WHERE %(hi)s <= (extract(epoch FROM c.cutoff) * 1000)::bigint
), made AS (
    SELECT count(*) AS runs, count(*) FILTER (WHERE NOT r.journal_trimmed) AS unmarked,
           coalesce(bool_and(r.finished_at IS NOT NULL AND r.finished_at < b.cutoff), true) AS done
    FROM bound b JOIN {schema}.agent_run r ON r.id >= b.lo AND r.id < b.hi
), ok AS (
    SELECT made.runs, made.unmarked FROM made, bound b
    WHERE made.done
      AND NOT EXISTS (SELECT 1 FROM {schema}.agent_run r
                      WHERE r.lineage_id >= b.lo AND r.lineage_id < b.hi
                        AND (r.finished_at IS NULL OR r.finished_at >= b.cutoff))
      AND NOT EXISTS (SELECT 1 FROM {schema}.agent_run r
                      WHERE r.root_run_id >= b.lo AND r.root_run_id < b.hi
                        AND (r.finished_at IS NULL OR r.finished_at >= b.cutoff))
), merged AS (
    UPDATE {schema}.journal_retired SET hi_ms = %(hi)s
    WHERE hi_ms = %(lo)s AND EXISTS (SELECT 1 FROM ok)
    RETURNING 1
), added AS (
    INSERT INTO {schema}.journal_retired (lo_ms, hi_ms)
    SELECT %(lo)s, %(hi)s WHERE EXISTS (SELECT 1 FROM ok) AND NOT EXISTS (SELECT 1 FROM merged)
), steps AS (
    DELETE FROM {schema}.run_step s USING bound b
    WHERE EXISTS (SELECT 1 FROM ok) AND s.lineage_id >= b.lo AND s.lineage_id < b.hi
      AND {schema}.run_ms(s.lineage_id) >= 1
), tree_gone AS (
    DELETE FROM {schema}.tree_log l USING bound b
    WHERE EXISTS (SELECT 1 FROM ok) AND l.root_run_id >= b.lo AND l.root_run_id < b.hi
      AND {schema}.run_ms(l.root_run_id) >= 1
), tree_members_gone AS (
    DELETE FROM {schema}.tree_member m USING bound b
    WHERE EXISTS (SELECT 1 FROM ok) AND m.root_run_id >= b.lo AND m.root_run_id < b.hi
      AND {schema}.run_ms(m.root_run_id) >= 1
)
SELECT runs, unmarked FROM ok

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
