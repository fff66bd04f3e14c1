package executor

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/pgdb"
	"github.com/promptline/promptline/internal/retry"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/transcript"
)

// The common turn's write transactions are one statement each, a call of
// a SQL function (ledger.Call; migration 00018): the claim with the first
// promotion and the first attempt's intent (promptline_turn_first), a
// later promotion of plain prompts under the claim (promptline_turn_next),
// and an answer without tool calls with the release
// (promptline_turn_answer). The other paths (continuations, permission
// replies, tool steps, retries, failures) write through
// ledger.Execution.Write, a statement each. Both paths commit the same rows
// in the same transactions; only the number of statements and round trips
// differs (TestTurnCallsWriteWhatTheStatementsWrite).

// sessionView is what the execution reads of its session before promoting:
// the head of the waiting inputs (waitingSQL: what a turn is chosen from),
// oldest first, and the transcript as stored (orphaned tool calls not yet
// settled). The execution is the session's only writer,
// and admission only adds inputs, so the view stays true until the
// execution's next write; an input admitted meanwhile waits for the next
// turn, as it would have had it been admitted a moment later.
type sessionView struct {
	waiting []waitingInput
	history []provider.TranscriptMessage
	// unreadable says that the stored transcript cannot be read (a
	// transcript.UnreadablePartError): no turn can be sent (history is
	// empty), and the session is left to recovery, which quarantines it.
	unreadable error
}

// kind is the input's (admission.KindPrompt, admission.KindPermissionReply,
// admission.KindContinuation):
// what the input is, whatever its ID says.
//
// pickable says that a turn can take it (waitingSQL): only then is its
// text read.
type waitingInput struct {
	id, text, delivery, kind string
	pickable                 bool
}

// queue adds the view's reads to b, filling v when b's results are read.
// The callbacks may run twice (a combined transaction that failed is sent
// again alone), so each sets its part of v afresh.
func (v *sessionView) queue(b *pgx.Batch, sessionID string) {
	b.Queue(waitingSQL, sessionID, maxSteersPerTurn, maxSteerBytesPerTurn).Query(func(rows pgx.Rows) (err error) {
		v.waiting, err = scanWaiting(rows)
		return err
	})
	transcript.QueueHistory(b, sessionID, func(h []provider.TranscriptMessage, unreadable error) {
		v.history, v.unreadable = h, unreadable
	})
}

// readCtx bounds a read made under the claim (ledger's RoundTripTimeout):
// the run's context has no deadline, and while a read waits on a
// connection gone silent (a partition, a failover with no reset) the
// lease is still renewed on other connections, so recovery would never
// take the claim over, and the session's prompts would wait until the
// kernel gave the connection up. Given up, the read fails and the claim
// is left to expire, as after any failed read.
func (ex *execution) readCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, ex.e.claims.RoundTripTimeout())
}

// plain reports whether every waiting input is a prompt: no continuation
// or permission reply, which take the transactional path. The head holds
// the oldest input that is not a prompt, if any waits.
func (v *sessionView) plain() bool {
	for _, w := range v.waiting {
		if w.kind != admission.KindPrompt {
			return false
		}
	}
	return true
}

