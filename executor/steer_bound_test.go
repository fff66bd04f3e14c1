package executor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/admission"
	"github.com/promptline/promptline/envelope"
	"github.com/promptline/promptline/provider/scripted"
)

// Steers beyond what one turn takes (TestATurnTakesABoundedShareOfTheSteers)
// are answered in the turns right after, still before the prompts queued
// before them, each once.
func TestSteersBeyondATurnRunInTheNextTurns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupExec(t)
	sess := id(t, "s")
	in := []admission.Incoming{{Prompt: envelope.Prompt{MessageID: sess + "-queued", SessionID: sess, Text: "queued", Delivery: envelope.DeliveryQueue}}}
	for i := range 250 {
		in = append(in, admission.Incoming{Prompt: envelope.Prompt{MessageID: fmt.Sprintf("%s-steer%03d", sess, i), SessionID: sess,
			Text: fmt.Sprintf("steer %d", i), Delivery: envelope.DeliverySteer}})
	}
	_, err := b.admitter.Admit(ctx, in)
	require.NoError(t, err)

	e := b.executor(t, "o", scripted.ScriptedProvider{}, 5*time.Second, 0)
	done, err := e.Wake(ctx, sess, 0)
	require.NoError(t, err)
	wait(t, done)

	rows, err := b.pool.Query(ctx, `SELECT answers FROM messages WHERE session_id = $1 AND role = 'assistant' AND status = 'completed' ORDER BY seq`, sess)
	require.NoError(t, err)
	var turns [][]string
	for rows.Next() {
		var a []string
		require.NoError(t, rows.Scan(&a))
		turns = append(turns, a)
	}
	require.NoError(t, rows.Err())
	var sizes []int
	var order []string
	for _, a := range turns {
		sizes = append(sizes, len(a))
		order = append(order, a...)
	}
	require.Equal(t, []int{100, 100, 50, 1}, sizes, "steers a hundred a turn, then the queued prompt")
	for i := range 250 {
		require.Equal(t, fmt.Sprintf("%s-steer%03d", sess, i), order[i])
	}
	require.Equal(t, sess+"-queued", order[250])
	require.Zero(t, b.count(t, `SELECT count(*) FROM waiting_inputs WHERE session_id = $1`, sess))
}
