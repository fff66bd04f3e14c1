-- +goose Up
-- ledger: the openings of several calls of one function in one statement:
-- what group commit sends in place of the openings of two or more calls
-- of promptline_turn_first (promptline_claim_as_read_group), or of
-- promptline_turn_answer (promptline_finish_release_group), whose
-- sessions follow each other in a flush (ledger's groupedFuncs;
-- docs/benchmarks.md, "Grouped openings"). The calls' writes follow at the
-- end of the flush, as for any grouped call (00024).
--
-- Argument i of each array is session i's argument of the lone opening;
-- a list (a waiting head as read) is given flattened, in the sessions'
-- order, with the session of each (1-based). Each checks what the lone
-- opening checks, for every session, and raises when one fails: the flush
-- then rolls back and sends each call again alone, which names the session
-- at fault and raises the lone opening's own error. Each returns the lone
-- opening's result, one row per session, in the sessions' order.
--
-- The sessions' rows are locked first, all of them, in byte order
-- (COLLATE "C": the order in which the flush sorts its sessions and
-- admission's lockSessionsSQL locks them; a locking clause locks the rows
-- after ORDER BY has sorted them), then the claims' rows, as each lone
-- opening locks its session's row before its claim's. The flush sends the
-- statement in the place of the first of its sessions, and no statement of
-- another session lies between them: the flush's locks stay in byte order
-- (TestGroupedCallsKeepTheSessionsLockOrder,
-- TestGroupedOpeningsLockTheirSessionsInByteOrder).
--
-- Lookups are by = ANY on primary keys, planned with enable_seqscan off,
-- as the grouped writes are (00024).

-- promptline_claim_as_read (00020) for several sessions.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION promptline_claim_as_read_group(p_session text[], p_execution text[], p_owner text[],
                                                          p_token bigint[], p_lease_ms bigint[], p_phase text[],
                                                          p_assistant text[], p_waiting text[], p_waiting_of integer[])
RETURNS SETOF timestamptz LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    v_bad      text;
    v_claimed  bigint;
    v_expires  timestamptz[];
BEGIN
    PERFORM 1 FROM sessions WHERE session_id = ANY (p_session) ORDER BY session_id COLLATE "C" FOR UPDATE;

    SELECT u.s INTO v_bad
    FROM unnest(p_session, p_token) AS u(s, t) LEFT JOIN sessions x ON x.session_id = u.s
    WHERE x.fencing_token IS DISTINCT FROM u.t - 1
    LIMIT 1;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'session %: fencing token is not the one read', v_bad USING ERRCODE = 'PLSTA';
    END IF;

    WITH w AS (
        SELECT w.of, array_agg(w.id ORDER BY w.n) AS ids
        FROM unnest(p_waiting, p_waiting_of) WITH ORDINALITY AS w(id, of, n) GROUP BY w.of
    )
    SELECT u.s INTO v_bad
    FROM unnest(p_session) WITH ORDINALITY AS u(s, k) LEFT JOIN w ON w.of = u.k
    WHERE w.ids IS NULL
       OR (SELECT array_agg(h.message_id ORDER BY h.admission_seq) FROM promptline_waiting_head(u.s) h)
          IS DISTINCT FROM w.ids
    LIMIT 1;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'session %: the head of the waiting inputs changed since it was read', v_bad
            USING ERRCODE = 'PLSTA';
    END IF;

    -- A session given twice inserts one claim: the count says so.
    WITH ins AS (
        INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, assistant_message_id, expires_at)
        SELECT u.s, u.e, u.o, u.t, u.p, nullif(u.a, ''), clock_timestamp() + u.l * interval '1 millisecond'
        FROM unnest(p_session, p_execution, p_owner, p_token, p_lease_ms, p_phase, p_assistant)
             WITH ORDINALITY AS u(s, e, o, t, l, p, a, k)
        ORDER BY u.k
        ON CONFLICT (session_id) DO NOTHING
        RETURNING session_id, expires_at
    )
    SELECT (SELECT count(*) FROM ins), array_agg(i.expires_at ORDER BY u.k)
    INTO v_claimed, v_expires
    FROM unnest(p_session) WITH ORDINALITY AS u(s, k) LEFT JOIN ins i ON i.session_id = u.s;
    IF v_claimed <> cardinality(p_session) THEN
        RAISE EXCEPTION 'sessions %: claim held', p_session USING ERRCODE = 'PLSTA';
    END IF;

    UPDATE sessions SET fencing_token = u.t
    FROM unnest(p_session, p_token) AS u(s, t)
    WHERE sessions.session_id = ANY (p_session) AND sessions.session_id = u.s;

    RETURN QUERY SELECT unnest(v_expires);
