package pipeline

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/faults"
	"github.com/promptline/promptline/internal/redact"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/metrics"
	"github.com/promptline/promptline/outbox"
	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/tools"
)

// turn is one promoted batch of inputs and the steps that answer it.
type turn struct {
	id          string // the turn's first assistant message ID
	inputs      []provider.TranscriptMessage
	assistantID string // the current step's assistant message
	promotedAt  time.Time
	// begun is the request whose attempt intent is already committed (the
	// first step's, with the promotion).
	begun *provider.Request
	// A continuation (recovery admitted it) first runs the calls its
	// predecessor requested and never dispatched (or that recovery
	// re-armed), and may send its first step with the idempotency key of
	// an attempt recovery chose to send again.
	pendingCalls []pendingCall
	retryKey     string
	// stepBase is the number of steps the turn completed before this run
	// of it (a continuation goes on counting), for step.completed.
	stepBase int
}

type pendingCall struct {
	params ledger.CallParams
	call   provider.ToolCall
}

// promote takes the next turn's inputs: every waiting steer if any (they
// jump the queue), else the oldest queued input. It creates their user
// messages and the turn's first (pending) assistant message in the same
// transaction.
func (ex *execution) promote(ctx context.Context) (*turn, error) {
	v := ex.view
	ex.view = nil
	if v == nil {
		var err error
		if v, err = ex.readView(ctx); err != nil {
			return nil, err
		}
	}
	if len(v.waiting) == 0 {
		return nil, nil // the caller's release looks again, under the session lock
	}
	if v.plain() {
		return ex.promoteQueued(ctx, v)
	}
	var t *turn
	err := ex.write(ctx, func(tx pgx.Tx) error {
		var err error
		t, err = ex.promoteTx(ctx, tx)
		return err
	})
	return t, err
}

// promoteTx promotes inside tx and commits the first step's attempt
// intent with it; nil when nothing waits.
func (ex *execution) promoteTx(ctx context.Context, tx pgx.Tx) (*turn, error) {
	t, err := ex.selectTurn(ctx, tx)
	if err != nil || t == nil {
		return nil, err
	}
	if len(t.pendingCalls) > 0 {
		return t, nil // the calls run first; the step's intent follows them
	}
	req, err := ex.beginStep(ctx, tx, t, 1, ex.nextAttemptID())
	if err != nil {
		return nil, err
	}
	t.begun = &req
	return t, nil
}

// selectTurn promotes the next turn's inputs inside tx.
func (ex *execution) selectTurn(ctx context.Context, tx pgx.Tx) (*turn, error) {
	cl := ex.x.Claim()
	rows, err := tx.Query(ctx, waitingSQL, ex.sessionID)
	if err != nil {
		return nil, fmt.Errorf("reading waiting inputs: %w", err)
	}
	all, err := scanWaiting(rows)
	if err != nil {
		return nil, err
	}
	if len(all) == 0 {
		return nil, nil
	}
	for _, w := range all {
		switch {
		case w.kind == admission.KindContinuation:
			return ex.continuation(ctx, tx, w.id)
		case w.kind == admission.KindPermissionReply:
			return ex.resume(ctx, tx, w.id)
		}
	}
	pick := pickTurn(all)
	t := newTurn(pick)
	for _, w := range pick {
		if _, err := tx.Exec(ctx, promoteSQL, w.id, cl.ExecutionID, cl.Token); err != nil {
			return nil, fmt.Errorf("promoting %s: %w", w.id, err)
		}
	}
	if _, err := tx.Exec(ctx, insertAssistantSQL, t.assistantID, ex.sessionID, ids(t.inputs), cl.ExecutionID, cl.Token, t.id); err != nil {
		return nil, fmt.Errorf("creating assistant message: %w", err)
	}
	if err := outbox.Insert(ctx, tx, ex.turnStarted(t)); err != nil {
		return nil, err
	}
	return t, ex.x.SetPhase(ctx, tx, ledger.PhaseReady, t.assistantID)
}

// Bounds of one turn.
const (
	maxSteps       = 16 // provider steps per turn: a model looping on tools ends the turn
	maxSendRetries = 5  // retries of an attempt that certainly was not acted on
)

// runTurn runs provider steps until the model answers without tool calls.
// Each step: commit the attempt's intent (phase unknown), dispatch, commit
// the response (and the requested tool calls) before acting on it, then
// run each tool call between its intent and its result.
// released reports that the turn's last write also released the claim
// (no input waited).
func (ex *execution) runTurn(ctx context.Context, t *turn, log *slog.Logger) (released bool, err error) {
	released, err = ex.runTurnSteps(ctx, t, log)
	if errors.Is(err, errDeclined) {
		// Declining halts the continuation: the calls not run are
		// interrupted, the turn fails with reason declined, the claim goes.
		return ex.failTurn(ctx, t, envelope.FailDeclined, errDeclined, failOpts{})
	}
	return released, err
}

