package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/promptline/promptline/internal/testkit"
)

// TestSelectIsAnOrderedIndexScan: after a burst of marks, with the
// table's statistics not yet caught up (autovacuum off here, as it lags
// on a busy table), the planner's own choice for the relay's select is a
// bitmap scan, which reads every index entry of a marked row and its heap
// page again on every pass. In the relay's pass, after its lock
// statement, the select is an ordered scan of outbox_unpublished, which
// marks those entries dead as it passes them and stops at the batch.
func TestSelectIsAnOrderedIndexScan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testkit.Pool(t)
	for _, sql := range []string{
		`ALTER TABLE outbox SET (autovacuum_enabled = false)`,
		`INSERT INTO outbox (topic, key, payload) SELECT 't', 's' || g, '\x00' FROM generate_series(1, 100000) g`,
		`UPDATE outbox SET published_at = now()`,
		`INSERT INTO outbox (topic, key, payload) SELECT 't', 's' || g, '\x00' FROM generate_series(1, 500) g`,
	} {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err)
	}
	nodes := func(tx pgx.Tx) []string {
		var plan []byte
		// Two failing IDs: with none, that branch's "id = ANY('{}')" is
		// constant false, and the planner may read it through any index.
		require.NoError(t, tx.QueryRow(ctx, `EXPLAIN (FORMAT JSON) `+selectSQL, 500, []int64{1, 2}, []string{}).Scan(&plan))
		var doc []struct{ Plan planNode }
		require.NoError(t, json.Unmarshal(plan, &doc))
		var all []string
		var walk func(n planNode)
		walk = func(n planNode) {
			all = append(all, n.Type+" "+n.Index)
			for _, c := range n.Plans {
				walk(c)
			}
		}
		walk(doc[0].Plan)
		return all
	}
	// One connection throughout, so that a setting left on it would show.
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	require.NoError(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		require.Contains(t, nodes(tx), "Bitmap Index Scan outbox_unpublished",
			"the planner's own choice (if this fails, the planner changed: see lockSQL's comment)")
		return nil
	}))
	for _, lock := range []string{lockSQL, tryLockSQL} {
		require.NoError(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, lock, RelayLockKey)
			require.NoError(t, err)
			// The second branch of the union (the batch) is the one that
			// scans; the first looks up the failing rows by ID.
			require.Equal(t, []string{"Merge Append ", "Limit ", "Index Scan outbox_unpublished", "Limit ", "Index Scan outbox_unpublished"}, nodes(tx), lock)
			return nil
		}))
	}
	require.NoError(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		require.Contains(t, nodes(tx), "Bitmap Index Scan outbox_unpublished", "the setting ends with the pass's transaction")
		return nil
	}))
}

type planNode struct {
	Type  string     `json:"Node Type"`
	Index string     `json:"Index Name"`
	Plans []planNode `json:"Plans"`
}

// A pass's statements look rows up by an index whatever the size and the
// statistics of the table when their plans were made: Postgres keeps the
// generic plan it makes for a prepared statement until an analyze
// invalidates it, and a plan made while the outbox held a few dozen rows
// (never analyzed, or analyzed at that size) scanned the whole table,
// kept as the table grew: every pass then read every row
// (docs/benchmarks.md, "A plan made on a small table").
func TestPassPlansAreIndexScansAtAnySize(t *testing.T) {
	t.Parallel()
	pc := testkit.NewPlanConn(t)
	pc.Exec(`ALTER TABLE outbox SET (autovacuum_enabled = false)`)
	// Generic plans, as the plan cache ends with; one is kept until an
	// analyze, so the plan made small is the one the grown table gets.
	pc.Exec(`SET plan_cache_mode = force_generic_plan`)
	fill := func(n int) {
		pc.Exec(fmt.Sprintf(`INSERT INTO outbox (topic, key, payload) SELECT 't', 's' || g, '\x00' FROM generate_series(1, %d) g`, n))
	}
	check := func(stage, sel, mark string) {
		t.Helper()
		selPlan := pc.Explain(sel, `(500, '{}', '{}')`)
		markPlan := pc.Explain(mark, `('{1,2}')`)
		if strings.Contains(selPlan+markPlan, "Seq Scan") ||
			strings.Count(selPlan, "Index Scan using outbox_unpublished ") != 2 ||
			!testkit.UsesIndex(markPlan, "outbox_pkey") || !strings.Contains(markPlan, "Index Cond: (id = ANY ($1))") {
			t.Fatalf("%s: the select must read outbox_unpublished in order, the mark look its rows up in outbox_pkey:\n%s\n%s", stage, selPlan, markPlan)
		}
	}
	// Plans made as a pass makes them: after its lock statement, as
	// generic plans (what the plan cache ends with).
	n := 0
	prepare := func(stage string) {
		t.Helper()
		for _, lock := range []string{lockSQL, tryLockSQL} {
			n++
			sel, mark := fmt.Sprint("sel", n), fmt.Sprint("mark", n)
			pc.Exec(`BEGIN`)
			pc.Exec(strings.ReplaceAll(lock, "$1", fmt.Sprint(RelayLockKey)))
			pc.Exec(`PREPARE ` + sel + `(int, bigint[], text[]) AS ` + selectSQL)
			pc.Exec(`PREPARE ` + mark + `(bigint[]) AS ` + markSQL)
			check(stage+", "+lock, sel, mark)
			pc.Exec(`COMMIT`)
		}
	}
	fill(30)
	prepare("30 rows, never analyzed")
	fill(30)
	pc.Exec(`ANALYZE outbox`)
	prepare("60 rows, analyzed")
}

// The quarantined outbox rows are counted for the gauge on every recovery
// pass of every process; the outbox holds every row of the retention
// (--outbox-retention, an hour by default), so the count must read the
// quarantined rows alone, not the table (migration 00019).
func TestCountQuarantinedReadsTheQuarantinedOnly(t *testing.T) {
	t.Parallel()
	pc := testkit.NewPlanConn(t)
	pc.Exec(`ALTER TABLE outbox SET (autovacuum_enabled = false)`)
	check := func(stage, name string) {
		t.Helper()
		plan := pc.Explain(name, "")
		if strings.Contains(plan, "Seq Scan") || !testkit.UsesIndex(plan, "outbox_quarantined") {
			t.Fatalf("%s: the count must read outbox_quarantined:\n%s", stage, plan)
		}
	}
	pc.Exec(`SET plan_cache_mode = force_generic_plan`)
	pc.Exec(`INSERT INTO outbox (topic, key, payload, published_at, quarantine_reason, quarantined_at)
		SELECT 't', 's' || g, '\x00', CASE WHEN g % 5000 <> 0 THEN now() END,
		       CASE WHEN g % 5000 = 0 THEN 'too large' END, CASE WHEN g % 5000 = 0 THEN now() END
		FROM generate_series(1, 20000) g`)
	pc.Exec(`ANALYZE outbox`)
	pc.Exec(`PREPARE count_analyzed AS ` + countQuarantinedSQL)
	check("generic, planned with statistics", "count_analyzed")
	// A release looks its row up by key, through whichever index, with
	// or without a bulk release's quarantine time.
	pc.Exec(`PREPARE release(bigint, timestamptz) AS ` + releaseSQL)
	for _, args := range []string{"(5000, NULL)", "(5000, now())"} {
		if plan := pc.Explain("release", args); strings.Contains(plan, "Seq Scan") || !strings.Contains(plan, "Index Cond: (id = $1)") {
			t.Fatalf("a release %s must look its row up by id:\n%s", args, plan)
		}
	}
}
