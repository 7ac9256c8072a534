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
-- How many runs the tree of %(root)s has spawned (first attempts: a retry is not a spawn),
-- and a hint on the root's journal channel, %(root_channel)s, sent if the spawn commits:
-- a tree tail (runrow._tailtree) listens there for new runs.
SELECT count(*), pg_notify(%(root_channel)s, '') FROM {schema}.agent_run
WHERE root_run_id = %(root)s AND attempt = 1

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

-- name: tree_root
-- The tree a tail of %(run_id)s reads: the run's first run (a root's retry reads its
-- root's tree), and its own root (NULL for a root; a child's tree is its root's).
SELECT coalesce(lineage_id, id) AS first_run, root_run_id FROM {schema}.agent_run WHERE id = %(run_id)s

-- name: tree_lock
-- A tree tail's pass holds the tree's lock to its end (migration 0016): the passes of
-- every reader of one tree append their blocks one after another, each reading (in
-- its next statement, under a new snapshot) what the one before it logged.
SELECT pg_advisory_xact_lock(hashtextextended('runrow.tree:' || %(root)s::text, 0))

-- name: tree_extend
-- A tree tail's pass (after tree_lock): appends to tree_log the events the tree's runs
-- have committed since the last pass, one block per run in the order the runs were
-- made, and says how far the tree's stream goes. The tree: the root turn %(root)s, its
-- retries (lineage) and every run whose root it is. Runs done (ended, and logged to
-- their ending) are skipped: one probe of tree_member each. The root's ending (the
-- latest attempt's terminal event) is held back while any other run of the tree is
-- live, and then logged after every other run's events: it is always the stream's last
-- event, as a run's ending is its own stream's. Returns how many runs the tree has
-- (0: no such run), the stream's last position, whether every run is done (the stream
-- is complete), and the runs still live (the tail listens for their journals).
WITH runs AS (
    SELECT a.id, a.status, a.created_at, a.attempt, true AS rootline
    FROM {schema}.agent_run a WHERE a.id = %(root)s OR a.lineage_id = %(root)s
    UNION ALL
    SELECT a.id, a.status, a.created_at, a.attempt, false
    FROM {schema}.agent_run a WHERE a.root_run_id = %(root)s
), last_root AS (
    SELECT r.id FROM runs r WHERE r.rootline ORDER BY r.attempt DESC LIMIT 1
), pending AS (
    SELECT r.id, r.created_at, coalesce(m.logged_seq, 0) AS logged, j.top,
           r.status NOT IN {live_status} AS ended,
           r.id = (SELECT id FROM last_root) AS root_last
    FROM runs r
    LEFT JOIN {schema}.tree_member m ON m.root_run_id = %(root)s AND m.run_id = r.id
    CROSS JOIN LATERAL (SELECT nullif({schema}.journal_last_seq(r.id), 0) AS top) j  -- (migration 0025)
    WHERE m.done IS NOT TRUE
), others_live AS (
    SELECT EXISTS (SELECT 1 FROM runs r
                   WHERE r.status IN {live_status} AND r.id <> (SELECT id FROM last_root)) AS live
), upto AS (
    SELECT p.id, p.created_at, p.logged, p.root_last,
           greatest(p.logged, coalesce(p.top, 0)
                    - CASE WHEN p.root_last AND p.ended AND o.live THEN 1 ELSE 0 END) AS upto,
           p.ended AND NOT (p.root_last AND o.live) AS done
    FROM pending p, others_live o
), base AS (
    SELECT coalesce(max(l.end_ord), 0) AS n FROM {schema}.tree_log l WHERE l.root_run_id = %(root)s
), blocks AS (
    INSERT INTO {schema}.tree_log (root_run_id, end_ord, run_id, first_seq, last_seq)
    SELECT %(root)s, b.n + sum(u.upto - u.logged) OVER (
               ORDER BY u.root_last AND u.done, u.created_at, u.id), u.id, u.logged + 1, u.upto
    FROM upto u, base b
    WHERE u.upto > u.logged
    RETURNING end_ord
), members AS (
    INSERT INTO {schema}.tree_member AS m (root_run_id, run_id, logged_seq, done)
    SELECT %(root)s, u.id, u.upto, u.done FROM upto u
    WHERE u.upto > u.logged OR u.done
    ON CONFLICT (root_run_id, run_id) DO UPDATE
        SET logged_seq = EXCLUDED.logged_seq, done = EXCLUDED.done
)
SELECT (SELECT count(*) FROM runs) AS runs,
       coalesce((SELECT max(end_ord) FROM blocks), (SELECT n FROM base)) AS total,
       NOT EXISTS (SELECT 1 FROM upto u WHERE NOT u.done) AS ended,
       ARRAY(SELECT u.id FROM upto u WHERE NOT u.done) AS live

-- name: tree_read
-- Up to %(limit)s of the tree's events after position %(after)s, in stream order: each
-- with its position, type, payload, run and seq in that run's journal. (Blocks by the
-- primary key from the cursor, each block's events by run_event's.)
SELECT b.end_ord - (b.last_seq - e.seq) AS ord, e.type, e.payload, b.run_id, e.seq
FROM (SELECT l.end_ord, l.run_id, l.first_seq, l.last_seq FROM {schema}.tree_log l
      WHERE l.root_run_id = %(root)s AND l.end_ord > %(after)s
      ORDER BY l.end_ord LIMIT %(limit)s) b
CROSS JOIN LATERAL (
    SELECT s.seq, s.type, s.payload FROM {schema}.run_event s
    WHERE s.run_id = b.run_id AND {schema}.run_ms(s.run_id) = {schema}.run_ms(b.run_id) AND s.seq <= b.last_seq
      AND s.seq >= greatest(b.first_seq, b.last_seq - (b.end_ord - %(after)s) + 1)
    ORDER BY s.seq LIMIT %(limit)s
) e
ORDER BY 1
LIMIT %(limit)s
