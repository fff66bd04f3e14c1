-- +goose NO TRANSACTION
-- +goose Up
-- The operator console (`consumer console`, docs/console.md) pages every
-- list by index, newest first, so that a page costs the same with 100,000
-- sessions as with ten.
--
-- sessions: by created_at, which never changes after the insert, so the
-- admission's update of last_admitted_at stays a HOT update (an index on
-- last_admitted_at would make every admission write the index too).
-- session_id breaks ties, making the keyset cursor (created_at, session_id)
-- total.
--
-- recoveries: the recent decisions, by decided_at. A recovery inserts one
-- row per recovered execution, rarely; the index costs that insert little.
--
-- CONCURRENTLY, so that upgrading a running deployment blocks neither
-- admission nor recovery while the indexes build; an interrupted run may
-- leave an invalid index behind, dropped first.
DROP INDEX CONCURRENTLY IF EXISTS sessions_newest;
CREATE INDEX CONCURRENTLY sessions_newest ON sessions (created_at DESC, session_id DESC);
DROP INDEX CONCURRENTLY IF EXISTS recoveries_recent;
CREATE INDEX CONCURRENTLY recoveries_recent ON recoveries (decided_at DESC, execution_id DESC);

-- +goose Down
SELECT 'down migrations are not supported';
