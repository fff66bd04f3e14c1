-- +goose Up
-- What an input is (docs/design.md, invariant 14): a prompt, a permission reply's
-- input, or a recovery continuation. Before this migration the executor,
-- the waiting_inputs view and the rest told internal inputs by a message ID
-- prefix (permission-reply-, recovery-continue-), which any sender may also
-- use: a prompt could take a reply's ID (the reply was then lost and its
-- session stranded), and a prompt named like one was quarantined in
-- silence. Now the column says, and a prompt is a prompt whatever its ID.
--
-- Existing rows: an internal input is recognised by its prefix AND the
-- payload hash its writer gives it (sha256 of 'permission-reply:<request>'
-- or 'continuation:<session>:<execution>'), which no prompt has (a prompt's
-- hash covers its length-prefixed fields); a prompt that merely looks like
-- one stays a prompt. Adding the column with a constant default is
-- instant; the CHECK and the backfill read the table once.
ALTER TABLE inputs ADD COLUMN kind text NOT NULL DEFAULT 'prompt'
    CONSTRAINT inputs_kind CHECK (kind IN ('prompt', 'permission_reply', 'continuation'));

-- +goose StatementBegin
CREATE FUNCTION promptline_legacy_input_kind() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.message_id LIKE 'permission-reply-%'
       AND NEW.payload_hash = sha256(convert_to('permission-reply:' || substr(NEW.message_id, 18), 'UTF8')) THEN
        NEW.kind := 'permission_reply';
    ELSIF NEW.message_id LIKE 'recovery-continue-%'
       AND NEW.payload_hash = sha256(convert_to('continuation:' || NEW.session_id || ':' || substr(NEW.message_id, 19), 'UTF8')) THEN
        NEW.kind := 'continuation';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- The backfill is the same rule.
UPDATE inputs SET kind = 'permission_reply'
WHERE message_id LIKE 'permission-reply-%'
  AND payload_hash = sha256(convert_to('permission-reply:' || substr(message_id, 18), 'UTF8'));
UPDATE inputs SET kind = 'continuation'
WHERE message_id LIKE 'recovery-continue-%'
  AND payload_hash = sha256(convert_to('continuation:' || session_id || ':' || substr(message_id, 19), 'UTF8'));

-- Consumers of the previous release keep running while the Deployment
-- rolls (docs/deploy.md) and insert internal inputs without a kind: this
-- trigger classifies them by the same rule. It fires only for rows named
-- like an internal input and left at the default (the WHEN is evaluated
-- without calling the function), so admission of ordinary prompts pays
-- nothing. It can go once no release before this one runs.
CREATE TRIGGER inputs_legacy_kind BEFORE INSERT ON inputs FOR EACH ROW
    WHEN (NEW.kind = 'prompt' AND (NEW.message_id LIKE 'permission-reply-%' OR NEW.message_id LIKE 'recovery-continue-%'))
    EXECUTE FUNCTION promptline_legacy_input_kind();

-- The view tells a parked session's reply by its kind. The column list
-- (i.*) gains kind at its end, as CREATE OR REPLACE VIEW allows.
CREATE OR REPLACE VIEW waiting_inputs AS
SELECT i.* FROM inputs i
WHERE i.promotion_seq IS NULL AND i.wake_pending AND i.quarantine_reason IS NULL
  AND (i.kind = 'permission_reply'
       OR NOT EXISTS (SELECT 1 FROM permission_requests p WHERE p.session_id = i.session_id AND p.status = 'pending'));

-- +goose Down
SELECT 'down migrations are not supported';
