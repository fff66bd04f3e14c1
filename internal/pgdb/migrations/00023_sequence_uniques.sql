-- +goose Up
-- Two UNIQUE constraints that no query reads and that nothing but their
-- sequence could break, dropped: every turn paid for them.
--
--   - inputs.promotion_seq (00001): the value comes from nextval of the
--     promotion_seq sequence, which never hands a value out twice, and no
--     statement looks an input up or orders inputs by it (the turn's
--     order is admission_seq, per session). The index took an entry when
--     the input was admitted (a NULL) and another when it was promoted:
--     the promotion changes columns of the waiting indexes' predicates, so
--     it is never a HOT update and writes every index of the table again.
--   - messages.seq (00001): an identity column, GENERATED ALWAYS, so only
--     an OVERRIDING SYSTEM VALUE could repeat a value; every query orders a
--     session's messages by it through messages_session (session_id, seq).
--     A turn inserts two messages. The global index also offered the
--     planner "ORDER BY seq DESC LIMIT 1" over every session's messages,
--     filtered on the session (the plan of a small table, docs/benchmarks.md
--     "A plan made on a small table"), which messages_session answers by
--     one probe.
--
-- Measured on the burn-down: docs/benchmarks.md, "2026-12-07 (later):
-- uniques that only a sequence could break". Dropping a constraint is a
-- catalog change under an ACCESS EXCLUSIVE lock (an index behind a
-- constraint cannot be dropped CONCURRENTLY), held for an instant, but
-- waited for behind any transaction on the table, with every write that
-- comes after queued behind the wait. So each wait is bounded at 2 s
-- (lock_timeout times each lock's wait apart: the writes to inputs may
-- queue for up to 4 s while the second waits, once per upgrade). Past it
-- the migration fails (55P03, lock_not_available) in its one transaction,
-- changes nothing, and runs again as it is (consumer migrate).
SET LOCAL lock_timeout = '2s';
ALTER TABLE inputs DROP CONSTRAINT IF EXISTS inputs_promotion_seq_key;
ALTER TABLE messages DROP CONSTRAINT IF EXISTS messages_seq_key;

-- +goose Down
SELECT 'down migrations are not supported';
