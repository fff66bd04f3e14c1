-- +goose Up
-- The write transactions of the common turn (a plain prompt answered
-- without tool calls), each one call instead of five or six statements
-- (issue 21: statements per turn; docs/benchmarks.md, "One call per
-- transaction"). The statements inside are the ones the executor sent
-- one by one before, in the same order and the same transaction; only the
-- number of statements the client sends and the server parses changes.
-- docs/design.md, "Table owners", lists who owns each piece.

-- ledger: the opening of a finishing write: the session's row lock, which
-- orders the release against admission (invariant 7), then the fence
-- (invariant 5).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION promptline_finish_open(p_session text, p_execution text, p_token bigint, p_lease_ms bigint,
                                                  p_phase text DEFAULT NULL, p_assistant text DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM sessions WHERE session_id = p_session FOR UPDATE;
    PERFORM promptline_fence(p_session, p_execution, p_token, p_lease_ms, p_phase, p_assistant);
END
$$;
-- +goose StatementEnd

-- ledger: the release of a finishing write: the claim goes unless an input
-- waits. It must run after promptline_finish_open in the same transaction.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION promptline_release_idle(p_session text, p_token bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM claims
    WHERE session_id = p_session AND fencing_token = p_token
      AND NOT EXISTS (SELECT 1 FROM waiting_inputs w WHERE w.session_id = p_session);
    RETURN FOUND;
END
$$;
-- +goose StatementEnd

-- executor: what a turn's first step writes after the transaction's
-- opening (the claim, or the fence): the promotion of the turn's inputs,
-- in order, each with its user message (executor/turn.go, promoteSQL);
-- the turn's pending assistant message (transcript's insertAssistantSQL);
-- the outbox rows (turn.started; outbox's insertSQL); the first step's
-- attempt intent (ledger's insertAttemptSQL, step 1).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION promptline_turn_writes(p_session text, p_execution text, p_token bigint, p_assistant text,
                                                  p_inputs text[], p_turn text,
                                                  p_attempt text, p_provider text, p_key text, p_request_hash bytea,
                                                  p_model text, p_request_tokens bigint,
                                                  p_topics text[], p_keys text[], p_payloads bytea[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_input text;
BEGIN
    FOREACH v_input IN ARRAY p_inputs LOOP
        WITH p AS (
            UPDATE inputs SET promotion_seq = nextval('promotion_seq'), promoted_at = now()
            WHERE message_id = v_input AND promotion_seq IS NULL
            RETURNING message_id, session_id, text
        ), m AS (
            INSERT INTO messages (message_id, session_id, role, status, completed_at, execution_id, fencing_token)
            SELECT message_id, session_id, 'user', 'completed', now(), p_execution, p_token FROM p
        )
        INSERT INTO message_parts (message_id, idx, kind, body) SELECT message_id, 0, 'text', text FROM p;
    END LOOP;
    INSERT INTO messages (message_id, session_id, role, status, answers, execution_id, fencing_token, turn_id)
    VALUES (p_assistant, p_session, 'assistant', 'pending', p_inputs, p_execution, p_token, p_turn);
    INSERT INTO outbox (topic, key, payload)
    SELECT t, k, p FROM unnest(p_topics, p_keys, p_payloads) WITH ORDINALITY AS r(t, k, p, n) ORDER BY n;
    INSERT INTO attempts (attempt_id, session_id, execution_id, assistant_message_id, step, provider,
                          idempotency_key, fencing_token, request_hash, state, model, request_tokens)
    VALUES (p_attempt, p_session, p_execution, p_assistant, 1, p_provider, p_key, p_token, p_request_hash,
            'started', nullif(p_model, ''), p_request_tokens);
END
$$;
-- +goose StatementEnd

-- executor: a turn's first step with the claim (ledger's
-- promptline_claim_as_read, whose eight arguments come first); returns the
-- claim's expiry.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION promptline_turn_first(p_session text, p_execution text, p_owner text, p_token bigint,
                                                 p_lease_ms bigint, p_phase text, p_assistant text, p_waiting text[],
                                                 p_inputs text[], p_turn text,
                                                 p_attempt text, p_provider text, p_key text, p_request_hash bytea,
                                                 p_model text, p_request_tokens bigint,
                                                 p_topics text[], p_keys text[], p_payloads bytea[])
RETURNS timestamptz LANGUAGE plpgsql AS $$
DECLARE
    v_expires timestamptz;
BEGIN
    v_expires := promptline_claim_as_read(p_session, p_execution, p_owner, p_token, p_lease_ms, p_phase, p_assistant, p_waiting);
    PERFORM promptline_turn_writes(p_session, p_execution, p_token, p_assistant, p_inputs, p_turn,
                                   p_attempt, p_provider, p_key, p_request_hash, p_model, p_request_tokens,
                                   p_topics, p_keys, p_payloads);
    RETURN v_expires;
END
$$;
-- +goose StatementEnd

-- executor: a later turn's first step under a claim held (the fence's six
-- arguments come first).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION promptline_turn_next(p_session text, p_execution text, p_token bigint, p_lease_ms bigint,
                                                p_phase text, p_assistant text,
                                                p_inputs text[], p_turn text,
                                                p_attempt text, p_provider text, p_key text, p_request_hash bytea,
                                                p_model text, p_request_tokens bigint,
                                                p_topics text[], p_keys text[], p_payloads bytea[])
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM promptline_fence(p_session, p_execution, p_token, p_lease_ms, p_phase, p_assistant);
    PERFORM promptline_turn_writes(p_session, p_execution, p_token, p_assistant, p_inputs, p_turn,
                                   p_attempt, p_provider, p_key, p_request_hash, p_model, p_request_tokens,
                                   p_topics, p_keys, p_payloads);
END
$$;
-- +goose StatementEnd

-- executor: a step's answer without tool calls, which completes the turn,
-- with the release when nothing waits (the fence's six arguments come
-- first): the attempt succeeded (ledger's finishAttemptSQL), the answer's
-- text and its message completed (transcript's answerSQL), the outbox rows
-- (step.completed, turn.completed). Returns whether the claim was released.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION promptline_turn_answer(p_session text, p_execution text, p_token bigint, p_lease_ms bigint,
                                                  p_phase text, p_assistant text,
                                                  p_attempt text, p_input_tokens bigint, p_output_tokens bigint,
                                                  p_response_id text, p_message text, p_text text,
                                                  p_topics text[], p_keys text[], p_payloads bytea[])
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM promptline_finish_open(p_session, p_execution, p_token, p_lease_ms, p_phase, p_assistant);
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
