-- +goose NO TRANSACTION
-- +goose Up
-- The quarantine gauge (promptline_quarantined_rows) is read from the
-- database on every recovery pass of every consumer process (every
-- --recovery-interval, 10 s by default): a count of the quarantined rows
-- of inputs and of outbox. Neither had an index for it, so each count read
-- the whole table: inputs only grows (a prompt's row is its idempotency
-- key), and the outbox holds every row of --outbox-retention (measured:
-- 88-103 ms a count at 1,000,000 outbox rows, 0.16-0.49 ms with the index;
-- docs/benchmarks.md).
--
-- These partial indexes hold the quarantined rows alone, which are rare: a
-- write that quarantines nothing evaluates the predicate and adds no
-- entry, and every update that sets quarantine_reason was already not HOT
-- (the column is in the predicates of outbox_unpublished,
-- inputs_waiting_session and inputs_redrive_admitted). Each is keyed on
-- its table's primary key, so that a quarantined row's lookup by key (a
-- release: "id = $1 AND quarantine_reason IS NOT NULL") that the planner
-- sends through the small partial index still finds the row by its key,
-- not by reading every quarantined row.
--
-- CONCURRENTLY, as in 00010, so that upgrading a running deployment blocks
-- no writer while they build; a run cut short (the lock timeout, a killed
-- migration) may leave an invalid index behind, so each is dropped first
-- and the file can run again. 00017's index had IF NOT EXISTS, which keeps
-- such an invalid index: it is rebuilt here the same way (quarantine
-- releases are an operator's audit log, a small table).
DROP INDEX CONCURRENTLY IF EXISTS inputs_quarantined;
CREATE INDEX CONCURRENTLY inputs_quarantined ON inputs (message_id) WHERE quarantine_reason IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS outbox_quarantined;
CREATE INDEX CONCURRENTLY outbox_quarantined ON outbox (id) WHERE quarantine_reason IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS quarantine_releases_ref;
CREATE INDEX CONCURRENTLY quarantine_releases_ref ON quarantine_releases (kind, ref, released_at);

-- +goose Down
SELECT 'down migrations are not supported';