func (ex *execution) runTurnSteps(ctx context.Context, t *turn, log *slog.Logger) (released bool, err error) {
	log = log.With(slog.String("turn_id", t.id))
	// IDs only: prompt text is never logged.
	log.DebugContext(ctx, "turn started", slog.Any("message_ids", ids(t.inputs)))
	for _, pc := range t.pendingCalls {
		if err := ex.runCall(ctx, t.id, pc.params, pc.call, log); err != nil {
			return false, err
		}
	}
	for step := 1; ; step++ {
		if step > maxSteps {
			return ex.failTurn(ctx, t, envelope.FailMaxSteps, fmt.Errorf("the model asked for tools %d times in one turn", maxSteps), failOpts{})
		}
		done, released, err := ex.runStep(ctx, t, step, log)
		if err != nil || done {
			return released, err
		}
		// Tools settled: the next step answers their results in a new
		// assistant message.
		t.assistantID = newID()
	}
}

func (ex *execution) runStep(ctx context.Context, t *turn, step int, log *slog.Logger) (done, released bool, err error) {
	var attemptID string
	if t.begun != nil {
		attemptID = t.begun.AttemptID
	} else {
		attemptID = ex.nextAttemptID()
	}
	for {
		var req provider.Request
		if t.begun != nil {
			req, t.begun = *t.begun, nil
		} else {
			// Intent: the attempt row and the phase unknown, committed
			// before the request leaves. A retry of the step reuses its ID,
			// as does a try again after the server refused the write.
			err := retryRefused(ctx, log, "step intent", func() error {
				return ex.write(ctx, func(tx pgx.Tx) error {
					var err error
					req, err = ex.beginStep(ctx, tx, t, step, attemptID)
					return err
				})
			})
			if err != nil {
				return false, false, err
			}
		}
		faults.Hit(faults.ProviderAfterIntent)
		deltas := ex.deltaStream(t, step)
		if deltas != nil {
			req.TextDeltaFunc = deltas.write
		}
		rid := ex.responseIDRecorder(attemptID, log)
		req.ResponseIDFunc = rid.report
		sent := time.Now()
		resp, perr := ex.e.cfg.Provider.Complete(ctx, req)
		ex.keepResponseID(attemptID, cmp.Or(rid.wait(), cleanResponseID(resp.ResponseID)))
		if deltas != nil {
			// The rest of the text goes out before the response is
			// committed, so that a UI mostly sees the deltas of a step
			// before its step.completed (not an order anyone may rely on).
			deltas.close()
		}
		ex.attemptMetric(ctx, perr, time.Since(sent))
		if ex.x.Fenced() {
			return false, false, ledger.ErrFenced // dispatch nothing more, write nothing
		}
		if perr == nil {
			return ex.recordResponse(ctx, t, step, attemptID, resp, log)
		}
		if ctx.Err() != nil {
			// Cut off by shutdown: the request may have been acted on.
			released, err := ex.failTurn(ctx, t, envelope.FailInterrupted, perr, failOpts{AttemptID: attemptID, AttemptState: ledger.AttemptUnknown})
			ex.unknownMetric(err)
			return true, released, err
		}
		if errors.Is(perr, provider.ErrOutcomeUnknown) && !ex.e.idempotentProvider {
			released, err := ex.failTurn(ctx, t, envelope.FailOutcomeUnknown, perr, failOpts{AttemptID: attemptID, AttemptState: ledger.AttemptUnknown})
			ex.unknownMetric(err)
			return true, released, err
		}
		if wait, retry := ex.retryable(perr); retry {
			var tries int
			deferred := func(ctx context.Context, tx pgx.Tx) (bool, error) {
				state, err := ledger.ReadAttemptState(ctx, tx, attemptID)
				if err != nil || state != ledger.AttemptRetryWait {
					return false, err
				}
				tries, _, err = ledger.AttemptRetry(ctx, tx, attemptID)
				return true, err
			}
			err := ex.writeRetried(ctx, deferred, func(tx pgx.Tx) error {
				if err := ex.x.DeferAttempt(ctx, tx, attemptID, wait, perr.Error()); err != nil {
					return err
				}
				var err error
				tries, _, err = ledger.AttemptRetry(ctx, tx, attemptID)
				return err
			})
			if err != nil {
				return false, false, err
			}
			if tries <= maxSendRetries {
				log.WarnContext(ctx, "provider attempt will be retried", append([]any{slog.String("attempt_id", attemptID),
					slog.Int("tries", tries), slog.Duration("after", wait)}, ex.errorAttrs(ctx, perr)...)...)
				if !sleep(ctx, wait) {
					released, err := ex.failTurn(ctx, t, envelope.FailInterrupted, perr, failOpts{AttemptID: attemptID, AttemptState: ledger.AttemptFailed})
					return true, released, err
				}
				continue
			}
		}
		reason := envelope.FailProviderError
		if errors.Is(perr, provider.ErrUnsupported) {
			reason = envelope.FailUnsupported
		}
		released, err := ex.failTurn(ctx, t, reason, perr, failOpts{AttemptID: attemptID, AttemptState: ledger.AttemptFailed})
		return true, released, err
	}
}