// readView reads the session's view in one round trip, again after a
// transient error (readRetried).
func (ex *execution) readView(ctx context.Context) (*sessionView, error) {
	var v *sessionView
	err := ex.readRetried(ctx, "session", func(ctx context.Context) error {
		v = &sessionView{}
		b := &pgx.Batch{}
		v.queue(b, ex.sessionID)
		return ex.e.pool.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return nil, err
	}
	return v, nil
}

// readRetried runs read, a read under the held claim that writes nothing
// (the session's view before a promotion, the transcript before a step's
// intent), each try bounded by readCtx, again after a transient error
// (pgdb.Transient: a lost or silent connection, a lock not granted in
// time), with retryRefused's backoff, while one lease from its first
// retry lives (a silent connection's try alone takes the round-trip
// timeout, at least a lease). A read holds no position, so it is always
// safe to run again; ending the execution instead left the claim to
// expire and the turn to recovery, a lease and a decision for a read.
// Bounded as the ledger's write retries are: the keep-alive renews the
// claim meanwhile, and a read that never heals must still leave it to
// recovery (docs/design.md, invariant 13).
func (ex *execution) readRetried(ctx context.Context, what string, read func(ctx context.Context) error) error {
	try := func(ctx context.Context) error {
		tctx, cancel := ex.readCtx(ctx)
		defer cancel()
		return read(tctx)
	}
	err := try(ctx)
	if err == nil || !pgdb.Transient(err) || ctx.Err() != nil {
		return err
	}
	// The first failure is a warning; the tries after it are debug, as
	// a database away would otherwise log one a second per execution
	// (the last error is the caller's to log).
	msg := "reading the " + what + " failed transiently; reading again while the lease lives"
	ex.e.log.WarnContext(ctx, msg, slog.String("session_id", ex.sessionID), slog.Any("error", err))
	rctx, cancel := context.WithTimeout(ctx, ex.e.claims.Lease())
	defer cancel()
	return retry.Do(rctx, retry.Policy{
		Min: refusedBackoffMin, Max: refusedBackoffMax,
		Final: func(err error) bool { return !pgdb.Transient(err) },
		OnRetry: func(n int, err error, _ time.Duration) {
			ex.e.log.DebugContext(ctx, msg, slog.String("session_id", ex.sessionID), slog.Int("try", n+1), slog.Any("error", err))
		},
	}, func() error { return try(rctx) })
}

// promoteQueued promotes the next turn's inputs from v (every waiting steer
// if any, else the oldest queued input) and commits, behind the fence and
// in one call (promptline_turn_next; group commit may send its fence
// alone and its writes with other sessions': ledger's grouped_calls.go),
// their user messages, the turn's pending assistant message and the first
// step's attempt intent with the phase unknown: the same transaction
// promote commits.
func (ex *execution) promoteQueued(ctx context.Context, v *sessionView) (*turn, error) {
	t := newTurn(pickTurn(v.waiting))
	call, req := ex.firstStep("promptline_turn_next", t, v)
	// Retried as the writes after a dispatch are: the intent's position
	// makes a retry exact, and an intent committed unheard, found landed,
	// lets the turn run rather than leave it to recovery as outcome
	// unknown (nothing was dispatched). On a goroutine of its own: the
	// retry's frames are deeper than the execution's 8 KiB stack allows
	// (onOwnStack).
	var err error
	onOwnStack(func() { err = ex.writeCallRetried(ctx, nil, ledger.PhaseUnknown, t.assistantID, call, nil) })
	if err != nil {
		return nil, err
	}
	t.begun = &req
	return t, nil
}

// claimFirstTurn is promoteQueued for a session read without a claim: the
// claim commits in the same call (promptline_turn_first), straight in
// phase unknown (ledger.Claims.AcquireAsReadCall), and only if the read is
// still true (the same head of the waiting inputs: the turn's inputs and
// path are chosen from it alone); else ledger.ErrStale and nothing is
// written. ex.x is the execution after it.
func (ex *execution) claimFirstTurn(ctx context.Context, read ledger.SessionRead, v *sessionView) (*turn, error) {
	t := newTurn(pickTurn(v.waiting))
	waiting := make([]string, len(v.waiting))
	for i, w := range v.waiting {
		waiting[i] = w.id
	}
	var req provider.Request
	x, err := ex.e.claims.AcquireAsReadCall(ctx, ex.sessionID, newID(), read, waiting, ledger.PhaseUnknown, t.assistantID,
		func(x *ledger.Execution) ledger.Call {
			ex.x = x
			var call ledger.Call
			call, req = ex.firstStep("promptline_turn_first", t, v)
			return call
		})
	if err != nil {
		ex.x, ex.steps = nil, 0
		return nil, err
	}
	ex.x = x
	t.begun = &req
	ex.e.announced(nil) // the transaction wrote turn.started
	return t, nil
}

// firstStep is the call of fn (promptline_turn_first or
// promptline_turn_next, migration 00018) that promotes t's inputs (taken
// from v) with their user messages, and writes t's pending assistant
// message, turn.started and the first step's attempt intent, after the
// transaction's opening; and the step's request.
func (ex *execution) firstStep(fn string, t *turn, v *sessionView) (call ledger.Call, req provider.Request) {
	onOwnStack(func() { call, req = ex.firstStepDeep(fn, t, v) })
	return call, req
}

// firstStepDeep is firstStep on whatever goroutine calls it: the
// request's hash and turn.started are encoded by encoding/json, the
// deepest calls of an execution before it waits on its provider (see
// onOwnStack).
func (ex *execution) firstStepDeep(fn string, t *turn, v *sessionView) (ledger.Call, provider.Request) {
	attemptID := ex.nextAttemptID()
	// The transcript after promotion: the stored one, then the turn's user
	// messages, which promotion appends.
	hist := transcript.SettleOrphans(append(v.history[:len(v.history):len(v.history)], t.inputs...))
	req := ex.request(t, attemptID, attemptID, hist)
	hash, tokens := requestFingerprint(req)
	topics, keys, payloads := outbox.Columns([]outbox.Row{ex.e.eventRowHere(ex.turnStartedEvent(t))})
	return ledger.Call{Func: fn, Args: []any{
		ids(t.inputs), t.id,
		attemptID, ex.e.providerName, attemptID, hash, ex.e.providerModel, tokens,
		topics, keys, payloads,
	}}, req
}

// scanWaiting reads waitingSQL's rows.
func scanWaiting(rows pgx.Rows) ([]waitingInput, error) {
	var all []waitingInput
	var w waitingInput
	if _, err := pgx.ForEachRow(rows, []any{&w.id, &w.text, &w.delivery, &w.kind, &w.pickable}, func() error {
		all = append(all, w)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("reading waiting inputs: %w", err)
	}
	return all, nil
}

// A turn takes the oldest waiting steers up to maxSteersPerTurn of them
// and maxSteerBytesPerTurn of their text (the one that reaches it
// included: one at least); the others jump the queue in the turns right
// after. Unbounded, a thousand steers of a megabyte were one request of a
// gigabyte, held several times over, and events naming a thousand inputs.
// maxSteersPerTurn must not exceed the steers the head of the queue holds
// (promptline_waiting_head, migration 00020: a hundred).
const (
	maxSteersPerTurn     = 100
	maxSteerBytesPerTurn = 1 << 20
)

// pickTurn chooses the next turn's inputs from the waiting ones (oldest
// first, at least one): the steers waitingSQL found pickable if any steer
// waits (they jump the queue; the oldest is always pickable), else the
// oldest queued input.
func pickTurn(waiting []waitingInput) []waitingInput {
	var pick []waitingInput
	for _, w := range waiting {
		if w.delivery == string(envelope.DeliverySteer) && w.pickable {
			pick = append(pick, w)
		}
	}
	if len(pick) == 0 {
		pick = waiting[:1]
	}
	return pick
}

// newTurn is a turn answering pick, its first assistant message named
// after it.
func newTurn(pick []waitingInput) *turn {
	t := &turn{id: newID(), promotedAt: time.Now()}
	t.assistantID = t.id
	for _, w := range pick {
		t.inputs = append(t.inputs, provider.TranscriptMessage{ID: w.id, Role: "user", Text: w.text})
	}
	return t
}

// request is the provider request of t's current step.
func (ex *execution) request(t *turn, attemptID, key string, hist []provider.TranscriptMessage) provider.Request {
	return provider.Request{
		SessionID: ex.sessionID, AssistantMessageID: t.assistantID, AttemptID: attemptID,
		IdempotencyKey: key, FencingToken: ex.x.Claim().Token, Messages: hist, Turn: t.inputs, Tools: ex.toolSpecs(),
	}
}
