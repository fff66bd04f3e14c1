package admission

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/outbox"
)

// ReplyPrefix starts the message ID of the input that a permission reply
// admits: permission-reply-<request ID>. Promoting it resumes the parked
// turn. The ID only names the input: what it is says its kind
// (KindPermissionReply), and a prompt may carry any ID, this one included.
// When a prompt holds it, the reply's input takes ReplyTakenPrefix
// instead, which no prompt can hold: a prompt's message ID has no space
// (envelope.Decode).
const (
	ReplyPrefix      = "permission-reply-"
	ReplyTakenPrefix = "permission-reply "
)

// maxQuotedKey is how much of a mismatched Kafka key a reject's detail
// quotes: as much as a prompt's does (envelope.Decode).
const maxQuotedKey = 64

// errInputIDTaken: every ID an internal input may take is held by another
// input (of another kind, or the same kind with another payload).
var errInputIDTaken = errors.New("input ID taken by another input")

// ReplyOutcome classifies a permission reply at admission.
type ReplyOutcome struct {
	Outcome Outcome
	// Reason is the rejects-topic reason for a reply that is not admitted.
	Reason string
	Detail string
}

// AdmitReply admits a permission reply exactly once: it records the reply
// (and an "always" grant), and admits the reply's input with a wake, in one
// transaction. A repeated identical reply is a duplicate; a different
// reply to a replied request is a conflict; a reply to no request is
// rejected with reason unknown_request.
//
// key is the Kafka key (nil when absent); a present key must be the
// request's session, as for prompts.
func (a *Admitter) AdmitReply(ctx context.Context, key []byte, r envelope.PermissionReply, src Source) (ReplyOutcome, error) {
	h := sha256.Sum256([]byte(r.Reply + "\x00" + r.Message))
	var out ReplyOutcome
	var wrote bool
	err := pgdb.InTx(ctx, a.pool, func(tx pgx.Tx) error {
		out, wrote = ReplyOutcome{}, false
		var session string
		err := tx.QueryRow(ctx, `SELECT session_id FROM permission_requests WHERE request_id = $1`, r.RequestID).Scan(&session)
		if errors.Is(interpretError(err), errNotFound) {
			out = ReplyOutcome{Outcome: Conflict, Reason: envelope.ReasonUnknownRequest, Detail: fmt.Sprintf("no permission request %q", r.RequestID)}
			return nil
		}
		if err != nil {
			return err
		}
		if key != nil && string(key) != session {
			// The key is the sender's, of any size: the detail quotes its
			// first bytes only, as a prompt's does (envelope.Decode). Whole,
			// a large key (four bytes of detail for each control byte) made
			// a reject too large to publish even without the original.
			out = ReplyOutcome{Outcome: Conflict, Reason: envelope.ReasonKeyMismatch,
				Detail: fmt.Sprintf("Kafka key %q differs from the request's session %q", key[:min(len(key), maxQuotedKey)], session)}
			return nil
		}
		// Lock order: the session row first, as everywhere.
		// The request's session exists (a foreign key): found is true.
		if _, _, err := LockSession(ctx, tx, &LockSessionParams{SessionID: session}); err != nil {
			return err
		}
		var status string
		var prior []byte
		if err := tx.QueryRow(ctx, `SELECT status, reply_hash FROM permission_requests WHERE request_id = $1 FOR UPDATE`, r.RequestID).Scan(&status, &prior); err != nil {
			return err
		}
		if status != "pending" {
			if bytes.Equal(prior, h[:]) {
				out = ReplyOutcome{Outcome: Duplicate}
			} else {
				out = ReplyOutcome{Outcome: Conflict, Reason: envelope.ReasonConflict, Detail: fmt.Sprintf("request %q was answered before with another reply", r.RequestID)}
			}
			return nil
		}
		newStatus := "approved"
		if r.Reply == envelope.ReplyReject {
			newStatus = "rejected"
		}
		if _, err := tx.Exec(ctx, `UPDATE permission_requests SET status = $2, reply = $3, message = nullif($4, ''), reply_hash = $5,
			source_topic = $6, source_partition = $7, source_offset = $8, replied_at = now() WHERE request_id = $1`,
			r.RequestID, newStatus, r.Reply, r.Message, h[:], src.Topic, src.Partition, src.Offset); err != nil {
			return fmt.Errorf("recording reply: %w", err)
		}
		if r.Reply == envelope.ReplyAlways {
			if _, err := tx.Exec(ctx, `INSERT INTO permission_grants (session_id, pattern, request_id)
				SELECT session_id, pattern, request_id FROM permission_requests WHERE request_id = $1
				ON CONFLICT DO NOTHING`, r.RequestID); err != nil {
				return fmt.Errorf("recording grant: %w", err)
			}
		}
		if err := a.insertReplyInput(ctx, tx, r.RequestID, session, src); err != nil {
			if errors.Is(err, errInputIDTaken) {
				out = ReplyOutcome{Outcome: Conflict, Reason: envelope.ReasonConflict, Detail: fmt.Sprintf("the input of the reply to %q: %v", r.RequestID, err)}
			}
			return err
		}
		out = ReplyOutcome{Outcome: Admitted}
		wrote = true
		now := time.Now().UTC()
		return outbox.Insert(ctx, tx,
			eventRow(a.cfg.Topics.Events, envelope.Event{ID: "permission.replied:" + r.RequestID, Type: envelope.EventPermissionReplied,
				SessionID: session, At: now, RequestID: r.RequestID, Reply: r.Reply}),
			wakeRow(a.cfg.Topics.Wakes, session, "permission-reply", now))
	})
	if errors.Is(err, errInputIDTaken) {
		return out, nil // rolled back: the request stays pending
	}
	if err != nil {
		return ReplyOutcome{}, fmt.Errorf("admitting reply to %s: %w", r.RequestID, err)
	}
	if wrote && a.cfg.OnCommitFunc != nil {
		a.cfg.OnCommitFunc()
	}
	return out, nil
}

