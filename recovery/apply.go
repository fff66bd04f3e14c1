package recovery

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/faults"
	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
	"github.com/promptline/promptline/transcript"
)

// OutcomeUnknownText marks an assistant message reconciled after a restart.
const OutcomeUnknownText = "outcome unknown after restart"

// apply carries out a decision taken on ev, in the transaction that
// gathered ev under the session's lock: the takeover (compare-and-swap),
// the decision's writes, its record and its outbox rows commit together
// (invariant 9). It writes nothing that Decide did not name, except that
// the continuation moves to its other ID when a prompt of another session
// took the chosen one since ev was read (admitContinuation).
func (r *Recoverer) apply(ctx context.Context, tx pgx.Tx, old ledger.Claim, ev Evidence, d Decision) error {
	if d.Decision == DecisionQuarantined {
		return r.quarantineTx(ctx, tx, old, d.QuarantineReason, &ev)
	}
	nc, err := ledger.Takeover(ctx, tx, old, "recovery/"+old.ExecutionID, r.cfg.OwnerID, time.Minute)
	if errors.Is(err, ledger.ErrNotExpired) {
		return errSkipped
	}
	if err != nil {
		return err
	}
	faults.Hit(faults.RecoveryAfterTakeover)
	if err := r.carryOut(ctx, tx, old, nc, ev, &d); err != nil {
		return err
	}
	var at *time.Time
	if r.cfg.Rate > 0 && paced(ev, d) {
		// Late in the transaction, so that the bucket's row is held for
		// the record and the commit only; a rollback from here on (a
		// crash, a failed insert) returns the token.
		t, err := r.takeTokens(ctx, tx, 1)
		if err != nil {
			return err
		}
		if t.got == 0 {
			return &noTokenError{After: t.after}
		}
		faults.Hit(faults.RecoveryAfterToken)
		at = &t.at
	}
	return r.record(ctx, tx, old, nc, ev, d, at)
}

// carryOut writes what the decision d names, after the takeover;
// d.ContinuationID becomes the continuation's ID as admitted.
func (r *Recoverer) carryOut(ctx context.Context, tx pgx.Tx, old, nc ledger.Claim, ev Evidence, d *Decision) error {
	if d.Decision == DecisionContinued {
		if d.Rule == RuleIdempotentToolRetry {
			// Started idempotent calls run again, with their keys.
			if err := ledger.RearmIdempotentCalls(ctx, tx, &ledger.RearmIdempotentCallsParams{SessionID: old.SessionID}); err != nil {
				return err
			}
		}
		if d.RetryAttemptID != "" && d.retryDeferred {
			// It was answered (a failure) and waited for its retry: the
			// continuation sends that retry, under the same key.
			if err := ledger.SettleRetriedAttempt(ctx, tx, &ledger.SettleRetriedAttemptParams{AttemptID: d.RetryAttemptID}); err != nil {
				return err
			}
		} else if d.RetryAttemptID != "" {
			if err := ledger.FinishAttempt(ctx, tx, d.RetryAttemptID, ledger.AttemptUnknown, OutcomeUnknownText+"; sent again with the same idempotency key", 0, 0); err != nil {
				return err
			}
		}
		// An attempt deferred (certainly not sent) is settled: the
		// continuation sends its step afresh.
		if err := ledger.SettleDeferredAttempts(ctx, tx, &ledger.SettleDeferredAttemptsParams{ExecutionID: old.ExecutionID}); err != nil {
			return err
		}
		id, err := r.admitContinuation(ctx, tx, old, ev, d.ContinuationID)
		if err != nil {
			return err
		}
		d.ContinuationID = id
	}
	if d.Decision == DecisionReconciled {
		if err := r.reconcile(ctx, tx, old, nc, ev); err != nil {
			return err
		}
	}
	// Every decision clears the claim; invariant 7: with a wake when
	// inputs wait (a continuation input always waits).
	return ledger.ClearClaim(ctx, tx, &ledger.ClearClaimParams{SessionID: nc.SessionID, Token: nc.Token})
}

