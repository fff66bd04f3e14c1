package recovery_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/recovery"
	"github.com/promptline/promptline/tools"
)

// breakToolCallParts overwrites the session's stored tool-call parts
// with a body that is not JSON, as a hand edit or an old bug might leave
// them.
func breakToolCallParts(t *testing.T, pool *pgxpool.Pool, session string) {
	t.Helper()
	tag, err := pool.Exec(context.Background(), `UPDATE message_parts SET body = '{"id": "call-0", "name": '
		WHERE kind = 'tool_call' AND message_id IN (SELECT message_id FROM messages WHERE session_id = $1)`, session)
	require.NoError(t, err)
	require.NotZero(t, tag.RowsAffected(), "the session has a tool-call part to break")
}

// repairToolCallParts rebuilds the session's tool-call parts from the
// ledger's record of the calls (runbook, PromptlineQuarantinedRows).
func (b *testBundle) repairToolCallParts(t *testing.T, session string) {
	t.Helper()
	b.exec(t, `UPDATE message_parts p SET body = json_build_object('id', c.model_call_id, 'name', c.tool, 'input', c.input)::text
		FROM messages m, attempts a, tool_calls c
		WHERE p.kind = 'tool_call' AND m.message_id = p.message_id AND m.session_id = $1
		  AND a.assistant_message_id = m.message_id AND a.state = 'succeeded' AND c.attempt_id = a.attempt_id AND c.idx = p.idx - 1`, session)
}

// corruptingTool is the side-effecting append_line that, on its first
// run, breaks the tool-call part of the step that requested it (stored
// before the call runs): the turn's next step reads a transcript it
// cannot decode.
type corruptingTool struct {
	pool    *pgxpool.Pool
	session string
	mu      sync.Mutex
	runs    int
}

func (c *corruptingTool) Spec() tools.Spec {
	return tools.Spec{Name: "append_line", Class: tools.SideEffecting, InputSchema: json.RawMessage(`{"type":"object"}`)}
}

func (c *corruptingTool) Run(ctx context.Context, _ tools.Call) (tools.Result, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.runs++
	if c.runs == 1 {
		if _, err := c.pool.Exec(ctx, `UPDATE message_parts SET body = 'not json'
			WHERE kind = 'tool_call' AND message_id IN (SELECT message_id FROM messages WHERE session_id = $1)`, c.session); err != nil {
			return tools.Result{}, err
		}
	}
	return tools.Result{Output: "appended"}, nil
}

func (c *corruptingTool) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runs
}

// sentFor returns the requests whose turn answers the input msg.
func sentFor(reqs []provider.Request, msg string) []provider.Request {
	var out []provider.Request
	for _, r := range reqs {
		for _, m := range r.Turn {
			if m.ID == msg {
				out = append(out, r)
				break
			}
		}
	}
	return out
}

