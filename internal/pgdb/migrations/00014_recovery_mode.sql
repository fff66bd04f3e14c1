-- +goose Up
-- The fleet's recovery mode (consumer recovery hold|resume): one row, read
-- by every recovery pass, so that switching a running fleet needs no
-- restart. No row: each process runs in its --recovery-mode. In hold, a
-- pass only plans (nothing is taken over) and operators apply with
-- `consumer recovery apply`. The runtime role reads and writes it through
-- the default table grants (deployments/postgres/roles.sql); the console
-- role only reads it.
CREATE TABLE recovery_mode (
    singleton boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    mode      text        NOT NULL CHECK (mode IN ('auto', 'hold')),
    set_by    text        NOT NULL,
    note      text,
    set_at    timestamptz NOT NULL DEFAULT now()
);

-- The audit of operators' recovery actions: each hold, resume and apply
-- run, who did it and why. An apply names the decisions it made in
-- recoveries.recovered_by ('apply#<id>:<operator>'), so a run cut short is
-- visible, and running it again applies only what is left.
CREATE TABLE recovery_actions (
    id         bigserial   PRIMARY KEY,
    action     text        NOT NULL CHECK (action IN ('hold', 'resume', 'apply')),
    operator   text        NOT NULL,
    note       text,
    session_id text,
    decision   text,
    applied    integer,
    at         timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);

-- +goose Down
SELECT 'down migrations are not supported';
