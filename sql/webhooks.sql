-- Webhooks (#42; migration 0015): subscriptions, their deliveries (the outbox each ending
-- fills, see the fragment webhook_outbox), and the delivery service's claim and record
-- (src/runrow/_engine/webhooks.py).

-- fragment: webhook_columns
-- A subscription as runrow.Webhook reads it (src/runrow/_webhook_models.py), in order.
name, url, endings, secret, tenant_id, created_at

-- fragment: delivery_columns
-- A delivery as runrow.WebhookDelivery reads it, in its field order.
id, seq, webhook, run_id, event_type, payload, state, attempts, next_attempt_at,
last_status, last_error, created_at, delivered_at

-- name: add_webhook
-- A name taken returns nothing (the caller refuses it).
INSERT INTO {schema}.webhook (name, url, endings, secret, tenant_id)
VALUES (%(name)s, %(url)s, %(endings)s, %(secret)s, %(tenant_id)s)
ON CONFLICT (name) DO NOTHING
RETURNING {webhook_columns}

-- name: list_webhooks
SELECT {webhook_columns} FROM {schema}.webhook ORDER BY name

-- name: remove_webhook
-- (Its deliveries go with it: ON DELETE CASCADE.)
DELETE FROM {schema}.webhook WHERE name = %(name)s RETURNING name

-- name: add_test_delivery
-- A test delivery for the subscription named %(name)s (no run); nothing if there is none.
INSERT INTO {schema}.webhook_delivery (webhook, event_type, payload)
SELECT w.name, 'webhook.test',
       jsonb_build_object('type', 'webhook.test', 'timestamp', now(),
                          'data', jsonb_build_object('webhook', w.name))
FROM {schema}.webhook w WHERE w.name = %(name)s
RETURNING {delivery_columns}

-- name: redeliver
-- A delivery sent again (delivered or dead, or pending: then due now), with its id (the
-- webhook-id a receiver deduplicates by) and a fresh count of attempts.
UPDATE {schema}.webhook_delivery
SET state = 'pending', attempts = 0, next_attempt_at = now(), delivered_at = NULL
WHERE id = %(id)s
RETURNING {delivery_columns}

-- name: list_deliveries
-- The latest deliveries, newest first, of one subscription or all (%(webhook)s NULL),
-- in one state or all (%(state)s NULL).
SELECT {delivery_columns} FROM {schema}.webhook_delivery
WHERE (%(webhook)s::text IS NULL OR webhook = %(webhook)s::text)
  AND (%(state)s::text IS NULL OR state = %(state)s::text)
  AND (%(run_id)s::uuid IS NULL OR run_id = %(run_id)s::uuid)
ORDER BY seq DESC
LIMIT %(limit)s

-- name: claim_deliveries
-- Up to %(limit)s due deliveries, leased for %(lease_seconds)s (next_attempt_at moves to
-- the lease's end, so a worker killed mid-delivery leaves the row due again when the
-- lease lapses: redelivered, never dropped). SKIP LOCKED: a row another worker is
-- claiming is left to it. A run's later delivery to a subscription waits until its
-- earlier ones (by seq) are delivered or dead. The attempt is counted at the claim, so a
-- killed worker's attempt counts towards the bound too.
WITH due AS (
    SELECT d.id FROM {schema}.webhook_delivery d
    WHERE d.state = 'pending' AND d.next_attempt_at <= now()
      AND NOT EXISTS (SELECT 1 FROM {schema}.webhook_delivery e
                      WHERE e.webhook = d.webhook AND e.lineage = d.lineage
                        AND e.state = 'pending' AND e.seq < d.seq)
    ORDER BY d.next_attempt_at
    LIMIT %(limit)s
    FOR UPDATE OF d SKIP LOCKED
)
UPDATE {schema}.webhook_delivery d
SET attempts = d.attempts + 1,
    next_attempt_at = now() + make_interval(secs => %(lease_seconds)s),
    claimed_until = now() + make_interval(secs => %(lease_seconds)s)
FROM due, {schema}.webhook w
WHERE d.id = due.id AND w.name = d.webhook
RETURNING d.id, d.webhook, w.url, w.secret, d.payload, d.attempts

-- name: record_attempt
-- An attempt's outcome, fenced by its claim's count of attempts (a worker whose lease
-- lapsed and whose row was claimed again writes nothing): delivered; dead once
-- %(max_attempts)s attempts failed; else due again in %(retry_in)s seconds.
UPDATE {schema}.webhook_delivery
SET state = CASE WHEN %(ok)s THEN 'delivered'
                 WHEN attempts >= %(max_attempts)s THEN 'dead' ELSE 'pending' END,
    delivered_at = CASE WHEN %(ok)s THEN now() END,
    next_attempt_at = now() + make_interval(secs => %(retry_in)s),
    claimed_until = NULL,
    last_status = %(status)s,
    last_error = %(error)s
WHERE id = %(id)s AND attempts = %(attempts)s AND state = 'pending'
RETURNING state

-- name: any_webhook
SELECT EXISTS (SELECT 1 FROM {schema}.webhook)
