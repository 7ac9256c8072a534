-- Session settings runrow applies to the connections it runs statements on.
--
-- JIT: stock server packages ship jit = on with jit_above_cost = 100000. A claim or a
-- queue position read at depth is estimated above that and would be compiled by LLVM on
-- every execution (hundreds of milliseconds for a statement that runs in a few). No
-- runrow statement is worth compiling, so none runs with JIT: runrow's own connections
-- turn it off for their session once (jit_off_session), and any other connection (the
-- host's pool or connection, or a connection behind a transaction pooler) turns it off
-- for the one statement, pipelined in the same round trip (see src/runrow/_gateway/_exec.py).
--
-- Also the transaction- and session-local bounds the ending writer and the metrics
-- collector set (statement_timeout, lock_timeout).

-- name: jit_off_session
-- (Also generic plans: runrow's statements are written to be planned once, whatever
-- their parameters, and at depth a custom plan costs 1-3 ms of planning per call, more
-- than the claim itself runs; see bench/backlog_plans.py.)
-- And the bound on how long a transaction runrow opens on it may wait for runrow's next
-- statement (own_transaction_local's, set once here: see there).
SELECT set_config('jit', 'off', false), set_config('plan_cache_mode', 'force_generic_plan', false),
       set_config('idle_in_transaction_session_timeout', %(idle)s, false)

-- name: jit_off_local
-- In an implicit transaction (an autocommit connection's pipeline: everything up to the
-- Sync is one transaction): lasts until it ends. (runrow's own transactions turn it off
-- with own_transaction_local.)
SELECT set_config('jit', 'off', true)

-- name: own_transaction_local
-- The first statement of a transaction runrow opens itself on a connection whose session
-- it did not set up (src/runrow/_gateway/_exec.py, own_transaction): JIT off, and a bound
-- on how long the transaction may sit waiting for its client. A process frozen
-- mid-transaction (SIGSTOP, a paused VM) then loses its session after %(idle)s and the
-- rows it locked go free, a lost run's among them, which the reaper must end. Both end
-- with the transaction. (Nothing bounds a client frozen between a pipeline's statements
-- and its sync before PostgreSQL 17's transaction_timeout: see the reaper's SKIP LOCKED.)
SELECT set_config('jit', 'off', true), set_config('idle_in_transaction_session_timeout', %(idle)s, true)

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

-- name: ending_budget
-- Pipelined ahead of finalize, in the same round trip and the same (implicit)
-- transaction: the server itself ends the ending's statement (and bounds its commit's
-- lock wait) before the worker gives up on it, so an ending given up is never left
-- waiting, e.g. on a locked row, to commit later. Transaction-local: nothing stays set.
-- It also turns JIT off for the finalize (sql/session.sql), so that the finalize needs
-- no guard of its own: a guard's pipeline nested in this one would sync, ending this
-- transaction, and the budget with it, before the finalize ran.
SELECT set_config('statement_timeout', %(timeout)s, true), set_config('lock_timeout', %(timeout)s, true),
       set_config('jit', 'off', true)

-- name: ending_budget_session
-- The same bound for the session of the ending writer's own connection (one runrow
-- opened and keeps; never the host's, never behind a transaction pooler), set once with
-- the first finalize it carries: later endings whose budget leaves at least this much
-- time are sent alone. The bound comes off (ending_budget_unset) before the connection
-- goes back to the pool; if that fails, the connection is closed instead.
SELECT set_config('statement_timeout', %(timeout)s, false), set_config('lock_timeout', %(timeout)s, false)

-- name: ending_budget_unset
-- Both settings back to the values the session started with (its reset values: the
-- server's, the role's, or the connection's own options).
SELECT set_config(name, reset_val, false) FROM pg_settings
WHERE name IN ('statement_timeout', 'lock_timeout')

-- name: metrics_statement_timeout
-- Bounds the scrape-time read on the server too, for this transaction only (a
-- transaction-local setting is safe behind a transaction-pooling pgbouncer).
SELECT set_config('statement_timeout', %(timeout_ms)s, true)
