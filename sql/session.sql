-- Session settings runrow applies to the connections it runs statements on.
--
-- JIT: stock server packages ship jit = on with jit_above_cost = 100000. A claim or a
-- queue position read at depth is estimated above that and would be compiled by LLVM on
-- every execution (hundreds of milliseconds for a statement that runs in a few). No
-- runrow statement is worth compiling, so none runs with JIT: runrow's own connections
-- turn it off for their session once (jit_off_session), and any other connection (the
-- host's pool or connection, or a connection behind a transaction pooler) turns it off
-- for the one statement, pipelined in the same round trip (see src/runrow/_db.py).

-- name: jit_off_session
-- (Also generic plans: runrow's statements are written to be planned once, whatever
-- their parameters, and at depth a custom plan costs 1-3 ms of planning per call, more
-- than the claim itself runs; see bench/backlog_plans.py.)
SELECT set_config('jit', 'off', false), set_config('plan_cache_mode', 'force_generic_plan', false)

-- name: jit_off_local
-- In an implicit transaction (an autocommit connection's pipeline: everything up to the
-- Sync is one transaction) or runrow's own transaction: lasts until it ends.
SELECT set_config('jit', 'off', true)

-- name: jit_save_off_local
-- Inside the host's transaction: remember its setting, then turn JIT off...
SELECT set_config('runrow.saved_jit', current_setting('jit'), true), set_config('jit', 'off', true)

-- name: jit_restore_local
-- ...and put the host's setting back after runrow's statement, in the same round trip.
SELECT set_config('jit', current_setting('runrow.saved_jit'), true)

-- name: jit_provider_available
-- Whether this server can compile at all (a JIT provider is installed and loads), asked
-- once per connection: servers built without LLVM need no guard. jit is turned on for
-- this statement's own implicit transaction only (the connection is in autocommit and
-- idle), so the session's own setting neither hides the answer nor changes.
SELECT pg_jit_available() FROM (SELECT set_config('jit', 'on', true) OFFSET 0) s
