-- runrow schema, version 16 (#41): one resumable stream for a tree of runs, and a cap on
-- a tree's running runs (at the end). A tree's events live in its runs' own journals
-- (run_event); a tree tail gives them one order of its own, a gap-free position per
-- event counted from 1 across the whole tree, so that a
-- client resumes the tree from one number, as it resumes a run from its seq.
--
-- The order is fixed by the readers, not by the workers: a tree tail appends blocks (a
-- run's next events, seq first_seq..last_seq, all committed) to tree_log under the tree's
-- advisory lock, and every reader of the tree, in any process, reads the same blocks. A
-- worker writes nothing here: a tree nobody tails costs nothing. tree_member keeps each
-- run's progress (how far its journal is logged; done once its ending is), so a pass
-- reads the journals of the tree's live runs only.
--
-- No foreign keys: runs are never deleted (retention trims journals, see trim), and a
-- key check would lock each run's row for share from a tail, beside its worker's writes.
-- Expand only: new tables that a previous release never touches.
CREATE TABLE {schema}.tree_log (
    -- The tree's root turn (its first run).
    root_run_id uuid NOT NULL,
    -- The position of the block's last event in the tree's stream; its first event is at
    -- end_ord - (last_seq - first_seq). Blocks tile the positions 1..max(end_ord).
    end_ord     bigint NOT NULL CONSTRAINT tree_log_end_ord_check CHECK (end_ord >= 1),
    run_id      uuid NOT NULL,
    first_seq   integer NOT NULL,
    last_seq    integer NOT NULL,
    PRIMARY KEY (root_run_id, end_ord),
    CONSTRAINT tree_log_block_check CHECK (first_seq >= 1 AND last_seq >= first_seq
                                           AND end_ord - (last_seq - first_seq) >= 1)
);
CREATE TABLE {schema}.tree_member (
    root_run_id uuid NOT NULL,
    run_id      uuid NOT NULL,
    -- The run's journal is in tree_log up to this seq.
    logged_seq  integer NOT NULL CONSTRAINT tree_member_logged_check CHECK (logged_seq >= 0),
    -- Ended, and its journal logged to its ending: later passes skip it.
    done        boolean NOT NULL DEFAULT false,
    PRIMARY KEY (root_run_id, run_id)
);

-- Dispatcher(max_running_per_tree=N) (#41 point 3): a claim counts a tree's running
-- spawned runs (up to N) by this index, never by reading the whole tree. Only spawned
-- runs that are running are in it: a run no tree spawned never is.
CREATE INDEX agent_run_tree_running_idx ON {schema}.agent_run (root_run_id)
    WHERE status = 'running' AND root_run_id IS NOT NULL;
