-- runrow schema, version 20 (#44), step 3 of 3: the journal becomes a table partitioned by
-- run_ms(run_id), with the journal so far as its legacy partition (keys below 1), and new
-- runs get time-ordered ids. Catalog changes only: the legacy partition is attached
-- without being read (step 19 proved its rows fit), and the first partitions are made
-- empty. The locks are short but exclusive: the rename and the attach wait for
-- transactions using the journal to end, and hold new ones until this commits.
--
-- Expand: a previous release reads and writes `run_event` by name, with the same columns,
-- and its rows are routed by the key; it does not prune, so its reads look into every
-- partition's keys (correct, a little slower). The name `run_event_legacy` is new.
ALTER TABLE {schema}.run_event RENAME TO run_event_legacy;

CREATE TABLE {schema}.run_event (
    run_id     uuid        NOT NULL,
    seq        integer     NOT NULL CONSTRAINT run_event_seq_check CHECK (seq > 0),
    type       text        NOT NULL CONSTRAINT run_event_type_check CHECK (type <> ''),
    payload    jsonb       NOT NULL DEFAULT '{{}}'::jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    -- (Declared here, while the table is empty; the legacy table's own key is the same,
    -- so attaching it adopts that one instead of checking every row again.)
    CONSTRAINT run_event_run_id_fkey FOREIGN KEY (run_id)
        REFERENCES {schema}.agent_run (id) ON DELETE CASCADE
) PARTITION BY RANGE ({schema}.run_ms(run_id));

ALTER TABLE {schema}.run_event ATTACH PARTITION {schema}.run_event_legacy FOR VALUES FROM (MINVALUE) TO (1);

ALTER TABLE {schema}.agent_run ALTER COLUMN id SET DEFAULT {schema}.new_run_id();

SELECT {schema}.journal_ensure_partitions();