// beginStep commits (in tx) the intent of the step's provider attempt —
// creating the step's assistant message after the first — and returns the
// request to send.
func (ex *execution) beginStep(ctx context.Context, tx pgx.Tx, t *turn, step int, attemptID string) (provider.Request, error) {
	cl := ex.x.Claim()
	// The step's assistant message (the first step's exists already, made
	// with the promotion).
	if _, err := tx.Exec(ctx, insertAssistantSQL+` ON CONFLICT (message_id) DO NOTHING`, t.assistantID, ex.sessionID, ids(t.inputs), cl.ExecutionID, cl.Token, t.id); err != nil {
		return provider.Request{}, fmt.Errorf("creating assistant message: %w", err)
	}
	hist, err := history(ctx, tx, ex.sessionID)
	if err != nil {
		return provider.Request{}, err
	}
	key := attemptID
	if step == 1 && t.retryKey != "" {
		key = t.retryKey
	}
	req := ex.request(t, attemptID, key, hist)
	hash, tokens := requestFingerprint(req)
	return req, ex.x.BeginAttempt(ctx, tx, ledger.AttemptParams{
		ID: attemptID, AssistantMessageID: t.assistantID, Step: step, Provider: ex.e.providerName,
		IdempotencyKey: key, RequestHash: hash, Model: ex.e.providerModel, RequestTokens: tokens,
	})
}

// nextAttemptID numbers the execution's provider steps across its turns:
// attempt IDs are unique per execution, and deterministic from it.
func (ex *execution) nextAttemptID() string {
	ex.steps++
	return ledger.AttemptID(ex.x.Claim().ExecutionID, ex.steps)
}

// retryable says whether a failed attempt may be sent again, and after how
// long: only when the request certainly was not acted on, or when the
// provider honours idempotency keys (the retry carries the same key) and
// did not refuse the request itself (provider.ErrUnsupported, provider.ErrRejected).
func (ex *execution) retryable(err error) (time.Duration, bool) {
	var ra *provider.RetryAfterError
	switch {
	case errors.As(err, &ra):
		return ra.After, true
	case errors.Is(err, provider.ErrNotSent):
		return 200 * time.Millisecond, true
	case ex.e.idempotentProvider && !errors.Is(err, provider.ErrUnsupported) && !errors.Is(err, provider.ErrRejected):
		return 200 * time.Millisecond, true
	}
	return 0, false
}

