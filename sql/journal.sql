-- The journal (run_event): fenced appends by the claim holder, reads after a cursor, retention.

-- name: append_events
-- Flushes of one or more runs, each written only while its worker still holds the claim.
-- Returns the runs whose rows landed; the NOTIFY rides the same statement, so a
-- fenced-out flush writes nothing and announces nothing. The rows come as one JSON
-- array of {run_id, token, seq, type, payload} objects, each payload a JSON value in
-- place (parsed once, with the array). `usage` events (RunContext.record_usage) are
-- added to usage_rollup in the same statement.
WITH ins AS (
    INSERT INTO {schema}.run_event (run_id, seq, type, payload)
    SELECT e.run_id, e.seq, e.type, e.payload
    FROM jsonb_to_recordset(%(events)s::jsonb)
         AS e(run_id uuid, token uuid, seq integer, type text, payload jsonb)
    JOIN {schema}.agent_run a
      ON a.id = e.run_id AND a.claim_token = e.token AND a.status = 'running'
    -- (A usage event's payload only: the rollup's; copying every delta's would cost.)
    RETURNING run_id, CASE WHEN type = 'usage' THEN payload END AS usage
), usage_rows AS (
    SELECT run_id, usage FROM ins WHERE usage IS NOT NULL
), {usage_rolled}
)
SELECT run_id,
       -- notify = false exists to measure what the NOTIFY costs (tails then poll).
       CASE WHEN %(notify)s THEN pg_notify(%(events_prefix)s || replace(run_id::text, '-', ''), '') END
FROM (SELECT DISTINCT run_id FROM ins) landed

-- name: read_events
SELECT seq, type, payload FROM {schema}.run_event
WHERE run_id = %(run_id)s AND seq > %(after)s AND {schema}.run_ms(run_id) = {schema}.run_ms(%(run_id)s)
ORDER BY seq
LIMIT %(limit)s

-- name: read_events_many
-- The reads of many tails woken together, as one statement (see src/runrow/_tailbatch.py).
-- For each request (run_id, after, limit), numbered i from 1: up to limit of the run's
-- events after seq `after`, one row each; for a request with none, one row with seq NULL
-- and run_terminal_state's columns (status NULL: no such run). One statement reads one
-- snapshot, so a terminal status always comes with the ending it committed with (the
-- single read must read again for that). Each lateral read walks the primary key; the
-- run's row is looked up only for requests that found no events (a join filter on the
-- events' lateral would look it up for every row, then drop it).
WITH q AS (
    SELECT * FROM unnest(%(run_ids)s::uuid[], %(afters)s::bigint[], %(limits)s::integer[])
                  WITH ORDINALITY AS q(run_id, after, lim, i)
), ev AS (
    SELECT q.i, e.seq, e.type, e.payload
    FROM q CROSS JOIN LATERAL (
        SELECT seq, type, payload FROM {schema}.run_event
        WHERE run_id = q.run_id AND seq > q.after AND {schema}.run_ms(run_id) = {schema}.run_ms(q.run_id)
        ORDER BY seq
        LIMIT q.lim
    ) e
)
SELECT i, seq, type, payload, NULL AS status, NULL::jsonb AS error,
       NULL::boolean AS journaled_end, NULL::integer AS last_seq
FROM ev
UNION ALL
SELECT q.i, NULL, NULL, NULL, a.status, a.error,
       EXISTS (SELECT 1 FROM {schema}.run_event
               WHERE run_id = q.run_id AND type = 'complete' AND {schema}.run_ms(run_id) = {schema}.run_ms(q.run_id)),
       (SELECT max(seq) FROM {schema}.run_event
        WHERE run_id = q.run_id AND {schema}.run_ms(run_id) = {schema}.run_ms(q.run_id))
FROM q
-- (LIMIT 1 keeps the lookup a lateral probe of the primary key, one per request that
-- found nothing, whatever the planner believes of agent_run's size: never a hash join
-- over the whole table.)
LEFT JOIN LATERAL (SELECT status, error FROM {schema}.agent_run WHERE id = q.run_id LIMIT 1) a ON true
WHERE NOT EXISTS (SELECT 1 FROM ev WHERE ev.i = q.i)
ORDER BY 1, 2

