-- runrow schema, version 28 (#44 point 2): retention in O(partitions), no per-run write.
--
-- Until now trim marked each run it trimmed (journal_trimmed, request NULL): one row
-- update per run, none of them heap-only (journal_trimmed is in the predicate of
-- agent_run_untrimmed_idx, so every index of agent_run took a new entry), ~13 us a run
-- on Debian's PostgreSQL 15 and 17.7 s for a day of 1.4M runs. Now a partition's runs are
-- trimmed together, by one row: trim retires a partition (its range of creation times
-- goes into journal_retired) once nobody needs it, deletes the step records and tree
-- streams keyed by runs made in it (ranges of their keys), and drops it. A run made in a
-- retired range is trimmed, whether or not its flag is set. Version-4 ids (made before
-- version 20; key 0) are in no range: their flag still says.
--
-- The lock row orders trim against retry: trim holds it FOR UPDATE from before it checks
-- that no run of a partition's lineages is unfinished until its range is written; a
-- retry takes it FOR SHARE (the trigger below) before its row is written. So a retry
-- either commits first (trim then sees its unfinished run, and keeps the partition) or
-- waits and then reads the new range and is refused: a retry never replays a lineage
-- whose step records are gone (it would run its steps again).
--
-- Expand only: a previous release's trim marks runs one by one and drops a partition
-- once all are marked, as before (a marked run is trimmed either way), and its retry
-- passes through the same trigger.

-- Runs made in [lo_ms, hi_ms) are trimmed (their journal partition retired). Adjacent
-- ranges are merged as they are written, so the table stays a few rows long.
CREATE TABLE {schema}.journal_retired (
    lo_ms bigint PRIMARY KEY CHECK (lo_ms >= 1),
    hi_ms bigint NOT NULL,
    CHECK (hi_ms > lo_ms)
);

-- One row, only ever locked: trim's FOR UPDATE against a retry's FOR SHARE (above).
CREATE TABLE {schema}.journal_retire_lock (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row)
);
INSERT INTO {schema}.journal_retire_lock DEFAULT VALUES;

-- Whether the run (or lineage) with this id was made in a retired range. False for a
-- version-4 id (key 0).
CREATE FUNCTION {schema}.run_retired(id uuid) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT EXISTS (SELECT 1 FROM {schema}.journal_retired
                   WHERE lo_ms <= {schema}.run_ms(id) AND hi_ms > {schema}.run_ms(id))
$$;

-- The least run id made at millisecond `ms` (a partition's bound as a key of agent_run,
-- run_step or the tree tables: a range of ids is a range of creation times).
CREATE FUNCTION {schema}.run_id_floor(ms bigint) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (lpad(to_hex(ms), 12, '0') || repeat('0', 20))::uuid
$$;

-- A retry (a run with retry_of) of a lineage in a retired range is refused, whoever
-- writes it. VOLATILE: after the lock is granted, the check below runs on a new
-- snapshot, which sees the range a trim that held the lock committed.
CREATE FUNCTION {schema}.refuse_retired_retry() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM 1 FROM {schema}.journal_retire_lock FOR SHARE;
    IF {schema}.run_retired(NEW.lineage_id) THEN
        RAISE EXCEPTION 'run % retries a turn whose journal retention retired', NEW.retry_of
            USING ERRCODE = 'check_violation', CONSTRAINT = 'agent_run_retry_unretired',
                  TABLE = 'agent_run';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER agent_run_retry_unretired
    BEFORE INSERT ON {schema}.agent_run
    FOR EACH ROW WHEN (NEW.retry_of IS NOT NULL)
    EXECUTE FUNCTION {schema}.refuse_retired_retry();