// recordResponse commits the provider's response before anything acts on
// it: the attempt succeeded, the assistant message's parts, and the
// requested tool calls. Without tool calls the turn is complete (phase
// safe, turn.completed in the same transaction); with them, the phase is
// continue (nothing is in flight; the model must see their results) and
// the calls run next.
func (ex *execution) recordResponse(ctx context.Context, t *turn, step int, attemptID string, resp provider.Response, log *slog.Logger) (done, released bool, err error) {
	calls := make([]ledger.CallParams, len(resp.ToolCalls))
	for i, c := range resp.ToolCalls {
		calls[i] = ledger.CallParams{
			ID: fmt.Sprintf("%s/call-%d", attemptID, i), AttemptID: attemptID, Index: i,
			ModelCallID: cmp.Or(c.ID, fmt.Sprintf("call-%d", i)), Tool: c.Name, Class: string(ex.classOf(c)),
			Input: c.Input, IdempotencyKey: fmt.Sprintf("%s/call-%d", attemptID, i),
		}
		resp.ToolCalls[i].ID = calls[i].ModelCallID
	}
	stepDone := ex.stepCompleted(t, step, resp.Text, calls)
	if len(calls) == 0 {
		// The answer, and the release when nothing waits: one commit, in
		// one round trip.
		landed := attemptLanded(attemptID, ledger.AttemptSucceeded)
		released, err := ex.finishQueuedRetried(ctx, landed, ledger.PhaseSafe, t.assistantID, func(b *pgx.Batch) {
			ledger.QueueFinishAttempt(b, attemptID, ledger.AttemptSucceeded, "", resp.Usage.InputTokens, resp.Usage.OutputTokens, ex.responseIDs[attemptID])
			b.Queue(answerSQL, t.assistantID, resp.Text)
			outbox.QueueInsert(b, stepDone, eventRow(ex.e.cfg.Topics.Events, envelope.Event{
				ID: "turn.completed:" + t.assistantID, Type: envelope.EventTurnCompleted, SessionID: ex.sessionID,
				At: time.Now().UTC(), MessageIDs: ids(t.inputs), AssistantMessageID: t.assistantID, Text: resp.Text,
			}))
		})
		if err != nil {
			return false, false, fmt.Errorf("recording response of %s: %w", attemptID, err)
		}
		ex.turnMetric("completed", t)
		return true, released, nil
	}
	// Tool calls: the response and the calls as requested, phase continue.
	err = ex.writeRetried(ctx, attemptLanded(attemptID, ledger.AttemptSucceeded), func(tx pgx.Tx) error {
		if err := ledger.FinishAttemptWith(ctx, tx, attemptID, ledger.AttemptSucceeded, "", resp.Usage.InputTokens, resp.Usage.OutputTokens, ex.responseIDs[attemptID]); err != nil {
			return err
		}
		if resp.Text != "" {
			if _, err := tx.Exec(ctx, insertPartSQL, t.assistantID, 0, "text", resp.Text); err != nil {
				return fmt.Errorf("storing answer: %w", err)
			}
		}
		for i, c := range resp.ToolCalls {
			body, _ := json.Marshal(toolCallPart{ID: c.ID, Name: c.Name, Input: jsonOrString(c.Input)})
			if _, err := tx.Exec(ctx, insertPartSQL, t.assistantID, i+1, "tool_call", string(body)); err != nil {
				return fmt.Errorf("storing tool call: %w", err)
			}
		}
		if _, err := tx.Exec(ctx, completeMessageSQL, t.assistantID); err != nil {
			return fmt.Errorf("completing assistant message: %w", err)
		}
		if err := ex.x.RequestCalls(ctx, tx, calls); err != nil {
			return err
		}
		if err := outbox.Insert(ctx, tx, stepDone); err != nil {
			return err
		}
		return ex.x.SetPhase(ctx, tx, ledger.PhaseContinue, t.assistantID)
	})
	if err != nil {
		return false, false, fmt.Errorf("recording response of %s: %w", attemptID, err)
	}
	for i, c := range resp.ToolCalls {
		if err := ex.runCall(ctx, t.id, calls[i], c, log); err != nil {
			return false, false, err
		}
	}
	return false, false, nil
}

type toolCallPart struct {
	ID    string          `json:"id"`
	Name  string          `json:"name"`
	Input json.RawMessage `json:"input"`
}

// runCall runs one requested tool call between its intent and its result.
// Invalid input (unknown tool, schema mismatch) is a failed call returned
// to the model, not a crash.
func (ex *execution) runCall(ctx context.Context, turnID string, p ledger.CallParams, c provider.ToolCall, log *slog.Logger) error {
	tool, ok := ex.lookup(c.Name)
	if err := ex.validate(c); err != nil || !ok {
		if err == nil {
			err = fmt.Errorf("unknown tool %q", c.Name)
		}
		return ex.settleCall(ctx, turnID, p, c, ledger.CallFailed, "invalid tool call: "+err.Error(), true)
	}
	feedback, err := ex.checkPermission(ctx, p, c)
	if err != nil {
		return err
	}
	if feedback != "" {
		return ex.settleCall(ctx, turnID, p, c, ledger.CallFailed, feedback, true)
	}
	// The intent, retried as the results are: nothing is dispatched until
	// it is known to be committed, and one that committed unheard is found
	// started (retried as it was, it would fail as not requested, and the
	// call, never run, would end unknown).
	intent := func(ctx context.Context, tx pgx.Tx) (bool, error) {
		state, err := ledger.ReadCallState(ctx, tx, p.ID)
		return state == ledger.CallStarted, err
	}
	started := ex.toolEvent(envelope.EventToolStarted, turnID, p, "")
	if err := ex.writeRetried(ctx, intent, func(tx pgx.Tx) error {
		if err := ex.x.StartCall(ctx, tx, p.ID); err != nil {
			return err
		}
		return outbox.Insert(ctx, tx, started)
	}); err != nil {
		return err
	}
	if p.Class == string(tools.SideEffecting) {
		faults.Hit(faults.ToolAfterIntent)
	} else {
		faults.Hit(faults.IdempotentToolAfterIntent)
	}
	sent := time.Now()
	res, err := ex.runTool(ctx, tool, tools.Call{
		ID: c.ID, Name: c.Name, Input: c.Input, SessionID: ex.sessionID,
		IdempotencyKey: p.IdempotencyKey, FencingToken: ex.x.Claim().Token,
	})
	faults.Hit(faults.ToolAfterRun)
	ex.callSecondsMetric(ctx, err, res, time.Since(sent))
	if ex.x.Fenced() {
		return ledger.ErrFenced
	}
	switch {
	case errors.Is(err, tools.ErrNotRun):
		return ex.settleCall(ctx, turnID, p, c, ledger.CallFailed, "not run: "+redact.Text(err.Error()), true)
	case err != nil && ctx.Err() != nil:
		return ex.settleCall(ctx, turnID, p, c, ledger.CallUnknown, "outcome unknown: interrupted by shutdown", true)
	case err != nil:
		// The tool could not say how it went: its outcome is unknown, and
		// it is never run again automatically.
		// A tool's error text goes to the model, the transcript and the
		// session events: no URL in it keeps its secrets.
		log.WarnContext(ctx, "tool call outcome unknown", slog.String("call_id", p.ID), slog.Any("error", redact.Error(err)))
		return ex.settleCall(ctx, turnID, p, c, ledger.CallUnknown, "outcome unknown: "+redact.Text(err.Error()), true)
	case res.IsError:
		return ex.settleCall(ctx, turnID, p, c, ledger.CallFailed, res.Output, true)
	default:
		return ex.settleCall(ctx, turnID, p, c, ledger.CallSucceeded, res.Output, false)
	}
}

