-- runrow schema, version 26: a step's record is a heap-only update.
--
-- A durable step writes its row twice: begun (status 'started') before its body runs,
-- then its outcome. The outcome changes `status`, and `run_step_waiting_idx` named
-- `status` in its predicate, so PostgreSQL could never make that update heap-only
-- (HOT): every record wrote a new entry into each of the table's indexes (the primary
-- key and the position index), about 190 bytes of WAL a step on Debian's
-- PostgreSQL 15. The waiting index served two operator lookups (provide_input and
-- waiting_inputs), which since this version find a waiting step by its lineage through
-- the primary key instead, so the index goes: no index of run_step now names a column
-- that recording a step changes (tests/test_steps_hot.py holds that). A page keeps a
-- fifth free for the new versions of its rows: with the default (full pages) a
-- record found room on its own page 94% of the time, with 80 every time (16 turns in
-- flight, 3 steps each, small results).
--
-- A previous release still running beside this schema reads a waiting step by run id:
-- without the index that is a scan of run_step, for a person's answer and for the
-- list of waiting inputs only (never for a claim, a step or an ending). The fill factor
-- applies to pages written from now on; existing pages are left as they are.

DROP INDEX {schema}.run_step_waiting_idx;
ALTER TABLE {schema}.run_step SET (fillfactor = 80);
