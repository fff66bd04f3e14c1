-- +goose Up
-- Durable asks for tool approval. request_id is the tool call's ID: one ask
-- per call. While a request is pending its session is parked: no claim, and
-- only the reply's input is promotable.
CREATE TABLE permission_requests (
    request_id       text        PRIMARY KEY,
    session_id       text        NOT NULL REFERENCES sessions (session_id),
    call_id          text        NOT NULL REFERENCES tool_calls (call_id),
    tool             text        NOT NULL,
    pattern          text        NOT NULL,
    metadata         jsonb       NOT NULL DEFAULT '{}',
    status           text        NOT NULL CHECK (status IN ('pending', 'approved', 'rejected')),
    reply            text        CHECK (reply IN ('once', 'always', 'reject')),
    message          text,
    reply_hash       bytea,
    source_topic     text,
    source_partition integer,
    source_offset    bigint,
    asked_at         timestamptz NOT NULL DEFAULT now(),
    replied_at       timestamptz,
    resumed_at       timestamptz
);
CREATE INDEX permission_requests_pending ON permission_requests (session_id) WHERE status = 'pending';

-- "always" replies, remembered per session and pattern.
CREATE TABLE permission_grants (
    session_id text        NOT NULL REFERENCES sessions (session_id),
    pattern    text        NOT NULL,
    request_id text        NOT NULL,
    granted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, pattern)
);

-- The one definition of a waiting input, used by the executor, claim
-- release, recovery and redrive: unpromoted, asked to be woken, not
-- quarantined, and — while its session waits for a permission reply —
-- only the reply's own input.
CREATE VIEW waiting_inputs AS
SELECT i.* FROM inputs i
WHERE i.promotion_seq IS NULL AND i.wake_pending AND i.quarantine_reason IS NULL
  AND (i.message_id LIKE 'permission-reply-%'
       OR NOT EXISTS (SELECT 1 FROM permission_requests p WHERE p.session_id = i.session_id AND p.status = 'pending'));

-- +goose Down
SELECT 'down migrations are not supported';
