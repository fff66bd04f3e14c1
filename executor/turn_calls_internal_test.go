package executor

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/outbox"
	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/transcript"
)

// TestTurnCallsWriteWhatTheStatementsWrite holds the common turn's SQL
// functions (migration 00018) to the owners' statements they stand for:
// one session runs two queued turns through the calls, as the executor
// does (the claim with the first step, the answer kept for the waiting
// prompt, the next turn's first step, the answer with the release); a
// second session runs the same turns with the same arguments through the
// owners' statements one by one, in the same transactions (the
// transactional path). After each transaction every row either session
// wrote (sessions, inputs, claims, messages and their parts, attempts,
// outbox) must be the same, less the session's name, times (set or not)
// and sequence numbers (set or not).
func TestTurnCallsWriteWhatTheStatementsWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	admitter := admission.NewAdmitter(pool, &admission.AdmitterConfig{})
	claims := ledger.NewClaims(pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "owner", Logger: testkit.Logger(t, nil)})
	at := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)

	type turnArgs struct {
		inputs                       []string
		turn, assistant, attempt     string
		started, completed           []outbox.Row
		hash                         []byte
		text, response, model        string
		requestTokens, in, outTokens int64
	}
	// The first turn answers one prompt with text, a model and a response
	// ID; the second answers two at once (as steers are) with none of them:
	// the empty values the functions must store as the statements do.
	turnOf := func(s string, n string) turnArgs {
		a := turnArgs{turn: s + "-t" + n, assistant: s + "-a" + n, attempt: s + "-e/step-" + n, hash: []byte("hash-" + n),
			requestTokens: 7, in: 3, outTokens: 5}
		if n == "1" {
			a.inputs, a.text, a.response, a.model = []string{s + "-p1"}, "first answer", "resp-1", "model"
		} else {
			a.inputs = []string{s + "-p2", s + "-p3"}
		}
		ev := func(typ, what string) outbox.Row {
			return outbox.EventRow("session-events", envelope.Event{ID: what + ":" + a.turn, Type: typ, SessionID: s, At: at,
				TurnID: a.turn, MessageIDs: a.inputs, AssistantMessageID: a.assistant, Text: a.text})
		}
		a.started = []outbox.Row{ev(envelope.EventTurnStarted, "turn.started")}
		a.completed = []outbox.Row{ev(envelope.EventStepCompleted, "step.completed"), ev(envelope.EventTurnCompleted, "turn.completed")}
		return a
	}
	firstArgs := func(a turnArgs) []any {
		topics, keys, payloads := outbox.Columns(a.started)
		return []any{a.inputs, a.turn, a.attempt, "scripted", a.attempt, a.hash, a.model, a.requestTokens, topics, keys, payloads}
	}
	answerCall := func(a turnArgs) ledger.Call {
		topics, keys, payloads := outbox.Columns(a.completed)
		return ledger.Call{Func: "promptline_turn_answer", Args: []any{a.attempt, a.in, a.outTokens, a.response, a.assistant, a.text, topics, keys, payloads}}
	}
	admit := func(s string) {
		for _, n := range []string{"1", "2", "3"} {
			_, err := admitter.Admit(ctx, []admission.Incoming{{Prompt: envelope.Prompt{MessageID: s + "-p" + n, SessionID: s, Text: "prompt " + n, Delivery: envelope.DeliveryQueue}}})
			require.NoError(t, err)
		}
	}

	// Through the calls.
	calls := "sessA"
	admit(calls)
	read, err := claims.Peek(ctx, calls, nil)
	require.NoError(t, err)
	one, two := turnOf(calls, "1"), turnOf(calls, "2")
	xc, err := claims.AcquireAsReadCall(ctx, calls, calls+"-e", read, []string{calls + "-p1"}, ledger.PhaseUnknown, one.assistant,
		func(*ledger.Execution) ledger.Call {
			return ledger.Call{Func: "promptline_turn_first", Args: firstArgs(one)}
		})
	require.NoError(t, err)
	// The statements' session below claims with AcquireWaiting and fences
	// in its first write, which renews the lease; the call claims as read,
	// a new claim that no fence renews in its own transaction (as the
	// batch it replaced did): renewed_at is the claim's time there.
	fresh := "claims.renewed_at"
	var callSnaps []string
	callSnaps = append(callSnaps, testkit.Snapshot(t, pool, calls, fresh))
	released, err := xc.FinishCallRetried(ctx, ledger.RetryOpts{}, ledger.PhaseSafe, one.assistant, answerCall(one))
	require.NoError(t, err)
	require.False(t, released, "two prompts wait")
	callSnaps = append(callSnaps, testkit.Snapshot(t, pool, calls))
	require.NoError(t, xc.WriteCall(ctx, ledger.PhaseUnknown, two.assistant, ledger.Call{Func: "promptline_turn_next", Args: firstArgs(two)}))
	callSnaps = append(callSnaps, testkit.Snapshot(t, pool, calls))
	released, err = xc.FinishCallRetried(ctx, ledger.RetryOpts{}, ledger.PhaseSafe, two.assistant, answerCall(two))
	require.NoError(t, err)
	require.True(t, released, "nothing waits")
	callSnaps = append(callSnaps, testkit.Snapshot(t, pool, calls))

	// Through the statements.
	stmts := "sessB"
	admit(stmts)
	one, two = turnOf(stmts, "1"), turnOf(stmts, "2")
	xs, err := claims.AcquireWaiting(ctx, stmts, stmts+"-e", nil)
	require.NoError(t, err)
	first := func(a turnArgs) func(tx pgx.Tx) error {
		return func(tx pgx.Tx) error {
			cl := xs.Claim()
			for _, in := range a.inputs {
				if _, err := tx.Exec(ctx, promoteSQL, in, cl.ExecutionID, cl.Token); err != nil {
					return err
				}
			}
			if err := transcript.InsertAssistant(ctx, tx, &transcript.InsertAssistantParams{ID: a.assistant, SessionID: stmts, Answers: a.inputs,
				ExecutionID: cl.ExecutionID, Token: cl.Token, TurnID: a.turn}); err != nil {
				return err
			}
			if err := outbox.Insert(ctx, tx, a.started...); err != nil {
				return err
			}
			if err := xs.BeginAttempt(ctx, tx, ledger.AttemptParams{ID: a.attempt, AssistantMessageID: a.assistant, Step: 1, Provider: "scripted",
				IdempotencyKey: a.attempt, RequestHash: a.hash, Model: a.model, RequestTokens: a.requestTokens}); err != nil {
				return err
			}
			return xs.SetPhase(ctx, tx, ledger.PhaseUnknown, a.assistant)
		}
	}
	answer := func(a turnArgs) func(tx pgx.Tx) error {
		return func(tx pgx.Tx) error {
			if err := ledger.FinishAttemptWith(ctx, tx, a.attempt, ledger.AttemptSucceeded, "", a.in, a.outTokens, a.response); err != nil {
				return err
			}
			if err := transcript.Answer(ctx, tx, &transcript.AnswerParams{MessageID: a.assistant, Text: a.text}); err != nil {
				return err
			}
			if err := outbox.Insert(ctx, tx, a.completed...); err != nil {
				return err
			}
			return xs.SetPhase(ctx, tx, ledger.PhaseSafe, a.assistant)
		}
	}
	require.NoError(t, xs.Write(ctx, first(one)))
	stmtSnaps := []string{testkit.Snapshot(t, pool, stmts, fresh)}
	released, err = xs.Finish(ctx, answer(one))
	require.NoError(t, err)
	require.False(t, released)
	stmtSnaps = append(stmtSnaps, testkit.Snapshot(t, pool, stmts))
	require.NoError(t, xs.Write(ctx, first(two)))
	stmtSnaps = append(stmtSnaps, testkit.Snapshot(t, pool, stmts))
	released, err = xs.Finish(ctx, answer(two))
	require.NoError(t, err)
	require.True(t, released)
	stmtSnaps = append(stmtSnaps, testkit.Snapshot(t, pool, stmts))

	for i, what := range []string{"the claim with the first step", "the answer kept for a waiting prompt", "the next turn's first step", "the answer with the release"} {
		require.Equal(t, strings.ReplaceAll(stmtSnaps[i], stmts, "S"), strings.ReplaceAll(callSnaps[i], calls, "S"), what)
	}
	require.Contains(t, callSnaps[3], `"status": "completed"`, "the snapshot sees the rows")
}

