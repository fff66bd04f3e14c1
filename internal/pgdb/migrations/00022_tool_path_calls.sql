-- +goose Up
-- The write transactions of a turn with tool calls, each one call sent
-- through group commit instead of an explicit transaction of its own
-- (issue 21; docs/benchmarks.md, "the tool path's writes, one call
-- each"): the response with its calls, a call's intent, a call's result,
-- and the intent of the step that follows. The statements inside are the ones the executor sent one by one
-- before, in the same transaction (ledger's RequestCalls, StartCall and
-- SettleCall, which these replace; transcript's statements named beside
-- each); the fence, with the write's position (00021), opens each. What
-- changes is the number of statements the client sends, and that the
-- transaction may share its commit with other sessions' writes (group
-- commit), as the plain turn's do.

-- executor: a step's response that asks for tools (the fence's seven
-- arguments come first, setting the phase continue): the attempt succeeded
-- (ledger's finishAttemptSQL), the answer's text as part 0 unless empty
-- and each tool call as part i+1 (transcript's insertPartSQL), the
-- message completed (completeMessageSQL), the calls as requested, the
-- outbox row (step.completed). The executor stores an input that is not
-- JSON as a JSON string (ledger.CallInput): evidence, not input.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION promptline_step_calls(p_session text, p_execution text, p_token bigint, p_lease_ms bigint,
                                                 p_phase text, p_assistant text, p_seq bigint,
                                                 p_attempt text, p_input_tokens bigint, p_output_tokens bigint,
                                                 p_response_id text, p_message text, p_text text, p_call_parts text[],
                                                 p_call_ids text[], p_call_idx integer[], p_model_call_ids text[], p_tools text[],
                                                 p_classes text[], p_inputs text[], p_call_keys text[],
                                                 p_topics text[], p_keys text[], p_payloads bytea[])
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM promptline_fence(p_session, p_execution, p_token, p_lease_ms, p_phase, p_assistant, p_seq);
    UPDATE attempts SET state = 'succeeded', error = NULL, input_tokens = p_input_tokens, output_tokens = p_output_tokens,
        finished_at = now(),
        response_id = coalesce(response_id, nullif(p_response_id, '')),
        response_id_at = CASE WHEN response_id IS NULL AND p_response_id <> '' THEN now() ELSE response_id_at END
    WHERE attempt_id = p_attempt;
    IF p_text <> '' THEN
        INSERT INTO message_parts (message_id, idx, kind, body) VALUES (p_message, 0, 'text', p_text);
    END IF;
    INSERT INTO message_parts (message_id, idx, kind, body)
    SELECT p_message, n::integer, 'tool_call', b FROM unnest(p_call_parts) WITH ORDINALITY AS r(b, n) ORDER BY n;
    UPDATE messages SET status = 'completed', completed_at = now() WHERE message_id = p_message AND status = 'pending';
    INSERT INTO tool_calls (call_id, attempt_id, session_id, execution_id, idx, model_call_id, tool, class,
                            input, idempotency_key, fencing_token, state)
    SELECT c, p_attempt, p_session, p_execution, x, m, t, k, i::jsonb, y, p_token, 'requested'
    FROM unnest(p_call_ids, p_call_idx, p_model_call_ids, p_tools, p_classes, p_inputs, p_call_keys)
         WITH ORDINALITY AS r(c, x, m, t, k, i, y, n)
    ORDER BY n;
    INSERT INTO outbox (topic, key, payload)
    SELECT t, k, p FROM unnest(p_topics, p_keys, p_payloads) WITH ORDINALITY AS r(t, k, p, n) ORDER BY n;
END
$$;
-- +goose StatementEnd

-- executor: a tool call's intent (the fence's seven arguments come first,
-- setting the phase unknown, before the tool runs): the call started,
-- which must be requested (a call is started once), and the outbox row
-- (tool.started).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION promptline_call_start(p_session text, p_execution text, p_token bigint, p_lease_ms bigint,
                                                 p_phase text, p_assistant text, p_seq bigint,
                                                 p_call text,
                                                 p_topics text[], p_keys text[], p_payloads bytea[])
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM promptline_fence(p_session, p_execution, p_token, p_lease_ms, p_phase, p_assistant, p_seq);
    UPDATE tool_calls SET state = 'started', started_at = now() WHERE call_id = p_call AND state = 'requested';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'starting tool call %: not in state requested', p_call USING ERRCODE = 'PLCNR';
    END IF;
    INSERT INTO outbox (topic, key, payload)
    SELECT t, k, p FROM unnest(p_topics, p_keys, p_payloads) WITH ORDINALITY AS r(t, k, p, n) ORDER BY n;
END
$$;
-- +goose StatementEnd

-- executor: a tool call's result (the fence's seven arguments come first):
-- the call settled, if open; its attempt's open calls counted and, when
-- none is started, the phase continue (by the fence); the tool
-- message and its text (transcript's insertToolMessageSQL,
-- insertPartSQL); the outbox row (tool.completed). Returns the attempt's
-- open calls and, of them, the started ones.
--
-- Once no call of the step is started, nothing is in flight, so the same
-- transaction sets the phase continue, whether calls of the step are still
-- requested or not: the turn goes on from here, the calls left requested
-- first (a continuation runs them), then a step that hands the model the
-- results. Left at unknown (the intent's) while a later call waited to
-- start, a crash there had recovery reconcile a turn in which nothing was
-- uncertain: the turn failed outcome_unknown and the call that never ran
-- was interrupted. The calls are counted by attempt (its index,
-- tool_calls_attempt), not by session, whose index holds every call the
-- session ever made; a call of another attempt is never started here (the
-- executor runs a session's calls one at a time, and a takeover reconciles
-- a started call before a continuation runs any).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION promptline_call_settle(p_session text, p_execution text, p_token bigint, p_lease_ms bigint,
                                                  p_phase text, p_assistant text, p_seq bigint,
                                                  p_call text, p_attempt text, p_state text, p_output text,
                                                  p_is_error boolean, p_model_call_id text,
                                                  p_topics text[], p_keys text[], p_payloads bytea[])
RETURNS integer[] LANGUAGE plpgsql AS $$
DECLARE
    v_open integer;
    v_started integer;
BEGIN
    PERFORM promptline_fence(p_session, p_execution, p_token, p_lease_ms, p_phase, p_assistant, p_seq);
    UPDATE tool_calls SET state = p_state, output = p_output, is_error = p_is_error, finished_at = now()
    WHERE call_id = p_call AND state IN ('requested', 'started');
    SELECT count(*), count(*) FILTER (WHERE state = 'started') INTO v_open, v_started
    FROM tool_calls WHERE attempt_id = p_attempt AND state IN ('requested', 'started');
    IF v_started = 0 THEN
        -- The phase through ledger's own function, as every write of a
        -- claim: the fence again, with no position (it passed above).
        PERFORM promptline_fence(p_session, p_execution, p_token, p_lease_ms, 'continue', NULL, NULL);
    END IF;
    INSERT INTO messages (message_id, session_id, role, status, tool_call_id, is_error, completed_at, execution_id, fencing_token)
    VALUES (p_call, p_session, 'tool', 'completed', p_model_call_id, p_is_error, now(), p_execution, p_token);
    INSERT INTO message_parts (message_id, idx, kind, body) VALUES (p_call, 0, 'text', p_output);
    INSERT INTO outbox (topic, key, payload)
    SELECT t, k, p FROM unnest(p_topics, p_keys, p_payloads) WITH ORDINALITY AS r(t, k, p, n) ORDER BY n;
    RETURN ARRAY[v_open, v_started];
END
$$;
-- +goose StatementEnd

-- executor: a later step's intent (the fence's seven arguments come first,
-- setting the phase unknown and the step's assistant message): the step's
-- pending assistant message unless it exists (transcript's
-- insertAssistantIfAbsentSQL), the attempt's intent (ledger's
-- beginAttemptSQL: a new attempt, or a deferred one begun again, counting
-- a try; any other reuse of its ID is refused). The transcript the
-- request carries is read before it, by the same execution: a claim that
-- passes this fence was held at that read too (a lost claim is never
-- regained), and under read committed the read inside the transaction,
-- as it was, saw no more than a read just before it.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION promptline_step_begin(p_session text, p_execution text, p_token bigint, p_lease_ms bigint,
                                                 p_phase text, p_assistant text, p_seq bigint,
                                                 p_answers text[], p_turn text,
                                                 p_attempt text, p_step integer, p_provider text, p_key text,
                                                 p_request_hash bytea, p_model text, p_request_tokens bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM promptline_fence(p_session, p_execution, p_token, p_lease_ms, p_phase, p_assistant, p_seq);
    INSERT INTO messages (message_id, session_id, role, status, answers, execution_id, fencing_token, turn_id)
    VALUES (p_assistant, p_session, 'assistant', 'pending', p_answers, p_execution, p_token, p_turn)
    ON CONFLICT (message_id) DO NOTHING;
    INSERT INTO attempts (attempt_id, session_id, execution_id, assistant_message_id, step, provider,
                          idempotency_key, fencing_token, request_hash, state, model, request_tokens)
    VALUES (p_attempt, p_session, p_execution, p_assistant, p_step, p_provider, p_key, p_token, p_request_hash,
            'started', nullif(p_model, ''), p_request_tokens)
    ON CONFLICT (attempt_id) DO UPDATE SET state = 'started', tries = attempts.tries + 1,
        next_retry_at = NULL, fencing_token = excluded.fencing_token, started_at = now(),
        model = excluded.model, request_tokens = excluded.request_tokens, response_id = NULL, response_id_at = NULL
    WHERE attempts.state = 'retry_wait';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'recording attempt %: it exists and is not awaiting a retry', p_attempt USING ERRCODE = 'PLARU';
    END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
SELECT 'down migrations are not supported';
