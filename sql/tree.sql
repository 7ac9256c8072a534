-- Sub-agents (runrow/_gateway/tree.py; migration 0011): a run's fenced spawn of child
-- runs, and the outcomes of the children a parent waited on.

-- name: spawn_parent
-- The spawning run, fenced by its claim (no row: the claim is no longer this worker's)
-- and locked against a stop until the spawn commits (a stop that locked it first is seen
-- here as a cancel_requested run, or a run no longer running), with the tree's advisory
-- lock (held to the end of the transaction: the next statement's count of the tree's
-- runs is then exact among concurrent spawns of one tree). What its children inherit
-- comes from its claimed row; here: the parent's depth (a root is 0; each ancestor is one
-- more, read up the parent links, at most %(max_depth)s + 1 steps).
WITH RECURSIVE parent AS (
    SELECT a.id, a.cancel_requested, coalesce(a.root_run_id, a.lineage_id, a.id) AS root, a.parent_run_id
    FROM {schema}.agent_run a
    WHERE a.id = %(run_id)s AND a.claim_token = %(claim_token)s AND a.status = 'running'
    FOR NO KEY UPDATE
), up (id, depth) AS (
    SELECT parent.parent_run_id, 1 FROM parent WHERE parent.parent_run_id IS NOT NULL
    UNION ALL
    SELECT a.parent_run_id, up.depth + 1
    FROM up JOIN {schema}.agent_run a ON a.id = up.id
    WHERE a.parent_run_id IS NOT NULL AND up.depth <= %(max_depth)s
)
SELECT p.cancel_requested, p.root, coalesce((SELECT max(up.depth) FROM up), 0) AS depth,
       pg_advisory_xact_lock(hashtextextended('runrow.spawn:' || p.root::text, 0))
FROM parent p

-- name: tree_spawned
-- How many runs the tree of %(root)s has spawned (first attempts: a retry is not a spawn).
SELECT count(*) FROM {schema}.agent_run WHERE root_run_id = %(root)s AND attempt = 1

-- name: child_outcomes
-- The children (by first run) of %(parent)s named in %(ids)s, each as its latest attempt
-- left it: status, error, and its answer (the content of the last assistant message
-- that attempt wrote; NULL if none). A child of another parent, or no run, is left out.
SELECT c.id, r.status, r.error,
       (SELECT m.content FROM {schema}.message m
        WHERE m.conversation_id = r.conversation_id AND m.run_id = r.id AND m.role = 'assistant'
          AND m.status = 'complete'
        ORDER BY m.position DESC LIMIT 1) AS answer
FROM unnest(%(ids)s::uuid[]) AS c(id)
CROSS JOIN LATERAL (
    SELECT r.id, r.status, r.error, r.conversation_id FROM {schema}.agent_run r
    WHERE (r.id = c.id OR r.lineage_id = c.id) AND r.parent_run_id = %(parent)s
    ORDER BY r.attempt DESC LIMIT 1
) r
