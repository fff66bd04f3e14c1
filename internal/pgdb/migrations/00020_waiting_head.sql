-- +goose NO TRANSACTION
-- +goose Up
-- A turn reads the head of its session's queue, not the whole queue.
-- Before this migration every turn read every waiting input of its session
-- (the executor's view, with window functions over all of them), and the
-- claim taken with the first turn compared the array of all their IDs with
-- the read's (promptline_claim_as_read, 00009): a session with 100,000
-- prompts waiting spent about a second a turn, and drained its queue in
-- quadratic time (docs/benchmarks.md, "A deep queue").
--
-- What a turn does depends on three parts of the queue only, together its
-- head (promptline_waiting_head):
--   - the oldest waiting input (the turn's input when no steer waits);
--   - the oldest waiting steers, up to 100 (the executor's
--     maxSteersPerTurn, which must not exceed it): steers jump the queue,
--     a turn takes some of these, and whether any steer waits is whether
--     this part is empty;
--   - the oldest waiting input that is not a prompt (a continuation or a
--     permission reply): whether one waits decides the path (the
--     transactional path takes the first of them).
-- Each part is an ordered index scan of one session that stops at its
-- limit, whatever the planner knows. Its session is a range of one value,
-- not an equality, and its order is (session_id, admission_seq): with
-- "session_id = $1 ORDER BY admission_seq LIMIT 1" the planner, given the
-- table's statistics, read inputs_admission_seq_key from the start of
-- every session's inputs, filtering on the session (measured: 20,606 rows
-- read for a head of 102; TestATurnReadsTheHeadOfADeepQueue); an equality
-- makes session_id a constant and drops it from the order, so any index
-- on admission_seq serves it, while (session_id, admission_seq) is an
-- order only the per-session indexes give. waiting_inputs
-- stays the one definition of a waiting input; the NOT EXISTS on a pending
-- permission request repeated in the first two parts names the session as
-- a parameter, so it is a one-time test: in a parked session (only a reply
-- waits) they read nothing, rather than every prompt filtered out one by
-- one; the reply is found by the third part.
--
-- Each row carries what a turn decides by (its delivery, its kind, the
-- size of its text: octet_length reads a stored value's size, not the
-- value), so that the head is not joined back to inputs: planned on a
-- table of some thousand rows, that join read the whole table (a hash
-- join). The executor reads the text of the inputs it may take alone, by
-- their key.
--
-- Partial indexes hold the steers and the inputs that are not prompts
-- while they wait (rare rows: a queued prompt adds no entry to either);
-- delivery and kind never change, and promotion_seq, wake_pending and
-- quarantine_reason are already in inputs_waiting_session's predicate, so
-- no update that was HOT stops being HOT. CONCURRENTLY, dropped first, as
-- in 00019: admission is not blocked while they build, and a run cut
-- short runs again.
DROP INDEX CONCURRENTLY IF EXISTS inputs_waiting_steers;
CREATE INDEX CONCURRENTLY inputs_waiting_steers ON inputs (session_id, admission_seq)
    WHERE promotion_seq IS NULL AND wake_pending AND quarantine_reason IS NULL AND delivery = 'steer';
DROP INDEX CONCURRENTLY IF EXISTS inputs_waiting_internal;
CREATE INDEX CONCURRENTLY inputs_waiting_internal ON inputs (session_id, admission_seq)
    WHERE promotion_seq IS NULL AND wake_pending AND quarantine_reason IS NULL AND kind <> 'prompt';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION promptline_waiting_head(p_session text)
RETURNS TABLE (message_id text, admission_seq bigint, delivery text, kind text, size integer) LANGUAGE sql STABLE AS $$
    (SELECT w.message_id, w.admission_seq, w.delivery, w.kind, octet_length(w.text) FROM waiting_inputs w
     WHERE w.session_id >= p_session AND w.session_id <= p_session
       AND NOT EXISTS (SELECT 1 FROM permission_requests p WHERE p.session_id = p_session AND p.status = 'pending')
     ORDER BY w.session_id, w.admission_seq LIMIT 1)
    UNION
    (SELECT w.message_id, w.admission_seq, w.delivery, w.kind, octet_length(w.text) FROM waiting_inputs w
     WHERE w.session_id >= p_session AND w.session_id <= p_session AND w.delivery = 'steer'
       AND NOT EXISTS (SELECT 1 FROM permission_requests p WHERE p.session_id = p_session AND p.status = 'pending')
     ORDER BY w.session_id, w.admission_seq LIMIT 100)
    UNION
    (SELECT w.message_id, w.admission_seq, w.delivery, w.kind, octet_length(w.text) FROM waiting_inputs w
     WHERE w.session_id >= p_session AND w.session_id <= p_session AND w.kind <> 'prompt'
     ORDER BY w.session_id, w.admission_seq LIMIT 1)
$$;
-- +goose StatementEnd

-- The claim taken with a session's first turn (00009) compares the head,
-- not the whole queue, with the read's: p_waiting is the IDs of
-- promptline_waiting_head as the executor read it, in admission order.
-- That is as strong as the whole queue for what the turn does: the turn
-- is chosen from the head alone (its inputs, steers or the oldest, and
-- its path), and its inputs' delivery, kind and text never change, so the
-- same head under the lock is the same turn a fresh read would choose. An
-- input admitted meanwhile behind the head (a queued prompt at the tail, a
-- steer past the hundredth) changes no part of it, and waits for the next
-- turn, as it would have had it come a moment later; any other change (an
-- input admitted into the head, a steer where none waited, a continuation
-- or a reply, an input quarantined, released or promoted, a permission
-- request pending) changes the head and refuses the claim (PLSTA).
-- A consumer of the previous release, during a rolling upgrade, passes
-- the whole queue: its claims are refused whenever more than the head
-- waits, and it claims first (phase ready), as for any stale read.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION promptline_claim_as_read(p_session text, p_execution text, p_owner text,
                                                    p_token bigint, p_lease_ms bigint, p_phase text,
                                                    p_assistant text, p_waiting text[])
RETURNS timestamptz LANGUAGE plpgsql AS $$
DECLARE
    v_token   bigint;
    v_expires timestamptz;
BEGIN
    SELECT fencing_token INTO v_token FROM sessions WHERE session_id = p_session FOR UPDATE;
    IF v_token IS DISTINCT FROM p_token - 1 THEN
        RAISE EXCEPTION 'session %: fencing token % is not the % read', p_session, v_token, p_token - 1
            USING ERRCODE = 'PLSTA';
    END IF;
    IF (SELECT array_agg(h.message_id ORDER BY h.admission_seq) FROM promptline_waiting_head(p_session) h)
       IS DISTINCT FROM p_waiting THEN
        RAISE EXCEPTION 'session %: the head of the waiting inputs changed since it was read', p_session
            USING ERRCODE = 'PLSTA';
    END IF;
    INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, assistant_message_id, expires_at)
    VALUES (p_session, p_execution, p_owner, p_token, p_phase, nullif(p_assistant, ''),
            clock_timestamp() + p_lease_ms * interval '1 millisecond')
    ON CONFLICT (session_id) DO NOTHING
    RETURNING expires_at INTO v_expires;
    IF v_expires IS NULL THEN
        RAISE EXCEPTION 'session %: claim held', p_session USING ERRCODE = 'PLSTA';
    END IF;
    UPDATE sessions SET fencing_token = p_token WHERE session_id = p_session;
    RETURN v_expires;
END
$$;
-- +goose StatementEnd

-- +goose Down
SELECT 'down migrations are not supported';
