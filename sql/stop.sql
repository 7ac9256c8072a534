-- Stops (runrow/_gateway/stop.py): lock a conversation's live runs or one run, cancel
-- the queued and paused ones outright, and flag the running one.

-- name: lock_conversation_runs
-- Stop's sweep: lock every active run of the conversation (queued, running, waiting) together.
-- (resumed: a queued run that input resumed has started: it is stopped as a waiting one.)
SELECT id, status, resumes > 0 AS resumed FROM {schema}.agent_run
WHERE conversation_id = %(conversation_id)s AND status IN {live_status}
ORDER BY queue_order
FOR UPDATE

-- name: lock_run
SELECT id, status, resumes > 0 AS resumed FROM {schema}.agent_run WHERE id = %(run_id)s FOR UPDATE

-- name: lock_descendants
-- Stop's sweep of a tree (#41): lock every live descendant of the conversation's live
-- turns (%(conversation_id)s) or of one run (%(run_id)s, whatever its status), in id
-- order. A root turn's descendants are its tree (root_run_id: one index scan); a child's
-- are found down the parent links (parent_run_id is the parent turn's first run). Run
-- before the stop locks the turns themselves (a child's ending locks the child, then its
-- parent: taking them in the other order could deadlock with it), and once more after
-- (children spawned meanwhile: a spawn holds its parent's lock until it commits).
WITH RECURSIVE top (lineage, is_root) AS (
    SELECT coalesce(a.lineage_id, a.id), a.parent_run_id IS NULL FROM {schema}.agent_run a
    WHERE a.conversation_id = %(conversation_id)s::text AND a.status IN {live_status}
    UNION ALL
    SELECT coalesce(a.lineage_id, a.id), a.parent_run_id IS NULL FROM {schema}.agent_run a
    WHERE a.id = %(run_id)s::uuid
), down (lineage) AS (
    SELECT top.lineage FROM top WHERE NOT top.is_root
    UNION
    SELECT coalesce(r.lineage_id, r.id) FROM down JOIN {schema}.agent_run r ON r.parent_run_id = down.lineage
)
-- (The descendants by probes of the tree's indexes, agent_run_root_idx and
-- agent_run_parent_idx, as arrays: written as "status IN live AND (root IN top OR
-- parent IN down)", it walked the live-turn index with both as filters, reading every
-- entry of it that vacuum had not yet cleared: 2.7 ms for a run with no tree after
-- 20,000 runs ended, twice per stop. The outer test reads the ids from the primary key.)
SELECT a.id, a.status, a.resumes > 0 AS resumed FROM {schema}.agent_run a
WHERE a.id = ANY (ARRAY(
        SELECT t.id FROM {schema}.agent_run t
        WHERE t.root_run_id = ANY (ARRAY(SELECT top.lineage FROM top WHERE top.is_root))
        UNION ALL
        SELECT c.id FROM {schema}.agent_run c
        WHERE c.parent_run_id = ANY (ARRAY(SELECT down.lineage FROM down))))
  AND (a.status IN {live_status}) IS TRUE  -- ("IS TRUE": implies no partial index's predicate)
ORDER BY a.id
FOR UPDATE OF a

-- name: cancel_queued
-- (Event names and payloads: the vocabulary in src/runrow/_events.py.)
-- Queued turns never started: cancel them outright, turn their user message back into
-- a draft for the composer, and journal their one terminal event.
-- A child's cancel queues its parent again if that completes the parent's wait (the
-- fragment woke_parents; no row is read for a run without a parent).
WITH c AS (
    UPDATE {schema}.agent_run SET status = 'cancelled', finished_at = now()
    WHERE id = ANY(%(ids)s::uuid[]) AND status = 'queued'
    RETURNING id, user_message_id, parent_run_id, coalesce(lineage_id, id) AS lineage
), fin AS (
    SELECT c.id, 'cancelled' AS status, c.parent_run_id, c.lineage FROM c
), retried AS (
    SELECT NULL::uuid AS retry_of WHERE false  -- (a stop retries nothing)
), {woke_parents}
), d AS (
    UPDATE {schema}.message m SET status = 'draft'
    FROM c WHERE m.id = c.user_message_id
    RETURNING m.id, m.content, c.id AS run_id
), ev AS (
    INSERT INTO {schema}.run_event (run_id, seq, type, payload)
    SELECT c.id,
           {schema}.journal_last_seq(c.id) + 1,  -- (a function: see migration 0025)
           'complete',
           jsonb_build_object('status', 'cancelled', 'reason', 'stopped_before_start')
    FROM c
), {webhook_outbox}
SELECT d.run_id, d.id AS message_id, d.content,
       pg_notify(%(events_prefix)s || replace(d.run_id::text, '-', ''), ''),
       CASE WHEN EXISTS (SELECT 1 FROM woke WHERE woke.resumed) THEN pg_notify(%(wake_channel)s, '') END
FROM d

-- name: cancel_paused
-- (Event names and payloads: the vocabulary in src/runrow/_events.py.)
-- Turns paused for input: waiting, or queued again by provide_input and not yet
-- claimed. No worker holds them, so a stop ends them at once, cancelled (they had
-- started: no draft), with their one terminal event, and wakes the queue (the
-- conversation's next turn, if any, may start).
-- (A child's cancel queues its parent again as in cancel_queued.)
WITH c AS (
    UPDATE {schema}.agent_run SET status = 'cancelled', finished_at = now(), input_deadline_at = NULL,
                                  awaiting = NULL, await_any = NULL
    WHERE id = ANY(%(ids)s::uuid[]) AND (status = 'waiting' OR (status = 'queued' AND resumes > 0))
    RETURNING id, parent_run_id, coalesce(lineage_id, id) AS lineage
), fin AS (
    SELECT c.id, 'cancelled' AS status, c.parent_run_id, c.lineage FROM c
), retried AS (
    SELECT NULL::uuid AS retry_of WHERE false  -- (a stop retries nothing)
), {woke_parents}
), ev AS (
    INSERT INTO {schema}.run_event (run_id, seq, type, payload)
    SELECT c.id,
           {schema}.journal_last_seq(c.id) + 1,  -- (a function: see migration 0025)
           'complete',
           jsonb_build_object('status', 'cancelled', 'reason', 'stopped')
    FROM c
), {webhook_outbox}
SELECT c.id,
       pg_notify(%(events_prefix)s || replace(c.id::text, '-', ''), ''),
       pg_notify(%(wake_channel)s, '')
FROM c

-- name: request_cancel
-- The running turn: the durable flag is the truth, the NOTIFY only the fast path.
UPDATE {schema}.agent_run SET cancel_requested = true
WHERE id = ANY(%(ids)s::uuid[]) AND status = 'running'
RETURNING id, pg_notify(%(cancel_channel)s, id::text)
