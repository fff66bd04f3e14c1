-- +goose Up
-- The fleet's recovery token bucket (--recovery-rate): one row, shared by
-- every consumer's recovery passes, so that the rate bounds the whole
-- fleet, not each process. tokens is what was left at updated_at; a taker
-- refills it from clock_timestamp() - updated_at at its own --recovery-rate
-- (capped at one second's worth) and takes its tokens in one UPDATE inside
-- the decision's own transaction: a rolled back decision (a crash, a
-- failed statement) gives its token back with everything else. The
-- runtime role reads and writes it through the default table grants
-- (deployments/postgres/roles.sql).
CREATE TABLE recovery_rate (
    singleton  boolean          PRIMARY KEY DEFAULT true CHECK (singleton),
    tokens     double precision NOT NULL CHECK (tokens >= 0),
    updated_at timestamptz      NOT NULL DEFAULT clock_timestamp()
);
INSERT INTO recovery_rate (tokens) VALUES (0);

-- +goose Down
SELECT 'down migrations are not supported';
