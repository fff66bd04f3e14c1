package admission

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
)

type planNode struct {
	Type     string     `json:"Node Type"`
	Relation string     `json:"Relation Name"`
	Index    string     `json:"Index Name"`
	Plans    []planNode `json:"Plans"`
}

// A generic plan of lockSessionsSQL made while inputs is small must still
// look the batch's IDs up by the primary key: pgx prepares the statement,
// Postgres keeps the generic plan it chose after five executions until
// something invalidates it (autovacuum's analyze, which on a fresh database
// comes a minute or more later), and a plan that scanned inputs whole,
// chosen at a few dozen rows, was kept while the table grew: every batch
// then read every input (the bench's steady phase read 19.8 million tuples
// for 15,000 turns; docs/benchmarks.md, "A plan chosen on an empty table").
func TestLockSessionsPlanIsAnIndexLookupAtAnySize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	for _, sql := range []string{
		`ALTER TABLE inputs SET (autovacuum_enabled = false)`,
		`INSERT INTO sessions (session_id) SELECT 's-' || g FROM generate_series(1, 30) g`,
		`INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
		 SELECT 'm-' || g, 's-' || g, 'hello', '\x00', 'queue', true FROM generate_series(1, 30) g`,
		`SET plan_cache_mode = force_generic_plan`,
		`PREPARE lock_sessions(text[], text[], bytea[], bool[]) AS ` + lockSessionsSQL,
	} {
		_, err := conn.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	scans := func() []string {
		var plan []byte
		require.NoError(t, conn.QueryRow(ctx, `EXPLAIN (FORMAT JSON) EXECUTE lock_sessions('{m-1,m-x}', '{s-1,s-x}', '{"\\x00","\\x00"}', '{t,t}')`).Scan(&plan))
		var doc []struct{ Plan planNode }
		require.NoError(t, json.Unmarshal(plan, &doc))
		var out []string
		var walk func(n planNode)
		walk = func(n planNode) {
			if n.Relation == "inputs" {
				out = append(out, n.Type+" "+n.Index)
			}
			for _, c := range n.Plans {
				walk(c)
			}
		}
		walk(doc[0].Plan)
		return out
	}
	lookup := []string{"Index Scan inputs_pkey"}
	require.Equal(t, lookup, scans(), "at 30 inputs")
	// The same generic plan after the table grew: nothing re-plans it.
	_, err = conn.Exec(ctx, `INSERT INTO sessions (session_id) SELECT 's-' || g FROM generate_series(31, 20000) g;
		INSERT INTO inputs (message_id, session_id, text, payload_hash, delivery, wake_pending)
		SELECT 'm-' || g, 's-' || g, 'hello', '\x00', 'queue', true FROM generate_series(31, 20000) g`)
	require.NoError(t, err)
	require.Equal(t, lookup, scans(), "at 20,000 inputs")
}