-- name: run_terminal_state
-- (Event names and payloads: the vocabulary in src/runrow/_events.py.)
-- The run's status, whether its journal holds its ending (a trimmed one does not), and
-- its last seq (NULL once trimmed): a tail's cursor past it is refused.
SELECT status, error,
       EXISTS (SELECT 1 FROM {schema}.run_event
               WHERE run_id = %(run_id)s AND type = 'complete'
                 AND {schema}.run_ms(run_id) = {schema}.run_ms(%(run_id)s)) AS journaled_end,
       (SELECT max(seq) FROM {schema}.run_event
        WHERE run_id = %(run_id)s AND {schema}.run_ms(run_id) = {schema}.run_ms(%(run_id)s)) AS last_seq
FROM {schema}.agent_run WHERE id = %(run_id)s

-- name: trim
-- Trim's per-run pass: marks the journal of runs finished longer ago than the retention
-- window trimmed and nulls their request snapshot (it may hold personal data), run by
-- run. Since migration 28 retention needs it only for the legacy partition's runs (made
-- before migration 20, key 0: %(legacy_only)s), whose events it deletes row by row;
-- every other run is trimmed with its partition, when it is retired (sql/partitions.sql).
-- With erase_requests a host runs it over every run, to null their snapshots too. The
-- transcript stays.
-- A pass's batches go on from where the previous one ended (%(after)s: its last run's
-- finished_at): without the bound, a batch planned on the index of all finished runs
-- read every run the pass had already trimmed again, so a pass grew with its square.
-- (A run a batch skipped as locked, behind the bound, is left for the next pass.)
WITH old AS (
    SELECT id, coalesce(lineage_id, id) AS lineage_id, finished_at FROM {schema}.agent_run
    WHERE finished_at IS NOT NULL AND NOT journal_trimmed
      AND finished_at >= coalesce(%(after)s::timestamptz, '-infinity')
      AND finished_at < coalesce(%(now)s::timestamptz, now())
                        - make_interval(secs => %(retention_seconds)s)
      AND (NOT %(legacy_only)s OR {schema}.run_ms(id) = 0)
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM {schema}.run_event e USING old
    WHERE e.run_id = old.id AND {schema}.run_ms(e.run_id) = 0 AND {schema}.run_ms(old.id) = 0
    RETURNING 1
), steps AS (
    -- A lineage's step records go with the last of its runs to be trimmed: while any
    -- other run of it is unfinished (a queued retry replays them) or untrimmed (it may
    -- still be retried, and that retry replays them), they stay. (retry takes its run
    -- FOR SHARE, so a retry being made now holds this trim off that run.)
    DELETE FROM {schema}.run_step s USING old
    WHERE s.lineage_id = old.lineage_id
      AND NOT EXISTS (SELECT 1 FROM {schema}.agent_run r
                      WHERE (r.id = old.lineage_id OR r.lineage_id = old.lineage_id)
                        AND (r.finished_at IS NULL OR NOT r.journal_trimmed)
                        AND r.id NOT IN (SELECT id FROM old))
), tree_gone AS (
    -- A trimmed root's tree stream (migration 0016) goes with its journal: a tree tail
    -- that comes later finds the runs' journals gone and ends at once.
    DELETE FROM {schema}.tree_log l USING old WHERE l.root_run_id = old.id
), tree_members_gone AS (
    DELETE FROM {schema}.tree_member m USING old WHERE m.root_run_id = old.id
), marked AS (
    -- (By the primary key, run by run: a join with `old` may be planned as a hash join
    -- over a sequential scan of every run, once per batch.)
    UPDATE {schema}.agent_run a SET journal_trimmed = true, request = NULL
    WHERE a.id = ANY (ARRAY(SELECT id FROM old))
    RETURNING 1
)
SELECT (SELECT count(*) FROM marked) AS runs, (SELECT count(*) FROM gone) AS events,
       (SELECT max(finished_at) FROM old) AS last_finished

-- name: trim_legacy_left
-- Whether the legacy partition (events of runs made before migration 20) holds any row:
-- while it does, trim's per-run pass has runs to trim there.
SELECT EXISTS (SELECT 1 FROM {schema}.run_event WHERE {schema}.run_ms(run_id) = 0)

-- name: flush_landed
-- After a flush failed without an answer (connection lost): did its rows land, and does
-- this worker still hold the claim? Decides between "done", "retry" and "stand down".
SELECT (SELECT count(*) FROM {schema}.run_event
        WHERE run_id = %(run_id)s AND seq = ANY(%(seqs)s::integer[])
          AND {schema}.run_ms(run_id) = {schema}.run_ms(%(run_id)s)) AS landed,
       EXISTS (SELECT 1 FROM {schema}.agent_run
               WHERE id = %(run_id)s AND claim_token = %(claim_token)s AND status = 'running') AS owned
