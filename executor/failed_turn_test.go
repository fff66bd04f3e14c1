package executor_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/provider/scripted"
	"github.com/promptline/promptline/tools"
)

// danglingClaimSQL counts claims that name an assistant message the
// transcript does not hold (recovery quarantines such a claim).
const danglingClaimSQL = `SELECT count(*) FROM claims c WHERE coalesce(c.assistant_message_id, '') <> ''
	AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.message_id = c.assistant_message_id)`

// loopingProvider asks for the echo tool at every step: the turn ends at
// the step limit.
type loopingProvider struct{}

func (loopingProvider) Complete(_ context.Context, req provider.Request) (provider.Response, error) {
	for _, m := range req.Turn {
		if m.Text == "loop" {
			return provider.Response{ToolCalls: []provider.ToolCall{{ID: "c", Name: "echo", Input: json.RawMessage(`{"text": "again"}`)}}}, nil
		}
	}
	return scripted.ScriptedProvider{}.Complete(context.Background(), req)
}

// TestFailedTurnNamesAnExistingMessage: a turn that fails after its first
// step (a permission declined on resume, the step limit) names in its claim
// and in its turn.failed event an assistant message that the transcript
// holds, errored; after every commit of the execution the claim names no
// missing message, so a crash at any point leaves nothing for recovery to
// quarantine, and the prompt queued behind the failed turn runs.
func TestFailedTurnNamesAnExistingMessage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	type bundle struct {
		*execBundle
		mu       sync.Mutex
		dangling []string // what the probe saw after each commit
	}
	setupFailed := func(t *testing.T) *bundle {
		return &bundle{execBundle: setupExec(t)}
	}
	// newExecutor builds an executor whose every commit is followed by a look
	// at the claim, before the execution goes on.
	newExecutor := func(t *testing.T, b *bundle, provider provider.Provider, perm tools.Permission) *executor.Executor {
		reg := tools.NewRegistry()
		require.NoError(t, reg.Register(tools.NewEcho()))
		claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 5 * time.Second, OwnerID: "f"})
		e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Provider: provider, Tools: reg,
			PermissionFunc: func(string) tools.Permission { return perm },
			OnCommitFunc: func() {
				var id string
				err := b.pool.QueryRow(ctx, `SELECT coalesce(string_agg(c.assistant_message_id, ','), '') FROM claims c
					WHERE coalesce(c.assistant_message_id, '') <> ''
					AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.message_id = c.assistant_message_id)`).Scan(&id)
				b.mu.Lock()
				defer b.mu.Unlock()
				if err != nil {
					b.dangling = append(b.dangling, "probe failed: "+err.Error())
				} else if id != "" {
					b.dangling = append(b.dangling, id)
				}
			}})
		t.Cleanup(e.StopNow)
		return e
	}
	runOnce := func(t *testing.T, e *executor.Executor) {
		done, err := e.Wake(ctx, "s", 0)
		require.NoError(t, err)
		wait(t, done)
	}
	// requireFailedTurnReadable checks the one turn.failed event: its
	// assistant message is in the transcript, errored, answering m1.
	requireFailedTurnReadable := func(t *testing.T, b *bundle, reason string) {
		failed := testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnFailed)
		require.Len(t, failed, 1)
		require.Equal(t, reason, failed[0].Reason)
		require.Equal(t, []string{"m1"}, failed[0].MessageIDs)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM messages WHERE message_id = $1 AND role = 'assistant'
			AND status = 'errored' AND 'm1' = ANY(answers)`, failed[0].AssistantMessageID),
			"turn.failed names assistant message %q: it must be in the transcript, errored", failed[0].AssistantMessageID)
		require.Zero(t, b.count(t, `SELECT count(*) FROM messages WHERE role = 'assistant' AND status = 'pending'`), "nothing left pending")
		b.mu.Lock()
		defer b.mu.Unlock()
		require.Empty(t, b.dangling, "after a commit the claim named a missing assistant message")
		require.Zero(t, b.count(t, danglingClaimSQL))
	}

	t.Run("DeclinedResumedTurn", func(t *testing.T) {
		t.Parallel()
		b := setupFailed(t)
		b.admit(t, "s", "m1", `/tool echo {"text": "no"}`)
		runOnce(t, newExecutor(t, b, nil, tools.Ask))
		var requestID string
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT request_id FROM permission_requests WHERE status = 'pending'`).Scan(&requestID))
		out, err := b.admitter.AdmitReply(ctx, nil, envelope.PermissionReply{RequestID: requestID, Reply: envelope.ReplyReject}, admission.Source{Topic: "permission-replies"})
		require.NoError(t, err)
		require.Equal(t, admission.Admitted, out.Outcome)
		b.admit(t, "s", "m2", "after") // waits: the claim is kept past the failed turn

		runOnce(t, newExecutor(t, b, nil, tools.Ask))
		requireFailedTurnReadable(t, b, envelope.FailDeclined)
		require.Equal(t, 1, b.answered(t, "m2"), "the queued prompt ran")
	})

	t.Run("MaxSteps", func(t *testing.T) {
		t.Parallel()
		b := setupFailed(t)
		b.admit(t, "s", "m1", "loop")
		b.admit(t, "s", "m2", "after")

		runOnce(t, newExecutor(t, b, loopingProvider{}, tools.Allow))
		requireFailedTurnReadable(t, b, envelope.FailMaxSteps)
		require.Equal(t, 1, b.answered(t, "m2"), "the queued prompt ran")
		require.Equal(t, 16, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = 's' AND state = 'succeeded'
			AND assistant_message_id IN (SELECT message_id FROM messages WHERE 'm1' = ANY(answers))`), "sixteen steps, then the limit")
	})
}
