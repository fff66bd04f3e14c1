package recovery

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
)

// The redrive scan reads the old waiting inputs through a partial index of
// waiting inputs (inputs_redrive_admitted, or inputs_waiting_session on a
// table without statistics, as before), never the whole inputs table,
// whatever the planner knows: without statistics and after ANALYZE, with
// generic (as prepared statements end up) and custom plans. Filtering
// before the limit (claims, recent redrives) must not cost that index; how
// the few filtered rows are joined to claims and sessions is the planner's
// choice (at this size it hashes the small tables, as it did before).
func TestRedriveScanUsesTheRedriveIndex(t *testing.T) {
	t.Parallel()
	pc := testkit.NewPlanConn(t)
	exec := pc.Exec
	for _, table := range []string{"sessions", "inputs", "claims"} {
		exec(`ALTER TABLE ` + table + ` SET (autovacuum_enabled = false)`)
	}
	// A backlog: 20,000 sessions, each with a promoted input and a young
	// waiting one; 3,000 with a live claim, 300 with an old lost wake.
	exec(`INSERT INTO sessions (session_id) SELECT 's' || g FROM generate_series(1, 20000) g`)
	exec(`INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, admitted_at, promotion_seq)
		SELECT 'p' || g, 's' || g, 'x', '\x00', 'queue', false, now() - interval '2 hours', g FROM generate_series(1, 20000) g`)
	exec(`INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending, admitted_at)
		SELECT 'm' || g, 's' || g, 'x', '\x00', 'queue', true, now() - CASE WHEN g % 64 = 0 THEN interval '1 hour' ELSE interval '1 second' END
		FROM generate_series(1, 20000) g`)
	exec(`INSERT INTO claims (session_id, execution_id, owner_id, fencing_token, phase, expires_at)
		SELECT 's' || g, 'e' || g, 'o', 1, 'ready', now() + interval '1 minute' FROM generate_series(1, 3000) g`)
	plan := func(name string) string { return pc.Explain(name, `(60000, 100, '')`) }
	check := func(stage string) {
		for _, mode := range []string{"force_generic_plan", "force_custom_plan"} {
			exec(`SET plan_cache_mode = ` + mode)
			name := fmt.Sprintf("redrive_%s", mode)
			exec(`PREPARE ` + name + ` AS ` + redriveSQL)
			p := plan(name)
			exec(`DEALLOCATE ` + name)
			require.True(t, testkit.UsesIndex(p, "inputs_redrive_admitted") || testkit.UsesIndex(p, "inputs_waiting_session"),
				"%s, %s: the scan must read waiting inputs through a partial index of waiting inputs:\n%s", stage, mode, p)
			require.True(t, testkit.UsesIndex(p, "claims_pkey"), "%s, %s: claims are checked by primary key:\n%s", stage, mode, p)
			for _, table := range []string{"inputs"} {
				require.NotContains(t, p, "Seq Scan on "+table, "%s, %s:\n%s", stage, mode, p)
			}
			t.Logf("%s, %s:\n%s", stage, mode, p)
		}
	}
	check("without statistics")
	exec(`ANALYZE sessions, inputs, claims`)
	check("after ANALYZE")
}
