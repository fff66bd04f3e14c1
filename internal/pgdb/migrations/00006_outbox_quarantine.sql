-- +goose Up
-- An outbox row that Kafka will never accept (larger than the producer's or
-- the broker's message limit) is quarantined with its reason instead of
-- blocking every row behind it (P6); an operator repairs and releases it.
ALTER TABLE outbox ADD COLUMN quarantine_reason text;
ALTER TABLE outbox ADD COLUMN quarantined_at timestamptz;
DROP INDEX outbox_unpublished;
CREATE INDEX outbox_unpublished ON outbox (id) WHERE published_at IS NULL AND quarantine_reason IS NULL;

-- +goose Down
SELECT 'down migrations are not supported';
