-- +goose NO TRANSACTION
-- +goose Up
-- The recovery cap (--recovery-max-per-session) reads, for every decision,
-- plan and held page, the last release of a capped claim of the session:
-- quarantine_releases by kind and ref. The table is an audit log that only
-- grows; without this index each lookup read all of it. Built
-- CONCURRENTLY, so that upgrading a running deployment does not block
-- releases.
CREATE INDEX CONCURRENTLY IF NOT EXISTS quarantine_releases_ref ON quarantine_releases (kind, ref, released_at);

-- +goose Down
SELECT 'down migrations are not supported';