// errToolTimeout is the cause of a tool call's context when ToolTimeout
// passed.
var errToolTimeout = errors.New("tool timeout")

// toolAbandonAfter is how long a tool gets to answer once its context
// ended (deadline or shutdown): one that honours its context answers at
// once and may still say that it did not run (tools.ErrNotRun).
const toolAbandonAfter = 500 * time.Millisecond

// runTool runs one call under the tool deadline. A tool that ignores its
// context (blocked in a system call, say) is abandoned toolAbandonAfter
// past the deadline or the end of the shutdown grace, and its outcome is
// unknown: no tool may keep a turn, or the process's stop, waiting. The
// abandoned goroutine ends when the tool returns, or with the process.
func (ex *execution) runTool(ctx context.Context, tool tools.Tool, call tools.Call) (tools.Result, error) {
	d := ex.e.cfg.ToolTimeout
	cctx, cancel := context.WithTimeoutCause(ctx, d, errToolTimeout)
	defer cancel()
	type outcome struct {
		res tools.Result
		err error
	}
	got := make(chan outcome, 1)
	go func() {
		faults.Stall(faults.ToolStall)
		res, err := tool.Run(cctx, call)
		got <- outcome{res, err}
	}()
	var o outcome
	select {
	case o = <-got:
	case <-cctx.Done():
		abandon := time.NewTimer(toolAbandonAfter)
		defer abandon.Stop()
		select {
		case o = <-got:
		case <-abandon.C:
			o.err = fmt.Errorf("the tool did not return after its context ended: %w", context.Cause(cctx))
		}
	}
	if o.err != nil && ctx.Err() == nil && errors.Is(context.Cause(cctx), errToolTimeout) {
		o.err = fmt.Errorf("exceeded the tool timeout (%s): %w", d, o.err)
	}
	return o.res, o.err
}

// settleCall records a call's result and its tool message; the last call of
// a step sets the phase continue in the same transaction. After a
// cancellation (a shutdown past its grace) it writes once, on a context
// that outlives it (afterCancel).
func (ex *execution) settleCall(ctx context.Context, turnID string, p ledger.CallParams, c provider.ToolCall, state ledger.CallState, output string, isError bool) error {
	cl := ex.x.Claim()
	var last bool
	settled := func(ctx context.Context, tx pgx.Tx) (settled bool, err error) {
		settled, last, err = ledger.CallSettled(ctx, tx, p.ID, p.AttemptID)
		return settled, err
	}
	write := ex.writeRetried
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = afterCancel(ctx)
		defer cancel()
		write = ex.writeOnce
	}
	err := write(ctx, settled, func(tx pgx.Tx) error {
		var err error
		if last, err = ex.x.SettleCall(ctx, tx, p.ID, p.AttemptID, state, output, isError); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, insertToolMessageSQL, p.ID, ex.sessionID, c.ID, isError, cl.ExecutionID, cl.Token); err != nil {
			return fmt.Errorf("storing tool result: %w", err)
		}
		if _, err := tx.Exec(ctx, insertPartSQL, p.ID, 0, "text", output); err != nil {
			return err
		}
		return outbox.Insert(ctx, tx, ex.toolEvent(envelope.EventToolCompleted, turnID, p, string(state)))
	})
	if err == nil {
		ex.callMetric(state)
		if last {
			faults.Hit(faults.StepAfterSettle)
		}
	}
	return err
}

