-- +goose NO TRANSACTION
-- +goose Up
-- Per-session lookups must use a per-session index whatever the planner
-- knows. Before this migration the executor's hot statements (waiting inputs
-- of a session; the fence on a session's claim) were planned, on a table
-- without statistics (a new database, or one that autovacuum has not yet
-- analysed), on the cross-session partial indexes inputs_redrive and
-- claims_expiry, and so scanned every waiting input and every live claim:
-- each turn cost O(backlog), and under load the backlog grew until the
-- executor stalled (measured: 2.5 ms per waiting-inputs count and 1.1 ms per
-- fence at a backlog of a few thousand; docs/benchmarks.md).
--
-- inputs: the session index carries exactly the predicate of the
-- waiting_inputs view and replaces inputs_waiting, whose wider predicate no
-- query needs. inputs_redrive gains "admitted_at IS NOT NULL" (always true:
-- the column is NOT NULL) so that only a query with a strict condition on
-- admitted_at — recovery's redrive, "admitted_at < now() - ..." — can use
-- it: the planner proves a partial index's predicate from the query's own
-- conditions, not from column constraints. Without statistics it otherwise
-- preferred scanning the whole (smaller) redrive index to the session
-- index, even with session_id as an index condition.
--
-- claims: the table holds one row per running (or expired) session, a few
-- hundred or thousand rows; recovery's scan for expired claims reads it
-- whole at no real cost, while the index on expires_at made every fence (it
-- renews expires_at) a non-HOT update and competed with the primary key.
-- A lower fillfactor leaves room on each page for those HOT updates.
--
-- CONCURRENTLY, so that upgrading a running deployment does not block
-- admission while the index builds. An interrupted run may leave an invalid
-- index behind; it is dropped first.
DROP INDEX CONCURRENTLY IF EXISTS inputs_waiting_session;
CREATE INDEX CONCURRENTLY inputs_waiting_session ON inputs (session_id, admission_seq)
    WHERE promotion_seq IS NULL AND wake_pending AND quarantine_reason IS NULL;
DROP INDEX CONCURRENTLY IF EXISTS inputs_waiting;
DROP INDEX CONCURRENTLY IF EXISTS inputs_redrive_admitted;
CREATE INDEX CONCURRENTLY inputs_redrive_admitted ON inputs (admitted_at)
    WHERE promotion_seq IS NULL AND wake_pending AND quarantine_reason IS NULL AND admitted_at IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS inputs_redrive;
DROP INDEX CONCURRENTLY IF EXISTS claims_expiry;
ALTER TABLE claims SET (fillfactor = 70);

-- The fence that opens every write of an execution (docs/design.md, invariant 5):
-- the claim's token matches, its lease is live by the database clock and it
-- is not quarantined; the lease is renewed in the same statement, and so is
-- the phase when the caller sets one (p_phase NULL keeps it; the phase
-- commits with the writes it describes, invariant 8). A lost claim raises
-- SQLSTATE PLFEN instead of affecting zero rows, so that the executor can
-- queue its statements behind the fence and send a whole transaction in one
-- round trip: the error rolls everything back.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION promptline_fence(p_session text, p_execution text, p_token bigint, p_lease_ms bigint,
                                            p_phase text DEFAULT NULL, p_assistant text DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE claims SET expires_at = now() + p_lease_ms * interval '1 millisecond', renewed_at = now(),
                      phase = coalesce(p_phase, phase),
                      assistant_message_id = coalesce(nullif(p_assistant, ''), assistant_message_id)
    WHERE session_id = p_session AND execution_id = p_execution AND fencing_token = p_token
      AND expires_at > now() AND quarantine_reason IS NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'execution % of session % is fenced: its claim (token %) is lost', p_execution, p_session, p_token
            USING ERRCODE = 'PLFEN';
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
SELECT 'down migrations are not supported';
