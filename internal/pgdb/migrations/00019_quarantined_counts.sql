-- +goose NO TRANSACTION
-- +goose Up
-- The quarantine gauge (promptline_quarantined_rows) is read from the
-- database on every recovery pass of every consumer process (every
-- --recovery-interval, 10 s by default): a count of the quarantined rows
-- of inputs and of outbox. Neither had an index for it, so each count read
-- the whole table: inputs only grows (a prompt's row is its idempotency
-- key), and the outbox holds every row of --outbox-retention. These
-- partial indexes hold the quarantined rows alone, which are rare: a
-- write that quarantines nothing evaluates the predicate and inserts no
-- entry, and every update that could set quarantine_reason is already
-- not HOT (the columns of outbox_unpublished's and inputs_waiting_session's
-- predicates), so no update loses HOT. They also serve the quarantine list
-- (recovery's ListQuarantined), oldest first. Built CONCURRENTLY, so that
-- upgrading a running deployment blocks no writer.
CREATE INDEX CONCURRENTLY IF NOT EXISTS inputs_quarantined ON inputs (quarantined_at) WHERE quarantine_reason IS NOT NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_quarantined ON outbox (quarantined_at) WHERE quarantine_reason IS NOT NULL;

-- +goose Down
SELECT 'down migrations are not supported';