// failOpts is what a failing turn records of its provider attempt: the
// zero value records none (the turn failed before or between attempts).
type failOpts struct {
	AttemptID    string              // the attempt whose outcome is recorded
	AttemptState ledger.AttemptState // its outcome; "" records nothing
}

// failTurn settles a turn that ends without an answer: the attempt's
// outcome (unless empty), the assistant message errored (created if the
// step never began), phase safe, and turn.failed, in one transaction. After a cancellation it writes once on a
// context that outlives it (afterCancel); the fence still applies.
func (ex *execution) failTurn(ctx context.Context, t *turn, reason string, cause error, o failOpts) (released bool, err error) {
	wctx, finish := ctx, ex.finishRetried
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		wctx, cancel = afterCancel(ctx)
		defer cancel()
		finish = ex.finishOnce
	}
	failed := func(ctx context.Context, tx pgx.Tx) (bool, error) {
		var status string
		err := tx.QueryRow(ctx, `SELECT status FROM messages WHERE message_id = $1`, t.assistantID).Scan(&status)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return status == "errored", err
	}
	released, err = finish(wctx, failed, func(tx pgx.Tx) error {
		// The calls not run end interrupted, each announced (tool.completed)
		// before the turn's end, in the order they were requested.
		rows, err := tx.Query(wctx, `WITH interrupted AS (
				UPDATE tool_calls SET state = 'interrupted', output = $2, is_error = true, finished_at = now()
				WHERE session_id = $1 AND state = 'requested'
				RETURNING call_id, model_call_id, tool, class, requested_at, attempt_id, idx)
			SELECT call_id, model_call_id, tool, class FROM interrupted ORDER BY requested_at, attempt_id, idx`,
			ex.sessionID, "interrupted: "+reason)
		if err != nil {
			return fmt.Errorf("interrupting calls not run: %w", err)
		}
		var interrupted []outbox.Row
		var p ledger.CallParams
		if _, err := pgx.ForEachRow(rows, []any{&p.ID, &p.ModelCallID, &p.Tool, &p.Class}, func() error {
			interrupted = append(interrupted, ex.toolEvent(envelope.EventToolCompleted, t.id, p, string(ledger.CallInterrupted)))
			return nil
		}); err != nil {
			return fmt.Errorf("interrupting calls not run: %w", err)
		}
		if err := outbox.Insert(wctx, tx, interrupted...); err != nil {
			return err
		}
		if o.AttemptState != "" {
			if err := ledger.FinishAttemptWith(wctx, tx, o.AttemptID, o.AttemptState, cause.Error(), 0, 0, ex.responseIDs[o.AttemptID]); err != nil {
				return err
			}
		}
		// The step's assistant message exists once its provider attempt
		// began; a turn that fails before that (a permission declined when
		// resumed or continued, the step limit after a tool step) creates
		// it here, so that the claim and turn.failed name a message the
		// transcript holds (invariant 12).
		cl := ex.x.Claim()
		if _, err := tx.Exec(wctx, insertAssistantSQL+` ON CONFLICT (message_id) DO NOTHING`, t.assistantID, ex.sessionID, ids(t.inputs), cl.ExecutionID, cl.Token, t.id); err != nil {
			return fmt.Errorf("creating failed turn's assistant message: %w", err)
		}
		if _, err := tx.Exec(wctx, failAssistantSQL, t.assistantID, cause.Error()); err != nil {
			return fmt.Errorf("storing failed turn: %w", err)
		}
		if err := ex.x.SetPhase(wctx, tx, ledger.PhaseSafe, t.assistantID); err != nil {
			return err
		}
		return outbox.Insert(wctx, tx, eventRow(ex.e.cfg.Topics.Events, envelope.Event{
			ID: "turn.failed:" + t.assistantID, Type: envelope.EventTurnFailed, SessionID: ex.sessionID,
			At: time.Now().UTC(), MessageIDs: ids(t.inputs), AssistantMessageID: t.assistantID,
			Reason: reason, Error: cause.Error(),
		}))
	})
	if err != nil {
		return false, fmt.Errorf("settling failed turn %s: %w", t.id, err)
	}
	if !released {
		faults.Hit(faults.TurnAfterFail)
	}
	ex.logTurnFailed(ctx, t, reason, cause)
	ex.turnMetric("failed", t)
	return released, nil
}

// Step events (docs/session-events.md). Each ID is derived from what the
// event announces (the turn, the step's assistant message, the call), all
// of them durable: a retried write, a relay's republication and a
// recovery's continuation name the same fact with the same ID.

// turnStarted announces t's promotion.
func (ex *execution) turnStarted(t *turn) outbox.Row {
	return eventRow(ex.e.cfg.Topics.Events, envelope.Event{
		ID: "turn.started:" + t.id, Type: envelope.EventTurnStarted, SessionID: ex.sessionID, At: time.Now().UTC(),
		TurnID: t.id, MessageIDs: ids(t.inputs),
	})
}

