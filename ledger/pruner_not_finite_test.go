package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/ledger"
)

// A settled execution whose rows finished at a time that is not a time
// ('-infinity', 'infinity': the column admits both; a hand edit, a restore
// or a repair script may leave one) is pruned as one past the retention:
// that time says nothing of when it finished, so no retention can be
// counted from it, and every other condition (an idle session, every row
// settled, no continuation pending) still holds it while anything may need
// it. Before, 'infinity' was never before the cutoff and the execution's
// rows were kept for good.
func TestPrunerPrunesAFinishTimeThatIsNotATime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const retention = 24 * time.Hour
	for _, value := range []string{"-infinity", "infinity"} {
		for _, table := range []string{"attempts", "tool_calls"} {
			t.Run(value+"/"+table, func(t *testing.T) {
				t.Parallel()
				b := setup(t, 0)
				b.session(t, "idle", 0)
				b.execution(t, "idle", "e-odd", 2, 2, 48*time.Hour)
				b.execution(t, "idle", "e-young", 1, 1, time.Hour)
				b.exec(t, `UPDATE `+table+` SET finished_at = $1::timestamptz WHERE execution_id = 'e-odd'`, value)

				p := mustPruner(t, b.pool, &ledger.PrunerConfig{Retention: retention})
				a, c, err := p.Prune(ctx)
				require.NoError(t, err)
				require.Equal(t, []int{2, 4}, []int{a, c})
				require.Zero(t, b.ledgerRows(t, "e-odd"))
				require.Equal(t, 2, b.ledgerRows(t, "e-young"), "young executions stay")
			})
		}
	}
}