// reconcile marks what is uncertain, never replays it: started attempts
// and calls unknown, calls never dispatched interrupted (each call's
// tool.completed says so), the assistant message errored; the turn fails
// with reason outcome_unknown. nc is the takeover claim, whose fencing
// token names the outcomes it commits (as the executor's do).
func (r *Recoverer) reconcile(ctx context.Context, tx pgx.Tx, old, nc ledger.Claim, ev Evidence) error {
	if err := ledger.ReconcileAttempts(ctx, tx, &ledger.ReconcileAttemptsParams{ExecutionID: old.ExecutionID, Error: OutcomeUnknownText}); err != nil {
		return err
	}
	// Each call's outcome is announced (tool.completed), in the order the
	// calls were requested, before the turn's end.
	settled, err := ledger.ReconcileCalls(ctx, tx, &ledger.ReconcileCallsParams{SessionID: old.SessionID, Output: OutcomeUnknownText})
	if err != nil {
		return err
	}
	events := make([]outbox.Row, 0, len(settled)+1)
	for _, c := range settled {
		events = append(events, outbox.EventRow(r.cfg.Topics.Events, envelope.Event{
			ID: "tool.completed:" + c.ID + "@" + strconv.FormatInt(nc.Token, 10), Type: envelope.EventToolCompleted,
			SessionID: old.SessionID, At: time.Now().UTC(), TurnID: cmp.Or(ev.TurnID, old.AssistantMessageID),
			CallID: c.ID, ModelCallID: c.ModelCallID, Tool: c.Tool, Class: c.Class, Outcome: string(c.State),
		}))
	}
	if old.AssistantMessageID == "" {
		return outbox.Insert(ctx, tx, events...)
	}
	if err := transcript.FailAssistant(ctx, tx, &transcript.FailAssistantParams{MessageID: old.AssistantMessageID, Error: OutcomeUnknownText}); err != nil {
		return fmt.Errorf("reconciling assistant message: %w", err)
	}
	failed, err := r.failedMessage(ctx, tx, old, nc, ev)
	if err != nil {
		return err
	}
	return outbox.Insert(ctx, tx, append(events, outbox.EventRow(r.cfg.Topics.Events, envelope.Event{
		ID: "turn.failed:" + failed, Type: envelope.EventTurnFailed, SessionID: old.SessionID,
		At: time.Now().UTC(), MessageIDs: ev.TurnMessageIDs, AssistantMessageID: failed,
		Reason: envelope.FailOutcomeUnknown, Error: OutcomeUnknownText,
	}))...)
}

// FailedMessageID is the assistant message recovery creates for a turn it
// reconciles when the claim's own message cannot be the one its failure
// names (failedMessage). The space keeps it out of reach of senders: no
// envelope message ID has one (envelope.validID).
func FailedMessageID(executionID string) string { return "recovery-failed " + executionID }

