-- +goose NO TRANSACTION
-- +goose Up
-- The ledger read by session and by execution, through an index. Before
-- this migration no index served tool_calls by session nor attempts by
-- execution (00003 indexes attempts by session and tool calls by attempt
-- only), so recovery's evidence reads and its reconcile updates, every
-- failed turn's update (made while it holds the session row's lock) and
-- every continuation's read of its requested calls scanned the whole table:
-- 177-245 ms per statement at 1 M rows, about 40 s for a recovery pass of
-- 100 claims, and past the statement timeout (docs/benchmarks.md).
--
-- tool_calls_session: every per-session statement on tool_calls (state
-- filters are applied on the session's rows; no partial index on state, so
-- that a call's state changes stay HOT updates). attempts_execution:
-- recovery's per-execution reads and updates, and the ledger pruner.
-- permission_requests_call: the foreign key from permission requests to
-- tool calls, which every deleted tool call checks (the ledger pruner).
--
-- CONCURRENTLY, as in 00007, so that upgrading a running deployment blocks
-- no writer while the indexes build; a run cut short may leave an invalid
-- index behind, so each is dropped first and the file can run again.
DROP INDEX CONCURRENTLY IF EXISTS tool_calls_session;
CREATE INDEX CONCURRENTLY tool_calls_session ON tool_calls (session_id, requested_at);
DROP INDEX CONCURRENTLY IF EXISTS attempts_execution;
CREATE INDEX CONCURRENTLY attempts_execution ON attempts (execution_id, step);
DROP INDEX CONCURRENTLY IF EXISTS permission_requests_call;
CREATE INDEX CONCURRENTLY permission_requests_call ON permission_requests (call_id);

-- +goose Down
SELECT 'down migrations are not supported';
