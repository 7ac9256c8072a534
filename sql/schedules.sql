-- Schedules (#42): the rows, the API's reads and writes, and the fire that any worker
-- runs (src/runrow/_engine/schedules.py).

-- fragment: schedule_columns
-- A schedule as runrow.Schedule reads it (src/runrow/_models.py), in its field order.
name, cron, interval_seconds, timezone, conversation_id, user_id, tenant_id, content, request,
overlap, catch_up, catch_up_limit, paused, next_fire_at, last_tick_at, last_run_id,
fired_ticks, skipped_ticks, last_skipped_at, created_at, updated_at

-- name: add_schedule
-- A name taken returns nothing (the caller refuses it).
INSERT INTO {schema}.schedule (
    name, cron, interval_seconds, timezone, conversation_id, user_id, tenant_id, content,
    request, overlap, catch_up, catch_up_limit, paused, next_fire_at
) VALUES (
    %(name)s, %(cron)s, %(interval_seconds)s, %(timezone)s, %(conversation_id)s, %(user_id)s,
    %(tenant_id)s, %(content)s::jsonb, %(request)s::jsonb, %(overlap)s, %(catch_up)s,
    %(catch_up_limit)s, %(paused)s, %(next_fire_at)s
)
ON CONFLICT (name) DO NOTHING
RETURNING {schedule_columns}

-- name: list_schedules
SELECT {schedule_columns} FROM {schema}.schedule ORDER BY name

-- name: get_schedule
SELECT {schedule_columns} FROM {schema}.schedule WHERE name = %(name)s

-- name: lock_schedule
-- A pause or a resume: the row, held until the caller's transaction ends, so a fire in
-- flight finishes first and the new next_fire_at is computed from what it left.
SELECT {schedule_columns} FROM {schema}.schedule WHERE name = %(name)s FOR UPDATE

-- name: set_schedule_paused
UPDATE {schema}.schedule
SET paused = %(paused)s, next_fire_at = %(next_fire_at)s, updated_at = now()
WHERE name = %(name)s
RETURNING {schedule_columns}

-- name: remove_schedule
DELETE FROM {schema}.schedule WHERE name = %(name)s RETURNING name

-- name: due_schedule
-- One due schedule, locked until the fire's transaction ends; a schedule another worker
-- is firing is skipped, not waited for. previous_live: whether the run of its last fired
-- tick is still in its conversation's way (the overlap policy's question). at: the fire's
-- clock (the server's, unless a test gives one). passing: schedules this worker could not
-- read in this pass (an unknown zone, a cron it cannot parse), left for another.
SELECT {schedule_columns},
       EXISTS (SELECT 1 FROM {schema}.agent_run r
               WHERE r.id = s.last_run_id AND r.status IN {live_status}) AS previous_live,
       coalesce(%(now)s::timestamptz, now()) AS at
FROM {schema}.schedule s
WHERE NOT s.paused AND s.next_fire_at <= coalesce(%(now)s::timestamptz, now())
  AND NOT s.name = ANY(%(passing)s::text[])
ORDER BY s.next_fire_at
LIMIT 1
FOR UPDATE OF s SKIP LOCKED

-- name: advance_schedule
-- In the fire's transaction, after the ticks' enqueues: the next tick, and what was done.
UPDATE {schema}.schedule
SET next_fire_at = %(next_fire_at)s,
    last_tick_at = coalesce(%(last_tick_at)s, last_tick_at),
    last_run_id = coalesce(%(last_run_id)s, last_run_id),
    fired_ticks = fired_ticks + %(fired)s,
    skipped_ticks = skipped_ticks + %(skipped)s,
    last_skipped_at = coalesce(%(last_skipped_at)s, last_skipped_at),
    updated_at = now()
WHERE name = %(name)s

-- name: next_schedule_due
-- Seconds until the earliest unpaused schedule is due (negative: overdue); NULL: none.
-- passing: as in due_schedule (those this worker cannot read do not wake it).
SELECT extract(epoch FROM min(next_fire_at) - now())::float8
FROM {schema}.schedule WHERE NOT paused AND NOT name = ANY(%(passing)s::text[])
