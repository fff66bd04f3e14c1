-- +goose Up
-- Provider attempts: intent committed before dispatch, result before anything
-- acts on it (docs/design.md, P4). attempt_id is derived from the execution and the
-- step number, so a retry of the same step reuses it and its idempotency key.
CREATE TABLE attempts (
    attempt_id           text        PRIMARY KEY,
    session_id           text        NOT NULL REFERENCES sessions (session_id),
    execution_id         text        NOT NULL,
    assistant_message_id text        NOT NULL,
    step                 integer     NOT NULL,
    provider             text        NOT NULL,
    idempotency_key      text        NOT NULL,
    fencing_token        bigint      NOT NULL,
    request_hash         bytea       NOT NULL,
    state                text        NOT NULL CHECK (state IN ('started', 'retry_wait', 'succeeded', 'failed', 'unknown')),
    tries                integer     NOT NULL DEFAULT 1,
    next_retry_at        timestamptz,
    error                text,
    input_tokens         bigint,
    output_tokens        bigint,
    started_at           timestamptz NOT NULL DEFAULT now(),
    finished_at          timestamptz
);
CREATE INDEX attempts_session ON attempts (session_id, started_at);

-- Tool calls: intent (state started) before running, result before the step
-- continues.
CREATE TABLE tool_calls (
    call_id         text        PRIMARY KEY,
    attempt_id      text        NOT NULL REFERENCES attempts (attempt_id),
    session_id      text        NOT NULL REFERENCES sessions (session_id),
    execution_id    text        NOT NULL,
    idx             integer     NOT NULL,
    model_call_id   text        NOT NULL,
    tool            text        NOT NULL,
    class           text        NOT NULL CHECK (class IN ('idempotent', 'side_effecting')),
    input           jsonb       NOT NULL,
    idempotency_key text        NOT NULL,
    fencing_token   bigint      NOT NULL,
    state           text        NOT NULL CHECK (state IN ('requested', 'started', 'succeeded', 'failed', 'unknown', 'interrupted')),
    output          text,
    is_error        boolean,
    requested_at    timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    finished_at     timestamptz
);
CREATE INDEX tool_calls_attempt ON tool_calls (attempt_id, idx);

-- The transcript learns tool calls and results.
ALTER TABLE messages DROP CONSTRAINT messages_role_check;
ALTER TABLE messages ADD CONSTRAINT messages_role_check CHECK (role IN ('user', 'assistant', 'tool'));
ALTER TABLE messages ADD COLUMN turn_id text;
ALTER TABLE messages ADD COLUMN tool_call_id text;
ALTER TABLE messages ADD COLUMN is_error boolean NOT NULL DEFAULT false;
ALTER TABLE message_parts DROP CONSTRAINT message_parts_kind_check;
ALTER TABLE message_parts ADD CONSTRAINT message_parts_kind_check CHECK (kind IN ('text', 'tool_call'));

-- +goose Down
SELECT 'down migrations are not supported';
