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
-- Where a queued run stands under the fair order, from one snapshot. Its rank k in its
-- tenant counts the tenant's queued runs ahead of it by (priority DESC, queue_order);
-- its load is L = (running + k - 1) / weight. Another tenant u places ahead of it every
-- run j with (running_u + j - 1) / weight_u < L (integer arithmetic, no rounding), plus
-- the run with an equal load, if any, when it wins the tie (higher priority, or equal
-- and older), at most u's queued count. Since taking a run raises its tenant's running
-- count and lowers the rank of the rest by one, loads do not move between claims, and
-- this is the order of successive claims as long as every run counted is claimable.
-- Approximation: conversation order (a later turn waits for its conversation's earlier
-- ones), delays and caps of the runs ahead are not modelled.
WITH me AS (
    SELECT r.id, r.status, r.tenant_key, r.priority, r.queue_order, r.not_before
    FROM {schema}.agent_run r WHERE r.id = %(run_id)s
), queued AS (
    SELECT q.tenant_key, count(*) AS n
    FROM {schema}.agent_run q WHERE q.status = 'queued' GROUP BY q.tenant_key
), running AS (
    SELECT r.tenant_key, count(*) AS n
    FROM {schema}.agent_run r WHERE r.status = 'running' GROUP BY r.tenant_key
), share AS (
    SELECT q.tenant_key, q.n AS queued, coalesce(ru.n, 0) AS running,
           coalesce(p.weight, 1)::bigint AS weight
    FROM queued q
    LEFT JOIN running ru ON ru.tenant_key = q.tenant_key
    LEFT JOIN {schema}.tenant_policy p ON p.tenant_key = q.tenant_key
), mine AS (
    SELECT me.id, me.tenant_key, me.queue_order, me.priority, s.running, s.weight,
           1 + (SELECT count(*) FROM {schema}.agent_run o
                WHERE o.status = 'queued' AND o.tenant_key = me.tenant_key
                  AND (o.priority > me.priority
                       OR (o.priority = me.priority AND o.queue_order < me.queue_order))) AS k
    FROM me JOIN share s ON s.tenant_key = me.tenant_key
    WHERE me.status = 'queued'
), others AS (
    SELECT s.tenant_key, s.queued, mine.weight AS my_weight, mine.priority AS my_priority,
           mine.queue_order AS my_order,
           (mine.running + mine.k - 1) * s.weight - s.running * mine.weight AS d
    FROM mine JOIN share s ON s.tenant_key <> mine.tenant_key
), counted AS (
    SELECT o.queued,
           CASE WHEN o.d <= 0 THEN 0 ELSE (o.d + o.my_weight - 1) / o.my_weight END AS before,
           CASE WHEN o.d >= 0 AND mod(o.d, o.my_weight) = 0 AND o.d / o.my_weight < o.queued
                THEN (SELECT (t.priority > o.my_priority
                              OR (t.priority = o.my_priority AND t.queue_order < o.my_order))::int
                      FROM {schema}.agent_run t
                      WHERE t.status = 'queued' AND t.tenant_key = o.tenant_key
                      ORDER BY t.priority DESC, t.queue_order
                      OFFSET o.d / o.my_weight LIMIT 1)
                ELSE 0 END AS tie
    FROM others o
)
SELECT me.status,
       (SELECT mine.k FROM mine) AS rank_in_tenant,
       (SELECT mine.k FROM mine)
       + coalesce((SELECT sum(least(c.queued, c.before + c.tie)) FROM counted c), 0) AS position,
       extract(epoch FROM me.not_before - coalesce(%(now)s::timestamptz, now()))::float8 AS due_in
FROM me
