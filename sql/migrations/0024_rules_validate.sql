-- runrow schema, version 24, step 4 of 4: validates the constraints steps 21-23 added
-- NOT VALID, reading each table once. VALIDATE takes SHARE UPDATE EXCLUSIVE, which lets
-- reads and writes go on meanwhile (and holds off only vacuum and schema changes).
ALTER TABLE {schema}.agent_run VALIDATE CONSTRAINT agent_run_rules;
ALTER TABLE {schema}.run_step VALIDATE CONSTRAINT run_step_rules;
ALTER TABLE {schema}.message VALIDATE CONSTRAINT message_rules;
