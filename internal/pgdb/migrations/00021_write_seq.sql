-- +goose Up
-- Every write of an execution carries its position, and the fence applies
-- each position once and in order (docs/design.md, invariant 5 and crash
-- window "stale-write"). A write whose answer was lost is retried under
-- the same position; its retry's fence used to wait for the lost write's
-- own fence (both update the claim row), but a combined group commit
-- [a, b] can still be blocked in a's part, before b's fence, when its
-- connection is lost: b's retry then passed at once and committed, and the
-- lost transaction, once a's lock was free, passed b's fence again (same
-- token, lease live) and applied b's write a second time, after b's later
-- writes: its phase set back, its events twice.
--
-- write_seq is the highest position applied under the claim's token (0 for
-- a new claim; a takeover resets it). The fence given a position p raises
-- PLAPP, and changes nothing, when write_seq >= p: that write is there
-- already (the retry takes it as landed, a lost transaction rolls back
-- whole); otherwise it sets write_seq = p. Positions may skip (a write in
-- doubt, given up): a later write raises the mark past it, so the write in
-- doubt, should it still arrive, is refused too. A NULL position (a
-- renewal that writes nothing) is not counted.
--
-- The functions of 00009 and 00018 stay, for a process of the previous
-- release running beside this one during an upgrade: their writes are not
-- counted. The new ones take the position as the fence's seventh argument,
-- which Go's Calls put before their own arguments; the argument counts
-- differ, so no call is ambiguous.
ALTER TABLE claims ADD COLUMN IF NOT EXISTS write_seq bigint NOT NULL DEFAULT 0;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION promptline_fence(p_session text, p_execution text, p_token bigint, p_lease_ms bigint,
                                            p_phase text, p_assistant text, p_seq bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    UPDATE claims SET expires_at = v_now + p_lease_ms * interval '1 millisecond', renewed_at = v_now,
                      phase = coalesce(p_phase, phase),
                      assistant_message_id = coalesce(nullif(p_assistant, ''), assistant_message_id),
                      write_seq = coalesce(p_seq, write_seq)
    WHERE session_id = p_session AND execution_id = p_execution AND fencing_token = p_token
      AND expires_at > v_now AND quarantine_reason IS NULL
      AND (p_seq IS NULL OR write_seq < p_seq);
    IF FOUND THEN
        RETURN;
    END IF;
    -- The row locked by the UPDATE's attempt, if it is this claim's: a
    -- write already applied is told from a lost claim.
    IF p_seq IS NOT NULL AND EXISTS (
        SELECT 1 FROM claims
        WHERE session_id = p_session AND execution_id = p_execution AND fencing_token = p_token
          AND expires_at > v_now AND quarantine_reason IS NULL AND write_seq >= p_seq) THEN
        RAISE EXCEPTION 'execution % of session %: write % is already applied', p_execution, p_session, p_seq
            USING ERRCODE = 'PLAPP';
    END IF;
    RAISE EXCEPTION 'execution % of session % is fenced: its claim (token %) is lost', p_execution, p_session, p_token
        USING ERRCODE = 'PLFEN';
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION promptline_finish_open(p_session text, p_execution text, p_token bigint, p_lease_ms bigint,
                                                  p_phase text, p_assistant text, p_seq bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM sessions WHERE session_id = p_session FOR UPDATE;
    PERFORM promptline_fence(p_session, p_execution, p_token, p_lease_ms, p_phase, p_assistant, p_seq);
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION promptline_turn_next(p_session text, p_execution text, p_token bigint, p_lease_ms bigint,
                                                p_phase text, p_assistant text, p_seq bigint,
                                                p_inputs text[], p_turn text,
                                                p_attempt text, p_provider text, p_key text, p_request_hash bytea,
                                                p_model text, p_request_tokens bigint,
                                                p_topics text[], p_keys text[], p_payloads bytea[])
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM promptline_fence(p_session, p_execution, p_token, p_lease_ms, p_phase, p_assistant, p_seq);
    PERFORM promptline_turn_writes(p_session, p_execution, p_token, p_assistant, p_inputs, p_turn,
                                   p_attempt, p_provider, p_key, p_request_hash, p_model, p_request_tokens,
                                   p_topics, p_keys, p_payloads);
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION promptline_turn_answer(p_session text, p_execution text, p_token bigint, p_lease_ms bigint,
                                                  p_phase text, p_assistant text, p_seq bigint,
                                                  p_attempt text, p_input_tokens bigint, p_output_tokens bigint,
                                                  p_response_id text, p_message text, p_text text,
                                                  p_topics text[], p_keys text[], p_payloads bytea[])
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM promptline_finish_open(p_session, p_execution, p_token, p_lease_ms, p_phase, p_assistant, p_seq);
    UPDATE attempts SET state = 'succeeded', error = NULL, input_tokens = p_input_tokens, output_tokens = p_output_tokens,
        finished_at = now(),
        response_id = coalesce(response_id, nullif(p_response_id, '')),
        response_id_at = CASE WHEN response_id IS NULL AND p_response_id <> '' THEN now() ELSE response_id_at END
    WHERE attempt_id = p_attempt;
    IF p_text <> '' THEN
        INSERT INTO message_parts (message_id, idx, kind, body) VALUES (p_message, 0, 'text', p_text);
    END IF;
    UPDATE messages SET status = 'completed', completed_at = now() WHERE message_id = p_message AND status = 'pending';
    INSERT INTO outbox (topic, key, payload)
    SELECT t, k, p FROM unnest(p_topics, p_keys, p_payloads) WITH ORDINALITY AS r(t, k, p, n) ORDER BY n;
    RETURN promptline_release_idle(p_session, p_token);
END
$$;
-- +goose StatementEnd

-- +goose Down
SELECT 'down migrations are not supported';