END
$$;
-- +goose StatementEnd

-- promptline_finish_release (00024) for several sessions: each session's
-- lock, its fence (promptline_fence, 00021: the claim's lease renewed,
-- its phase, its assistant message and its write's position), then the
-- release of each claim whose session has no input waiting. A fence
-- refused for any session raises 'PLFEN' (the lone fence tells a write
-- already applied from a lost claim, when the call is sent again alone).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION promptline_finish_release_group(p_session text[], p_execution text[], p_token bigint[],
                                                           p_lease_ms bigint[], p_phase text[], p_assistant text[],
                                                           p_seq bigint[])
RETURNS SETOF boolean LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    v_now      timestamptz;
    v_fenced   bigint;
    v_released text[];
BEGIN
    PERFORM 1 FROM sessions WHERE session_id = ANY (p_session) ORDER BY session_id COLLATE "C" FOR UPDATE;
    -- The fence's clock, read after the wait for the locks, as the lone
    -- fence reads it after its session's: a lease that ran out while the
    -- call waited is lost.
    v_now := clock_timestamp();

    -- A session given twice is fenced once: the count says so.
    WITH f AS (
        UPDATE claims SET expires_at = v_now + u.l * interval '1 millisecond', renewed_at = v_now,
                          phase = coalesce(u.p, claims.phase),
                          assistant_message_id = coalesce(nullif(u.a, ''), claims.assistant_message_id),
                          write_seq = coalesce(u.q, claims.write_seq)
        FROM unnest(p_session, p_execution, p_token, p_lease_ms, p_phase, p_assistant, p_seq) AS u(s, e, t, l, p, a, q)
        WHERE claims.session_id = ANY (p_session) AND claims.session_id = u.s
          AND claims.execution_id = u.e AND claims.fencing_token = u.t
          AND claims.expires_at > v_now AND claims.quarantine_reason IS NULL
          AND (u.q IS NULL OR claims.write_seq < u.q)
        RETURNING claims.session_id
    )
    SELECT count(DISTINCT session_id) INTO v_fenced FROM f;
    IF v_fenced <> cardinality(p_session) OR cardinality(p_session) <> (SELECT count(DISTINCT s) FROM unnest(p_session) s) THEN
        RAISE EXCEPTION 'sessions %: a claim is lost or its write already applied', p_session USING ERRCODE = 'PLFEN';
    END IF;

    -- OFFSET 0 keeps the waiting inputs a lookup per session (a subplan
    -- given the session), never an anti-join: planned on small tables,
    -- the join read every waiting input of every session at each call
    -- (TestPerSessionStatementsUseSessionIndexes).
    WITH r AS (
        DELETE FROM claims USING unnest(p_session, p_token) AS u(s, t)
        WHERE claims.session_id = ANY (p_session) AND claims.session_id = u.s AND claims.fencing_token = u.t
          AND NOT EXISTS (SELECT 1 FROM waiting_inputs w WHERE w.session_id = u.s OFFSET 0)
        RETURNING claims.session_id
    )
    SELECT coalesce(array_agg(session_id), '{}') INTO v_released FROM r;

    RETURN QUERY SELECT u.s = ANY (v_released) FROM unnest(p_session) WITH ORDINALITY AS u(s, k) ORDER BY u.k;
END
$$;
-- +goose StatementEnd

-- +goose Down
SELECT 'down migrations are not supported';
