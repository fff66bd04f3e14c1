-- +goose Up
-- One row per recovered execution: the decision and the evidence it rested
-- on. The primary key makes a second recovery of the same execution a no-op.
CREATE TABLE recoveries (
    execution_id            text        PRIMARY KEY,
    session_id              text        NOT NULL,
    phase_found             text        NOT NULL,
    decision                text        NOT NULL,
    rule                    text,
    evidence                jsonb       NOT NULL,
    token_before            bigint      NOT NULL,
    token_after             bigint      NOT NULL,
    continuation_message_id text        UNIQUE,
    retry_attempt_id        text,
    recovered_by            text        NOT NULL,
    decided_at              timestamptz NOT NULL DEFAULT now(),
    settled_at              timestamptz,
    quarantine_reason       text
);
CREATE INDEX recoveries_session ON recoveries (session_id, decided_at);

-- Inputs can be quarantined (e.g. a continuation naming another session's
-- execution); quarantined inputs are skipped until an operator releases them.
ALTER TABLE inputs ADD COLUMN quarantine_reason text;
ALTER TABLE inputs ADD COLUMN quarantined_at timestamptz;

-- Lost-wake redrive remembers when it last woke a session.
ALTER TABLE sessions ADD COLUMN redriven_at timestamptz;
CREATE INDEX inputs_redrive ON inputs (admitted_at) WHERE promotion_seq IS NULL AND wake_pending AND quarantine_reason IS NULL;

-- Operators release quarantined rows; every release is audited.
CREATE TABLE quarantine_releases (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind        text        NOT NULL,
    ref         text        NOT NULL,
    reason      text        NOT NULL,
    released_by text        NOT NULL,
    note        text,
    released_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
SELECT 'down migrations are not supported';
