package executor

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/tools"
	"github.com/promptline/promptline/transcript"
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

// Step events (docs/session-events.md). Each ID is derived from what the
// event announces (the turn, the step's assistant message, the call), all
// of them durable: a retried write, a relay's republication and a
// recovery's continuation name the same fact with the same ID.

// turnStarted announces t's promotion.
func (ex *execution) turnStarted(t *turn) outbox.Row {
	return ex.e.eventRow(ex.turnStartedEvent(t))
}

func (ex *execution) turnStartedEvent(t *turn) envelope.Event {
	return envelope.Event{
		ID: "turn.started:" + t.id, Type: envelope.EventTurnStarted, SessionID: ex.sessionID, At: time.Now().UTC(),
		TurnID: t.id, MessageIDs: ids(t.inputs),
	}
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
	return ex.e.eventRow(e)
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
	return ex.e.eventRow(envelope.Event{
		ID: id, Type: typ, SessionID: ex.sessionID, At: time.Now().UTC(),
		TurnID: turnID, CallID: p.ID, ModelCallID: p.ModelCallID, Tool: p.Tool, Class: p.Class, Outcome: outcome,
	})
}

func (ex *execution) turnMetric(outcome string, t *turn) {
	if f := ex.e.cfg.OnTurnFunc; f != nil {
		f(outcome, time.Since(t.promotedAt))
	}
}

// attemptMetric counts one provider request by the outcome the process
// saw: a response (succeeded), an error that may have been acted on
// (unknown: provider.ErrOutcomeUnknown, or cut off by cancellation), or any other
// error (failed).
func (ex *execution) attemptMetric(ctx context.Context, perr error, d time.Duration) {
	f := ex.e.cfg.OnAttemptFunc
	if f == nil {
		return
	}
	outcome := OutcomeSucceeded
	switch {
	case perr == nil:
	case errors.Is(perr, provider.ErrOutcomeUnknown) || ctx.Err() != nil:
		outcome = OutcomeUnknown
	default:
		outcome = OutcomeFailed
	}
	f(outcome, d)
}

// unknownMetric counts an attempt the executor recorded unknown (the
// failed turn's write committed: err is nil), as recovery counts those it
// reconciles: promptline_provider_attempts_unknown_total.
func (ex *execution) unknownMetric(err error) {
	if f := ex.e.cfg.OnAttemptUnknownFunc; f != nil && err == nil {
		f(ex.e.providerName, ex.e.providerModel)
	}
}

// callSecondsMetric observes how long a tool ran, by the outcome runCall
// decides from the same facts.
func (ex *execution) callSecondsMetric(ctx context.Context, err error, res tools.Result, d time.Duration) {
	f := ex.e.cfg.OnToolRunFunc
	if f == nil {
		return
	}
	outcome := OutcomeSucceeded
	switch {
	case errors.Is(err, tools.ErrNotRun) || (err == nil && res.IsError):
		outcome = OutcomeFailed
	case err != nil:
		outcome = OutcomeUnknown
	}
	f(outcome, d)
}

// callMetric counts a settled tool call (invalid and declined calls are
// failed) by the state settleCall records.
func (ex *execution) callMetric(state ledger.CallState) {
	f := ex.e.cfg.OnCallSettledFunc
	if f == nil {
		return
	}
	outcome := OutcomeFailed
	switch state {
	case ledger.CallSucceeded:
		outcome = OutcomeSucceeded
	case ledger.CallUnknown:
		outcome = OutcomeUnknown
	}
	f(outcome)
}

// assistantParams are t's current assistant message, pending, as the
// execution's claim writes it.
func (ex *execution) assistantParams(t *turn) *transcript.InsertAssistantParams {
	cl := ex.x.Claim()
	return &transcript.InsertAssistantParams{
		ID: t.assistantID, SessionID: ex.sessionID, Answers: ids(t.inputs), ExecutionID: cl.ExecutionID, Token: cl.Token, TurnID: t.id,
	}
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

// waitingSQL reads the head of a session's waiting inputs
// (promptline_waiting_head, migration 00020: the oldest input, the oldest
// steers up to a hundred, the oldest input that is not a prompt), oldest
// first, and whether a turn can pick each (pickTurn): the oldest input,
// and the oldest steers up to $2 of them and $3 bytes of text (the one
// that reaches it included). A turn is chosen from the head alone, so
// what it reads does not grow with the queue behind it: every turn read
// every waiting input, a second a turn at 100,000 prompts waiting
// (BenchmarkTurnAtQueueDepth, TestATurnReadsTheHeadOfADeepQueue). Only the
// pickable inputs have their text read, by their key; the others' is
// empty, not read from storage (the head gives the sizes): a session with
// a hundred steers of a megabyte would have every turn read and hold all
// of them (TestViewReadsTheTextOfWhatATurnCanPick).
const waitingSQL = `
SELECT message_id, CASE WHEN pickable THEN (SELECT i.text FROM inputs i WHERE i.message_id = v.message_id) ELSE '' END,
       delivery, kind, pickable
FROM (
    SELECT message_id, delivery, kind, admission_seq,
           CASE WHEN delivery = 'steer'
                THEN count(*) FILTER (WHERE delivery = 'steer') OVER w <= $2
                     AND sum(size) FILTER (WHERE delivery = 'steer') OVER w - size < $3
                ELSE row_number() OVER w = 1
           END AS pickable
    FROM promptline_waiting_head($1)
    WINDOW w AS (ORDER BY admission_seq)
) v
ORDER BY admission_seq`

// promoteSQL promotes one input and creates its user message with its
// text, in one statement: it writes inputs (admission's table) and
// messages and message_parts (transcript's) at once, and stays here as a
// cross-table statement (docs/design.md, Table owners).
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