// failedMessage is the assistant message the reconciled turn's turn.failed
// names: the claim's, marked errored by reconcile just before, unless
// that message could not be:
//   - it was answered: a turn that died in a tool call has the step that
//     asked for the calls as its claim's message, completed with its
//     tool_call parts, which stays as answered (the executor's
//     continuation, too, answers in a message of its own);
//   - an earlier reconcile named it already: a continuation (recovery's
//     or an operator's resolution) that dies before it began a step of
//     its own, while re-running the calls its turn left, has a claim that
//     still points at the message the first failure named; the second
//     failure's turn.failed must be a new event (consumers deduplicate on
//     id);
//   - it is not in the transcript.
//
// Then the failure gets an errored message of its own, as the executor
// creates one for a turn that fails before its step began, so that its
// turn.failed names a message the transcript holds, errored (invariant
// 12).
func (r *Recoverer) failedMessage(ctx context.Context, tx pgx.Tx, old, nc ledger.Claim, ev Evidence) (string, error) {
	a, err := transcript.ReadAssistantTurn(ctx, tx, &transcript.AssistantTurnParams{MessageID: old.AssistantMessageID})
	if err := interpretError(err); err != nil && !errors.Is(err, errNotFound) {
		return "", fmt.Errorf("reading the claim's message %s: %w", old.AssistantMessageID, err)
	}
	var named bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM recoveries
		WHERE session_id = $1 AND execution_id <> $2 AND decision = $3 AND evidence->>'assistant_message_id' = $4)`,
		old.SessionID, old.ExecutionID, DecisionReconciled, old.AssistantMessageID).Scan(&named); err != nil {
		return "", fmt.Errorf("reading earlier failures of %s: %w", old.AssistantMessageID, err)
	}
	if a.Status == "errored" && !named {
		return old.AssistantMessageID, nil
	}
	id := FailedMessageID(old.ExecutionID)
	if err := transcript.InsertErroredAssistant(ctx, tx, &transcript.InsertErroredAssistantParams{
		ID: id, SessionID: old.SessionID, Answers: ev.TurnMessageIDs, ExecutionID: old.ExecutionID, Token: nc.Token,
		TurnID: cmp.Or(ev.TurnID, old.AssistantMessageID), Error: OutcomeUnknownText,
	}); err != nil {
		return "", fmt.Errorf("creating the failed turn's assistant message: %w", err)
	}
	return id, nil
}

// admitContinuation admits the continuation input (Decide chose its ID
// on ev), of kind continuation: a steer, so that it runs before queued
// prompts, and returns the ID it admitted. A second admission is an exact
// retry. Inputs of other sessions are not serialised by this session's
// lock, so a prompt of another session may have come to hold the chosen ID
// since ev was read: the holder it finds joins the evidence and the ID is
// chosen again by the same rule (continuationID), as the pass chose it
// before it decided on gathered evidence; an ID held by an input of another
// session, kind or payload is never taken for this one, and when no ID
// fits, the decision fails.
func (r *Recoverer) admitContinuation(ctx context.Context, tx pgx.Tx, old ledger.Claim, ev Evidence, id string) (string, error) {
	h := continuationHash(old)
	holders := slices.Clone(ev.ContinuationHolders)
	for range 3 { // two candidate IDs: at most two holders found here
		p := &admission.AdmitContinuationParams{MessageID: id, SessionID: old.SessionID, PayloadHash: h}
		held, err := admission.AdmitContinuation(ctx, tx, p)
		if err != nil {
			return "", err
		}
		if held.Is(p) {
			return id, nil
		}
		holders = append(slices.DeleteFunc(holders, func(f InputFact) bool { return f.MessageID == held.MessageID }), InputFact(held))
		var reason string
		if id, reason = continuationID(old, Evidence{ContinuationHolders: holders}); reason != "" {
			return "", errors.New(reason)
		}
	}
	return "", fmt.Errorf("continuation input of %s: no ID could be admitted", old.ExecutionID)
}

// record stores the decision, decided at at (the time its token was
// taken, so that recoveries.decided_at shows the pace) or now().
func (r *Recoverer) record(ctx context.Context, tx pgx.Tx, old, nc ledger.Claim, ev Evidence, d Decision, at *time.Time) error {
	evJSON, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	tag, err := tx.Exec(ctx, `INSERT INTO recoveries (execution_id, session_id, phase_found, decision, rule, evidence,
			token_before, token_after, continuation_message_id, retry_attempt_id, recovered_by, decided_at)
		VALUES ($1, $2, $3, $4, nullif($5, ''), $6, $7, $8, nullif($9, ''), nullif($10, ''), $11, coalesce($12, now()))
		ON CONFLICT (execution_id) DO UPDATE SET phase_found = excluded.phase_found, decision = excluded.decision,
			rule = excluded.rule, evidence = excluded.evidence, token_before = excluded.token_before,
			token_after = excluded.token_after, continuation_message_id = excluded.continuation_message_id,
			retry_attempt_id = excluded.retry_attempt_id, recovered_by = excluded.recovered_by, decided_at = excluded.decided_at
		WHERE recoveries.decision = 'quarantined'`,
		old.ExecutionID, old.SessionID, string(old.Phase), d.Decision, d.Rule, evJSON, old.Token, nc.Token,
		d.ContinuationID, d.RetryAttemptID, r.cfg.OwnerID, at)
	if err != nil {
		return fmt.Errorf("recording recovery of %s: %w", old.ExecutionID, err)
	}
	if tag.RowsAffected() != 1 {
		// Only a quarantine (repaired and released since) may be followed
		// by a decision; a second decision for one execution is a bug.
		return fmt.Errorf("recording recovery of %s: it was decided before", old.ExecutionID)
	}
	rows := []outbox.Row{outbox.EventRow(r.cfg.Topics.Events, envelope.Event{
		ID: "recovery.decided:" + old.ExecutionID, Type: envelope.EventRecoveryDecided, SessionID: old.SessionID,
		At: time.Now().UTC(), ExecutionID: old.ExecutionID, Decision: string(d.Decision), Rule: d.Rule,
		ContinuationMessageID: d.ContinuationID,
	})}
	if d.ContinuationID != "" && old.AssistantMessageID != "" && len(ev.TurnMessageIDs) > 0 {
		// The turn goes on: its ID, from the execution, is the same however
		// often this decision is retried (it commits once, invariant 9).
		rows = append(rows, outbox.EventRow(r.cfg.Topics.Events, envelope.Event{
			ID: "turn.recovered:" + old.ExecutionID, Type: envelope.EventTurnRecovered, SessionID: old.SessionID,
			At: time.Now().UTC(), TurnID: cmp.Or(ev.TurnID, old.AssistantMessageID), MessageIDs: ev.TurnMessageIDs,
			AssistantMessageID: old.AssistantMessageID, ExecutionID: old.ExecutionID, Rule: d.Rule,
			ContinuationMessageID: d.ContinuationID,
		}))
	}
	if wakes(ev, d) {
		rows = append(rows, outbox.WakeRow(r.cfg.Topics.Wakes, old.SessionID, "recovery", time.Now().UTC()))
	}
	return outbox.Insert(ctx, tx, rows...)
}

// quarantineClaim marks the claim in its own transaction (after a failed
// decision).
func (r *Recoverer) quarantineClaim(ctx context.Context, c ledger.Claim, reason string) error {
	return pgdb.InTx(ctx, r.pool, func(tx pgx.Tx) error { return r.quarantineTx(ctx, tx, c, reason, nil) })
}

// quarantineTx marks the claim, by compare-and-swap on the values that were
// scanned, so that later scans skip it until an operator releases it. ev,
// when not nil, is the evidence the quarantine was decided on, stored with
// it (a failed decision has none: '{}').
func (r *Recoverer) quarantineTx(ctx context.Context, tx pgx.Tx, c ledger.Claim, reason string, ev *Evidence) error {
	evJSON := []byte(`{}`)
	if ev != nil {
		var err error
		if evJSON, err = json.Marshal(ev); err != nil {
			return err
		}
	}
	quarantined, err := ledger.QuarantineClaim(ctx, tx, &ledger.QuarantineClaimParams{Claim: c, Reason: reason})
	if err != nil {
		return err
	}
	if !quarantined {
		return errSkipped
	}
	// decidedAt is the record's time, or now() when the execution has a
	// decision of another kind on record (the failed decision may be a
	// second one, which record refuses): the claim is quarantined all the
	// same, and that record stays.
	var decidedAt time.Time
	if err := tx.QueryRow(ctx, `WITH recorded AS (
			INSERT INTO recoveries (execution_id, session_id, phase_found, decision, evidence,
				token_before, token_after, recovered_by, quarantine_reason)
			VALUES ($1, $2, $3, 'quarantined', $7, $4, $4, $5, $6)
			ON CONFLICT (execution_id) DO UPDATE SET quarantine_reason = excluded.quarantine_reason, evidence = excluded.evidence, decided_at = now()
			WHERE recoveries.decision = 'quarantined'
			RETURNING decided_at)
		SELECT coalesce((SELECT decided_at FROM recorded), now())`,
		c.ExecutionID, c.SessionID, string(c.Phase), c.Token, r.cfg.OwnerID, reason, evJSON).Scan(&decidedAt); err != nil {
		return fmt.Errorf("recording quarantine of %s: %w", c.SessionID, err)
	}
	// The session's watchers learn that it waits for an operator. The ID
	// names the quarantine, not only the execution: a claim released and
	// then decided (or quarantined again, after another release) gets an
	// event of its own, which a consumer that deduplicates on id keeps.
	// decided_at is the transaction's start, and a release commits between
	// two quarantines of one claim, so it tells them apart.
	return outbox.Insert(ctx, tx, outbox.EventRow(r.cfg.Topics.Events, envelope.Event{
		ID:   "recovery.decided:" + c.ExecutionID + ":quarantined:" + strconv.FormatInt(decidedAt.UnixMicro(), 10),
		Type: envelope.EventRecoveryDecided, SessionID: c.SessionID, At: time.Now().UTC(),
		ExecutionID: c.ExecutionID, Decision: string(DecisionQuarantined),
	}))
}
