package pipeline_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/pipeline"
	"github.com/promptline/promptline/tools"
)

// countingEcho is the echo tool, counting runs.
type countingEcho struct {
	tools.Tool
	runs chan string
}

func (c countingEcho) Run(ctx context.Context, call tools.Call) (tools.Result, error) {
	c.runs <- call.IdempotencyKey
	return c.Tool.Run(ctx, call)
}

func TestPermissions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	type bundle struct {
		*execBundle
		runs chan string
		exec func() *pipeline.Executor
	}
	setupPerm := func(t *testing.T) *bundle {
		b := &bundle{execBundle: setupExec(t), runs: make(chan string, 16)}
		reg := tools.NewRegistry()
		require.NoError(t, reg.Register(countingEcho{Tool: tools.NewEcho(), runs: b.runs}))
		// Each call builds a new executor: a restart, as far as the
		// session is concerned.
		b.exec = func() *pipeline.Executor {
			claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "p"})
			e := pipeline.NewExecutor(b.pool, &pipeline.ExecutorConfig{Claims: claims, Tools: reg,
				PermissionFunc: func(string) tools.Permission { return tools.Ask }})
			t.Cleanup(e.Stop)
			return e
		}
		return b
	}
	runOnce := func(t *testing.T, e *pipeline.Executor, session string) {
		done, err := e.Wake(ctx, session, 0)
		require.NoError(t, err)
		wait(t, done)
	}
	requestID := func(t *testing.T, b *bundle) string {
		var id string
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT request_id FROM permission_requests WHERE status = 'pending'`).Scan(&id))
		return id
	}
	reply := func(t *testing.T, b *bundle, id, r, msg string) pipeline.ReplyOutcome {
		out, err := b.admitter.AdmitReply(ctx, nil, envelope.PermissionReply{RequestID: id, Reply: r, Message: msg}, pipeline.Source{Topic: "permission-replies"})
		require.NoError(t, err)
		return out
	}
	events := func(t *testing.T, b *bundle, typ string) []envelope.Event {
		rows, err := b.pool.Query(ctx, `SELECT payload FROM outbox WHERE topic = 'session-events' ORDER BY id`)
		require.NoError(t, err)
		payloads, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
		require.NoError(t, err)
		var out []envelope.Event
		for _, p := range payloads {
			e, err := envelope.DecodeEvent(p)
			require.NoError(t, err)
			if e.Type == typ {
				out = append(out, e)
			}
		}
		return out
	}

	t.Run("AskParksTheSessionAndOnceResumesIt", func(t *testing.T) {
		t.Parallel()
		b := setupPerm(t)
		b.admit(t, "s", "m1", `/tool echo {"text": "hi"}`)
		runOnce(t, b.exec(), "s")
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "parked: the claim is released")
		id := requestID(t, b)
		asked := events(t, b, envelope.EventPermissionAsked)
		require.Len(t, asked, 1)
		require.Equal(t, "echo", asked[0].Tool)
		require.Equal(t, id, asked[0].RequestID)
		require.Empty(t, b.runs, "the tool did not run")

		b.admit(t, "s", "m2", "queued behind the ask")
		runOnce(t, b.exec(), "s")
		require.Zero(t, b.answered(t, "m2"), "nothing else of a parked session runs")

		require.Equal(t, pipeline.Admitted, reply(t, b, id, envelope.ReplyOnce, "").Outcome)
		require.Equal(t, pipeline.Duplicate, reply(t, b, id, envelope.ReplyOnce, "").Outcome, "an exact retry of the reply")
		out := reply(t, b, id, envelope.ReplyReject, "")
		require.Equal(t, envelope.ReasonConflict, out.Reason, "another reply to an answered request")
		runOnce(t, b.exec(), "s") // a new process: the request survived
		require.Len(t, b.runs, 1, "the tool ran once")
		completed := events(t, b, envelope.EventTurnCompleted)
		require.Len(t, completed, 2)
		require.Equal(t, []string{"m1"}, completed[0].MessageIDs)
		require.Equal(t, "tool results: echo: hi", completed[0].Text)
		require.Equal(t, []string{"m2"}, completed[1].MessageIDs, "the queued prompt ran after the resumed turn")
	})

	t.Run("AlwaysIsRememberedForTheSession", func(t *testing.T) {
		t.Parallel()
		b := setupPerm(t)
		b.admit(t, "s", "m1", `/tool echo {"text": "one"}`)
		runOnce(t, b.exec(), "s")
		require.Equal(t, pipeline.Admitted, reply(t, b, requestID(t, b), envelope.ReplyAlways, "").Outcome)
		runOnce(t, b.exec(), "s")
		b.admit(t, "s", "m2", `/tool echo {"text": "two"}`)
		runOnce(t, b.exec(), "s")
		require.Len(t, b.runs, 2)
		require.Len(t, events(t, b, envelope.EventPermissionAsked), 1, "asked once")
		completed := events(t, b, envelope.EventTurnCompleted)
		require.Len(t, completed, 2)
		require.Equal(t, []string{"m2"}, completed[1].MessageIDs)
	})

	t.Run("RejectHaltsTheTurn", func(t *testing.T) {
		t.Parallel()
		b := setupPerm(t)
		b.admit(t, "s", "m1", `/tool echo {"text": "no"}`)
		runOnce(t, b.exec(), "s")
		b.admit(t, "s", "m2", "after")
		require.Equal(t, pipeline.Admitted, reply(t, b, requestID(t, b), envelope.ReplyReject, "").Outcome)
		runOnce(t, b.exec(), "s")
		require.Empty(t, b.runs)
		failed := events(t, b, envelope.EventTurnFailed)
		require.Len(t, failed, 1)
		require.Equal(t, envelope.FailDeclined, failed[0].Reason)
		require.Equal(t, []string{"m1"}, failed[0].MessageIDs)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE state = 'interrupted'`))
		require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "claim cleared")
		require.Len(t, events(t, b, envelope.EventTurnCompleted), 1, "the session goes on with its next prompt")
	})

	t.Run("RejectWithMessageIsFeedbackAndTheTurnContinues", func(t *testing.T) {
		t.Parallel()
		b := setupPerm(t)
		b.admit(t, "s", "m1", `/tool echo {"text": "x"}`)
		runOnce(t, b.exec(), "s")
		require.Equal(t, pipeline.Admitted, reply(t, b, requestID(t, b), envelope.ReplyReject, "use the other tool").Outcome)
		runOnce(t, b.exec(), "s")
		require.Empty(t, b.runs)
		completed := events(t, b, envelope.EventTurnCompleted)
		require.Len(t, completed, 1)
		require.Equal(t, "tool results: echo: declined: use the other tool", completed[0].Text)
	})

	t.Run("ReplyKeyedToAnotherSessionIsRejected", func(t *testing.T) {
		t.Parallel()
		b := setupPerm(t)
		b.admit(t, "s", "m1", `/tool echo {"text": "x"}`)
		runOnce(t, b.exec(), "s")
		out, err := b.admitter.AdmitReply(ctx, []byte("other"), envelope.PermissionReply{RequestID: requestID(t, b), Reply: envelope.ReplyOnce}, pipeline.Source{})
		require.NoError(t, err)
		require.Equal(t, envelope.ReasonKeyMismatch, out.Reason)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM permission_requests WHERE status = 'pending'`), "nothing changed")
	})

	t.Run("ReplyToUnknownRequestIsRejected", func(t *testing.T) {
		t.Parallel()
		b := setupPerm(t)
		out := reply(t, b, "no-such-request", envelope.ReplyOnce, "")
		require.Equal(t, envelope.ReasonUnknownRequest, out.Reason)
		require.Zero(t, b.count(t, `SELECT count(*) FROM inputs`))
	})
}
