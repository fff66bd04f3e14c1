package executor

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/faults"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/transcript"
)

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
	if err := ex.runPendingCalls(ctx, t, log); err != nil {
		return false, err
	}
	for step := 1; ; step++ {
		if step > maxSteps {
			return ex.failTurn(ctx, t, envelope.FailMaxSteps, fmt.Errorf("the model asked for tools %d times in one turn", maxSteps), failOpts{})
		}
		done, released, err := ex.runStep(ctx, t, step, log)
		if err != nil || done {
			return released, err
		}
		if err := ex.runPendingCalls(ctx, t, log); err != nil {
			return false, err
		}
		// Tools settled: the next step answers their results in a new
		// assistant message.
		t.assistantID = newID()
	}
}

// runPendingCalls runs the calls a step recorded as requested (or a
// continuation's predecessor left), in order, each between its intent and
// its result. They run from here, not from within the step that recorded
// them: the step's frames (runStep, recordResponse: some 3 KiB) under a
// call's would take the execution's stack past 8 KiB, and it would keep
// 16 KiB through its next step's wait on the provider
// (TestParkedToolTurnsKeepEightKiBStacks).
func (ex *execution) runPendingCalls(ctx context.Context, t *turn, log *slog.Logger) error {
	for _, pc := range t.pendingCalls {
		if err := ex.runCall(ctx, t.id, pc.params, pc.call, log); err != nil {
			return err
		}
	}
	t.pendingCalls = nil
	return nil
}

