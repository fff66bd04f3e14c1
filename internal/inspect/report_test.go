package inspect_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/internal/inspect"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/tools"
)

// testBundle is a real database with the real admission and executor: the
// sessions a report reads are built by the code that builds them in
// production, so a change of the schema or of what the executor writes
// shows here.
type testBundle struct {
	pool     *pgxpool.Pool
	admitter *admission.Admitter
	exec     *executor.Executor
}

type setupOpts struct {
	permission tools.Permission // of every tool; empty: allow
}

func setup(t *testing.T, opts setupOpts) *testBundle {
	t.Helper()
	pool, _ := testkit.Pool(t)
	reg := tools.NewRegistry()
	require.NoError(t, reg.Register(tools.NewEcho()))
	cfg := &executor.ExecutorConfig{
		Claims: ledger.NewClaims(pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "inspect-test"}),
		Tools:  reg,
	}
	if opts.permission != "" {
		cfg.PermissionFunc = func(string) tools.Permission { return opts.permission }
	}
	e, err := executor.NewExecutor(pool, cfg)
	require.NoError(t, err)
	require.NoError(t, e.Start(context.Background()))
	t.Cleanup(e.StopNow)
	return &testBundle{pool: pool, admitter: admission.NewAdmitter(pool, &admission.AdmitterConfig{}), exec: e}
}

func (b *testBundle) admit(t *testing.T, session, msg, text string) {
	t.Helper()
	out, err := b.admitter.Admit(context.Background(), []admission.Incoming{{
		Prompt: envelope.Prompt{MessageID: msg, SessionID: session, Text: text, Delivery: envelope.DeliveryQueue},
		Source: admission.Source{Topic: "prompts", Partition: 2, Offset: 7},
	}})
	require.NoError(t, err)
	require.Equal(t, []admission.Outcome{admission.Admitted}, out)
}

// run wakes the session and waits until it went idle.
func (b *testBundle) run(t *testing.T, session string) {
	t.Helper()
	done, err := b.exec.Wake(context.Background(), session, 0)
	require.NoError(t, err)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		require.FailNow(t, "the session did not go idle within 20s")
	}
}

func (b *testBundle) report(t *testing.T, session string) inspect.Report {
	t.Helper()
	r, err := inspect.Session(context.Background(), b.pool, session)
	require.NoError(t, err)
	return r
}

func render(t *testing.T, r inspect.Report) string {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, inspect.Render(&buf, r))
	return buf.String()
}