// deltaStream returns the live deltas of one sending of a step, numbered
// as its step.completed will be; nil when the process publishes none.
func (ex *execution) deltaStream(t *turn, step int) *deltaStream {
	cfg := ex.e.cfg
	if cfg.Deltas == nil {
		return nil
	}
	return newDeltaStream(cfg.Deltas, envelope.Delta{
		SessionID: ex.sessionID, TurnID: t.id, AssistantMessageID: t.assistantID, Step: t.stepBase + step,
	}, cfg.DeltaInterval, cfg.DeltaMaxBytes)
}

// stepCompleted announces a step's durable response: its text and the
// calls it requested, without their inputs (they may hold secrets).
func (ex *execution) stepCompleted(t *turn, step int, text string, calls []ledger.CallParams) outbox.Row {
	e := envelope.Event{
		ID: "step.completed:" + t.assistantID, Type: envelope.EventStepCompleted, SessionID: ex.sessionID, At: time.Now().UTC(),
		TurnID: t.id, MessageIDs: ids(t.inputs), AssistantMessageID: t.assistantID, Step: t.stepBase + step, Text: text,
	}
	for _, c := range calls {
		e.ToolCalls = append(e.ToolCalls, envelope.EventToolCall{CallID: c.ID, ModelCallID: c.ModelCallID, Tool: c.Tool, Class: c.Class})
	}
	return eventRow(ex.e.cfg.Topics.Events, e)
}

// toolEvent announces a call's dispatch (tool.started) or outcome
// (tool.completed, outcome = the ledger state), never its input or output.
// Its ID also names the claim that committed it (its fencing token, the
// same on every retry of the write): a call can be dispatched again (an
// idempotent one after a crash, one an operator re-armed with consumer
// session resolve --did-not-run) and have a second outcome; neither may
// share the first one's ID, or a consumer deduplicating on id never sees
// the call start again and keeps "unknown" for what really happened.
func (ex *execution) toolEvent(typ, turnID string, p ledger.CallParams, outcome string) outbox.Row {
	id := typ + ":" + p.ID + "@" + strconv.FormatInt(ex.x.Claim().Token, 10)
	return eventRow(ex.e.cfg.Topics.Events, envelope.Event{
		ID: id, Type: typ, SessionID: ex.sessionID, At: time.Now().UTC(),
		TurnID: turnID, CallID: p.ID, ModelCallID: p.ModelCallID, Tool: p.Tool, Class: p.Class, Outcome: outcome,
	})
}

func (ex *execution) turnMetric(outcome string, t *turn) {
	if m := ex.e.cfg.Metrics; m != nil {
		m.Turns.WithLabelValues(outcome).Inc()
		m.TurnSeconds.Observe(time.Since(t.promotedAt).Seconds())
	}
}

// attemptMetric counts one provider request by the outcome the process
// saw: a response (succeeded), an error that may have been acted on
// (unknown: provider.ErrOutcomeUnknown, or cut off by cancellation), or any other
// error (failed).
func (ex *execution) attemptMetric(ctx context.Context, perr error, d time.Duration) {
	m := ex.e.cfg.Metrics
	if m == nil {
		return
	}
	outcome := metrics.OutcomeSucceeded
	switch {
	case perr == nil:
	case errors.Is(perr, provider.ErrOutcomeUnknown) || ctx.Err() != nil:
		outcome = metrics.OutcomeUnknown
	default:
		outcome = metrics.OutcomeFailed
	}
	m.ProviderAttempts.WithLabelValues(outcome).Inc()
	m.ProviderSeconds.WithLabelValues(outcome).Observe(d.Seconds())
}

// unknownMetric counts an attempt the executor recorded unknown (the
// failed turn's write committed: err is nil), as recovery counts those it
// reconciles: promptline_provider_attempts_unknown_total.
func (ex *execution) unknownMetric(err error) {
	if m := ex.e.cfg.Metrics; m != nil && err == nil {
		m.AttemptsUnknown.WithLabelValues(ex.e.providerName, ex.e.providerModel).Inc()
	}
}

// callSecondsMetric observes how long a tool ran, by the outcome runCall
// decides from the same facts.
func (ex *execution) callSecondsMetric(ctx context.Context, err error, res tools.Result, d time.Duration) {
	m := ex.e.cfg.Metrics
	if m == nil {
		return
	}
	outcome := metrics.OutcomeSucceeded
	switch {
	case errors.Is(err, tools.ErrNotRun) || (err == nil && res.IsError):
		outcome = metrics.OutcomeFailed
	case err != nil:
		outcome = metrics.OutcomeUnknown
	}
	m.ToolCallSeconds.WithLabelValues(outcome).Observe(d.Seconds())
}