// A tool-call part of the transcript that cannot be decoded fails every
// read of the session's history. That read precedes every provider step,
// so the session cannot run until the part is repaired; it must not be
// retried silently for ever either (a wake dropped at each redrive, or a
// claim re-woken or continued at each lease: docs/design.md, P6 and
// invariant 13). The executor leaves the session's claim to recovery,
// which quarantines it with the part named (the claim gauge and its alert
// see it), refuses its release while the part is still unreadable, and
// after the repair and release decides it by its phase: nothing is sent
// or run twice, the prompts that waited run, other sessions go on
// meanwhile.
func TestUnreadableTranscriptIsQuarantinedNotRetried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	release := func(b *testBundle) error {
		return recovery.Release(ctx, b.pool, recovery.KindClaim, "s", &recovery.ReleaseOpts{Operator: "op", Note: "tool-call part rebuilt from the ledger"})
	}
	quarantined := func(t *testing.T, b *testBundle) recovery.QuarantinedRow {
		t.Helper()
		rows, err := recovery.ListQuarantined(ctx, b.pool)
		require.NoError(t, err)
		require.Len(t, rows, 1)
		counts, err := recovery.QuarantinedCounts(ctx, b.pool)
		require.NoError(t, err)
		require.Equal(t, 1, counts[recovery.KindClaim], "the gauge of quarantined claims counts it")
		var asst string
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT m.message_id FROM messages m JOIN message_parts p USING (message_id)
			WHERE m.session_id = 's' AND p.kind = 'tool_call'`).Scan(&asst))
		require.Equal(t, recovery.KindClaim, rows[0].Kind)
		require.Equal(t, "s", rows[0].SessionID)
		require.Contains(t, rows[0].Reason, "transcript unreadable")
		require.Contains(t, rows[0].Reason, "message "+asst+" part 1", "the reason names the part to repair")
		return rows[0]
	}

	t.Run("BeforeATurn", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		side := &sideTool{}
		reg := b.registry(t, side)
		rec := &recorder{}
		b.admit(t, "s", "m1", `/tool append_line {"line":"x"}`)
		b.run(t, rec, reg, "s")
		require.Len(t, b.completed(t, "s"), 1)
		require.Len(t, side.runs(), 1)

		breakToolCallParts(t, b.pool, "s")
		b.admit(t, "s", "m2", "next")
		b.admit(t, "other", "o1", "hello")
		b.run(t, rec, reg, "s")
		require.Empty(t, sentFor(rec.all(), "m2"), "nothing is sent on a transcript that cannot be read")
		b.die(t, "s")
		p := b.pass(t)
		require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionQuarantined: 1}, p.Decisions,
			"the session is handed to recovery and quarantined, not dropped at every wake")
		quarantined(t, b)

		b.run(t, rec, reg, "other")
		require.Len(t, b.completed(t, "other"), 1, "other sessions go on")
		b.run(t, rec, reg, "s")
		require.Empty(t, sentFor(rec.all(), "m2"), "a quarantined session does not run")

		require.ErrorIs(t, release(b), recovery.ErrStillInvalid, "released unrepaired, it would only fail again")
		b.repairToolCallParts(t, "s")
		require.NoError(t, release(b))
		require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionRewoken: 1}, b.pass(t).Decisions)
		b.run(t, rec, reg, "s")
		require.Len(t, b.completed(t, "s"), 2, "the prompt that waited ran")
		sent := sentFor(rec.all(), "m2")
		require.Len(t, sent, 1)
		var calls []provider.ToolCall
		for _, m := range sent[0].Messages {
			calls = append(calls, m.ToolCalls...)
		}
		require.Len(t, calls, 1, "the repaired call is in the history sent")
		require.Equal(t, "append_line", calls[0].Name)
		require.Len(t, side.runs(), 1, "the tool never ran again")
	})

	t.Run("MidTurn", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tool := &corruptingTool{pool: b.pool, session: "s"}
		reg := b.registry(t, tool)
		rec := &recorder{}
		b.admit(t, "s", "m1", `/tool append_line {"line":"x"}`)
		b.run(t, rec, reg, "s")
		require.Equal(t, 1, tool.count())
		require.Len(t, rec.all(), 1, "the step after the call was not sent")
		require.Empty(t, b.completed(t, "s"))

		b.die(t, "s")
		p := b.pass(t)
		require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionQuarantined: 1}, p.Decisions,
			"not continued into the same unreadable transcript at every lease")
		quarantined(t, b)
		require.Zero(t, b.count(t, `SELECT count(*) FROM inputs WHERE kind = 'continuation'`), "nothing admitted to run it again")

		require.ErrorIs(t, release(b), recovery.ErrStillInvalid)
		b.repairToolCallParts(t, "s")
		require.NoError(t, release(b))
		require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionContinued: 1}, b.pass(t).Decisions,
			"decided by its phase once repaired: the call's result is settled, the turn goes on")
		b.run(t, rec, reg, "s")
		require.Len(t, b.completed(t, "s"), 1, "the turn ended")
		require.Equal(t, 1, tool.count(), "the side-effecting call never ran again")
		require.Len(t, rec.all(), 2, "the step after the call was sent once")
	})
}
