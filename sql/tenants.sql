-- Tenants: weights and caps for the fair claim, and where a queued run stands.

-- name: set_tenant_policy
-- Upsert; tenant_key '' is the default tenant (runs without a tenant_id).
INSERT INTO {schema}.tenant_policy (tenant_key, weight, max_running)
VALUES (coalesce(%(tenant_id)s::text, ''), %(weight)s, %(max_running)s)
ON CONFLICT (tenant_key) DO UPDATE
    SET weight = EXCLUDED.weight, max_running = EXCLUDED.max_running, updated_at = now()
RETURNING nullif(tenant_key, '') AS tenant_id, weight, max_running

-- name: list_tenant_policies
SELECT nullif(tenant_key, '') AS tenant_id, weight, max_running
FROM {schema}.tenant_policy ORDER BY tenant_key

-- name: queue_position
-- Where a queued run stands under the fair order, from one snapshot, at a cost that does
-- not grow with the depth of the queue (#17): every walk below stops after %(cap)s index
-- entries, and past that the count is estimated and `exact` is false.
-- Its rank k in its tenant counts the tenant's queued runs ahead of it by (priority DESC,
-- queue_order): those of a higher priority (a lower bound past the cap) plus the older
-- ones of its own priority. Past the cap those are extrapolated from the density of the
-- tenant's runs among the queue_order values of the cap nearest ahead of it, out to the
-- head of its priority band (exact for a queue the tenant has to itself).
-- Its load is L = (running + k - 1) / weight. Another tenant u places ahead of it every
-- run j with (running_u + j - 1) / weight_u < L (integer arithmetic, no rounding), plus
-- the run with an equal load, if any, when it wins the tie (higher priority, or equal
-- and older), at most u's queued count. Since taking a run raises its tenant's running
-- count and lowers the rank of the rest by one, loads do not move between claims, and
-- this is the order of successive claims as long as every run counted is claimable.
-- u's queued count is walked up to its share of the cap (%(cap)s over the other tenants,
-- at least %(min_walk)s); past it, it is extrapolated from the queue_order span of the
-- runs walked and of u's last run.
-- Approximation: conversation order (a later turn waits for its conversation's earlier
-- ones), delays and caps of the runs ahead are not modelled.
WITH RECURSIVE me AS (
    SELECT r.id, r.status, r.tenant_key, r.priority, r.queue_order, r.not_before
    FROM {schema}.agent_run r WHERE r.id = %(run_id)s
), tenants (tenant_key) AS (
    -- The tenants with queued runs: a skip scan of agent_run_fair_idx's leading column.
    (SELECT r.tenant_key FROM {schema}.agent_run r
     WHERE r.status = 'queued' AND EXISTS (SELECT 1 FROM me WHERE me.status = 'queued')
     ORDER BY r.tenant_key LIMIT 1)
    UNION ALL
    SELECT (SELECT r.tenant_key FROM {schema}.agent_run r
            WHERE r.status = 'queued' AND r.tenant_key > t.tenant_key
            ORDER BY r.tenant_key LIMIT 1)
    FROM tenants t WHERE t.tenant_key IS NOT NULL
), running AS (
    SELECT r.tenant_key, count(*) AS n
    FROM {schema}.agent_run r WHERE r.status = 'running' GROUP BY r.tenant_key
), share AS (
    SELECT t.tenant_key, coalesce(ru.n, 0) AS running, coalesce(p.weight, 1)::bigint AS weight
    FROM tenants t
    LEFT JOIN running ru ON ru.tenant_key = t.tenant_key
    LEFT JOIN {schema}.tenant_policy p ON p.tenant_key = t.tenant_key
    WHERE t.tenant_key IS NOT NULL
), ahead AS MATERIALIZED (
    -- (Every walk is ordered as agent_run_fair_idx is: unordered, a count of the higher
    -- priorities, which are usually none, was planned as a scan of the whole table.)
    SELECT
        (SELECT count(*) FROM (
            SELECT 1 FROM {schema}.agent_run o
            WHERE o.status = 'queued' AND o.tenant_key = me.tenant_key AND o.priority > me.priority
            ORDER BY o.priority DESC, o.queue_order
            LIMIT %(cap)s) x) AS higher,
        s.n AS same, s.far,
        (SELECT o.queue_order FROM {schema}.agent_run o
         WHERE o.status = 'queued' AND o.tenant_key = me.tenant_key AND o.priority = me.priority
         ORDER BY o.priority DESC, o.queue_order LIMIT 1) AS head
    FROM me,
    LATERAL (
        -- The nearest runs ahead in its own priority band, walked backwards from it.
        SELECT count(*) AS n, min(x.queue_order) AS far FROM (
            SELECT o.queue_order FROM {schema}.agent_run o
            WHERE o.status = 'queued' AND o.tenant_key = me.tenant_key
              AND o.priority = me.priority AND o.queue_order < me.queue_order
            ORDER BY o.priority DESC, o.queue_order DESC
            LIMIT %(cap)s) x) s
    WHERE me.status = 'queued'
), mine AS (
    SELECT me.id, me.tenant_key, me.queue_order, me.priority, s.running, s.weight,
           a.higher < %(cap)s AND a.same < %(cap)s AS exact,
           1 + a.higher + CASE
               WHEN a.same < %(cap)s THEN a.same
               ELSE greatest(a.same, round(a.same * (me.queue_order - a.head)::numeric
                                           / (me.queue_order - a.far))::bigint) END AS k
    FROM me JOIN share s ON s.tenant_key = me.tenant_key, ahead a
), others AS (
    SELECT s.tenant_key, mine.weight AS my_weight, mine.priority AS my_priority,
           mine.queue_order AS my_order,
           (mine.running + mine.k - 1) * s.weight - s.running * mine.weight AS d
    FROM mine JOIN share s ON s.tenant_key <> mine.tenant_key
), walk AS (
    SELECT greatest(%(min_walk)s::bigint, %(cap)s::bigint / greatest(1, count(*))) AS per_tenant
    FROM others
), before AS (
    SELECT o.*, CASE WHEN o.d <= 0 THEN 0 ELSE (o.d + o.my_weight - 1) / o.my_weight END AS before,
           w.per_tenant
    FROM others o, walk w
), walked AS (
    -- u's queue in claim order, as far as the run at u's offset `before` (the one that
    -- may tie) or its share of the cap, whichever comes first; the last run
    -- walked, in claim order (final_priority, final_order): the one that may tie when the
    -- walk reached it.
    SELECT b.*, least(b.before + 1, b.per_tenant) AS lim, x.n, x.first, x.last, x.final_priority,
           x.final_order
    FROM before b,
    LATERAL (
        SELECT count(*) AS n, min(y.queue_order) AS first, max(y.queue_order) AS last,
               (array_agg(y.priority ORDER BY y.priority, y.queue_order DESC))[1] AS final_priority,
               (array_agg(y.queue_order ORDER BY y.priority, y.queue_order DESC))[1] AS final_order
        FROM (
            SELECT t.priority, t.queue_order FROM {schema}.agent_run t
            WHERE t.status = 'queued' AND t.tenant_key = b.tenant_key
            ORDER BY t.priority DESC, t.queue_order
            LIMIT CASE WHEN b.d < 0 THEN 0 ELSE least(b.before + 1, b.per_tenant) END) y) x
), counted AS (
    SELECT
        CASE WHEN w.d < 0 THEN 0
             WHEN w.n < w.lim THEN w.n  -- u has fewer queued: all of them
             WHEN w.before < w.lim THEN w.before + CASE
                 WHEN mod(w.d, w.my_weight) = 0
                 THEN (w.final_priority > w.my_priority
                       OR (w.final_priority = w.my_priority AND w.final_order < w.my_order))::int
                 ELSE 0 END
             ELSE least(w.before, greatest(w.n, round(w.n * (greatest(w.last, (
                 SELECT t.queue_order FROM {schema}.agent_run t
                 WHERE t.status = 'queued' AND t.tenant_key = w.tenant_key
                 ORDER BY t.priority, t.queue_order DESC LIMIT 1)) - w.first + 1)::numeric
                 / (w.last - w.first + 1))::bigint))
        END AS ahead,
        w.d < 0 OR w.n < w.lim OR w.before < w.lim AS exact
    FROM walked w
)
SELECT me.status,
       (SELECT mine.k FROM mine) AS rank_in_tenant,
       (SELECT mine.k FROM mine)
       + coalesce((SELECT sum(c.ahead) FROM counted c), 0) AS position,
       extract(epoch FROM me.not_before - coalesce(%(now)s::timestamptz, now()))::float8 AS due_in,
       coalesce((SELECT mine.exact FROM mine) AND (SELECT bool_and(c.exact) FROM counted c) IS NOT FALSE,
                true) AS exact
FROM me
