-- runrow schema, version 19 (#44), step 2 of 3: reads every event once to validate the
-- constraint step 18 added. VALIDATE CONSTRAINT takes SHARE UPDATE EXCLUSIVE: the
-- journal's reads and writes go on while it reads (on a large journal, for a while).
ALTER TABLE {schema}.run_event VALIDATE CONSTRAINT run_event_before_partitions;
