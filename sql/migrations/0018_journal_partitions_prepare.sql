-- runrow schema, version 18 (#44 points 1-2), step 1 of 3: the journal, partitioned by
-- the time its runs were made. Steps 18-20 each run in a transaction of their own so that
-- none holds a long lock on a large journal: 18 is catalog changes only, 19 checks the
-- existing rows under a lock that lets reads and writes go on, 20 swaps tables in place.
--
-- The partition key is the millisecond at which a run was made, read from its id:
-- from version 20 on run ids are time-ordered (the UUIDv7 layout: the first 48 bits are
-- the Unix time in ms, then the version nibble 7). Every event of a run carries the run's
-- id, so a run's whole journal lives in one partition, and the journal's keys (run_id,
-- seq) and its one terminal event per run stay unique across the table (a partition
-- holds them unique, and no run spans two). A read that names a run prunes to that one
-- partition; retention drops whole partitions (see trim). Ids made before version 20
-- (random, version 4) have key 0: their events stay in the table as it is today, which
-- becomes the partition for keys below 1 ("legacy").
--
-- Expand only: a previous release writes the same columns; its runs' ids are still
-- version 4 until step 20 changes the default, and then their events are routed by the
-- same key.

-- The millisecond a run was made, from its id; 0 for an id that is not time-ordered.
-- IMMUTABLE and plain SQL, so the planner inlines it and prunes on it.
CREATE FUNCTION {schema}.run_ms(id uuid) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN get_byte(uuid_send(id), 6) >> 4 = 7
                THEN ('x' || encode(substring(uuid_send(id) FROM 1 FOR 6), 'hex'))::bit(48)::bigint
                ELSE 0 END
$$;

-- A run id made at `at`: its ms first, then random bits (a version-4 id's, with the
-- version nibble set to 7). For loading runs made in the past (a backfill, a benchmark).
CREATE FUNCTION {schema}.run_id_at(at timestamptz) RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT encode(set_bit(set_bit(
               overlay(uuid_send(gen_random_uuid())
                       PLACING substring(int8send((extract(epoch FROM at) * 1000)::bigint) FROM 3)
                       FROM 1 FOR 6),
               52, 1), 53, 1), 'hex')::uuid
$$;

-- A new run id, made now by the database's clock, not a host's, so that every process
-- routes to partitions made by the same clock.
CREATE FUNCTION {schema}.new_run_id() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT {schema}.run_id_at(clock_timestamp())
$$;

-- How the journal is cut: one partition per partition_seconds of run creation, and
-- premake partitions kept ready past now (workers and migrate make them ahead; see
-- journal_ensure_partitions). One row.
CREATE TABLE {schema}.journal_settings (
    only_row          boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    partition_seconds integer NOT NULL DEFAULT 86400 CHECK (partition_seconds >= 1),
    premake           integer NOT NULL DEFAULT 4 CHECK (premake BETWEEN 1 AND 1000)
);
INSERT INTO {schema}.journal_settings DEFAULT VALUES;

-- Makes the journal's partitions up to premake intervals past `at` (none before the
-- newest one that exists), and returns how many it made. Each is made empty, with its
-- keys, then attached: attaching takes a lock on the journal that lets its reads and
-- writes go on (making one as a partition directly would take one that stops them).
-- Serialised per schema; lock_timeout bounds the wait behind a long transaction (a
-- later call tries again: partitions are made well ahead).
CREATE FUNCTION {schema}.journal_ensure_partitions(at timestamptz DEFAULT now()) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    nsp name := (SELECT n.nspname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
                 WHERE t.oid = pg_typeof(NULL::{schema}.journal_settings));
    step bigint;
    upto bigint;
    top bigint;
    lo bigint;
    hi bigint;
    part text;
    made integer := 0;
BEGIN
    IF to_regclass(format('%I.run_event', nsp)) IS NULL
       OR NOT EXISTS (SELECT 1 FROM pg_partitioned_table
                      WHERE partrelid = to_regclass(format('%I.run_event', nsp))) THEN
        RETURN 0;  -- (before step 20: the journal is not partitioned yet)
    END IF;
    PERFORM set_config('lock_timeout', '5s', true);
    PERFORM pg_advisory_xact_lock(hashtextextended(nsp || ':runrow.journal_partitions', 0));
    SELECT partition_seconds::bigint * 1000, premake INTO step, upto FROM {schema}.journal_settings;
    upto := (extract(epoch FROM at) * 1000)::bigint + upto * step;
    SELECT max(b.hi) INTO top FROM {schema}.journal_partition_bounds() b WHERE b.lo >= 1;
    IF top IS NULL THEN  -- the first: from the interval `at` is in, aligned (ids come
        -- from the database's clock, so no run is made before the first partition)
        top := greatest(1, ((extract(epoch FROM at) * 1000)::bigint / step) * step);
    END IF;
    WHILE top < upto LOOP
        lo := top;
        hi := (lo / step + 1) * step;  -- (realigns after partition_seconds changed)
        part := 'run_event_' || to_char(to_timestamp(lo / 1000.0) AT TIME ZONE 'UTC', 'YYYYMMDD"t"HH24MISS');
        EXECUTE format('CREATE TABLE %I.%I (LIKE %I.run_event INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
                       nsp, part, nsp);
        EXECUTE format('ALTER TABLE %I.%I ADD PRIMARY KEY (run_id, seq)', nsp, part);
        EXECUTE format('CREATE UNIQUE INDEX %I ON %I.%I (run_id) WHERE type = ''complete''',
                       part || '_one_terminal', nsp, part);
        EXECUTE format('ALTER TABLE %I.run_event ATTACH PARTITION %I.%I FOR VALUES FROM (%s) TO (%s)',
                       nsp, nsp, part, lo, hi);
        made := made + 1;
        top := hi;
    END LOOP;
    RETURN made;
END
$$;

-- The journal's partitions and their bounds in ms of run creation (lo NULL: the legacy
-- partition, from MINVALUE), read from the catalog: nothing to keep in step by hand.
CREATE FUNCTION {schema}.journal_partition_bounds()
RETURNS TABLE (name name, lo bigint, hi bigint, detach_pending boolean, rows_estimate bigint)
LANGUAGE sql STABLE AS $$
    SELECT c.relname,
           (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''?(-?\d+)''?\)'))[1]::bigint,
           (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''?(-?\d+)''?\)'))[1]::bigint,
           i.inhdetachpending,
           greatest(c.reltuples, 0)::bigint
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = to_regclass(format('%I.run_event',
              (SELECT n.nspname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
               WHERE t.oid = pg_typeof(NULL::{schema}.journal_settings))))
$$;

-- Step 19 checks that every event written so far has key 0, so that step 20 attaches the
-- table as the legacy partition without reading it again under a lock. NOT VALID here:
-- only new rows are checked, and a previous release writes only version-4 ids until
-- step 20 (and then to the partitioned table, never to this one). The IS NOT NULL half is
-- needed: a range partition's bounds include "key IS NOT NULL", which a CHECK on
-- `key < 1` alone (true or null) does not prove, and without the proof the attach reads
-- every row under its exclusive lock.
-- holds for old writers: run_event_before_partitions
ALTER TABLE {schema}.run_event ADD CONSTRAINT run_event_before_partitions
    CHECK ({schema}.run_ms(run_id) IS NOT NULL AND {schema}.run_ms(run_id) < 1) NOT VALID;
