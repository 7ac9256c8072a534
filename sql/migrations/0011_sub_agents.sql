-- runrow schema, version 13 (#41): sub-agents. A run names the agent that runs it (an
-- agent key), and a run may spawn child runs and park until they end. Expand only: every
-- new column is nullable (a previous release's writes leave them NULL, which means "the
-- default agent" and "no parent"), and no previous statement reads them.

-- The agent that runs it: a key a Dispatcher serves (Dispatcher(agents=...)); NULL is
-- the default agent (Dispatcher(agent)). A retry keeps it.
ALTER TABLE {schema}.agent_run ADD COLUMN agent_key text
    CONSTRAINT agent_run_agent_key_check CHECK (length(agent_key) BETWEEN 1 AND 200);
-- A child's parent and root: the first run (lineage) of the spawning turn and of the
-- tree's root turn. Set at insert and never changed, so a cycle cannot be made. Both NULL
-- for a root (a turn enqueued by a host).
ALTER TABLE {schema}.agent_run ADD COLUMN parent_run_id uuid REFERENCES {schema}.agent_run (id);
-- (Checked with the new column: a previous release writes neither, so it always holds.)
ALTER TABLE {schema}.agent_run ADD COLUMN root_run_id uuid REFERENCES {schema}.agent_run (id)
    CONSTRAINT agent_run_tree_check CHECK ((parent_run_id IS NULL) = (root_run_id IS NULL));
-- A parent parked on its children (RunContext.wait_for_children): the children (by first
-- run) it waits on, and whether the first of them to end is enough. Every child's ending
-- appends the child to children_ended of its parent's live run, in the ending's
-- transaction, and requeues the parent once what it waits on has ended. Kept on the
-- parent's row so that a child's ending and the parent's park, which both update it, see
-- each other's writes whichever commits first.
ALTER TABLE {schema}.agent_run ADD COLUMN awaiting uuid[];
ALTER TABLE {schema}.agent_run ADD COLUMN await_any boolean;
ALTER TABLE {schema}.agent_run ADD COLUMN children_ended uuid[];
-- A tree's runs (a stop reaches every descendant) and a parent's children, by index.
CREATE INDEX agent_run_root_idx ON {schema}.agent_run (root_run_id) WHERE root_run_id IS NOT NULL;
CREATE INDEX agent_run_parent_idx ON {schema}.agent_run (parent_run_id) WHERE parent_run_id IS NOT NULL;

-- The agent keys a worker serves (NULL, as a previous release registers: the default only).
ALTER TABLE {schema}.worker ADD COLUMN agent_keys text[];
-- Whether it serves the default agent (NULL: yes, as a previous release does).
ALTER TABLE {schema}.worker ADD COLUMN serves_default boolean;
