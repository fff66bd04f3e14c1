-- +goose NO TRANSACTION
-- +goose Up
-- What is known of a provider attempt, as early as it is known, so that an
-- attempt left unknown (it may have been billed) says what it may have cost
-- and whom to ask (issue 20, the spend at risk):
--   model           the model the provider was asked for (empty when the
--                   provider names none), written with the intent, in the
--                   intent's own statement;
--   request_tokens  an estimate of the request's input tokens, written
--                   with the intent: the bytes of the request as the
--                   executor hashes it (its JSON encoding), divided by 4
--                   and rounded up; an estimate, not the provider's count;
--   response_id     the provider's response or request ID, written as
--                   soon as the first bytes of the answer arrive (a
--                   best-effort, fenced write of its own: absent when that
--                   write failed or the process died first), and again
--                   with the outcome.
-- Adding nullable columns without a default rewrites nothing.
ALTER TABLE attempts ADD COLUMN IF NOT EXISTS model text;
ALTER TABLE attempts ADD COLUMN IF NOT EXISTS request_tokens bigint;
ALTER TABLE attempts ADD COLUMN IF NOT EXISTS response_id text;
ALTER TABLE attempts ADD COLUMN IF NOT EXISTS response_id_at timestamptz;

-- attempts_unknown serves the recovery loop's read of the tokens at risk
-- (promptline_provider_tokens_at_risk, every pass): the unknown attempts
-- are few, the table is not. Its predicate on state makes an attempt's
-- state change a non-HOT update (one or two per attempt); a full scan of
-- the ledger every pass would cost more. CONCURRENTLY, as in 00010, so
-- that no writer is blocked while it builds; a run cut short may leave an
-- invalid index behind, so it is dropped first and the file can run again.
DROP INDEX CONCURRENTLY IF EXISTS attempts_unknown;
CREATE INDEX CONCURRENTLY attempts_unknown ON attempts (provider, model) INCLUDE (request_tokens, attempt_id) WHERE state = 'unknown';

-- +goose Down
SELECT 'down migrations are not supported';
