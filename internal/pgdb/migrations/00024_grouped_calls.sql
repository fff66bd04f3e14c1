-- +goose Up
-- executor: the writes of the common turn's calls of several sessions,
-- one statement per table for all of them: what group commit sends when a
-- flush holds two or more calls of promptline_turn_first, of
-- promptline_turn_next, or of promptline_turn_answer (migrations 00018,
-- 00021; ledger's groupedFuncs; docs/benchmarks.md, "Grouped calls").
-- Each call then sends only its opening, in its session's place in the
-- flush (the sessions' byte order, as admission locks them):
-- promptline_claim_as_read for a first step with its claim,
-- promptline_fence for a later turn's first step, promptline_finish_release
-- for an answer; and the flush sends the writes of each function's calls
-- last, in the same transaction.
--
-- The writes are the calls' writes. Argument i of each scalar array is
-- session i's argument of the call; the turns' inputs are given
-- flattened, in the sessions' order, with the session of each (1-based),
-- the outbox rows flattened in the order they are inserted. A session's
-- rows are in the order its call writes them (promotion_seq drawn in its
-- inputs' order, its user messages before its assistant message, its
-- outbox rows in their order); across sessions, which no reader compares,
-- in another order than the calls'.
--
-- The writes find their rows by = ANY on a primary key, planned with
-- enable_seqscan off, as admission's statements are (admission's
-- admissionSettingsSQL): plpgsql keeps the generic plan it makes for an
-- array of unknown length, and made while a table is small (a fresh
-- database, the first minutes of a process) that plan scans the table,
-- and keeps scanning it at millions of rows (docs/benchmarks.md, "A plan
-- made on a small table"). The arrays hold a flush's sessions, at most
-- 64, and their turns' inputs (at most a hundred steers a turn): a lookup
-- through the key is the plan at any size of the tables
-- (TestPerSessionStatementsUseSessionIndexes, TestLedgerStatementsUseIndexes).

-- ledger: an answer's opening: the session's lock and the fence
-- (promptline_finish_open), then the release unless an input waits
-- (promptline_release_idle), whose answer it returns. In one transaction
-- with the answer's writes, the release may come before them: nothing
-- they write reads the claim.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION promptline_finish_release(p_session text, p_execution text, p_token bigint, p_lease_ms bigint,
                                                     p_phase text, p_assistant text, p_seq bigint)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM promptline_finish_open(p_session, p_execution, p_token, p_lease_ms, p_phase, p_assistant, p_seq);
    RETURN promptline_release_idle(p_session, p_token);
END
$$;
-- +goose StatementEnd

-- executor: promptline_turn_writes (00018) for several sessions, whose
-- claims promptline_claim_as_read took, or whose fences promptline_fence
-- passed, earlier in the transaction: the promotions of the turns' inputs
-- with their user messages, the pending assistant messages, the outbox
-- rows and the first attempts' intents.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION promptline_turn_writes_group(p_session text[], p_execution text[], p_token bigint[], p_assistant text[],
                                                        p_inputs text[], p_inputs_of integer[], p_turn text[],
                                                        p_attempt text[], p_provider text[], p_key text[], p_request_hash bytea[],
                                                        p_model text[], p_request_tokens bigint[],
                                                        p_topics text[], p_keys text[], p_payloads bytea[])
RETURNS void LANGUAGE plpgsql SET enable_seqscan = off AS $$
BEGIN
    -- The promotion_seq values are drawn in the inputs' order, an input
    -- listed twice once (the call promotes it at its first place); an
    -- input already promoted keeps its value and leaves the one drawn for
    -- it unused, a gap as a rolled-back transaction leaves.
    WITH s AS (
        SELECT DISTINCT ON (u.id) u.id, u.k, u.n
        FROM unnest(p_inputs, p_inputs_of) WITH ORDINALITY AS u(id, k, n) ORDER BY u.id, u.n
    ), q AS (
        SELECT s.id, s.k, nextval('promotion_seq') AS seq FROM s ORDER BY s.n
    ), p AS (
        UPDATE inputs SET promotion_seq = q.seq, promoted_at = now()
        FROM q WHERE inputs.message_id = ANY (p_inputs) AND inputs.message_id = q.id AND inputs.promotion_seq IS NULL
        RETURNING inputs.message_id, inputs.session_id, inputs.text, q.k, q.seq
    ), m AS (
        INSERT INTO messages (message_id, session_id, role, status, completed_at, execution_id, fencing_token)
        SELECT p.message_id, p.session_id, 'user', 'completed', now(), p_execution[p.k], p_token[p.k] FROM p ORDER BY p.seq
    )
    INSERT INTO message_parts (message_id, idx, kind, body) SELECT p.message_id, 0, 'text', p.text FROM p;
    INSERT INTO messages (message_id, session_id, role, status, answers, execution_id, fencing_token, turn_id)
    SELECT p_assistant[i], p_session[i], 'assistant', 'pending', coalesce(a.answers, '{}'), p_execution[i], p_token[i], p_turn[i]
    FROM generate_subscripts(p_session, 1) AS i
    LEFT JOIN (SELECT u.k, array_agg(u.id ORDER BY u.n) AS answers
               FROM unnest(p_inputs, p_inputs_of) WITH ORDINALITY AS u(id, k, n) GROUP BY u.k) a ON a.k = i
    ORDER BY i;
    INSERT INTO outbox (topic, key, payload)
    SELECT t, k, p FROM unnest(p_topics, p_keys, p_payloads) WITH ORDINALITY AS r(t, k, p, n) ORDER BY n;
    INSERT INTO attempts (attempt_id, session_id, execution_id, assistant_message_id, step, provider,
                          idempotency_key, fencing_token, request_hash, state, model, request_tokens)
    SELECT p_attempt[i], p_session[i], p_execution[i], p_assistant[i], 1, p_provider[i], p_key[i], p_token[i], p_request_hash[i],
           'started', nullif(p_model[i], ''), p_request_tokens[i]
    FROM generate_subscripts(p_session, 1) AS i ORDER BY i;
END
$$;
-- +goose StatementEnd

-- executor: promptline_turn_answer's writes (00021) for several sessions,
-- whose openings (promptline_finish_release) ran earlier in the
-- transaction: the attempts' success, the answers' text and their
-- messages completed, the outbox rows.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION promptline_turn_answer_writes_group(p_attempt text[], p_input_tokens bigint[], p_output_tokens bigint[],
                                                               p_response_id text[], p_message text[], p_text text[],
                                                               p_topics text[], p_keys text[], p_payloads bytea[])
RETURNS void LANGUAGE plpgsql SET enable_seqscan = off AS $$
BEGIN
    UPDATE attempts SET state = 'succeeded', error = NULL, input_tokens = a.input_tokens, output_tokens = a.output_tokens,
        finished_at = now(),
        response_id = coalesce(attempts.response_id, nullif(a.response_id, '')),
        response_id_at = CASE WHEN attempts.response_id IS NULL AND a.response_id <> '' THEN now() ELSE attempts.response_id_at END
    FROM unnest(p_attempt, p_input_tokens, p_output_tokens, p_response_id) AS a(attempt_id, input_tokens, output_tokens, response_id)
    WHERE attempts.attempt_id = ANY (p_attempt) AND attempts.attempt_id = a.attempt_id;
    INSERT INTO message_parts (message_id, idx, kind, body)
    SELECT u.message_id, 0, 'text', u.body FROM unnest(p_message, p_text) WITH ORDINALITY AS u(message_id, body, n)
    WHERE u.body <> '' ORDER BY u.n;
    UPDATE messages SET status = 'completed', completed_at = now() WHERE message_id = ANY (p_message) AND status = 'pending';
    INSERT INTO outbox (topic, key, payload)
    SELECT t, k, p FROM unnest(p_topics, p_keys, p_payloads) WITH ORDINALITY AS r(t, k, p, n) ORDER BY n;
END
$$;
-- +goose StatementEnd

-- +goose Down
SELECT 'down migrations are not supported';
