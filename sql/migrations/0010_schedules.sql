-- runrow schema, version 10 (#42): schedules. A schedule is a row: when it fires (a cron
-- expression in its time zone, or an interval), what it enqueues, and its policies. Any
-- worker fires a due schedule under FOR UPDATE SKIP LOCKED and, in the same transaction,
-- enqueues the tick (idempotency key schedule:<name>:<tick>) and advances next_fire_at.
-- Expand only: a new table that a previous release never touches.
-- (Numbered 11: 10 is another change's; the loader accepts a gap, see src/runrow/_sql.py.)
CREATE TABLE {schema}.schedule (
    name             text PRIMARY KEY CONSTRAINT schedule_name_check CHECK (length(name) BETWEEN 1 AND 100),
    cron             text CONSTRAINT schedule_cron_check CHECK (length(cron) BETWEEN 1 AND 200),
    interval_seconds double precision CONSTRAINT schedule_interval_check CHECK (interval_seconds > 0),
    -- An IANA zone (zoneinfo): the zone the cron expression is read in.
    timezone         text NOT NULL DEFAULT 'UTC',
    conversation_id  text NOT NULL,
    user_id          text NOT NULL,
    tenant_id        text,
    content          jsonb NOT NULL,
    request          jsonb,
    -- skip: a tick while the schedule's previous run is live is skipped (and counted);
    -- queue: it is enqueued behind it.
    overlap          text NOT NULL DEFAULT 'skip' CONSTRAINT schedule_overlap_check CHECK (overlap IN ('skip', 'queue')),
    -- After downtime: none (missed ticks are dropped), last (the latest only), all (each,
    -- up to catch_up_limit of the latest).
    catch_up         text NOT NULL DEFAULT 'last' CONSTRAINT schedule_catch_up_check CHECK (catch_up IN ('none', 'last', 'all')),
    catch_up_limit   integer NOT NULL DEFAULT 100 CONSTRAINT schedule_catch_up_limit_check CHECK (catch_up_limit BETWEEN 1 AND 10000),
    paused           boolean NOT NULL DEFAULT false,
    next_fire_at     timestamptz NOT NULL,
    last_tick_at     timestamptz,
    last_run_id      uuid,
    fired_ticks      bigint NOT NULL DEFAULT 0,
    skipped_ticks    bigint NOT NULL DEFAULT 0,
    last_skipped_at  timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT schedule_when_check CHECK ((cron IS NULL) <> (interval_seconds IS NULL))
);
-- The dispatchers' one question: which unpaused schedule is due first.
CREATE INDEX schedule_due_idx ON {schema}.schedule (next_fire_at) WHERE NOT paused;
