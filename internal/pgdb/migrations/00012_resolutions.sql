-- +goose Up
-- An operator's finding on a tool call or provider attempt left unknown
-- (consumer session resolve): what the person found out in the outside
-- system, who said so, and the continuation it admitted when the turn can
-- go on. One row per resolution round of a target: a target becomes
-- unknown again only if the continuation its resolution admitted was
-- promoted and ended unknown once more, and then it may be resolved anew
-- (round 2, ...). Within a round, running the command again is a no-op.
CREATE TABLE resolutions (
    target_id               text        NOT NULL,
    round                   integer     NOT NULL,
    target_kind             text        NOT NULL CHECK (target_kind IN ('tool_call', 'attempt')),
    session_id              text        NOT NULL REFERENCES sessions (session_id),
    execution_id            text        NOT NULL,
    assistant_message_id    text        NOT NULL,
    finding                 text        NOT NULL CHECK (finding IN ('ran', 'did_not_run')),
    output                  text,
    state_before            text        NOT NULL,
    output_before           text,
    continuation_message_id text        UNIQUE,
    resolved_by             text        NOT NULL,
    note                    text,
    resolved_at             timestamptz NOT NULL DEFAULT now(),
    settled_at              timestamptz,
    PRIMARY KEY (target_id, round)
);
CREATE INDEX resolutions_session ON resolutions (session_id, resolved_at);

-- +goose Down
SELECT 'down migrations are not supported';
