package recovery_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/executor"
	"github.com/promptline/promptline/internal/testkit"
	"github.com/promptline/promptline/ledger"
	"github.com/promptline/promptline/recovery"
	"github.com/promptline/promptline/tools"
)

// A process that dies between two tool calls of one step (the first
// settled, the second requested and never started) leaves nothing
// uncertain: the turn is continued, the second call runs once, and the
// turn completes. It is not failed outcome_unknown, nor is the call that
// never ran interrupted. The executor is stopped at that point by its
// permission check of the second call, then resumes as a zombie: its
// claim taken over, it runs nothing more.
func TestDeathBetweenToolCallsContinuesTheTurn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.admit(t, "s", "m1", "/tool echo {\"text\": \"a\"}\n/tool append_line {\"line\": \"x\"}")

	echo, side := &keyTool{}, &sideTool{}
	reg := tools.NewRegistry()
	require.NoError(t, reg.Register(echo))
	require.NoError(t, reg.Register(side))
	asked, gate := make(chan struct{}), make(chan struct{})
	claims := ledger.NewClaims(b.pool, &ledger.ClaimsConfig{Lease: time.Minute, OwnerID: "zombie"})
	zombie, err := executor.NewExecutor(b.pool, &executor.ExecutorConfig{Claims: claims, Provider: &recorder{}, Tools: reg,
		PermissionFunc: func(tool string) tools.Permission {
			if tool == "append_line" {
				close(asked) // once: the zombie asks no more
				<-gate
			}
			return tools.Allow
		}})
	require.NoError(t, err)
	require.NoError(t, zombie.Start(context.Background()))
	t.Cleanup(zombie.StopNow)
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(open) // before the stop, should the test fail first
	done, err := zombie.Wake(context.Background(), "s", 0)
	require.NoError(t, err)
	select {
	case <-asked:
	case <-time.After(20 * time.Second):
		t.Fatal("the second call was never reached")
	}
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = 's' AND tool = 'echo' AND state = 'succeeded'`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = 's' AND tool = 'append_line' AND state = 'requested'`))

	b.die(t, "s")
	p := b.pass(t)
	require.Equal(t, map[recovery.DecisionKind]int{recovery.DecisionContinued: 1}, p.Decisions,
		"nothing was in flight: the turn goes on (phase %v)", b.records(t, "s"))

	open()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the zombie did not stop")
	}
	require.Empty(t, side.runs(), "the fenced zombie ran nothing")

	b.run(t, &recorder{}, reg, "s")
	require.Len(t, side.runs(), 1, "the call left requested ran once, by the continuation")
	require.Len(t, echo.keys, 1, "the settled call did not run again")
	require.Zero(t, b.count(t, `SELECT count(*) FROM tool_calls WHERE session_id = 's' AND state NOT IN ('succeeded')`))
	require.Empty(t, testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnFailed))
	completed := testkit.SessionEvents(t, b.pool, "s", envelope.EventTurnCompleted)
	require.Len(t, completed, 1)
	require.Equal(t, []string{"m1"}, completed[0].MessageIDs)
}