func (ex *execution) runStep(ctx context.Context, t *turn, step int, log *slog.Logger) (done, released bool, err error) {
	var attemptID string
	if t.begun != nil {
		attemptID = t.begun.AttemptID
	} else {
		attemptID = ex.nextAttemptID()
	}
	// uncertain: a try of this attempt may have been acted on. A later
	// try's plain failure (a refusal, retries run out) says nothing of
	// the earlier one: the attempt stays unknown.
	uncertain := false
	for {
		var req provider.Request
		if t.begun != nil {
			req, t.begun = *t.begun, nil
		} else {
			// Intent: the attempt row and the phase unknown, committed
			// before the request leaves. A retry of the step reuses its ID,
			// as does the ledger's retry of the write after the server
			// refused it (writeCallRetried).
			var err error
			onOwnStack(func() { req, err = ex.beginStepCall(ctx, t, step, attemptID) })
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
		resp, perr := ex.complete(ctx, req, log) // a panic in it is an unknown outcome
		if perr == nil {
			perr = checkResponse(resp)
		}
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
			return ex.recordResponse(ctx, t, step, attemptID, storableResponse(resp))
		}
		if ctx.Err() != nil {
			// Cut off by shutdown: the request may have been acted on.
			released, err := ex.failTurn(ctx, t, envelope.FailInterrupted, perr, failOpts{AttemptID: attemptID, AttemptState: ledger.AttemptUnknown})
			ex.unknownMetric(err)
			return true, released, err
		}
		uncertain = uncertain || errors.Is(perr, provider.ErrOutcomeUnknown)
		if errors.Is(perr, provider.ErrOutcomeUnknown) && !ex.e.idempotentProvider {
			released, err := ex.failTurn(ctx, t, envelope.FailOutcomeUnknown, perr, failOpts{AttemptID: attemptID, AttemptState: ledger.AttemptUnknown})
			ex.unknownMetric(err)
			return true, released, err
		}
		if wait, retry := ex.retryable(perr); retry {
			var tries int
			// No landed check: a deferral run again after its commit's
			// answer was lost changes nothing (DeferAttempt updates only a
			// started attempt) and reads the tries it committed.
			err := ex.writeRetried(ctx, nil, func(tx pgx.Tx) error {
				if err := ex.x.DeferAttempt(ctx, tx, attemptID, wait, storable(perr.Error())); err != nil {
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
					state := ledger.AttemptFailed
					if uncertain {
						state = ledger.AttemptUnknown
					}
					released, err := ex.failTurn(ctx, t, envelope.FailInterrupted, perr, failOpts{AttemptID: attemptID, AttemptState: state})
					if uncertain {
						ex.unknownMetric(err)
					}
					return true, released, err
				}
				continue
			}
		}
		if uncertain {
			// A try of an idempotent provider's step was uncertain, and no
			// later try answered: it may have been acted on (and billed).
			// Unknown, as a first uncertain try is for a provider without
			// keys.
			released, err := ex.failTurn(ctx, t, envelope.FailOutcomeUnknown, perr, failOpts{AttemptID: attemptID, AttemptState: ledger.AttemptUnknown})
			ex.unknownMetric(err)
			return true, released, err
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
	// The step's assistant message (the first step's exists already, made
	// with the promotion).
	if err := transcript.InsertAssistantIfAbsent(ctx, tx, ex.assistantParams(t)); err != nil {
		return provider.Request{}, fmt.Errorf("creating assistant message: %w", err)
	}
	hist, err := transcript.History(ctx, tx, ex.sessionID)
	if err != nil {
		return provider.Request{}, err
	}
	req, p := ex.stepAttempt(t, step, attemptID, hist)
	return req, ex.x.BeginAttempt(ctx, tx, p)
}

// stepAttempt is the step's request over the transcript hist, and its
// attempt's intent: keyed by the attempt, or by the turn's retry key in
// its first step, with the request's fingerprint.
func (ex *execution) stepAttempt(t *turn, step int, attemptID string, hist []provider.TranscriptMessage) (provider.Request, ledger.AttemptParams) {
	key := attemptID
	if step == 1 && t.retryKey != "" {
		key = t.retryKey
	}
	req := ex.request(t, attemptID, key, hist)
	hash, tokens := requestFingerprint(req)
	return req, ledger.AttemptParams{
		ID: attemptID, AssistantMessageID: t.assistantID, Step: step, Provider: ex.e.providerName,
		IdempotencyKey: key, RequestHash: hash, Model: ex.e.providerModel, RequestTokens: tokens,
	}
}

// beginStepCall commits the intent of the step's provider attempt, as
// beginStep does, in one call (promptline_step_begin, migration 00022)
// sent through group commit, after a read of the transcript the request
// carries; it returns the request to send. It runs on a goroutine of its
// own (onOwnStack, from runStep): the request's fingerprint is encoded
// by reflection, and the execution waits on its provider next.
func (ex *execution) beginStepCall(ctx context.Context, t *turn, step int, attemptID string) (provider.Request, error) {
	hist, err := ex.readHistory(ctx)
	if err != nil {
		return provider.Request{}, err
	}
	req, p := ex.stepAttempt(t, step, attemptID, hist)
	// Retried as promoteQueued's intent is.
	return req, ex.writeCallRetried(ctx, nil, ledger.PhaseUnknown, t.assistantID, ledger.StepBeginCall(ids(t.inputs), t.id, p), nil)
}

// readHistory reads the session's transcript as the provider sees it, in
// one round trip bounded by readCtx, again after a transient error
// (readRetried).
func (ex *execution) readHistory(ctx context.Context) ([]provider.TranscriptMessage, error) {
	var (
		hist       []provider.TranscriptMessage
		unreadable error
	)
	err := ex.readRetried(ctx, "transcript", func(ctx context.Context) error {
		b := &pgx.Batch{}
		transcript.QueueHistory(b, ex.sessionID, func(h []provider.TranscriptMessage, u error) { hist, unreadable = h, u })
		return ex.e.pool.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return nil, fmt.Errorf("reading transcript: %w", err)
	}
	if unreadable != nil {
		return nil, unreadable
	}
	return transcript.SettleOrphans(hist), nil
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
//
// An answer in hand when the turn's context has ended (a shutdown past its
// grace) is recorded all the same, once, on a context that outlives the
// cancellation (afterCancel), as failTurn and settleCall record theirs:
// thrown away, the attempt would stay started and recovery could only fail
// the turn as outcome unknown. Its tool calls are then recorded as
// requested and not run: the claim, in phase continue, is left to expire,
// and recovery continues the turn.
func (ex *execution) recordResponse(ctx context.Context, t *turn, step int, attemptID string, resp provider.Response) (done, released bool, err error) {
	writeCall, finishCall := ex.writeCallRetried, ex.finishCallRetried
	cut := context.Cause(ctx)
	if cut != nil {
		var cancel context.CancelFunc
		ctx, cancel = afterCancel(ctx)
		defer cancel()
		writeCall, finishCall = ex.writeCallOnce, ex.finishCallOnce
	}
	calls := make([]ledger.CallParams, len(resp.ToolCalls))
	for i, c := range resp.ToolCalls {
		calls[i] = ledger.CallParams{
			ID: envelope.ToolCallID(attemptID, i), AttemptID: attemptID, Index: i,
			ModelCallID: cmp.Or(c.ID, fmt.Sprintf("call-%d", i)), Tool: c.Name, Class: string(ex.classOf(ctx, c)),
			Input: c.Input, IdempotencyKey: envelope.ToolCallID(attemptID, i),
		}
		resp.ToolCalls[i].ID = calls[i].ModelCallID
	}
	stepDone := ex.stepCompleted(t, step, resp.Text, calls)
	if len(calls) == 0 {
		// The answer, and the release when nothing waits: one commit, in
		// one round trip.
		landed := attemptLanded(attemptID, ledger.AttemptSucceeded)
		topics, keys, payloads := outbox.Columns([]outbox.Row{stepDone, ex.e.eventRow(envelope.Event{
			ID: "turn.completed:" + t.assistantID, Type: envelope.EventTurnCompleted, SessionID: ex.sessionID,
			At: time.Now().UTC(), MessageIDs: ids(t.inputs), AssistantMessageID: t.assistantID, Text: resp.Text,
		})})
		released, err := finishCall(ctx, landed, ledger.PhaseSafe, t.assistantID,
			turnAnswerCall(attemptID, t, &resp, ex.responseIDs[attemptID], topics, keys, payloads))
		if err != nil {
			return false, false, fmt.Errorf("recording response of %s: %w", attemptID, err)
		}
		ex.turnMetric("completed", t)
		return true, released, nil
	}
	// Tool calls: the response and the calls as requested, phase continue,
	// in one call (promptline_step_calls, migration 00022).
	parts := make([]string, len(resp.ToolCalls))
	for i, c := range resp.ToolCalls {
		body, _ := json.Marshal(transcript.ToolCallPart{ID: c.ID, Name: c.Name, Input: jsonOrString(c.Input)})
		parts[i] = string(body)
	}
	topics, keys, payloads := outbox.Columns([]outbox.Row{stepDone})
	err = writeCall(ctx, attemptLanded(attemptID, ledger.AttemptSucceeded), ledger.PhaseContinue, t.assistantID,
		ledger.StepCallsCall(attemptID, resp.Usage.InputTokens, resp.Usage.OutputTokens, ex.responseIDs[attemptID],
			t.assistantID, resp.Text, parts, calls, ledger.Events{Topics: topics, Keys: keys, Payloads: payloads}), nil)
	if err != nil {
		return false, false, fmt.Errorf("recording response of %s: %w", attemptID, err)
	}
	if cut != nil {
		return false, false, fmt.Errorf("recorded the response of %s; its %d tool calls are left to recovery: %w", attemptID, len(calls), cut)
	}
	// The calls run next, from runTurnSteps (runPendingCalls).
	for i, c := range resp.ToolCalls {
		t.pendingCalls = append(t.pendingCalls, pendingCall{params: calls[i], call: c})
	}
	return false, false, nil
}

// turnAnswerCall is the call of promptline_turn_answer (migrations
// 00018, 00021) that records resp, the answer of t's step attemptID, and
// the outbox rows of its events, given as their columns.
func turnAnswerCall(attemptID string, t *turn, resp *provider.Response, responseID string, topics, keys []string, payloads [][]byte) ledger.Call {
	return ledger.Call{Func: "promptline_turn_answer", Args: []any{attemptID, resp.Usage.InputTokens, resp.Usage.OutputTokens, responseID,
		t.assistantID, resp.Text, topics, keys, payloads}}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// checkResponse refuses an answer with a tool call that has no name, as
// the providers of this repository refuse it when they decode one
// (docs/providers.md asks the same of every provider): the executor is the
// last step before the public events, whose tool calls name their tool
// (session-event.schema.json). Such an answer fails its step as the
// provider's error, as a malformed answer does.
func checkResponse(resp provider.Response) error {
	for i, c := range resp.ToolCalls {
		if c.Name == "" {
			return fmt.Errorf("the provider's answer has tool call %d (%q) with no name", i, c.ID)
		}
	}
	return nil
}