// The arguments the executor builds for promptline_turn_first,
// promptline_turn_next and promptline_turn_answer are of the types group
// commit reads to send several sessions' writes as one statement
// (ledger.Groupable): otherwise every call would go out whole, writing the
// same rows at a higher cost, and no other test would notice. A turn of
// one prompt and a turn of two steers.
func TestFirstStepCanBeGrouped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	claims := ledger.NewClaims(pool, &ledger.ClaimsConfig{Lease: time.Minute, OwnerID: "owner"})
	e, err := NewExecutor(pool, &ExecutorConfig{Claims: claims})
	require.NoError(t, err)
	admitter := admission.NewAdmitter(pool, &admission.AdmitterConfig{})
	for _, tc := range []struct {
		session  string
		delivery envelope.Delivery
		prompts  int
	}{{"one-prompt", envelope.DeliveryQueue, 1}, {"two-steers", envelope.DeliverySteer, 2}} {
		for i := range tc.prompts {
			_, err := admitter.Admit(ctx, []admission.Incoming{{Prompt: envelope.Prompt{MessageID: fmt.Sprintf("%s-p%d", tc.session, i),
				SessionID: tc.session, Text: "prompt", Delivery: tc.delivery}}})
			require.NoError(t, err)
		}
		view := &sessionView{}
		read, err := claims.Peek(ctx, tc.session, func(b *pgx.Batch) { view.queue(b, tc.session) })
		require.NoError(t, err)
		ex := &execution{e: e, sessionID: tc.session}
		turn := newTurn(pickTurn(view.waiting))
		require.Len(t, turn.inputs, tc.prompts, tc.session)
		var waiting []string
		for _, w := range view.waiting {
			waiting = append(waiting, w.id)
		}
		var call ledger.Call
		_, err = claims.AcquireAsReadCall(ctx, tc.session, "e-"+tc.session, read, waiting, ledger.PhaseUnknown, turn.assistantID,
			func(x *ledger.Execution) ledger.Call {
				ex.x = x
				call, _ = ex.firstStepDeep("promptline_turn_first", turn, view)
				return call
			})
		require.NoError(t, err, "the call is the executor's, and commits")
		require.True(t, ledger.Groupable("promptline_turn_first", call.Args), "%s: %#v", tc.session, call.Args)
		next, _ := ex.firstStepDeep("promptline_turn_next", turn, view)
		require.True(t, ledger.Groupable(next.Func, next.Args), "%s: %#v", tc.session, next.Args)
		topics, keys, payloads := outbox.Columns([]outbox.Row{{Topic: "session-events", Key: tc.session, Payload: []byte("{}")}})
		answer := turnAnswerCall("attempt", turn, &provider.Response{Text: "answer"}, "", topics, keys, payloads)
		require.True(t, ledger.Groupable(answer.Func, answer.Args), "%s: %#v", tc.session, answer.Args)
	}
}