// callMetric counts a settled tool call (invalid and declined calls are
// failed) by the state settleCall records.
func (ex *execution) callMetric(state ledger.CallState) {
	m := ex.e.cfg.Metrics
	if m == nil {
		return
	}
	outcome := metrics.OutcomeFailed
	switch state {
	case ledger.CallSucceeded:
		outcome = metrics.OutcomeSucceeded
	case ledger.CallUnknown:
		outcome = metrics.OutcomeUnknown
	}
	m.ToolCalls.WithLabelValues(outcome).Inc()
}

func (ex *execution) toolSpecs() []provider.ToolSpec {
	if ex.e.cfg.Tools == nil {
		return nil
	}
	var out []provider.ToolSpec
	for _, s := range ex.e.cfg.Tools.Specs() {
		out = append(out, provider.ToolSpec{Name: s.Name, Description: s.Description, InputSchema: s.InputSchema})
	}
	return out
}

func (ex *execution) lookup(name string) (tools.Tool, bool) {
	if ex.e.cfg.Tools == nil {
		return nil, false
	}
	return ex.e.cfg.Tools.Lookup(name)
}

func (ex *execution) validate(c provider.ToolCall) error {
	if ex.e.cfg.Tools == nil {
		return fmt.Errorf("no tools are configured")
	}
	return ex.e.cfg.Tools.Validate(c.Name, c.Input)
}

// classOf is the call's declared class; an unknown tool or an unresolvable
// class counts as side-effecting, the safe assumption.
func (ex *execution) classOf(c provider.ToolCall) tools.Class {
	t, ok := ex.lookup(c.Name)
	if !ok {
		return tools.SideEffecting
	}
	return tools.ResolveClass(t, c.Input)
}

func ids(ms []provider.TranscriptMessage) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

func jsonOrString(b json.RawMessage) json.RawMessage {
	if json.Valid(b) {
		return b
	}
	s, _ := json.Marshal(string(b))
	return s
}

// requestHash identifies what was sent, as evidence for recovery.
// requestFingerprint is the request's hash and its estimated input
// tokens: the bytes of its JSON encoding (transcript, turn and tool specs,
// as hashed) divided by 4, rounded up. A provider's own encoding and
// tokenizer differ; the estimate only sizes what an unknown attempt may
// have cost (promptline_provider_tokens_at_risk).
func requestFingerprint(req provider.Request) (hash []byte, tokens int64) {
	b, _ := json.Marshal(req)
	h := sha256.Sum256(b)
	return h[:], (int64(len(b)) + 3) / 4
}

const waitingSQL = `
SELECT message_id, text, delivery, kind FROM waiting_inputs WHERE session_id = $1 ORDER BY admission_seq`

const promoteSQL = `
WITH p AS (
    UPDATE inputs SET promotion_seq = nextval('promotion_seq'), promoted_at = now()
    WHERE message_id = $1 AND promotion_seq IS NULL
    RETURNING message_id, session_id, text
), m AS (
    INSERT INTO messages (message_id, session_id, role, status, completed_at, execution_id, fencing_token)
    SELECT message_id, session_id, 'user', 'completed', now(), $2, $3 FROM p
)
INSERT INTO message_parts (message_id, idx, kind, body) SELECT message_id, 0, 'text', text FROM p`

const insertAssistantSQL = `
INSERT INTO messages (message_id, session_id, role, status, answers, execution_id, fencing_token, turn_id)
VALUES ($1, $2, 'assistant', 'pending', $3, $4, $5, $6)`

const insertPartSQL = `INSERT INTO message_parts (message_id, idx, kind, body) VALUES ($1, $2, $3, $4)`

// answerSQL stores an answer's text (none when empty) and completes its
// assistant message.
const answerSQL = `
WITH p AS (
    INSERT INTO message_parts (message_id, idx, kind, body) SELECT $1, 0, 'text', $2::text WHERE $2::text <> ''
)
UPDATE messages SET status = 'completed', completed_at = now() WHERE message_id = $1 AND status = 'pending'`

const completeMessageSQL = `
UPDATE messages SET status = 'completed', completed_at = now() WHERE message_id = $1 AND status = 'pending'`

const insertToolMessageSQL = `
INSERT INTO messages (message_id, session_id, role, status, tool_call_id, is_error, completed_at, execution_id, fencing_token)
VALUES ($1, $2, 'tool', 'completed', $3, $4, now(), $5, $6)`

const failAssistantSQL = `
UPDATE messages SET status = 'errored', error = $2, completed_at = now()
WHERE message_id = $1 AND status = 'pending'`