func TestSession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("TurnWithAToolCall", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		b.admit(t, "s", "m1", `/tool echo {"text":"hi"}`)
		b.run(t, "s")
		r := b.report(t, "s")

		require.Equal(t, "s", r.SessionID)
		require.Equal(t, inspect.StateIdle, r.State)
		require.Positive(t, r.FencingToken)
		require.Nil(t, r.Claim, "the turn completed and released its claim")

		require.Len(t, r.Inputs, 1)
		in := r.Inputs[0]
		require.Equal(t, "m1", in.MessageID)
		require.Equal(t, "queue", in.Delivery)
		require.True(t, in.Promoted)
		require.NotNil(t, in.PromotionSeq)
		require.False(t, in.Waiting)
		require.Nil(t, in.QuarantineReason)
		require.Equal(t, "prompts", *in.SourceTopic)
		require.Equal(t, int32(2), *in.SourcePartition)
		require.Equal(t, int64(7), *in.SourceOffset)

		// user, assistant with the tool call, the tool result, the answer.
		require.Len(t, r.Transcript, 4)
		user, call, result, answer := r.Transcript[0], r.Transcript[1], r.Transcript[2], r.Transcript[3]
		require.Equal(t, "user", user.Role)
		require.Equal(t, "m1", user.MessageID)
		require.Len(t, user.Parts, 1)
		require.Equal(t, `/tool echo {"text":"hi"}`, user.Parts[0].Text.Value)
		require.False(t, user.Parts[0].Text.Truncated)

		require.Equal(t, "assistant", call.Role)
		require.Equal(t, "completed", call.Status)
		require.Equal(t, []string{"m1"}, call.Answers)
		require.Len(t, call.Parts, 1)
		require.Equal(t, "tool_call", call.Parts[0].Kind)
		require.Nil(t, call.Parts[0].Text)
		tc := call.Parts[0].ToolCall
		require.NotNil(t, tc)
		require.Equal(t, "echo", tc.Name)
		require.Equal(t, "call-0", tc.ID)
		require.JSONEq(t, `{"text":"hi"}`, tc.Input.Value)

		require.Equal(t, "tool", result.Role)
		require.Equal(t, "call-0", *result.ToolCallID)
		require.False(t, result.IsError)
		require.Equal(t, "hi", result.Parts[0].Text.Value)

		require.Equal(t, "assistant", answer.Role)
		require.Equal(t, "completed", answer.Status)
		require.Nil(t, answer.Error)
		require.Equal(t, "tool results: echo: hi", answer.Parts[0].Text.Value)
		require.Equal(t, *call.TurnID, *answer.TurnID, "both steps belong to one turn")
		for i := 1; i < len(r.Transcript); i++ {
			require.Greater(t, r.Transcript[i].Seq, r.Transcript[i-1].Seq, "the transcript is in session order")
		}

		require.Len(t, r.Attempts, 2)
		for i, a := range r.Attempts {
			require.Equal(t, i+1, a.Step)
			require.Equal(t, "succeeded", a.State)
			require.Equal(t, "scripted", a.Provider)
			require.Equal(t, 1, a.Tries)
			require.Equal(t, a.AttemptID, a.IdempotencyKey)
			require.Equal(t, r.FencingToken, a.FencingToken)
			require.Nil(t, a.Error)
			require.NotNil(t, a.FinishedAt)
		}
		require.Equal(t, call.MessageID, r.Attempts[0].AssistantMessageID)
		require.Equal(t, answer.MessageID, r.Attempts[1].AssistantMessageID)

		require.Len(t, r.ToolCalls, 1)
		c := r.ToolCalls[0]
		require.Equal(t, "echo", c.Tool)
		require.Equal(t, "idempotent", c.Class)
		require.Equal(t, "succeeded", c.State)
		require.Equal(t, r.Attempts[0].AttemptID, c.AttemptID)
		require.Equal(t, c.CallID, c.IdempotencyKey)
		require.Equal(t, result.MessageID, c.CallID, "the tool message is named after the call")
		require.Equal(t, "hi", c.Output.Value)
		require.False(t, *c.IsError)

		require.Empty(t, r.Recoveries)
		require.Empty(t, r.PermissionRequests)

		out := render(t, r)
		for _, want := range []string{
			"session        s\n",
			"state          idle\n",
			"INPUTS (1)",
			"TRANSCRIPT (4)",
			" user m1  completed",
			"    | /tool echo {\"text\":\"hi\"}\n",
			`    tool call call-0 echo {"text":"hi"}`,
			"result of call-0",
			"    | hi\n",
			"    | tool results: echo: hi\n",
			"CLAIM\n  no claim\n",
			"ATTEMPTS (2)",
			"TOOL CALLS (1)",
			"RECOVERIES (0)\n  none\n",
			"RESOLUTIONS (0)\n  none\n",
			"PERMISSION REQUESTS (0)\n  none\n",
		} {
			require.Contains(t, out, want)
		}
		require.Regexp(t, `(?m)^  \S+/call-0\s+echo\s+idempotent\s+succeeded\s+\S+/call-0\s+\d+\s+\S+Z\s+"hi"$`, out)
		// Provider and model (the scripted provider names itself), and the
		// estimate before the provider's own counts.
		require.Regexp(t, `(?m)^  \S+\s+1\s+scripted\s+scripted\s+succeeded\s+1\s.*\s\d+/0/0\s`, out)
		require.Regexp(t, `(?m)^  \S+\s+2\s+scripted\s+scripted\s+succeeded\s+1\s.*\s\d+/0/0\s`, out)
		require.NotContains(t, out, "+00:00", "times are in UTC, RFC 3339 with Z")

		// The JSON is snake_case, and every key is there even when unset.
		raw, err := json.Marshal(r)
		require.NoError(t, err)
		var top map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(raw, &top))
		for _, k := range []string{"session_id", "state", "fencing_token", "inputs", "transcript", "claim", "attempts",
			"tool_calls", "recoveries", "resolutions", "permission_requests", "permission_grants", "read_at"} {
			require.Contains(t, top, k)
		}
		require.Equal(t, "null", string(top["claim"]))
		require.Equal(t, "[]", string(top["recoveries"]), "an empty list is [], not null")
		require.Equal(t, "[]", string(top["resolutions"]), "an empty list is [], not null")
		var calls []map[string]any
		require.NoError(t, json.Unmarshal(top["tool_calls"], &calls))
		require.Equal(t, "idempotent", calls[0]["class"])
		require.Equal(t, "hi", calls[0]["output"].(map[string]any)["value"])
		var attempts []map[string]any
		require.NoError(t, json.Unmarshal(top["attempts"], &attempts))
		require.Equal(t, "scripted", attempts[0]["model"])
		require.Greater(t, attempts[0]["request_tokens"], float64(0))
		require.Contains(t, attempts[0], "response_id", "null when none was recorded")
		var back inspect.Report
		require.NoError(t, json.Unmarshal(raw, &back))
		require.Equal(t, r, back, "the JSON carries the whole report")
	})

	t.Run("LongTextsAreCutAndMarked", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		long := strings.Repeat("y", 300)
		prompt := `/tool echo {"text":"` + long + `"}` + "\n" + strings.Repeat("é", 2500) + "\x1b[31mred"
		b.admit(t, "s", "m1", prompt)
		b.run(t, "s")
		r := b.report(t, "s")

		user := r.Transcript[0].Parts[0].Text
		require.True(t, user.Truncated)
		require.Equal(t, len([]rune(prompt)), user.Runes)
		require.Equal(t, inspect.MaxTextRunes, len([]rune(user.Value)))
		require.True(t, strings.HasPrefix(prompt, user.Value), "cut on a character boundary")
		require.Equal(t, long, r.Transcript[2].Parts[0].Text.Value, "a tool result under the bound is whole")

		out := r.ToolCalls[0].Output
		require.True(t, out.Truncated)
		require.Equal(t, 300, out.Runes)
		require.Equal(t, strings.Repeat("y", inspect.MaxOutputRunes), out.Value)

		text := render(t, r)
		require.Contains(t, text, "[cut: 2000 of "+strconv.Itoa(len([]rune(prompt)))+" characters shown]")
		require.Contains(t, text, `"`+strings.Repeat("y", 200)+`" … [cut: 200 of 300 characters shown]`)
		require.NotContains(t, text, strings.Repeat("é", 2001))
	})

	t.Run("ControlCharactersAreEscaped", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		b.admit(t, "s", "m1", "/reply ok\n\x1b[2Jclear\tand\rback")
		b.run(t, "s")
		text := render(t, b.report(t, "s"))
		require.NotContains(t, text, "\x1b")
		require.NotContains(t, text, "\r")
		require.Contains(t, text, `    | \x1b[2Jclear\tand\rback`)
	})

	t.Run("ParkedSessionShowsItsRequestAndTheQueuedInput", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{permission: tools.Ask})
		b.admit(t, "s", "m1", `/tool echo {"text":"hi"}`)
		b.run(t, "s")
		b.admit(t, "s", "m2", "queued behind the ask")
		r := b.report(t, "s")

		require.Equal(t, inspect.StateParked, r.State)
		require.Nil(t, r.Claim, "a parked session holds no claim")
		require.Len(t, r.PermissionRequests, 1)
		q := r.PermissionRequests[0]
		require.Equal(t, "pending", q.Status)
		require.Equal(t, "echo", q.Tool)
		require.Nil(t, q.Reply)
		require.Len(t, r.ToolCalls, 1)
		require.Equal(t, q.CallID, r.ToolCalls[0].CallID)
		require.Equal(t, "requested", r.ToolCalls[0].State)
		require.Nil(t, r.ToolCalls[0].Output)
		require.Len(t, r.Inputs, 2)
		require.True(t, r.Inputs[1].WakePending)
		require.False(t, r.Inputs[1].Waiting, "a parked session's prompts do not wait for a wake: only the reply runs")

		text := render(t, r)
		require.Contains(t, text, "state          parked\n")
		require.Contains(t, text, "  m2 (not promoted):\n    | queued behind the ask\n")
		require.Regexp(t, `(?m)^  `+regexp.QuoteMeta(q.RequestID)+`\s+echo\s+pending\s+-\s+\S+Z\s+-\s+-\s+-$`, text)

		_, err := b.admitter.AdmitReply(ctx, nil, envelope.PermissionReply{RequestID: q.RequestID, Reply: envelope.ReplyReject, Message: "not now"},
			admission.Source{Topic: "permission-replies"})
		require.NoError(t, err)
		r = b.report(t, "s")
		require.Equal(t, inspect.StateWaiting, r.State, "the reply's input waits for its wake")
		require.Equal(t, "rejected", r.PermissionRequests[0].Status)
		require.Equal(t, "reject", *r.PermissionRequests[0].Reply)
		require.Equal(t, "not now", r.PermissionRequests[0].Message.Value)
		require.Contains(t, render(t, r), `"not now"`)
	})

	t.Run("LiveClaimIsShown", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		b.admit(t, "s", "m1", "hello")
		claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: time.Minute, OwnerID: "holder"})
		x, err := claims.AcquireWaiting(ctx, "s", "exec-1", nil) // m1 waits: the claim of its wake
		require.NoError(t, err)
		r := b.report(t, "s")
		require.Equal(t, inspect.StateRunning, r.State)
		require.NotNil(t, r.Claim)
		require.Equal(t, "exec-1", r.Claim.ExecutionID)
		require.Equal(t, "holder", r.Claim.OwnerID)
		require.Equal(t, x.Claim().Token, r.Claim.FencingToken)
		require.Equal(t, "ready", r.Claim.Phase)
		require.False(t, r.Claim.Expired)
		require.True(t, r.Claim.ExpiresAt.At.After(r.ReadAt))
		text := render(t, r)
		require.Contains(t, text, "  execution          exec-1\n")
		require.Contains(t, text, "  phase              ready\n")
		require.NotContains(t, text, "(expired)")

		// Expire it by the database clock: the report says so.
		_, err = b.pool.Exec(ctx, `UPDATE claims SET expires_at = now() - interval '1 second' WHERE session_id = 's'`)
		require.NoError(t, err)
		r = b.report(t, "s")
		require.Equal(t, inspect.StateClaimExpired, r.State)
		require.True(t, r.Claim.Expired)
		require.Contains(t, render(t, r), "(expired)")
	})

	// A lease that is not a time (a hand edit, a restore) is what recovery
	// quarantines for an operator to repair (docs/design.md, Phases):
	// the report that operator reads must show it, not fail on it.
	t.Run("LeaseThatIsNotATimeIsShown", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		b.admit(t, "s", "m1", "hello")
		claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: time.Minute, OwnerID: "holder"})
		_, err := claims.AcquireWaiting(ctx, "s", "exec-1", nil)
		require.NoError(t, err)
		for _, v := range []string{"-infinity", "infinity"} {
			_, err = b.pool.Exec(ctx, `UPDATE claims SET expires_at = $1::timestamptz WHERE session_id = 's'`, v)
			require.NoError(t, err)
			r := b.report(t, "s")
			require.NotNil(t, r.Claim)
			require.NotNil(t, r.Claim.ExpiresNotFinite, v)
			require.Equal(t, v, *r.Claim.ExpiresNotFinite)
			require.True(t, r.Claim.ExpiresAt.At.IsZero(), "the zero time, as recovery's evidence has it")
			require.Equal(t, v == "-infinity", r.Claim.Expired)
			js, err := json.Marshal(r)
			require.NoError(t, err)
			require.Contains(t, string(js), `"expires_at_not_finite":"`+v+`"`)
			require.Contains(t, render(t, r), "  expires            "+v)
		}
		_, err = b.pool.Exec(ctx, `UPDATE claims SET expires_at = now() + interval '1 minute' WHERE session_id = 's'`)
		require.NoError(t, err)
		js, err := json.Marshal(b.report(t, "s"))
		require.NoError(t, err)
		require.Contains(t, string(js), `"expires_at_not_finite":null`, "every key present, null when unset")
	})

	t.Run("UnknownSessionIsNotFound", func(t *testing.T) {
		t.Parallel()
		pool, _ := testkit.Pool(t)
		_, err := inspect.Session(ctx, pool, "no-such-session")
		require.True(t, errors.Is(err, inspect.ErrNotFound), "%v", err)
		require.EqualError(t, err, "session no-such-session not found")
	})
}
