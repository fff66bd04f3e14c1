-- +goose Up
-- Sessions: one row per session. Admission upserts it and executions lock it,
-- so admission and release serialise on it (docs/design.md, invariant 7).
CREATE TABLE sessions (
    session_id    text        PRIMARY KEY,
    fencing_token bigint      NOT NULL DEFAULT 0,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_admitted_at timestamptz NOT NULL DEFAULT now()
);

-- Inputs: one row per admitted prompt; message_id is the idempotency key.
CREATE TABLE inputs (
    message_id       text        PRIMARY KEY,
    session_id       text        NOT NULL REFERENCES sessions (session_id),
    text             text        NOT NULL,
    payload_hash     bytea       NOT NULL,
    delivery         text        NOT NULL CHECK (delivery IN ('queue', 'steer')),
    admission_seq    bigint      GENERATED ALWAYS AS IDENTITY UNIQUE,
    promotion_seq    bigint      UNIQUE,
    wake_pending     boolean     NOT NULL,
    source_topic     text,
    source_partition integer,
    source_offset    bigint,
    admitted_at      timestamptz NOT NULL DEFAULT now(),
    promoted_at      timestamptz
);
CREATE INDEX inputs_waiting ON inputs (session_id, admission_seq) WHERE promotion_seq IS NULL;
CREATE SEQUENCE promotion_seq;

-- Outbox: rows written in the transaction of the state change they announce;
-- the relay publishes them at least once and marks them published.
CREATE TABLE outbox (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic        text        NOT NULL,
    key          text        NOT NULL,
    payload      bytea       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);
CREATE INDEX outbox_unpublished ON outbox (id) WHERE published_at IS NULL;

-- Transcript: user messages (one per promoted input, same ID) and assistant
-- messages, with their parts.
CREATE TABLE messages (
    message_id   text        PRIMARY KEY,
    session_id   text        NOT NULL REFERENCES sessions (session_id),
    role         text        NOT NULL CHECK (role IN ('user', 'assistant')),
    seq          bigint      GENERATED ALWAYS AS IDENTITY UNIQUE,
    status       text        NOT NULL CHECK (status IN ('pending', 'completed', 'errored')),
    answers      text[],
    error        text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    completed_at timestamptz
);
CREATE INDEX messages_session ON messages (session_id, seq);

CREATE TABLE message_parts (
    message_id text    NOT NULL REFERENCES messages (message_id),
    idx        integer NOT NULL,
    kind       text    NOT NULL CHECK (kind IN ('text')),
    body       text    NOT NULL,
    PRIMARY KEY (message_id, idx)
);

-- +goose Down
-- Forward-only: promptline never migrates down in production.
SELECT 'down migrations are not supported';
