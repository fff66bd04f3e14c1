package executor_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/provider"
	"github.com/promptline/promptline/tools"
)

// answerAtCancel answers once the turn's context has ended: an answer in
// hand just as the shutdown grace runs out.
type answerAtCancel struct {
	started chan struct{}
	resp    provider.Response
}

func (p answerAtCancel) Complete(ctx context.Context, _ provider.Request) (provider.Response, error) {
	close(p.started)
	<-ctx.Done()
	return p.resp, nil
}

// An answer the provider returned is recorded even when the shutdown's
// grace ended while it came: thrown away, its attempt stayed started and
// recovery failed a turn the model had answered (outcome_unknown). Its tool
// calls are recorded as requested and left to recovery (phase continue),
// never run after the grace.
func TestAnswerAtTheEndOfTheGraceIsRecorded(t *testing.T) {
	t.Parallel()
	for name, resp := range map[string]provider.Response{
		"Answer":    {Text: "the answer"},
		"ToolCalls": {ToolCalls: []provider.ToolCall{{ID: "c1", Name: "append_line", Input: json.RawMessage(`{"line":"x"}`)}}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setupExec(t)
			p := answerAtCancel{started: make(chan struct{}), resp: resp}
			claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: 30 * time.Second, OwnerID: "a"})
			e := newExecutor(t, b.pool, &executor.ExecutorConfig{Claims: claims, Provider: p, StopGrace: 100 * time.Millisecond,
				Tools: tools.NewRegistry()})
			t.Cleanup(e.StopNow)
			b.admit(t, "s", "m1", "hello")
			_, err := e.Wake(context.Background(), "s", 0)
			require.NoError(t, err)
			select {
			case <-p.started:
			case <-time.After(20 * time.Second):
				t.Fatal("the provider was never called")
			}
			e.Stop()
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM attempts WHERE session_id = 's' AND state = 'succeeded'`),
				"the answer the provider returned is recorded")
			if len(resp.ToolCalls) == 0 {
				require.Equal(t, 1, b.answered(t, "m1"), "the turn is answered")
				require.Zero(t, b.count(t, `SELECT count(*) FROM claims`), "the claim is released")
				return
			}
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = 's' AND state = 'requested'`),
				"the call is recorded, not run after the grace")
			require.Equal(t, 1, b.count(t, `SELECT count(*) FROM claims WHERE phase = 'continue'`), "left to recovery, which continues the turn")
		})
	}
}
