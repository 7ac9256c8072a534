-- A worker's hold on runs (runrow/_gateway/claims.py, lease.py): the fair and the FIFO
-- claim, and the lease's heartbeat and cancel flag.
-- Worker writes are fenced: run id AND claim_token AND status = 'running'.

-- name: claim
-- (Claim times use clock_timestamp(), read after the statement's snapshot, not now(), the
-- transaction's start: a claim that saw the previous turn's ending must also be stamped
-- after it.)
-- The fair claim: up to %(limit)s runs in one statement, fairly across tenants.
-- Eligible: queued, due (not_before <= now), of an agent this worker serves (its
-- agent_key is one of %(agent_keys)s, or NULL, the default agent, with %(serves_default)s;
-- a worker serving the default only pays one NULL test per row read), the oldest queued
-- turn of its conversation,
-- no turn of that conversation running, and its tenant below its max_running cap; with
-- %(same_version)s (Dispatcher(resume_policy="same_version")), a run that has recorded
-- steps (resumed after a wait, or a retry whose lineage recorded some) only if its version
-- is the worker's: fresh turns go to any worker. (Written first in an OR, a false
-- %(same_version)s ends the test there: the default costs one parameter test per row.)
-- Order: each tenant's eligible runs are ranked k = 1, 2, ... by (priority DESC,
-- queue_order); across tenants runs go by (running + k - 1) / weight ascending (the
-- tenant's share after taking this run), then priority DESC, then queue_order.
-- Cost: the tenants with queued work are found by a skip scan of the fair index (one
-- probe each, which also brings the tenant's first run); each tenant offers its first
-- eligible run and, if its share is low enough to matter, a few more (see threshold).
-- Only a tenant that offers more than one run, or whose first run cannot start, reads
-- its queue again (in claim order, from the index), so a hot tenant's long queue is
-- never scanned (on statistics that say nothing is queued, the planner may still read
-- it once per claim: linear, never once per queued run; see tests/test_claim_plan.py).
-- Only the best candidates are locked
-- (SKIP LOCKED, in claim order, stopping at %(limit)s); those a concurrent claim holds
-- are skipped. A single claim's pick is exact; a batch is exact unless tenants' runs are
-- blocked (conversation order, not_before), when it may come back smaller. With one
-- tenant queued (solo, below) none of that ranking runs: its queue is walked in order.
-- The unique index one_turn_per_conversation is still the guarantee.
-- The batch size is read through a one-row CTE, not used inline: the planner then cannot
-- specialise a plan on it, so a prepared claim settles on its generic plan instead of
-- planning the whole statement again on every call (about half of the claim's cost).
WITH RECURSIVE lim (n) AS (
    SELECT %(limit)s::bigint
), limits_on (any_limit) AS (
    -- Is any rate limit or gate defined? (Read once: see the limits_open fragment.)
    SELECT EXISTS (SELECT 1 FROM {schema}.rate_limit)
), tenants (tenant_key, id, priority, queue_order, conversation_id, not_before, version, resumes,
             lineage_id, agent_key, limit_key, root_run_id) AS (
    -- The skip scan: each tenant's first queued run in claim order, one index probe per
    -- tenant. The row itself comes along (its heap tuple), so a tenant that offers just
    -- its first run (most of them, with many tenants) needs no second probe below.
    (SELECT r.tenant_key, r.id, r.priority, r.queue_order, r.conversation_id, r.not_before, r.version,
            r.resumes, r.lineage_id, r.agent_key, r.limit_key, r.root_run_id
     FROM {schema}.agent_run r
     WHERE r.status = 'queued' ORDER BY r.tenant_key, r.priority DESC, r.queue_order LIMIT 1)
    UNION ALL
    SELECT n.* FROM tenants t CROSS JOIN LATERAL (
        SELECT r.tenant_key, r.id, r.priority, r.queue_order, r.conversation_id, r.not_before, r.version,
               r.resumes, r.lineage_id, r.agent_key, r.limit_key, r.root_run_id
        FROM {schema}.agent_run r
        WHERE r.status = 'queued' AND r.tenant_key > t.tenant_key
        ORDER BY r.tenant_key, r.priority DESC, r.queue_order LIMIT 1) n
), running AS (
    SELECT r.tenant_key, count(*) AS n FROM {schema}.agent_run r
    WHERE r.status = 'running' GROUP BY r.tenant_key
), depth AS (
    -- At most how many candidates a tenant offers: %(limit)s, more with few tenants, so
    -- that concurrent claimers that lose a lock race (SKIP LOCKED) still find others.
    SELECT greatest((SELECT n FROM lim),
                    ceil(4.0 * (SELECT n FROM lim) / greatest(1, count(*)))::bigint) AS per_tenant
    FROM tenants
), share AS (
    SELECT t.tenant_key, coalesce(ru.n, 0) AS running, coalesce(p.weight, 1) AS weight,
           CASE WHEN p.max_running IS NULL THEN depth.per_tenant
                ELSE greatest(0, least(depth.per_tenant, p.max_running - coalesce(ru.n, 0))) END AS room
    FROM depth, tenants t
    LEFT JOIN running ru ON ru.tenant_key = t.tenant_key
    LEFT JOIN {schema}.tenant_policy p ON p.tenant_key = t.tenant_key
), threshold AS (
    -- The 4 x %(limit)s-th smallest load if every tenant had room runs eligible. A
    -- tenant's runs past it cannot be among the best 4 x %(limit)s, so it offers only
    -- those at or under it, and always its first: with 100 idle tenants, 100 candidates
    -- instead of 800.
    SELECT (s.running + k - 1)::float8 / s.weight AS load
    FROM share s, generate_series(1, s.room) k
    ORDER BY 1 OFFSET 4 * (SELECT n FROM lim) - 1 LIMIT 1
), sized AS (
    SELECT s.tenant_key, s.running, s.weight,
           CASE WHEN s.room = 0 THEN 0
                WHEN th.load IS NULL THEN s.room
                ELSE greatest(1, least(s.room, floor(th.load * s.weight - s.running + 1e-9)::bigint + 1))
           END AS offer
    FROM share s LEFT JOIN threshold th ON true
), head AS (
    -- Can each tenant's first run start now? (The same checks as the walk below.)
    SELECT r.tenant_key, r.id, r.priority, r.queue_order,
           (r.not_before IS NULL OR r.not_before <= coalesce(%(now)s::timestamptz, now()))
           AND (%(serves_default)s::bool AND r.agent_key IS NULL OR r.agent_key = ANY (%(agent_keys)s::text[]))
           AND {limits_open}
           AND {tree_open}
           AND {version_open}
           AND NOT EXISTS (
               SELECT 1 FROM {schema}.agent_run o
               WHERE o.conversation_id = r.conversation_id AND o.status IN ('running', 'waiting')
               OFFSET 0)
           AND NOT EXISTS (
               SELECT 1 FROM {schema}.agent_run o
               WHERE o.conversation_id = r.conversation_id
                 AND o.status IN {live_status} AND o.queue_order < r.queue_order
               OFFSET 0) AS ready
    FROM tenants r
), ranked AS (
    -- A tenant that offers one run and whose first run is ready offers exactly that run
    -- (k = 1); any other tenant walks its queue from the start, as follows.
    SELECT h.id, h.priority, h.queue_order, s.running::float8 / s.weight AS load
    FROM sized s JOIN head h ON h.tenant_key = s.tenant_key
    WHERE s.offer = 1 AND h.ready
    UNION ALL
    SELECT h.id, h.priority, h.queue_order,
           (s.running + row_number() OVER (PARTITION BY s.tenant_key
                                           ORDER BY h.priority DESC, h.queue_order) - 1)::float8
               / s.weight AS load
    FROM sized s
    JOIN head hd ON hd.tenant_key = s.tenant_key AND (s.offer > 1 OR (s.offer = 1 AND NOT hd.ready))
    CROSS JOIN LATERAL (
        SELECT r.id, r.priority, r.queue_order
        FROM {schema}.agent_run r
        WHERE r.status = 'queued' AND r.tenant_key = s.tenant_key
          AND (r.not_before IS NULL OR r.not_before <= coalesce(%(now)s::timestamptz, now()))
          AND (%(serves_default)s::bool AND r.agent_key IS NULL OR r.agent_key = ANY (%(agent_keys)s::text[]))
          AND {limits_open}
          AND {tree_open}
          AND {version_open}
          -- (OFFSET 0 keeps these per-row probes of the conversation's index entries;
          -- planned as an anti-join on stale statistics, one scanned the whole queue for
          -- every queued run. Two probes, not one with "running OR older": that OR was
          -- planned as a BitmapOr that read every older turn of the conversation, for
          -- each of them: 5 s per claim with 10,000 turns queued in one conversation.
          -- The running turn is one unique-index probe; the older turn the first entry
          -- of the conversation's active-turn index: status IN (queued, running) matches
          -- no index on the queue alone, so stale statistics cannot make it a queue walk.)
          AND NOT EXISTS (
              SELECT 1 FROM {schema}.agent_run o
              WHERE o.conversation_id = r.conversation_id AND o.status IN ('running', 'waiting')
              OFFSET 0)
          AND NOT EXISTS (
              SELECT 1 FROM {schema}.agent_run o
              WHERE o.conversation_id = r.conversation_id
                AND o.status IN {live_status} AND o.queue_order < r.queue_order
              OFFSET 0)
        ORDER BY r.priority DESC, r.queue_order
        LIMIT s.offer
    ) h
), picked AS (
    -- The best 4 x %(limit)s candidates in claim order, as one array of ids: the lock
    -- below then probes the primary key for exactly these rows.
    SELECT (array_agg(ranked.id ORDER BY ranked.load, ranked.priority DESC, ranked.queue_order))
               [1:4 * (SELECT n FROM lim)] AS ids
    FROM ranked
), fair_candidate AS (
    -- (Still queued, re-checked on the locked row version. Written "IS TRUE" so that it
    -- implies no partial index's predicate: with status = 'queued', statistics from before
    -- a burst had the planner scan a whole queue index believed empty, with the ids as a
    -- filter, rather than probe the primary key: 100,000 rows read per claim. By
    -- queue_order, as before, it did the same with agent_run_fair_idx.)
    SELECT a.id, a.queue_order, a.tenant_key, a.agent_key, a.limit_key, a.root_run_id
    FROM {schema}.agent_run a
    WHERE a.id = ANY ((SELECT ids FROM picked)::uuid[]) AND (a.status = 'queued') IS TRUE
    ORDER BY array_position((SELECT ids FROM picked)::uuid[], a.id)
    LIMIT (SELECT n FROM lim)
    FOR UPDATE OF a SKIP LOCKED
), solo AS (
    -- One tenant with queued work (the usual case): the fair order is just its own order
    -- (priority DESC, queue_order), so its runs are read, checked and locked lazily from
    -- the index, stopping at %(limit)s (or its cap): no ranking, no oversampling, and a
    -- lock race only moves the scan on.
    SELECT s.tenant_key, least((SELECT n FROM lim), s.room) AS room
    FROM share s
    WHERE (SELECT count(*) FROM share) = 1
), solo_candidate AS (
    SELECT r.id, r.queue_order, r.tenant_key, r.agent_key, r.limit_key, r.root_run_id
    FROM {schema}.agent_run r
    WHERE r.status = 'queued' AND r.tenant_key = (SELECT tenant_key FROM solo)
      AND (r.not_before IS NULL OR r.not_before <= coalesce(%(now)s::timestamptz, now()))
      AND (%(serves_default)s::bool AND r.agent_key IS NULL OR r.agent_key = ANY (%(agent_keys)s::text[]))
      AND {limits_open}
      AND {tree_open}
      AND {version_open}
      AND NOT EXISTS (  -- per-row probes (OFFSET 0), as above
          SELECT 1 FROM {schema}.agent_run o
          WHERE o.conversation_id = r.conversation_id AND o.status IN ('running', 'waiting')
          OFFSET 0)
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.agent_run o
          WHERE o.conversation_id = r.conversation_id
            AND o.status IN {live_status} AND o.queue_order < r.queue_order
          OFFSET 0)
    ORDER BY r.priority DESC, r.queue_order
    LIMIT (SELECT room FROM solo)
    FOR UPDATE OF r SKIP LOCKED
), locked AS MATERIALIZED (
    -- (MATERIALIZED: the rows are locked in a step of their own, whatever reads them. A
    -- variant whose later steps read them once (no tree cap, no rate limit) would
    -- otherwise have them inlined, row locks and all, into the update's array subquery,
    -- which crashed PostgreSQL 15 under concurrent claims: tests/test_processes.py.)
    SELECT * FROM solo_candidate
    UNION ALL
    SELECT * FROM fair_candidate WHERE NOT EXISTS (SELECT 1 FROM solo)
), {tree_capped}, {limits_grant}
{claim_stamp}

-- name: claim_fifo
-- The plain FIFO claim (Dispatcher(claim_order="fifo")): global enqueue order, ignoring
-- tenants, weights, caps and priorities; not_before is still honoured. Cheapest; unfair.
-- (The batch size goes through a CTE for the reason given at the fair claim.)
WITH lim (n) AS (
    SELECT %(limit)s::bigint
), limits_on (any_limit) AS (
    SELECT EXISTS (SELECT 1 FROM {schema}.rate_limit)
), locked AS MATERIALIZED (  -- (MATERIALIZED: see the fair claim)
    SELECT r.id, r.queue_order, r.tenant_key, r.agent_key, r.limit_key, r.root_run_id
    FROM {schema}.agent_run r
    WHERE r.status = 'queued' AND r.queue_order > 0  -- (agent_run_queued_idx: migration 0003)
      AND (r.not_before IS NULL OR r.not_before <= coalesce(%(now)s::timestamptz, now()))
      AND (%(serves_default)s::bool AND r.agent_key IS NULL OR r.agent_key = ANY (%(agent_keys)s::text[]))
      AND {limits_open}
      AND {tree_open}
      AND {version_open}
      AND NOT EXISTS (  -- per-row probes (OFFSET 0), as in the fair claim
          SELECT 1 FROM {schema}.agent_run o
          WHERE o.conversation_id = r.conversation_id AND o.status IN ('running', 'waiting')
          OFFSET 0)
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.agent_run o
          WHERE o.conversation_id = r.conversation_id
            AND o.status IN {live_status} AND o.queue_order < r.queue_order
          OFFSET 0)
    ORDER BY r.queue_order
    LIMIT (SELECT n FROM lim)
    FOR UPDATE SKIP LOCKED
), {tree_capped}, {limits_grant}
{claim_stamp}

-- name: heartbeat
-- Rolls the lease of every run this process holds, in one statement. A run missing
-- from the result has lost its claim. Returns the durable cancel flag too: the
-- heartbeat is the fallback for a lost cancel NOTIFY.
-- Every batched writer of agent_run (heartbeat, finalize, reap) locks its rows first, in
-- id order, so that overlapping batches never deadlock whatever order they come in.
WITH locked AS (
    SELECT a.id FROM {schema}.agent_run a
    JOIN unnest(%(ids)b::uuid[], %(tokens)b::uuid[]) AS h(id, token)
      ON a.id = h.id AND a.claim_token = h.token
    WHERE a.status = 'running'
    ORDER BY a.id
    FOR NO KEY UPDATE OF a
)
UPDATE {schema}.agent_run a SET
    last_heartbeat_at = coalesce(%(now)s::timestamptz, now()),
    claim_expires_at  = coalesce(%(now)s::timestamptz, now())
                        + make_interval(secs => %(lease_seconds)s)
WHERE a.id = ANY (ARRAY(SELECT id FROM locked)) AND a.status = 'running'
RETURNING a.id, a.cancel_requested

-- name: cancel_flag
SELECT cancel_requested FROM {schema}.agent_run
WHERE id = %(run_id)s AND claim_token = %(claim_token)s AND status = 'running'
