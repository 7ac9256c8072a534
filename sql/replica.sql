-- Tails served from a hot standby (see src/runrow/_replica.py).
--
-- Notifications come from the primary only. A tail woken by one asks the primary how far
-- its WAL goes (primary_wal_lsn), then reads the standby only once the standby has
-- replayed that far (replica_replayed): before, its read could miss the notified commit
-- and conclude "nothing new". A read is a prefix of the run's journal after a cursor, so a
-- lagging standby can only make it late, never skip or repeat an event.

-- name: primary_wal_lsn
-- Where the primary's WAL ends now: every commit notified so far lies before it. The
-- insert position, not pg_current_wal_lsn() (the write position): with
-- synchronous_commit = off a notified commit may still sit in the WAL buffers, past the
-- write position, and a standby replayed up to that would not hold it yet.
SELECT pg_current_wal_insert_lsn()::text

-- name: replica_replayed
-- Whether the standby has replayed the WAL up to %(lsn)s. On a server that is not in
-- recovery (a standby promoted, or a primary given as the replica) everything it holds
-- is its own: true.
SELECT NOT pg_is_in_recovery() OR coalesce(pg_last_wal_replay_lsn() >= %(lsn)s::pg_lsn, false)
