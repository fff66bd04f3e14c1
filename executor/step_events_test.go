package executor_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/provider/scripted"
	"github.com/promptline/promptline/tools"
)

func TestStepEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ToolTurnAnnouncesEachStepAndCall", func(t *testing.T) {
		t.Parallel()
		reg := tools.NewRegistry()
		require.NoError(t, reg.Register(tools.NewEcho()))
		require.NoError(t, reg.Register(tools.NewAppendLine(t.TempDir())))
		b := setup(t, setupOpts{tools: reg})
		sess, msg := id(t, "s"), id(t, "m")
		b.send(t, envelope.Prompt{MessageID: msg, SessionID: sess,
			Text: "/tool echo {\"text\": \"hi\"}\n/tool append_line {\"file\": \"log.txt\", \"line\": \"one\"}"})
		done := b.waitTurn(t, msg)
		require.Equal(t, envelope.EventTurnCompleted, done.Type)

		// The relay publishes at least once: keep the first copy of each id.
		schema := testkit.EventSchema(t)
		var evs []envelope.Event
		seen := map[string]bool{}
		require.Eventually(t, func() bool {
			evs, seen = nil, map[string]bool{}
			for _, m := range b.events.All() {
				if string(m.Key) != sess {
					continue
				}
				testkit.RequireValid(t, schema, m.Value)
				e, err := envelope.DecodeEvent(m.Value)
				require.NoError(t, err)
				if !seen[e.ID] {
					seen[e.ID] = true
					evs = append(evs, e)
				}
			}
			return len(evs) == 9
		}, 20*time.Second, 10*time.Millisecond, "events of %s: %v", sess, types(evs))

		require.Equal(t, []string{
			envelope.EventInputAdmitted, envelope.EventTurnStarted, envelope.EventStepCompleted,
			envelope.EventToolStarted, envelope.EventToolCompleted, envelope.EventToolStarted, envelope.EventToolCompleted,
			envelope.EventStepCompleted, envelope.EventTurnCompleted,
		}, types(evs), "in the order they were committed")

		started, step1, step2 := evs[1], evs[2], evs[7]
		turnID := started.TurnID
		require.Equal(t, "turn.started:"+turnID, started.ID)
		require.Equal(t, []string{msg}, started.MessageIDs)
		require.Empty(t, started.AssistantMessageID)

		require.Equal(t, "step.completed:"+turnID, step1.ID, "the turn is named after its first assistant message")
		require.Equal(t, turnID, step1.AssistantMessageID)
		require.Equal(t, 1, step1.Step)
		require.Equal(t, turnID, step1.TurnID)
		require.Len(t, step1.ToolCalls, 2)
		require.Equal(t, "echo", step1.ToolCalls[0].Tool)
		require.Equal(t, string(tools.Idempotent), step1.ToolCalls[0].Class)
		require.Equal(t, "append_line", step1.ToolCalls[1].Tool)
		require.Equal(t, string(tools.SideEffecting), step1.ToolCalls[1].Class)

		for i, c := range step1.ToolCalls {
			st, co := evs[3+2*i], evs[4+2*i]
			// Dispatch and outcome are named after the claim that committed
			// them.
			token := b.count(t, `SELECT fencing_token FROM messages WHERE message_id = $1 AND role = 'tool'`, c.CallID)
			require.Equal(t, fmt.Sprintf("tool.started:%s@%d", c.CallID, token), st.ID)
			require.Equal(t, fmt.Sprintf("tool.completed:%s@%d", c.CallID, token), co.ID)
			for _, e := range []envelope.Event{st, co} {
				require.Equal(t, turnID, e.TurnID)
				require.Equal(t, c.CallID, e.CallID)
				require.Equal(t, c.ModelCallID, e.ModelCallID)
				require.Equal(t, c.Tool, e.Tool)
				require.Equal(t, c.Class, e.Class)
			}
			require.Empty(t, st.Outcome)
			require.Equal(t, "succeeded", co.Outcome)
			// The ledger holds the call under the same ID.
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE call_id = $1 AND state = 'succeeded'`, c.CallID))
		}

		require.Equal(t, 2, step2.Step)
		require.Equal(t, turnID, step2.TurnID)
		require.Equal(t, done.AssistantMessageID, step2.AssistantMessageID)
		require.Equal(t, "step.completed:"+done.AssistantMessageID, step2.ID)
		require.Equal(t, done.Text, step2.Text, "the last step's text is the answer")
		require.Empty(t, step2.ToolCalls)
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM messages WHERE message_id = $1 AND turn_id = $2 AND status = 'completed'`,
			step2.AssistantMessageID, turnID))

		// No event carries a tool's input or output.
		for _, m := range b.events.All() {
			require.False(t, bytes.Contains(m.Value, []byte(`"one"`)), "%s", m.Value)
		}
		_ = ctx
	})

	t.Run("PlainTurnStartsAndCompletesOneStep", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})
		sess, msg := id(t, "s"), id(t, "m")
		b.send(t, envelope.Prompt{MessageID: msg, SessionID: sess, Text: "hello"})
		done := b.waitTurn(t, msg)
		var got []string
		require.Eventually(t, func() bool {
			got = nil
			for _, e := range b.events.Events(t) {
				if e.SessionID == sess && !slices.Contains(got, e.ID) {
					got = append(got, e.ID)
				}
			}
			return len(got) == 4
		}, 20*time.Second, 10*time.Millisecond)
		require.Equal(t, []string{"input.admitted:" + msg, "turn.started:" + done.AssistantMessageID,
			"step.completed:" + done.AssistantMessageID, "turn.completed:" + done.AssistantMessageID}, got)
	})
}

func types(evs []envelope.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Type
	}
	return out
}

// TestStepEventsOfTheTransactionalPromotion: prompts promoted on the
// transactional path (here behind a continuation input that no recovery
// vouches for, which is quarantined in the same transaction) start their
// turn as the queued path does: turn.started committed with the promotion.
func TestStepEventsOfTheTransactionalPromotion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupExec(t)
	b.admit(t, "s", "m1", "hello")
	_, err := b.pool.Exec(ctx, `INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, kind)
		VALUES ('orphan-continuation', 's', '', '\x00', 'steer', true, 'continuation')`)
	require.NoError(t, err)
	done, err := b.executor(t, "x", scripted.ScriptedProvider{}, 5*time.Second, 0).Wake(ctx, "s", 0)
	require.NoError(t, err)
	wait(t, done)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM inputs WHERE message_id = 'orphan-continuation' AND quarantine_reason IS NOT NULL`))
	require.Equal(t, 1, b.answered(t, "m1"))

	var got []string
	var turnID string
	for _, e := range testkit.SessionEvents(t, b.pool, "s") {
		got = append(got, e.ID)
		if strings.HasPrefix(e.ID, "turn.started:") {
			turnID = e.TurnID
		}
	}
	require.NotEmpty(t, turnID, "no turn.started: %v", got)
	require.Equal(t, []string{"input.admitted:m1", "turn.started:" + turnID, "step.completed:" + turnID, "turn.completed:" + turnID}, got)
}
