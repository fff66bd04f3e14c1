-- +goose Up
-- Claims: at most one per session. The fencing token comes from
-- sessions.fencing_token, which only grows; every write of an execution is
-- conditional on its token and a live lease (docs/design.md, invariant 5).
-- phase has no CHECK on purpose: recovery must be able to read a row with an
-- unknown phase and quarantine it rather than fail on it.
CREATE TABLE claims (
    session_id           text        PRIMARY KEY REFERENCES sessions (session_id),
    execution_id         text        NOT NULL UNIQUE,
    owner_id             text        NOT NULL,
    fencing_token        bigint      NOT NULL,
    phase                text        NOT NULL,
    assistant_message_id text,
    acquired_at          timestamptz NOT NULL DEFAULT now(),
    renewed_at           timestamptz NOT NULL DEFAULT now(),
    expires_at           timestamptz NOT NULL,
    quarantined_at       timestamptz,
    quarantine_reason    text
);
CREATE INDEX claims_expiry ON claims (expires_at, session_id) WHERE quarantine_reason IS NULL;

-- Messages remember the execution that wrote them (evidence for recovery).
ALTER TABLE messages ADD COLUMN execution_id text;
ALTER TABLE messages ADD COLUMN fencing_token bigint;

-- +goose Down
SELECT 'down migrations are not supported';
