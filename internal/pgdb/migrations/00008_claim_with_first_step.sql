-- +goose Up
-- The claim of a plain prompt's execution commits together with its first
-- step: the promotion, the pending assistant message and the attempt's
-- intent (docs/benchmarks.md: one transaction, one fence and one claim
-- update fewer per turn; p99 at 1,000 prompts/s about 0.7x). The executor
-- reads the session first, without a claim; this function takes the claim
-- only if that read is still true, and raises SQLSTATE PLSTA otherwise, so
-- that the statements queued behind it (written from the read) roll back
-- with it and the executor falls back to claiming first (phase ready).
--
-- "Still true" means, under the session row's lock (which admission and
-- every claim take, so nothing of the session can change until commit):
-- the fencing token is the one read (no execution has claimed the session
-- since: only a claim-holder promotes inputs or writes the transcript),
-- no claim exists, and the waiting inputs are exactly those read, in
-- admission order (none admitted, promoted or quarantined since). Each
-- statement of a volatile plpgsql function takes a fresh snapshot, so the
-- check after the lock sees every transaction that committed before it.
--
-- p_token is the new claim's token: the token read plus one.
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
    IF (SELECT array_agg(message_id ORDER BY admission_seq) FROM waiting_inputs WHERE session_id = p_session)
       IS DISTINCT FROM p_waiting THEN
        RAISE EXCEPTION 'session %: waiting inputs changed since they were read', p_session
            USING ERRCODE = 'PLSTA';
    END IF;
    INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, assistant_message_id, expires_at)
    VALUES (p_session, p_execution, p_owner, p_token, p_phase, nullif(p_assistant, ''),
            now() + p_lease_ms * interval '1 millisecond')
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