// insertReplyInput admits the input that resumes request requestID's turn,
// of kind permission_reply, under ReplyPrefix+requestID, or under
// ReplyTakenPrefix+requestID when a prompt (or anything but this reply's
// input) holds that ID: the reply reaches its request whatever a sender
// sent before it. An ID held by this very input (same kind, session and
// payload) is an exact retry. errInputIDTaken when both are held by
// others, which no sender can cause.
func (a *Admitter) insertReplyInput(ctx context.Context, tx pgx.Tx, requestID, session string, src Source) error {
	h := sha256.Sum256([]byte("permission-reply:" + requestID))
	for _, id := range []string{ReplyPrefix + requestID, ReplyTakenPrefix + requestID} {
		var kind, held string
		var hash []byte
		err := tx.QueryRow(ctx, `WITH ins AS (
				INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending,
				                    source_topic, source_partition, source_offset, kind)
				VALUES ($1, $2, '', $3, 'steer', true, $4, $5, $6, 'permission_reply')
				ON CONFLICT (message_id) DO NOTHING RETURNING kind, session_id, payload_hash)
			SELECT kind, session_id, payload_hash FROM ins
			UNION ALL SELECT kind, session_id, payload_hash FROM inputs WHERE message_id = $1 AND NOT EXISTS (SELECT 1 FROM ins)`,
			id, session, h[:], src.Topic, src.Partition, src.Offset).Scan(&kind, &held, &hash)
		if err != nil {
			return fmt.Errorf("admitting the reply's input %s: %w", id, err)
		}
		if kind == KindPermissionReply && held == session && bytes.Equal(hash, h[:]) {
			return nil
		}
	}
	return fmt.Errorf("reply to %s: %w", requestID, errInputIDTaken)
}
