-- +goose Up
-- A lease is judged by the database clock at the moment the fence runs,
-- not at its transaction's start (docs/design.md, invariants 5 and 6). now() is
-- the start of the transaction, and a transaction can wait inside itself:
-- a release locks the session row first and may wait up to lock_timeout,
-- and a combined group commit runs many sessions' fences under one start
-- time. With now(), a claim that ran out during such a wait passed the
-- fence and was renewed a whole lease ahead (measured: a claim that expired
-- during a 2 s wait inside the transaction was renewed 30 s ahead).
-- clock_timestamp() is the time of the check itself; the renewed expiry
-- counts from it too, and so does the expiry of a new claim taken after
-- waiting for the session's lock. The takeover (ledger) uses the same clock,
-- so the fence and the takeover never both see the lease live, or both
-- expired, at one instant.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION promptline_fence(p_session text, p_execution text, p_token bigint, p_lease_ms bigint,
                                            p_phase text DEFAULT NULL, p_assistant text DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    UPDATE claims SET expires_at = v_now + p_lease_ms * interval '1 millisecond', renewed_at = v_now,
                      phase = coalesce(p_phase, phase),
                      assistant_message_id = coalesce(nullif(p_assistant, ''), assistant_message_id)
    WHERE session_id = p_session AND execution_id = p_execution AND fencing_token = p_token
      AND expires_at > v_now AND quarantine_reason IS NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'execution % of session % is fenced: its claim (token %) is lost', p_execution, p_session, p_token
            USING ERRCODE = 'PLFEN';
    END IF;
END
$$;
-- +goose StatementEnd

-- As in 00008, but the new claim's lease counts from the clock after the
-- session's lock was granted.
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
